"""ucp-reshard --gpus: the layout planner against the model and against the files it leads to.

  planner.py UCP_RESHARD UCP_CONVERT ATOMIC_DIR SOURCE_DIR WORK_DIR

1. For 1 to 64 GPUs (8 per node), `--gpus N --plan-only --json` on ATOMIC_DIR (converted from the
   fixture SOURCE_DIR) chooses a layout whose degrees multiply to N, whose TP divides the heads,
   key-value heads and FFN width of the model's own args (read by torch from SOURCE_DIR) and the
   node, whose PP is at most the layers, whose ZeRO stage DeepSpeed runs, and whose estimate fits;
   the source's TP and PP whenever they fit. A budget nothing fits is refused: exit 1 naming it.
2. The estimate against the bytes: a generator checkpoint large enough that file overheads are
   small (llama, hidden 512) is converted, resharded to the layouts the planner chooses with some
   degrees fixed (ZeRO-1 over TP=2 x PP=2, ZeRO-2 and ZeRO-3 over DP=4), and the weights and
   optimizer terms of the most loaded rank are compared with the largest weights and optimizer
   files per rank: within 1%.
"""
import json
import os
import re
import shutil
import subprocess
import sys

import torch

reshard, convert, atomic, source, work = sys.argv[1:6]
here = os.path.dirname(os.path.abspath(__file__))
root = os.path.normpath(os.path.join(here, "..", ".."))
problems = []


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)


def plan(atomic_dir, gpus, *extra):
    p = run([reshard, atomic_dir, "--gpus", str(gpus), "--plan-only", "--json", *extra])
    return p, (json.loads(p.stdout) if p.returncode == 0 else None)


# 1. Validity over 1..64 GPUs.
tag = open(os.path.join(source, "latest")).read().strip()
args = torch.load(os.path.join(source, tag, "mp_rank_00_model_states.pt"), map_location="cpu", weights_only=False)["args"]
heads, kv, ffn, layers = args.num_attention_heads, getattr(args, "num_key_value_heads", None) or args.num_attention_heads, \
    args.ffn_hidden_size, args.num_layers
src = json.load(open(os.path.join(atomic, "ucp_manifest.json")))["source"]
budget = ["--gpu-memory", "4M", "--activation-memory", "1M"]
kept = 0
for gpus in range(1, 65):
    p, j = plan(atomic, gpus, *budget)
    if p.returncode != 0:
        problems.append(f"{gpus} GPUs: exit {p.returncode}: {p.stderr.strip()}")
        continue
    c = j["chosen"]
    dp, sp, tp, pp, z = c["dp"], c.get("sp", 1), c["tp"], c["pp"], c["zero_stage"]
    what = f"{gpus} GPUs: chose dp={dp} sp={sp} tp={tp} pp={pp} ZeRO-{z}"
    if dp * sp * tp * pp != gpus:
        problems.append(f"{what}: degrees do not multiply to {gpus}")
    if heads % tp or kv % tp or ffn % tp or 8 % tp:
        problems.append(f"{what}: tp does not divide heads {heads}, kv heads {kv}, ffn {ffn} or the node's 8")
    if pp > layers or (z >= 2 and pp > 1) or (z == 0 and c["dtype"] != "bf16"):
        problems.append(f"{what}: not a layout DeepSpeed runs for {layers} layers")
    fit = [x for x in j["candidates"] if x["layout"] == c]
    if not fit or not fit[0]["fits"] or fit[0]["memory_per_gpu"]["total"] > 4 << 20:
        problems.append(f"{what}: its estimate does not fit 4 MiB: {fit}")
    same = [x for x in j["candidates"] if x["fits"] and x["layout"]["tp"] == src["tp"] and x["layout"]["pp"] == src["pp"]]
    if same and (tp, pp) != (src["tp"], src["pp"]):
        problems.append(f"{what}: the source's tp={src['tp']} pp={src['pp']} fits and was not kept")
    kept += bool(same)
    for x in j["candidates"]:
        l = x["layout"]
        if l["dp"] * l.get("sp", 1) * l["tp"] * l["pp"] != gpus or (l.get("sp", 1) > 1 and l["pp"] > 1):
            problems.append(f"{gpus} GPUs: candidate {l} does not multiply to {gpus}")
if kept < 10:
    problems.append(f"only {kept} GPU counts kept the source's tp and pp: the preference is not exercised")
p, _ = plan(atomic, 8, "--gpu-memory", "16K", "--activation-memory", "0")
if p.returncode != 1 or "no layout fits 8 GPUs of 16.0 KiB" not in p.stderr + p.stdout:
    problems.append(f"a 16 KiB budget: expected exit 1 and 'no layout fits 8 GPUs of 16.0 KiB', got {p.returncode}: {p.stderr}{p.stdout[-300:]}")
p = run([reshard, atomic, "-o", os.path.join(work, "refused"), "--gpus", "8", "--gpu-memory", "16K"])
if p.returncode != 1 or "no layout fits" not in p.stderr or os.path.exists(os.path.join(work, "refused", "latest")):
    problems.append(f"a reshard nothing fits: expected exit 1 and no output, got {p.returncode}: {p.stderr}")
print(f"1..64 GPUs: valid layouts chosen; the source's tp and pp kept for {kept} counts")

# 2. The estimate against the files of the layouts chosen.
big = os.path.join(work, "big")
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
p = run([sys.executable, os.path.join(root, "scripts", "make_fixture.py"), big, "--dp", "2", "--tp", "2", "--pp", "2",
         "--zero-stage", "1", "--dtype", "bf16", "--family", "llama", "--layers", "2", "--scale", "16"])
if p.returncode != 0:
    sys.exit(f"make_fixture failed: {p.stderr}")
big_atomic = os.path.join(work, "big_atomic")
p = run([convert, big, "-o", big_atomic, "-q"])
if p.returncode != 0:
    sys.exit(f"ucp-convert failed: {p.stderr}")
for fixed, label in ((["--tp", "2", "--pp", "2", "--zero-stage", "1"], "ZeRO-1 tp=2 pp=2"),
                     (["--tp", "1", "--zero-stage", "2", "--model", "plain"], "ZeRO-2 tp=1"),
                     (["--tp", "1", "--zero-stage", "3"], "ZeRO-3 tp=1")):
    p, j = plan(big_atomic, 8 if "pp" in " ".join(fixed) else 4, *fixed)
    if p.returncode != 0:
        problems.append(f"{label}: plan failed: {p.stderr}")
        continue
    c = j["chosen"]
    est = [x for x in j["candidates"] if x["layout"] == c][0]["memory_per_gpu"]
    out = os.path.join(work, "out")
    shutil.rmtree(out, ignore_errors=True)
    p = run([reshard, big_atomic, "-o", out, "-q", "--gpus", str(c["dp"] * c.get("sp", 1) * c["tp"] * c["pp"]), *fixed])
    if p.returncode != 0:
        problems.append(f"{label}: reshard failed: {p.stderr}")
        continue
    d = os.path.join(out, open(os.path.join(out, "latest")).read().strip())
    files = {f: os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)}
    optim = max(v for f, v in files.items() if f.endswith("optim_states.pt"))
    weights = {}  # tp rank, stage -> bytes: layer files by their spec index and TP rank, or plain model states
    if c["zero_stage"] == 3:
        weights = None  # ZeRO-3 weights live as flat fp16 partitions among the optimizer groups: not a file of their own
    elif c["pp"] > 1:
        bounds = json.loads(run([reshard, big_atomic, "--plan-only", "--json", "--dp", str(c["dp"]), "--tp", str(c["tp"]),
                                 "--pp", str(c["pp"]), "--zero-stage", str(c["zero_stage"])]).stdout)["stage_bounds"]
        for f, v in files.items():
            m = re.fullmatch(r"layer_(\d+)-model_(\d+)-model_states\.pt", f)
            if m:
                spec, t = int(m.group(1)), int(m.group(2))
                stage = max(s for s in range(c["pp"]) if bounds[s] <= spec)
                weights[(t, stage)] = weights.get((t, stage), 0) + v
    else:
        for f, v in files.items():
            m = re.fullmatch(r"mp_rank_(\d+)_model_states\.pt", f)
            if m:
                weights[(int(m.group(1)), 0)] = v
    checks = [("optimizer", est["optimizer"], optim)]
    if weights is not None:
        checks.append(("weights", est["weights"], max(weights.values())))
    for term, e, got in checks:
        off = abs(e - got) / got
        print(f"{label} ({c['dp']}x{c['tp']}x{c['pp']}): {term} estimated {e} bytes, largest file(s) per rank {got} bytes: {100 * off:.3f}% off")
        if off > 0.01:
            problems.append(f"{label}: the {term} estimate {e} is {100 * off:.2f}% off the files' {got} bytes")

for pr in problems:
    print("FAIL:", pr)
sys.exit(1 if problems else 0)
