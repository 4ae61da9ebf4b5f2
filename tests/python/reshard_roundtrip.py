"""Round trip: an atomic checkpoint resharded to a layout and converted back gives the original
atomic tensors byte for byte (every zero/<param>/{fp32,exp_avg,exp_avg_sq,step}.pt file has the
same XXH64 as in the original manifest).

  reshard_roundtrip.py UCP_RESHARD UCP_CONVERT ATOMIC_DIR WORK_DIR MPIEXEC
"""
import json
import os
import shutil
import subprocess
import sys

reshard, convert, atomic, work, mpiexec = sys.argv[1:6]
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
original = {e["path"]: e["xxh64"] for e in json.load(open(os.path.join(atomic, "ucp_manifest.json")))["files"]
            if e["path"].startswith("zero/") and e["path"] != "zero/optimizer_state.pt"}
failures = 0
for dp, tp, pp, zero, dtype in [(3, 1, 2, 1, "fp16"), (2, 2, 1, 2, "fp32"), (4, 2, 2, 0, "bf16"), (1, 1, 1, 1, "bf16")]:
    name = f"dp{dp}-tp{tp}-pp{pp}-z{zero}-{dtype}"
    shards, back = os.path.join(work, name, "shards"), os.path.join(work, name, "atomic", "universal")
    shutil.rmtree(os.path.join(work, name), ignore_errors=True)
    subprocess.run([mpiexec, "--oversubscribe", "-np", "2", reshard, atomic, "-o", shards, "--dp", str(dp), "--tp",
                    str(tp), "--pp", str(pp), "--zero-stage", str(zero), "--dtype", dtype, "-q"], check=True, env=env)
    subprocess.run([convert, shards, "-o", back, "-q"], check=True, env=env)
    again = {e["path"]: e["xxh64"] for e in json.load(open(os.path.join(back, "ucp_manifest.json")))["files"]}
    diff = [p for p, h in original.items() if again.get(p) != h]
    print(f"{name}: {len(original)} atomic files, {len(diff)} differ {diff[:3]}")
    failures += bool(diff)
sys.exit(1 if failures else 0)
