"""DeepSpeed's own universal folder (ds_to_universal.py's output) read as an atomic checkpoint, on one
real case (issue 29, finding 10):

    ds_universal.py UCP_BIN_DIR CASE_DIR UCP_ATOMIC WORK

- ucp-inspect --verify on the folder: exit 0, described as DeepSpeed's (no ucp manifest), every file's
  zip CRC-32s checked; each parameter's shape, pattern and split dimension as ucp's own conversion of
  the same source says (UCP_ATOMIC, whose files real_convert.py checks against DeepSpeed's);
- ucp-reshard from the folder to the source's layout and two others writes byte for byte what
  ucp-reshard writes from ucp's atomic checkpoint (whose output real_reshard.py checks against the
  files DeepSpeed itself wrote for those layouts); a model ucp-reshard refuses is refused alike;
- a flipped byte in one of its tensor files: ucp-reshard refuses naming the file, nothing written;
- nothing in the folder is written (it is DeepSpeed's).
"""
import filecmp
import json
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklist import check, finish  # noqa: E402
from damage import flip_in_record, tree_digest as digest  # noqa: E402

bindir, case_dir, ucp_atomic, work = sys.argv[1:5]
INSPECT, RESHARD = os.path.join(bindir, "ucp-inspect"), os.path.join(bindir, "ucp-reshard")
theirs = os.path.join(case_dir, "ckpt", "global_step6_universal")


shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
before = digest(theirs)
case = os.path.basename(os.path.normpath(case_dir))

p = subprocess.run([INSPECT, theirs, "--verify", "--json"], capture_output=True, text=True)
report = json.loads(p.stdout) if p.stdout.strip().startswith("{") else {}
check("inspect --verify: exit 0", p.returncode == 0, p.stderr[-400:])
check("inspect: DeepSpeed's universal folder", report.get("deepspeed_universal") is True)
check("inspect: every file checked", (report.get("verify") or {}).get("files_checked", 0) > 0)
manifest = json.load(open(os.path.join(ucp_atomic, "ucp_manifest.json")))
ours = {q["name"]: q for q in manifest["params"]}
seen = {q["name"]: q for q in report.get("params", [])}
check("inspect: the parameters of ucp's conversion", sorted(seen) == sorted(ours), f"{sorted(set(seen) ^ set(ours))[:4]}")
for name in sorted(set(seen) & set(ours)):
    a, b = seen[name], ours[name]
    same = all(a[k] == b[k] for k in ("shape", "pattern", "split_dim", "split_dim_known", "vocab"))
    if not same:
        check(f"inspect: {name}", False, str({k: (a[k], b[k]) for k in ("shape", "pattern", "split_dim", "split_dim_known", "vocab")}))
src = manifest["source"]
check("inspect: the source layout", all(report.get("source", {}).get(k) == src[k]
                                         for k in ("dp", "tp", "pp", "zero_stage", "dtype", "naming", "iteration", "tag")),
      str({k: (report.get("source", {}).get(k), src[k]) for k in ("dp", "tp", "pp", "zero_stage", "dtype", "naming", "tag")}))

layouts = [[src["dp"], src["tp"], src["pp"], src["zero_stage"] if src["zero_stage"] > 0 or src["dtype"] == "bf16" else 1],
           [2, 2, 1, 1], [1, 1, 2, 1], [2, 1, 1, 3]]
layouts = [x for i, x in enumerate(layouts) if x not in layouts[:i]]  # the source's own may be one of the others
for dp, tp, pp, z in layouts:
    flags = ["--dp", str(dp), "--tp", str(tp), "--pp", str(pp), "--zero-stage", str(z)]
    label = f"reshard dp={dp} tp={tp} pp={pp} ZeRO-{z}"
    outs = {}
    for name, atomic in (("from ucp's atomic", ucp_atomic), ("from DeepSpeed's universal", theirs)):
        out = os.path.join(work, re.sub(r"\W+", "_", label + name))
        r = subprocess.run([RESHARD, atomic, "-o", out, "-q"] + flags, capture_output=True, text=True)
        outs[name] = (r, out)
    (ra, a), (rb, b) = outs["from ucp's atomic"], outs["from DeepSpeed's universal"]
    if ra.returncode != 0:  # refused from ucp's atomic: refused alike, with the same reason
        why = lambda t: re.sub(r"^.*?: (parameter|target)", r"\1", t.strip().splitlines()[-1] if t.strip() else "")  # noqa: E731
        check(f"{label}: refused alike", rb.returncode == ra.returncode and why(ra.stderr) == why(rb.stderr),
              f"{ra.returncode} {ra.stderr.strip()[-200:]} | {rb.returncode} {rb.stderr.strip()[-200:]}")
        continue
    check(f"{label}: runs", rb.returncode == 0, rb.stderr[-400:])
    if rb.returncode == 0:
        tag = open(os.path.join(a, "latest")).read().strip()
        names = sorted(os.listdir(os.path.join(a, tag)))
        match, mismatch, errors = filecmp.cmpfiles(os.path.join(a, tag), os.path.join(b, tag), names, shallow=False)
        check(f"{label}: {len(names)} files byte for byte", not mismatch and not errors and
              sorted(os.listdir(os.path.join(b, tag))) == names, f"differ: {mismatch + errors}")

# A flipped byte in one of its tensor files (a copy): refused naming the file.
damaged = os.path.join(work, "damaged_universal")
shutil.copytree(theirs, damaged)
victim = next(os.path.join(damaged, "zero", n, "exp_avg.pt") for n in sorted(os.listdir(os.path.join(damaged, "zero")))
              if os.path.isdir(os.path.join(damaged, "zero", n)))
flip_in_record(victim)
out = os.path.join(work, "from_damaged")
r = subprocess.run([RESHARD, damaged, "-o", out, "-q", "--dp", "1", "--tp", "1", "--pp", "1", "--zero-stage", "1"],
                   capture_output=True, text=True)
check("damaged tensor file: refused naming it", r.returncode == 1 and victim in r.stderr and "CRC-32 mismatch" in r.stderr,
      r.stderr[-400:])
check("damaged tensor file: nothing written", not os.path.exists(os.path.join(out, "latest")))
check("DeepSpeed's folder is as it was", digest(theirs) == before)
finish(case)
