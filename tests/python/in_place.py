#!/usr/bin/env python3
"""ucp-reshard --in-place: the lazy reconfiguration step, end to end on a native fixture checkpoint.

usage: in_place.py UCP_RESHARD SOURCE_ROOT WORK

SOURCE_ROOT is a generator checkpoint root (dp=2 tp=2 pp=2 ZeRO-1 bf16, with `latest`); each case runs
on a copy of it.
1. No-op: the layout `latest` already has (given as degrees, as --gpus 8, and with the source's
   --grad-accum-dtype fp32): exit 0, "nothing to do", not a byte nor a time stamp of the root
   changed, under 0.5 s. The same degrees with --grad-accum-dtype bf16 (ZeRO's optimizer, not the
   BF16 optimizer the files hold) are another checkpoint: resharded.
2. Native to dp=4 tp=1 pp=1 ZeRO-2: converted into ROOT/global_step12_universal (latest_universal names
   it), resharded into ROOT/global_step12_dp4_tp1_pp1_z2_bf16, `latest` names it; its files are
   byte-identical to a plain `ucp-reshard ATOMIC -o OUT` of the same layout (which the reshard matrix
   checks against the generator), the original tag is untouched, and the same command again is a no-op.
3. Reuse: from that tag to another layout the atomic checkpoint is reused (not rewritten); --keep 1
   leaves one tag written in place; --dtype fp16 names its tag so; an atomic checkpoint whose
   fingerprint does not match the tag's files is converted again.
4. Kill -9 at 20 or more fault points of the in-place run (lib/core/fault_point.h; spread over the
   run, plus every point at a marker, `latest`, the lock and the sync) and 3 times from outside at
   random: after each, `latest` names a complete checkpoint, the original (its files unchanged) or
   the new one (its files those of the uninterrupted run); the same command then finishes the job.
"""
import json
import os
import random
import shutil
import kill_support
import subprocess
import sys
import time

reshard, source, work = sys.argv[1:4]
ENV = kill_support.clean_env()
TARGET = ["--dp", "4", "--tp", "1", "--pp", "1", "--zero-stage", "2"]
NEW = "global_step12_dp4_tp1_pp1_z2_bf16"
problems = []
rng = random.Random("in-place")


def fresh(name):
    root = os.path.join(work, name)
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(source, root)
    return root


def run(root, args, env=None):
    return subprocess.run([reshard, root, "--in-place", *args], capture_output=True, text=True, env=env or ENV,
                          timeout=300, start_new_session=True)


def tree(d, stat=False):
    out = {}
    for dirpath, _, names in os.walk(d):
        for n in names:
            p = os.path.join(dirpath, n)
            rel = os.path.relpath(p, d)
            out[rel] = os.stat(p).st_mtime_ns if stat else open(p, "rb").read()
    return out


def latest(root):
    return open(os.path.join(root, "latest")).read().strip()


shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
tag = latest(source)
pristine = tree(os.path.join(source, tag))

# 1. No-op.
root = fresh("noop")
before = (tree(root), tree(root, stat=True), os.stat(root).st_mtime_ns)
same = ["--dp", "2", "--tp", "2", "--pp", "2", "--zero-stage", "1"]
for args in (same, ["--gpus", "8"], same + ["--grad-accum-dtype", "fp32"]):
    t0 = time.monotonic()
    p = run(root, args)
    wall = time.monotonic() - t0
    if p.returncode != 0 or "nothing to do" not in p.stderr:
        problems.append(f"no-op {args}: exit {p.returncode}: {p.stderr}")
    if (tree(root), tree(root, stat=True), os.stat(root).st_mtime_ns) != before:
        problems.append(f"no-op {args}: the root changed")
    if wall > 0.5:
        problems.append(f"no-op {args}: {wall:.2f} s, over 0.5 s")
    print(f"no-op ({' '.join(args)}): {wall:.3f} s, nothing written")

# The same degrees with bf16 gradient accumulation: ZeRO's optimizer instead of the BF16 optimizer
# the source's files hold, so another checkpoint, not a no-op.
root = fresh("accum")
p = run(root, same + ["--grad-accum-dtype", "bf16"])
if p.returncode != 0 or latest(root) != "global_step12_dp2_tp2_pp2_z1_bf16":
    problems.append(f"--grad-accum-dtype bf16: exit {p.returncode}, latest {latest(root)}: {p.stderr}")
print(f"same degrees, --grad-accum-dtype bf16: resharded into {latest(root)}")

# 2. Native -> converted -> resharded; the reference for the kills, with its fault points logged.
root = fresh("ref")
log = os.path.join(work, "points.log")
t0 = time.monotonic()
p = run(root, TARGET, env=dict(ENV, UCP_TEST_FAULT_LOG=log))
wall = time.monotonic() - t0
if p.returncode != 0:
    sys.exit(f"in-place run failed ({p.returncode}): {p.stderr}")
for want in ("converting it into", "now names " + NEW):
    if want not in p.stderr:
        problems.append(f"in-place run: no '{want}' in: {p.stderr}")
if latest(root) != NEW or open(os.path.join(root, "latest_universal")).read().strip() != tag + "_universal":
    problems.append(f"in-place run: latest is {latest(root)!r}")
ref_new = tree(os.path.join(root, NEW))
if tree(os.path.join(root, tag)) != pristine:
    problems.append("in-place run: the original tag changed")
direct = os.path.join(work, "direct")
p = subprocess.run([reshard, os.path.join(root, tag + "_universal"), "-o", direct, "-q", *TARGET], capture_output=True,
                   text=True, env=ENV)
if p.returncode != 0:
    sys.exit(f"direct reshard failed: {p.stderr}")
want = tree(os.path.join(direct, tag))
got = {k: v for k, v in ref_new.items() if k != "ucp_reshard.json"}
if got != want:
    problems.append(f"in-place files differ from a direct reshard's: {sorted(set(got) ^ set(want))[:3]} "
                    f"{[k for k in got if k in want and got[k] != want[k]][:3]}")
marker = json.loads(ref_new["ucp_reshard.json"])
if marker["source_tag"] != tag or marker["atomic"] != tag + "_universal" or marker["layout"]["dp"] != 4:
    problems.append(f"marker: {marker}")
p = run(root, TARGET)
if p.returncode != 0 or "nothing to do" not in p.stderr:
    problems.append(f"the same command again: exit {p.returncode}: {p.stderr}")
print(f"native to dp=4 tp=1 pp=1 ZeRO-2: {wall:.2f} s; files as a direct reshard's ({len(want)}); again: nothing to do")

# 3. Reuse, --keep, --dtype, a stale atomic checkpoint.
manifest = os.path.join(root, tag + "_universal", "ucp_manifest.json")
stamp = os.stat(manifest).st_mtime_ns
p = run(root, ["--dp", "2", "--tp", "1", "--pp", "2", "--zero-stage", "1", "--keep", "1"])
if p.returncode != 0 or "reusing the atomic checkpoint" not in p.stderr or os.stat(manifest).st_mtime_ns != stamp:
    problems.append(f"reuse: exit {p.returncode}: {p.stderr}")
kept = sorted(d for d in os.listdir(root) if os.path.exists(os.path.join(root, d, "ucp_reshard.json")))
if kept != ["global_step12_dp2_tp1_pp2_z1_bf16_gafp32"] or latest(root) != kept[0] or not os.path.isdir(os.path.join(root, tag)):
    problems.append(f"--keep 1: tags written in place {kept}, latest {latest(root)}")
p = run(root, ["--dp", "2", "--tp", "1", "--pp", "2", "--zero-stage", "1", "--dtype", "fp16"])
if p.returncode != 0 or latest(root) != "global_step12_dp2_tp1_pp2_z1_fp16":
    problems.append(f"--dtype fp16: exit {p.returncode}, latest {latest(root)}: {p.stderr}")
stale = fresh("stale")
shutil.copytree(os.path.join(root, tag + "_universal"), os.path.join(stale, tag + "_universal"))
m = json.load(open(os.path.join(stale, tag + "_universal", "ucp_manifest.json")))
m["source"]["fingerprint"] = "0123456789abcdef"
json.dump(m, open(os.path.join(stale, tag + "_universal", "ucp_manifest.json"), "w"))
p = run(stale, TARGET, env=ENV)
if p.returncode != 0 or "converting it into" not in p.stderr or tree(os.path.join(stale, NEW)) != ref_new:
    problems.append(f"stale atomic checkpoint: exit {p.returncode}: {p.stderr}")
print("reuse, --keep 1, --dtype fp16, stale atomic checkpoint: checked")

# 4. Kills.
points = kill_support.read_points(log)
special = kill_support.special(points, {"latest", "latest_universal", "ucp_manifest.json", "ucp_reshard.json", ".ucp-lock"})
tried = survived = 0


def check(root, what):
    now = latest(root)
    if now == tag:
        if tree(os.path.join(root, tag)) != pristine:
            problems.append(f"{what}: latest names {tag}, whose files changed")
    elif now == NEW:
        if tree(os.path.join(root, NEW)) != ref_new:
            problems.append(f"{what}: latest names {NEW}, whose files are not the uninterrupted run's")
    else:
        problems.append(f"{what}: latest names {now!r}")


def finish(root, what):
    p = run(root, TARGET)
    if p.returncode != 0 or latest(root) != NEW or tree(os.path.join(root, NEW)) != ref_new:
        problems.append(f"{what}: the rerun: exit {p.returncode}, latest {latest(root)}: {p.stderr[-300:]}")
    p = run(root, TARGET)
    if p.returncode != 0 or "nothing to do" not in p.stderr:
        problems.append(f"{what}: a second rerun did something: {p.stderr[-300:]}")


for k, (rank, name, n, _) in enumerate(kill_support.spread(points, 20, rng) + special):
    root = fresh("kill")
    what = f"kill {k} at {name}:{n}"
    before = len(problems)
    run(root, TARGET, env=dict(ENV, UCP_TEST_KILL_AT=f"{name}:{n}"))
    check(root, what)
    finish(root, what)
    tried += 1
    survived += len(problems) == before
for k in range(3):
    root = fresh("kill")
    kill_support.kill_after([reshard, root, "--in-place", *TARGET], ENV, rng.random() * wall)
    what = f"outside kill {k}"
    before = len(problems)
    check(root, what)
    finish(root, what)
    tried += 1
    survived += len(problems) == before
print(f"kills: {tried} tried ({len(special)} at markers, latest, the lock or the sync), {survived} survived")
if tried < 23:
    problems.append(f"only {tried} kills")
for pr in problems[:30]:
    print("FAIL:", pr)
sys.exit(1 if problems else 0)
