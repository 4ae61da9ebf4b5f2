"""A conversion killed (SIGKILL) after some files are committed leaves no manifest and no file
under a final name that is incomplete; --resume then finishes it, skipping the files it verifies,
and the result equals the ground truth. Also: a non-empty output folder is refused without --force.

  convert_resume.py UCP_CONVERT FIXTURE_DIR WORK_DIR MPIEXEC
"""
import json
import os
import shutil
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import ds_stubs  # noqa: E402,F401

binary, fixture, work, mpiexec = sys.argv[1:5]
out = os.path.join(work, "resume-out")
shutil.rmtree(out, ignore_errors=True)
os.makedirs(work, exist_ok=True)
problems = []


def run(args, ranks=1, env=None):
    cmd = [binary, fixture, "-o", out, "-q"] + args
    if ranks > 1:
        cmd = [mpiexec, "--oversubscribe", "-np", str(ranks)] + cmd
    e = dict(os.environ, **(env or {}))
    return subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=600)


# 1. Killed (both ranks) when each has renamed its 5th file into place.
p = run([], ranks=2, env={"UCP_TEST_KILL_AT": "file-renamed:5"})
if p.returncode == 0:
    problems.append("the killed run exited 0")
if os.path.exists(os.path.join(out, "ucp_manifest.json")):
    problems.append("the killed run left a manifest")
complete = 0
for dirpath, _, names in os.walk(out):
    for n in names:
        path = os.path.join(dirpath, n)
        if n.endswith(".pt"):
            try:
                torch.load(path)
                complete += 1
            except Exception as e:  # noqa: BLE001
                problems.append(f"{path}: a final name holds an unreadable file: {e}")
print(f"killed run: exit {p.returncode}, {complete} complete .pt files left, no manifest: "
      f"{not os.path.exists(os.path.join(out, 'ucp_manifest.json'))}")
if complete == 0:
    problems.append("the kill came before any file was committed: nothing to resume")

# 2. Without --resume or --force the folder is refused.
p = run([])
if p.returncode != 1 or "--resume" not in p.stderr:
    problems.append(f"a non-empty output was not refused clearly (exit {p.returncode}): {p.stderr.strip()}")

# 3. --resume with a different rank count finishes it.
report = os.path.join(work, "resume-report.json")
p = run(["--resume", "--report", report], ranks=1)
if p.returncode != 0:
    problems.append(f"--resume exited {p.returncode}: {p.stderr.strip()}")
else:
    skipped = json.load(open(report))["resumed_items"]
    print(f"resume: {skipped} parameter states verified done and skipped")
    if skipped == 0:
        problems.append("--resume skipped nothing")
    check = os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_atomic.py")
    if subprocess.run([sys.executable, check, fixture, out]).returncode != 0:
        problems.append("the resumed output differs from the ground truth")
    if os.path.exists(os.path.join(out, ".ucp-journal")):
        problems.append("the journal was left behind")

# 4. A run killed while removing its journal (after its manifest): the journal folder is left
# without its run.json; --resume finishes the commit.
os.makedirs(os.path.join(out, ".ucp-journal"))
open(os.path.join(out, ".ucp-journal", "rank-0.jsonl"), "w").write("")
p = run(["--resume"])
if p.returncode != 0 or os.path.exists(os.path.join(out, ".ucp-journal")):
    problems.append(f"--resume after a kill during the journal's removal: exit {p.returncode}, journal left: "
                    f"{os.path.exists(os.path.join(out, '.ucp-journal'))}: {p.stderr.strip()}")
elif subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_atomic.py"),
                     fixture, out]).returncode != 0:
    problems.append("the output finished after a kill during the journal's removal differs from the ground truth")

# 5. --resume on a complete folder of the same source: nothing to do, said clearly, exit 0 (a job
# script that always passes --resume goes on: issue 29, finding 7).
p = run(["--resume"])
if p.returncode != 0:
    problems.append(f"--resume on a complete folder: exit {p.returncode}: {p.stderr.strip()}")

# 6. Split items (--split-above 4K: every state tensor over 4 KiB written in parts by the 3 ranks into
# its one file), killed when each rank has written its 3rd part: no file under a final name is a
# part-written one; --resume on 2 ranks redoes every unfinished item whole and equals the truth.
p = run(["--force", "--split-above", "4K"], ranks=3, env={"UCP_TEST_KILL_AT": "part-written:3"})
left = [os.path.join(d, n) for d, _, names in os.walk(out) for n in names if ".tmp-split" in n]
if p.returncode == 0 or os.path.exists(os.path.join(out, "ucp_manifest.json")) or not left:
    problems.append(f"split items killed: exit {p.returncode}, manifest {os.path.exists(os.path.join(out, 'ucp_manifest.json'))}, "
                    f"{len(left)} part-written files (the kill must come among the parts)")
for dirpath, _, names in os.walk(out):
    for n in names:
        if n.endswith(".pt"):
            try:
                torch.load(os.path.join(dirpath, n))
            except Exception as e:  # noqa: BLE001
                problems.append(f"{os.path.join(dirpath, n)}: a final name holds an unreadable file after the kill: {e}")
print(f"split items killed: exit {p.returncode}, {len(left)} part-written files under temporary names")
p = run(["--resume", "--split-above", "4K"], ranks=2)
left = [os.path.join(d, n) for d, _, names in os.walk(out) for n in names if ".tmp-" in n]
if p.returncode != 0 or left:
    problems.append(f"--resume of split items: exit {p.returncode}, temporaries left {left[:3]}: {p.stderr.strip()}")
elif subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_atomic.py"),
                     fixture, out]).returncode != 0:
    problems.append("the resumed split conversion differs from the ground truth")

for m in problems:
    print("FAIL", m)
sys.exit(1 if problems else 0)
