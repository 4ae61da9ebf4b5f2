"""ucp-reshard against the fixture generator: for each target layout, reshard the atomic checkpoint
(with 1, 2 or 4 MPI ranks, in turn), let make_fixture.py write the same layout from the ground
truth, and compare the two with compare_shards.py.

  reshard_matrix.py UCP_RESHARD ATOMIC_DIR WORK_DIR MPIEXEC --family F --layers L --dp D [--source-tp T]

Targets: the given DP x TP {1, 2} x PP {1, 2} x ZeRO {0 (bf16), 1, 2 (PP=1), 3 (PP=1)} x {fp16, bf16, fp32}.
The target model is given explicitly: a PipelineModule for ZeRO 0-2, except that with --plain-pp1 the
PP=1 ZeRO 0-2 targets are models that are not one (weights in mp_rank_XX_model_states.pt); ZeRO-3
targets never are.
"""
import argparse
import os
import shutil
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.normpath(os.path.join(here, "..", ".."))
# The generator and the comparison run in this process: one torch import for ~30 targets, not two each.
import compare_shards  # noqa: E402
import in_process  # noqa: E402


def generate(argv):
    code, output = in_process.run_script(os.path.join(root, "scripts", "make_fixture.py"), argv)
    if code != 0:
        sys.exit(f"make_fixture.py {' '.join(argv)}: exit {code}\n{output[-3000:]}")
ap = argparse.ArgumentParser()
ap.add_argument("binary")
ap.add_argument("atomic")
ap.add_argument("work")
ap.add_argument("mpiexec")
ap.add_argument("--family", default="llama")
ap.add_argument("--layers", type=int, default=2)
ap.add_argument("--dp", type=int, nargs="+", default=[1, 2, 3, 4])
ap.add_argument("--plain-pp1", action="store_true", help="PP=1 ZeRO 0-2 targets: --model plain")
a = ap.parse_args()

targets = []
for dp in a.dp:
    for tp in (1, 2):
        for pp in (1, 2):
            for zero in (0, 1, 2, 3):
                for dtype in ("fp16", "bf16", "fp32"):
                    if (zero == 0 and dtype != "bf16") or (zero >= 2 and pp > 1):
                        continue
                    targets.append((dp, tp, pp, zero, dtype))
failures = []
for k, (dp, tp, pp, zero, dtype) in enumerate(targets):
    ranks = (1, 2, 4)[k % 3]
    model = "plain" if zero == 3 or (a.plain_pp1 and pp == 1) else "pipe"
    name = f"dp{dp}-tp{tp}-pp{pp}-z{zero}-{dtype}" + ("-plain" if model == "plain" and zero < 3 else "")
    out, gen = os.path.join(a.work, "ours", name), os.path.join(a.work, "gen", name)
    shutil.rmtree(out, ignore_errors=True)
    cmd = [a.binary, a.atomic, "-o", out, "--dp", str(dp), "--tp", str(tp), "--pp", str(pp),
           "--zero-stage", str(zero), "--dtype", dtype, "--model", model, "-q"]
    if ranks > 1:
        cmd = [a.mpiexec, "--oversubscribe", "-np", str(ranks)] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        failures.append(name)
        print(f"{name} ({ranks} ranks): ucp-reshard exited {p.returncode}: {p.stderr.strip()[:500]}")
        continue
    generate([gen, "--dp", str(dp), "--tp", str(tp), "--pp", str(pp), "--zero-stage", str(zero), "--dtype", dtype,
              "--family", a.family, "--layers", str(a.layers), "--zero-vocab-padding", "--synced-tied-copies",
              "--model", model])
    found, compared = compare_shards.compare_roots(gen, out)
    verdict = "OK" if not found else f"{len(found)} problems"
    print(f"{name} ({ranks} rank{'s' if ranks > 1 else ''}): {out}: {compared} files compared with {gen}: {verdict}")
    if found:
        for m in found[:40]:
            print("FAIL", m)
        failures.append(name)
print(f"{len(targets)} target layouts, {len(failures)} failures {failures}")
sys.exit(1 if failures else 0)
