"""The same model saved under different layouts must convert to byte-identical atomic tensors.
Compares every state tensor of every parameter across the atomic checkpoints named, and the files'
checksums too between checkpoints whose files DeepSpeed's converter would write alike: the same
parameter naming, the same form (ZeRO-3's bare tensors or the dict), and the same TP rules in the
checkpoint's info (Megatron-DeepSpeed names its TP rules only at TP > 1, and the dict's keys follow them).

  cross_layout.py ATOMIC_ROOT NAME...   (the fixtures must share family, layer count and seed)
"""
import json
import os
import sys

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(here, "..", "..", "scripts"))
import ds_stubs  # noqa: E402,F401
from make_fixture import Model  # noqa: E402
from atomic_files import atomic_tensor  # noqa: E402

root, names = sys.argv[1], sys.argv[2:]
model = Model("llama", 2)
to_pipe = {model.plain_name(n): n for n, _, _, _ in model.params()}
ref = None
problems = 0
for name in names:
    d = os.path.join(root, name, "universal")
    m = json.load(open(os.path.join(d, "ucp_manifest.json")))
    naming = (m["source"]["naming"], m["source"]["zero_stage"] == 3, m["source"]["tp"] > 1)
    sums = {e["path"]: e["xxh64"] for e in m["files"]}
    tensors = {}
    for p in m["params"]:
        canonical = p["name"] if naming[0] == "pipe" else to_pipe[p["name"]]
        for state in ("fp32", "exp_avg", "exp_avg_sq"):
            v = torch.load(os.path.join(d, p["files"][state]))
            t = atomic_tensor(v, p["shape"])
            tensors[(canonical, state)] = (t, sums[p["files"][state]], naming)
    if ref is None:
        ref, ref_name = tensors, name
        continue
    if set(tensors) != set(ref):
        print(f"{name}: parameters differ from {ref_name}")
        problems += 1
        continue
    for key, (t, digest, nm) in tensors.items():
        r, rdigest, rnm = ref[key]
        if t.shape != r.shape or not torch.equal(t.view(torch.int32), r.view(torch.int32)):
            print(f"{name}: {key} differs from {ref_name}")
            problems += 1
        elif nm == rnm and digest != rdigest:
            print(f"{name}: {key} file bytes differ from {ref_name} (same naming, form and TP rules)")
            problems += 1
    print(f"{name}: {len(tensors)} state tensors compared with {ref_name}")
print(f"{len(names)} layouts, {problems} differences")
sys.exit(1 if problems or len(names) < 2 else 0)
