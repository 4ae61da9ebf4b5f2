"""Converts a fixture with ucp-convert (a single process, or N MPI ranks) and checks the atomic
checkpoint against the fixture's ground truth with check_atomic.py.

  convert_case.py UCP_CONVERT FIXTURE_DIR OUT_DIR RANKS [MPIEXEC] [-- extra ucp-convert flags]
"""
import os
import subprocess
import sys

argv = sys.argv[1:]
extra = []
if "--" in argv:
    extra = argv[argv.index("--") + 1:]
    argv = argv[:argv.index("--")]
binary, fixture, out, ranks = argv[0], argv[1], argv[2], int(argv[3])
mpiexec = argv[4] if len(argv) > 4 else None
cmd = [binary, fixture, "-o", out, "--force", "-q"] + extra
if ranks > 1:
    cmd = [mpiexec, "--oversubscribe", "-np", str(ranks)] + cmd
print(" ".join(cmd), flush=True)
p = subprocess.run(cmd, timeout=600)
if p.returncode != 0:
    sys.exit(f"ucp-convert exited {p.returncode}")
check = os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_atomic.py")
sys.exit(subprocess.run([sys.executable, check, fixture, out]).returncode)
