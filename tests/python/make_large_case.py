"""Writes OUT/large.pt: one uint8 tensor of 4 GiB + 64 MiB (the archive needs zip64) with marker
bytes at known offsets, and a small tensor stored after it. If the disk has less than 12 GiB free,
writes OUT/large.skip with the reason instead."""
import os
import shutil
import sys

import torch

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
for name in ("large.pt", "large.skip"):
    if os.path.exists(os.path.join(out, name)):
        os.remove(os.path.join(out, name))
free = shutil.disk_usage(out).free
if free < 12 << 30:
    reason = f"only {free >> 20} MiB free on {out}; the zip64 case needs 12 GiB"
    open(os.path.join(out, "large.skip"), "w").write(reason)
    print("SKIP:", reason)
    sys.exit(0)
n = (4 << 30) + (64 << 20)
t = torch.zeros(n, dtype=torch.uint8)
for off, val in ((0, 11), (1 << 31, 22), ((1 << 32) + 5, 33), (n - 1, 44)):
    t[off] = val
torch.save({"big": t, "after": torch.arange(10, dtype=torch.int64)}, os.path.join(out, "large.pt"))
print(f"wrote {os.path.join(out, 'large.pt')} ({os.path.getsize(os.path.join(out, 'large.pt')) >> 20} MiB)")
