"""A Mixture-of-Experts fixture (scripts/make_moe_fixture.py) through ucp-convert and ucp-reshard,
against the generator's ground truth:

    moe_matrix.py CONVERT RESHARD WORK MPIEXEC --dp D --ep E --zero-stage Z [--dtype fp32] [--ranks N]

- ucp-convert (on --ranks ranks): every atomic tensor byte for byte the truth: fp32 unpadded, the
  moments as the job at ep kept them (an expert's ep and ep^2 times the truth's), every expert under
  its global id; the manifest's ep;
- ucp-reshard to layouts with ep in {1, 2, 4} dividing dp in {1, 2, 4} (and the experts), ZeRO-1 and
  ZeRO-2, and in fp32 ZeRO-0 too, in the same dtype (1, 2 or 4 MPI ranks in turn): from an fp32 source
  half the (ep, dp) pairs at one ZeRO stage each, turning with the source, so that the matrix's 18 fp32
  sources reach each of the 18 layouts 3 times; from a 16-bit source every layout of its kind; for
  the generator's DeepSpeed release (--ds-version: its files without ZeRO record none): every file
  equal to what the generator writes for that layout from the truth (compare_shards.py: tensor
  bytes, layout values, types), the expert groups named ep_size_<ep>;
- round trip: up to two of those outputs of another ep (from 15 of the 18 fp32 sources, every 16-bit
  one) converted again and resharded back to the source layout give the source's files again.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

import torch

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.normpath(os.path.join(here, "..", ".."))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(root, "scripts"))
import ds_stubs  # noqa: E402,F401
import make_moe_fixture  # noqa: E402
from compare_shards import compare_roots  # noqa: E402
from real_moe import same_bytes  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("convert")
ap.add_argument("reshard")
ap.add_argument("work")
ap.add_argument("mpiexec")
ap.add_argument("--dp", type=int, required=True)
ap.add_argument("--ep", type=int, required=True)
ap.add_argument("--zero-stage", type=int, required=True)
ap.add_argument("--dtype", default="fp32")
ap.add_argument("--ranks", type=int, default=1)
a = ap.parse_args()


def fixture(dp, ep, zero):
    out = os.path.join(a.work, "gen", f"dp{dp}_ep{ep}_z{zero}")
    if not os.path.exists(os.path.join(out, "fixture.json")):
        make_moe_fixture.write(argparse.Namespace(out=out, dp=dp, ep=ep, zero_stage=zero, dtype=a.dtype, layers=4,
                                                  experts=4, seed=1))
    return out


def mpi(cmd, ranks):
    return [a.mpiexec, "--oversubscribe", "-np", str(ranks)] + cmd if ranks > 1 else cmd


def run(cmd, what):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        sys.exit(f"{what} failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")


def reshard(atomic, out, dp, ep, zero, ranks):
    shutil.rmtree(out, ignore_errors=True)
    run(mpi([a.reshard, atomic, "-o", out, "-q", "--dp", str(dp), "--tp", "1", "--pp", "1", "--zero-stage", str(zero),
             "--dtype", a.dtype, "--ep", str(ep), "--ds-version", make_moe_fixture.DS_VERSION], ranks),
        f"ucp-reshard to dp={dp} ep={ep} ZeRO-{zero}")


shutil.rmtree(a.work, ignore_errors=True)
src = fixture(a.dp, a.ep, a.zero_stage)
truth = torch.load(os.path.join(src, "truth.pt"))
atomic = os.path.join(a.work, "atomic")
run(mpi([a.convert, src, "-o", atomic, "-q"], a.ranks), "ucp-convert")
zero = os.path.join(atomic, "zero")
names = sorted(p for p in os.listdir(zero) if os.path.isdir(os.path.join(zero, p)))
assert names == sorted(truth["params"]), f"atomic parameters differ: {sorted(set(names) ^ set(truth['params']))[:6]}"
experts = 0
for name in names:
    is_expert = ".deepspeed_experts." in name
    experts += is_expert
    for key in ("fp32", "exp_avg", "exp_avg_sq"):
        got = torch.load(os.path.join(zero, name, f"{key}.pt"))["param"]
        want = truth["params"][name][key]
        if is_expert and key != "fp32":
            want = want * (truth["expert_moment_scale"] ** (1 if key == "exp_avg" else 2))
        assert same_bytes(got, want), f"{name}: atomic {key} differs from the truth"
manifest = open(os.path.join(atomic, "ucp_manifest.json")).read()
assert re.search(r'"ep":\s*%d' % a.ep, manifest) and re.search(r'"moe":\s*true', manifest), "manifest: moe / ep"
print(f"convert ({a.ranks} rank(s)): {len(names)} atomic tensors ({experts} expert tensors under global ids) equal the truth")

layouts = [(dp, ep, z) for ep in (1, 2, 4) for dp in (1, 2, 4) for z in (0, 1, 2) if dp % ep == 0]
if a.dtype != "fp32":
    layouts = [x for x in layouts if x[2] > 0]  # without ZeRO: fp32 (the model's torch optimizer)
if a.dtype == "bf16":
    layouts = [x for x in layouts if x[2] == 2]  # bf16: compared at ZeRO-2 (the bf16 source is ZeRO-2)
# Each source to half the (ep, dp) pairs at one ZeRO stage each, the pairs and the stage turning with the
# source: the matrix's 18 sources together reach every one of the 18 target layouts 3 times (CI's time budget:
# 6 times before), at a sixth of the cost of every source to every layout.
if a.dtype == "fp32":
    here_k = layouts.index((a.dp, a.ep, a.zero_stage))
    pairs = sorted({(ep, dp) for dp, ep, _ in layouts})
    layouts = [x for x in layouts if (pairs.index((x[1], x[0])) + x[2] - here_k) % 6 == 0]
failures = []
for k, (dp, ep, z) in enumerate(layouts):
    ranks = (1, 2, 4)[k % 3]
    out = os.path.join(a.work, "ours", f"dp{dp}_ep{ep}_z{z}")
    reshard(atomic, out, dp, ep, z, ranks)
    found, compared = compare_roots(fixture(dp, ep, z), out)
    if a.zero_stage == 0:
        # DeepSpeed 0.14.5 saves no ds_config without ZeRO (its MoE model-states file has none, and
        # there is no ZeRO file): the ZeRO files written from such a source have None for it.
        found = [f for f in found if not re.fullmatch(r"zero_pp_rank_\d+_mp_rank_00_optim_states\.pt/ds_config: "
                                                      r"dict in the generator's file, NoneType in ours", f)]
    for d in range(dp if z > 0 else 0):
        prefix = "bf16_" if a.dtype == "bf16" else ""
        groups = torch.load(os.path.join(out, "global_step12", f"{prefix}zero_pp_rank_{d}_mp_rank_00_optim_states.pt"))[
            "optimizer_state_dict"]["base_optimizer_state"]["param_groups"]
        if [g["name"] for g in groups if g.get("moe")] != [f"ep_size_{ep}"] * 2:
            found.append(f"zero_pp_rank_{d}: expert group names {[g['name'] for g in groups]}")
    print(f"dp={dp} ep={ep} ZeRO-{z} ({ranks} rank(s)): {compared} files, {'OK' if not found else found[:8]}")
    if found:
        failures.append((dp, ep, z))

# Round trips through layouts of another ep; from a ZeRO source through ZeRO layouts only: DeepSpeed
# 0.14.5 keeps no ds_config without ZeRO, so the way back could not restore the source's.
for dp, ep, z in [x for x in layouts if x[1] != a.ep and (x[2] > 0 or a.zero_stage == 0)][:2]:
    back = os.path.join(a.work, f"back_dp{dp}_ep{ep}_z{z}")
    run(mpi([a.convert, os.path.join(a.work, "ours", f"dp{dp}_ep{ep}_z{z}"), "-o", back, "-q"], 2), "ucp-convert back")
    again = os.path.join(a.work, f"again_dp{dp}_ep{ep}_z{z}")
    reshard(back, again, a.dp, a.ep, a.zero_stage, 1)
    found, compared = compare_roots(src, again)
    print(f"round trip through dp={dp} ep={ep} ZeRO-{z}: {compared} files, {'OK' if not found else found[:8]}")
    if found:
        failures.append(("round trip", dp, ep, z))
print(f"{len(layouts)} target layouts, {len(failures)} failures {failures}")
sys.exit(1 if failures else 0)
