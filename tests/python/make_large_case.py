"""Writes OUT/large.pt: one uint8 tensor of 4 GiB + 64 MiB (the archive needs zip64) with marker
bytes at known offsets, and a small tensor stored after it, by torch.save itself.

The 4 GiB go to /dev/shm when it has room (OUT/large.pt is then a symbolic link to the file there):
written to the disk they took 70-140 s of CI and held up every other test's fsync while they were
flushed. Without room there, on the disk under OUT; if the disk has less than 12 GiB free, writes
OUT/large.skip with the reason instead.

    make_large_case.py OUT            generate
    make_large_case.py OUT --remove   remove OUT and the file it links to
"""
import hashlib
import os
import shutil
import sys

out = sys.argv[1]
shm = os.path.join("/dev/shm", "ucp-large-" + hashlib.sha1(os.path.abspath(out).encode()).hexdigest()[:12])


def remove():
    shutil.rmtree(shm, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)


if len(sys.argv) > 2 and sys.argv[2] == "--remove":
    remove()
    sys.exit(0)

import torch  # noqa: E402 (not needed to remove)

remove()
os.makedirs(out)
n = (4 << 30) + (64 << 20)
where = out
if os.path.isdir("/dev/shm") and shutil.disk_usage("/dev/shm").free > n + (2 << 30):
    os.makedirs(shm)
    where = shm
else:
    free = shutil.disk_usage(out).free
    if free < 12 << 30:
        reason = f"only {free >> 20} MiB free on {out}; the zip64 case needs 12 GiB"
        open(os.path.join(out, "large.skip"), "w").write(reason)
        print("SKIP:", reason)
        sys.exit(0)
t = torch.zeros(n, dtype=torch.uint8)
for off, val in ((0, 11), (1 << 31, 22), ((1 << 32) + 5, 33), (n - 1, 44)):
    t[off] = val
path = os.path.join(where, "large.pt")
torch.save({"big": t, "after": torch.arange(10, dtype=torch.int64)}, path)
if where != out:
    os.symlink(path, os.path.join(out, "large.pt"))
print(f"wrote {path} ({os.path.getsize(path) >> 20} MiB)")
