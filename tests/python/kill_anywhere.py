#!/usr/bin/env python3
"""Kill anywhere: SIGKILL a tool at many points of its run, then rerun it; nothing may ever look complete
while it is not, and the rerun must end byte-identical to an uninterrupted run.

usage: kill_anywhere.py MODE TOOL SOURCE WORK RANKS MPIEXEC [TOOL ARGS...]
  MODE  convert-pt | convert-hdf5 | reshard (any target format: --format hf among the TOOL ARGS)

1. A reference run into WORK/ref logs every fault point each rank passes (UCP_TEST_FAULT_LOG; the
   points are listed in lib/core/fault_point.h).
2. From that log, 50 kills or more (24 with 2 ranks): spread evenly over the run with a seeded jitter, plus every point of
   the files that mark an output complete (manifest, latest, latest_universal, the iteration file), the
   lock and the batch sync. With 2 ranks, each kill takes rank 0 alone, rank 1 alone, or both.
3. After each kill: every file under its final name is byte-identical to the reference's file of that
   name, and no marker exists before everything it stands for.
4. Then the rerun (--resume for the .pt convert while there is something to resume; for ucp-reshard the same
   command while no marker is there, a killed run's leftovers being its to replace; else --force);
   every fifth rerun is itself killed at a random point first. 5 more kills come from outside (SIGKILL
   to the whole process group at a random time). After each final rerun the output tree equals the
   reference's, file for file, byte for byte.
"""
import os
import random
import shutil
import kill_support
import subprocess
import sys
import time

mode, tool, source, work, ranks, mpiexec = sys.argv[1:7]
tool_args = sys.argv[7:]
ranks = int(ranks)
rng = random.Random(f"kill-anywhere {mode} {ranks}")
problems = []
ENV = kill_support.clean_env()
# The files that mark an output complete, in the order the tools write them: each stands for every
# file of the output but the markers written after it.
ORDER = ["latest_checkpointed_iteration.txt", "ucp_manifest.json", "latest_universal", "latest",
         "model.safetensors.index.json"]  # the last: a Hugging Face export's (ucp-reshard --format hf)
MARKERS = set(ORDER)


def out_dir(base):
    # The tools write latest_universal beside the atomic folder: each run gets a parent of its own.
    return os.path.join(base, "universal" if mode.startswith("convert") else "target")


def command(base, extra=()):
    cmd = [tool, source, "-o", out_dir(base), "-q"] + list(tool_args) + list(extra)
    if mode == "convert-hdf5":
        cmd += ["--format", "hdf5"]
    if ranks > 1:
        cmd = [mpiexec, "--oversubscribe", "-np", str(ranks)] + cmd
    return cmd


def run(base, extra=(), env=None, timeout=300):
    return subprocess.run(command(base, extra), capture_output=True, text=True, env=env or ENV, timeout=timeout,
                          start_new_session=True)


def tree(base):
    """relative path -> bytes, of every file under base (the lock's and temporaries' names marked)."""
    files = {}
    for dirpath, _, names in os.walk(base):
        for n in names:
            p = os.path.join(dirpath, n)
            with open(p, "rb") as f:
                files[os.path.relpath(p, base)] = f.read()
    return files


def transient(rel):
    """What a killed run may leave that marks itself unfinished: temporaries, its lock, its journal."""
    name = os.path.basename(rel)
    return ".tmp-" in name or name.startswith(".ucp-lock") or ".ucp-journal" in rel.split(os.sep)


def check_after_kill(base, ref, what):
    got = tree(base)
    for rel, data in got.items():
        if transient(rel):
            continue
        if rel not in ref:
            problems.append(f"{what}: {rel} is not a file of the uninterrupted run")
        elif ref[rel] != data:
            problems.append(f"{what}: {rel} is under its final name but differs from the uninterrupted run's")
    for rel in got:
        if os.path.basename(rel) in MARKERS:
            later = set(ORDER[ORDER.index(os.path.basename(rel)) + 1:])
            missing = [r for r in ref if r not in got and os.path.basename(r) not in later]
            if missing:
                problems.append(f"{what}: {rel} exists while {len(missing)} files are missing, e.g. {missing[0]}")
    return got


def rerun_args(base):
    """The flags of the rerun after a kill: none when no output folder was made yet."""
    if not os.path.exists(out_dir(base)):
        return []
    out = out_dir(base)
    if mode == "reshard":  # a run killed before its first marker is the next run's to replace: the same command
        return ["--force"] if any(os.path.exists(os.path.join(out, m)) for m in MARKERS) else []
    if mode != "convert-pt":
        return ["--force"]
    complete = os.path.exists(os.path.join(out, "ucp_manifest.json")) and \
        not os.path.exists(os.path.join(out, ".ucp-journal"))
    return ["--force"] if complete else ["--resume"]


def finish(base, ref, what):
    extra = rerun_args(base)
    p = run(base, extra)
    if p.returncode != 0:
        problems.append(f"{what}: the rerun ({' '.join(extra) or 'no flag'}) exited {p.returncode}: {p.stderr.strip()[-400:]}")
        return
    got = tree(base)
    if got.keys() != ref.keys():
        problems.append(f"{what}: after the rerun, files {sorted(set(got) ^ set(ref))[:4]} differ in presence")
    for rel in ref:
        if rel in got and got[rel] != ref[rel]:
            problems.append(f"{what}: after the rerun, {rel} differs from the uninterrupted run's")


# 1. The reference, with every point logged.
ref_base = os.path.join(work, "ref")
shutil.rmtree(work, ignore_errors=True)
os.makedirs(ref_base)
log = os.path.join(work, "points.log")
t0 = time.monotonic()
p = run(ref_base, env=dict(ENV, UCP_TEST_FAULT_LOG=log))
wall = time.monotonic() - t0
if p.returncode != 0:
    sys.exit(f"the reference run failed ({p.returncode}): {p.stderr}")
ref = tree(ref_base)
points = kill_support.read_points(log)
print(f"reference: {len(ref)} files, {len(points)} fault points passed, {wall:.2f}s")

# 2. The kills.
special = kill_support.special(points, MARKERS | {".ucp-lock"})
kills = []
# 50 spread kills with one rank; with two, 24: each kill there costs two mpirun start-ups, and what two
# ranks add (one rank dying alone, the other with the job) needs fewer points than the single run's
# coverage of every write path (CI's time budget: these were its four longest tests).
# The HDF5 store's conversion is the .pt store's but for its writer and commit (whose points `special`
# holds whole): half as many spread kills there.
spread_kills = (50 if ranks == 1 else 24) // (2 if mode == "convert-hdf5" else 1)
for pt in kill_support.spread(points, spread_kills, rng) + special:
    rank, name, n, _ = pt
    if ranks == 1:
        kills.append((name, n, None))
    else:
        # The rank that passed the point alone (the other dies with the job), or every rank at its own
        # Nth passing of that point.
        kills.append((name, n, rng.choice([rank, None])))

tried = survived = 0
for k, (name, n, only) in enumerate(kills):
    base = os.path.join(work, f"k{k}")
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    env = dict(ENV, UCP_TEST_KILL_AT=f"{name}:{n}")
    if only is not None:
        env["UCP_TEST_KILL_RANK"] = only
    what = f"kill {k} at {name}:{n} (rank {only if only is not None else 'all'})"
    p = run(base, env=env)
    tried += 1
    before = len(problems)
    check_after_kill(base, ref, what)
    if k % 5 == 4 and os.path.exists(out_dir(base)):  # the rerun itself killed at a random point first
        rank, name2, n2, _ = rng.choice(points)
        env2 = dict(ENV, UCP_TEST_KILL_AT=f"{name2}:{n2}")
        if ranks > 1:
            env2["UCP_TEST_KILL_RANK"] = rank
        subprocess.run(command(base, rerun_args(base)), capture_output=True, env=env2, timeout=300, start_new_session=True)
        check_after_kill(base, ref, what + f", its rerun killed at {name2}:{n2}")
    finish(base, ref, what)
    if len(problems) == before:
        survived += 1
        shutil.rmtree(base, ignore_errors=True)

# 3. Kills from outside, at random times.
for k in range(5):
    base = os.path.join(work, f"x{k}")
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    kill_support.kill_after(command(base), ENV, rng.random() * wall)
    what = f"outside kill {k}"
    tried += 1
    before = len(problems)
    check_after_kill(base, ref, what)
    finish(base, ref, what)
    if len(problems) == before:
        survived += 1
        shutil.rmtree(base, ignore_errors=True)

print(f"{mode}, {ranks} rank(s): {tried} kills tried, {survived} survived "
      f"({len(special)} at marker, lock and sync points)")
for pr in problems[:30]:
    print("PROBLEM:", pr)
sys.exit(1 if problems else 0)
