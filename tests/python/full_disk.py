#!/usr/bin/env python3
"""Full disk, read-only file system, permission denied: each refused cleanly.

usage: full_disk.py CONVERT RESHARD FIXTURE ATOMIC WORK MPIEXEC

The output goes to a tmpfs this test mounts (root only: without the right to mount it exits 77, which
ctest reports as skipped, with the reason printed):
- a disk that fills mid-run (half the bytes the run writes): ucp-convert to the .pt and HDF5 stores and
  ucp-reshard, on 1 and 2 ranks;
- a read-only file system, the output folder missing or already there;
- permission denied (the tool run as nobody through setpriv), the output folder missing or there.
Each must exit 1 with an error naming a file or folder under the output and the cause, leave no
temporary and no lock, and no manifest, latest or latest_universal; none may hang.
"""
import os
import shutil
import subprocess
import sys

convert, reshard, fixture, atomic, work, mpiexec = sys.argv[1:7]
problems = []
MARKERS = {"ucp_manifest.json", "latest", "latest_universal", "latest_checkpointed_iteration.txt"}


def sh(*cmd):
    return subprocess.run(list(cmd), capture_output=True, text=True)


def mount(path, size, options=""):
    os.makedirs(path, exist_ok=True)
    p = sh("mount", "-t", "tmpfs", "-o", f"size={size}" + ("," + options if options else ""), "tmpfs", path)
    return p.returncode == 0, p.stderr.strip()


def umount(path):
    sh("umount", "-l", path)


def command(tool, out, ranks, user=None):
    if tool == "reshard":
        cmd = [reshard, atomic, "-o", out, "-q", "--tp", "2", "--pp", "1", "--dp", "2", "--zero-stage", "1"]
    else:
        cmd = [convert, fixture, "-o", out, "-q"] + (["--format", "hdf5"] if tool == "convert-hdf5" else [])
    if ranks > 1:
        cmd = [mpiexec, "--oversubscribe", "-np", str(ranks)] + cmd
    if user:
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"] + cmd
    return cmd


def run(cmd):
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
        return proc.returncode, err
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.communicate()
        return None, "hung for 120 s"


def leftovers(root):
    bad = []
    for dirpath, _, names in os.walk(root):
        for n in names:
            if ".tmp-" in n or n.startswith(".ucp-lock") or n in MARKERS:
                bad.append(os.path.relpath(os.path.join(dirpath, n), root))
    return bad


def expect_failure(what, cmd, root, cause):
    code, err = run(cmd)
    last = err.strip().splitlines()[-1] if err.strip() else ""
    print(f"{what}: exit {code}: {last}")
    if code != 1:
        problems.append(f"{what}: exit {code} (expected 1): {err.strip()[-300:]}")
    if cause not in err or root not in err:
        problems.append(f"{what}: the error does not name a path under {root} and '{cause}': {err.strip()[-300:]}")
    left = leftovers(root)
    if left:
        problems.append(f"{what}: left {left[:5]}")


# Can this test mount?
probe = os.path.join(work, "probe")
ok, why = mount(probe, "1m")
if not ok:
    print(f"SKIP: cannot mount a tmpfs here ({why}); run as root to test full and read-only disks")
    sys.exit(77)
umount(probe)

# What each run writes: measured on an ordinary folder.
need = {}
for tool in ("convert-pt", "convert-hdf5", "reshard"):
    out = os.path.join(work, "sizes", tool, "out")
    shutil.rmtree(os.path.dirname(out), ignore_errors=True)
    code, err = run(command(tool, out, 1))
    if code != 0:
        sys.exit(f"{tool} into an ordinary folder failed: {err}")
    need[tool] = sum(os.path.getsize(os.path.join(d, n)) for d, _, ns in os.walk(os.path.dirname(out)) for n in ns)

# 1. A disk that fills mid-run.
full = os.path.join(work, "full")
for tool in ("convert-pt", "convert-hdf5", "reshard"):
    for ranks in (1, 2):
        ok, why = mount(full, str(max(64 * 1024, need[tool] // 2)))
        if not ok:
            problems.append(f"mount failed: {why}")
            continue
        try:
            expect_failure(f"{tool}, {ranks} rank(s), disk full", command(tool, os.path.join(full, "out"), ranks), full,
                           "No space left on device")
        finally:
            umount(full)

# 2. A read-only file system, the output folder missing or there.
ro = os.path.join(work, "ro")
for tool in ("convert-pt", "reshard"):
    for there in (False, True):
        ok, why = mount(ro, "16m")
        if not ok:
            problems.append(f"mount failed: {why}")
            continue
        try:
            if there:
                os.makedirs(os.path.join(ro, "out"))
            sh("mount", "-o", "remount,ro", ro)
            expect_failure(f"{tool}, read-only file system, output folder {'there' if there else 'missing'}",
                           command(tool, os.path.join(ro, "out"), 1), ro, "Read-only file system")
        finally:
            umount(ro)

# 3. Permission denied: the tool run as nobody, the output folder root's. The tool and the fixture
#    are copied to a world-readable folder of their own first: nobody may not reach the checkout.
import tempfile  # noqa: E402
shared = tempfile.mkdtemp(prefix="ucp-full-disk-")
try:
    os.chmod(shared, 0o755)
    tool = os.path.join(shared, "ucp-convert")
    shutil.copy2(convert, tool)
    src = os.path.join(shared, "fixture")
    shutil.copytree(fixture, src)
    for dirpath, dirs, names in os.walk(shared):
        for n in dirs:
            os.chmod(os.path.join(dirpath, n), 0o755)
        for n in names:
            os.chmod(os.path.join(dirpath, n), 0o755 if n == "ucp-convert" else 0o644)
    denied = os.path.join(shared, "denied")
    os.makedirs(denied)
    for there in (False, True):
        out = os.path.join(denied, "out")
        shutil.rmtree(out, ignore_errors=True)
        if there:
            os.makedirs(out)
        cmd = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", tool, src, "-o", out, "-q"]
        expect_failure(f"convert-pt as nobody, output folder {'there' if there else 'missing'}", cmd, denied,
                       "Permission denied")
finally:
    shutil.rmtree(shared, ignore_errors=True)

for p in problems:
    print("PROBLEM:", p)
sys.exit(1 if problems else 0)
