"""A real checkpoint of DeepSpeed 0.19's AutoEP (each MoE layer's experts in fused tensors,
<prefix>.experts.w1/w2/w3 of shape [experts, ...], each expert-parallel rank holding its run of
experts), through ucp-inspect, ucp-convert and ucp-reshard:

    real_autoep.py INSPECT CONVERT RESHARD CASE_DIR WORK MPIEXEC

- ucp-convert on 1 and 2 ranks, both stores, equals DeepSpeed's own universal output byte for byte
  (real_convert.py with real_universal.py: its fused tensors [experts, ...] with cat_dim 0,
  is_expert_param and ep_num_experts; the differences DeepSpeed's converter makes to metadata nobody
  reads are printed with their reasons);
- independently of DeepSpeed's converter, every fused fp32 tensor's slice for expert e equals the
  weight DeepSpeed saved in that expert's file (layer_<L>_expert_<e>_mp_rank_00_model_states.pt,
  <prefix>.experts.w<k>.<e>), and every other parameter the module's saved weight;
- ucp-inspect --json: ep as trained, each fused tensor the Expert pattern with its number of experts,
  no other parameter Expert;
- ucp-reshard refuses the atomic checkpoint by name (it writes no AutoEP layout), leaving nothing.
"""
import json
import os
import re
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ds_stubs  # noqa: E402,F401  DeepSpeed's pickled classes, without DeepSpeed
from real_moe import load, run, same_bytes  # noqa: E402


def main():
    inspect, convert, reshard, case, work, mpiexec = sys.argv[1:7]
    src = os.path.join(case, "ckpt")
    shard = os.path.join(src, open(os.path.join(src, "latest")).read().strip())
    states = load(os.path.join(shard, "mp_rank_00_model_states.pt"))
    layers = states["ds_autoep_layers"]
    ep = layers[0]["ep_size"]

    r = run(["/usr/bin/python3", os.path.join(HERE, "real_convert.py"), inspect, convert, case, os.path.join(work, "convert"),
             mpiexec, reshard], "real_convert.py (against DeepSpeed's universal output)")
    print(r.stdout.strip())

    atomic = os.path.join(work, "convert", "pt-np1", "universal")
    fused = {f"{l['expert_key_prefix']}.w{k}": l["num_experts"] for l in layers for k in (1, 2, 3)}
    experts = {}
    for f in os.listdir(shard):
        if re.fullmatch(r"layer_\d+_expert_\d+_mp_rank_00_model_states\.pt", f):
            experts.update(load(os.path.join(shard, f)))
    checked = 0
    for name, n in fused.items():
        fp32 = load(os.path.join(atomic, "zero", name, "fp32.pt"))["param"]
        assert fp32.shape[0] == n, f"{name}: {list(fp32.shape)}, not {n} experts on dim 0"
        for e in range(n):
            assert same_bytes(experts[f"{name}.{e}"], fp32[e]), f"{name}: expert {e} differs from its expert file"
            checked += 1
    for name, t in states["module"].items():
        path = os.path.join(atomic, "zero", name, "fp32.pt")
        if os.path.exists(path):  # (the module also lists aliases of a parameter, which the optimizer names once)
            assert same_bytes(t, load(path)["param"]), f"{name}: differs from the saved weight"
            checked += 1
    print(f"{checked} tensors equal DeepSpeed's saved weights ({len(fused)} fused tensors, expert by expert, against "
          "the expert files)")

    report = json.loads(run([inspect, src, "--json"], "ucp-inspect --json").stdout)
    assert report["degrees"]["ep"] == ep, f"ucp-inspect says ep={report['degrees']['ep']}, the case trained with {ep}"
    for p in report["params"]:
        if p["name"] in fused:
            assert p["pattern"] == "Expert" and p.get("fused_experts") == fused[p["name"]], p
        else:
            assert p["pattern"] != "Expert", p["name"]
    print(f"inspect: ep={ep}, {len(fused)} fused expert tensors (pattern Expert)")

    out = os.path.join(work, "resharded")
    r = subprocess.run([reshard, atomic, "-o", out, "--dp", "2", "--tp", "1", "--pp", "1", "--zero-stage", "1"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "AutoEP" in r.stderr and "load_universal" in r.stderr, (r.returncode, r.stderr)
    assert not os.path.exists(out), "ucp-reshard left an output folder behind"
    print("refused:", r.stderr.strip().splitlines()[-1][:120])
    print("ok")


if __name__ == "__main__":
    main()
