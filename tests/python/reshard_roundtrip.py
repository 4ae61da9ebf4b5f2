"""Round trip: an atomic checkpoint resharded to a layout and converted back gives the original
atomic tensors byte for byte (every zero/<param>/{fp32,exp_avg,exp_avg_sq,step}.pt file has the
same XXH64 as in the original manifest). A ZeRO-3 target names its parameters as GPTModel does and
the others as GPTModelPipe does, and the rules an atomic file embeds (SubparamShape) are written in
its naming; a ZeRO-3 source's files keep its TP's vocabulary padding (DeepSpeed's ZeRO-3 form). When a
target's naming or that form differs from the source's, its atomic checkpoint is resharded once more
to the source's own layout and converted, which must give the original bytes again.

  reshard_roundtrip.py UCP_RESHARD UCP_CONVERT ATOMIC_DIR WORK_DIR MPIEXEC [DP,TP,PP,ZERO,DTYPE ...]
"""
import json
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from gpt_names import pipe_name  # noqa: E402

reshard, convert, atomic, work, mpiexec = sys.argv[1:6]
layouts = [tuple(int(x) if x.isdigit() else x for x in s.split(",")) for s in sys.argv[6:]] or \
    [(3, 1, 2, 1, "fp16"), (2, 2, 1, 2, "fp32"), (4, 2, 2, 0, "bf16"), (1, 1, 1, 1, "bf16"), (2, 2, 1, 3, "bf16")]
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
manifest = json.load(open(os.path.join(atomic, "ucp_manifest.json")))
names = [p["name"] for p in manifest["params"]]
layers = 1 + max([int(m[1]) for n in names for m in [re.match(r"language_model\.encoder\.layers\.(\d+)\.", n)] if m] +
                 [int(m[1]) - 3 for n in names for m in [re.match(r"(\d+)\.", n)] if m])


def by_layer(files):
    """zero/<param>/<state>.pt checksums, keyed by the parameter's GPTModelPipe name."""
    out = {}
    for e in files:
        m = re.match(r"zero/(.+)/([a-z_0-9]+\.pt)$", e["path"])
        if m:
            out[f"{pipe_name(m[1], layers)}/{m[2]}"] = e["xxh64"]
    return out


original = by_layer(manifest["files"])


def there_and_back(atomic_dir, shards, back, dp, tp, pp, zero, dtype):
    subprocess.run([mpiexec, "--oversubscribe", "-np", "2", reshard, atomic_dir, "-o", shards, "--dp", str(dp), "--tp",
                    str(tp), "--pp", str(pp), "--zero-stage", str(zero), "--dtype", dtype, "-q"], check=True, env=env)
    subprocess.run([convert, shards, "-o", back, "-q"], check=True, env=env)


failures = 0
for dp, tp, pp, zero, dtype in layouts:
    name = f"dp{dp}-tp{tp}-pp{pp}-z{zero}-{dtype}"
    shards, back = os.path.join(work, name, "shards"), os.path.join(work, name, "atomic", "universal")
    shutil.rmtree(os.path.join(work, name), ignore_errors=True)
    there_and_back(atomic, shards, back, dp, tp, pp, zero, dtype)
    returned = json.load(open(os.path.join(back, "ucp_manifest.json")))
    # Atomic files embed the source's naming (rules in SubparamShape) and, from a ZeRO-3 source, its
    # TP (DeepSpeed's ZeRO-3 form keeps the vocabulary padding rows of the source's TP): where these
    # differ, one more hop to the source's own layout must give the original bytes.
    form = lambda s: (s["naming"], s["zero_stage"] == 3, s["tp"] if s["zero_stage"] == 3 else None)  # noqa: E731
    if form(returned["source"]) != form(manifest["source"]):
        src = manifest["source"]
        shards, back2 = os.path.join(work, name, "shards2"), os.path.join(work, name, "atomic2", "universal")
        there_and_back(back, shards, back2, src["dp"], src["tp"], src["pp"], src["zero_stage"], src["dtype"])
        returned = json.load(open(os.path.join(back2, "ucp_manifest.json")))
        name += f" and back to the source's layout ({returned['source']['naming']} names)"
    again = by_layer(returned["files"])
    diff = [p for p, h in original.items() if again.get(p) != h]
    extra = sorted(set(again) - set(original))
    print(f"{name}: {len(original)} atomic files, {len(diff)} differ {diff[:3]}, {len(extra)} unexpected {extra[:3]}")
    failures += bool(diff or extra)
sys.exit(1 if failures else 0)
