"""Converts a fixture with ucp-convert (a single process, or N MPI ranks) and checks the atomic
checkpoint against the fixture's ground truth with check_atomic.py. With --buffer among the extra
flags, the run's report must show no rank with more bytes in flight in a round than the buffer, and
the most any had exactly what `--plan-only --ranks RANKS --json` said it would be.

  convert_case.py UCP_CONVERT FIXTURE_DIR OUT_DIR RANKS [MPIEXEC] [-- extra ucp-convert flags]
"""
import json
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
report = out.rstrip("/") + ".report.json"
p = subprocess.run(cmd + ["--report", report], timeout=600)
if p.returncode != 0:
    sys.exit(f"ucp-convert exited {p.returncode}")
if "--buffer" in extra:
    text = extra[extra.index("--buffer") + 1]
    buffer = int(text.rstrip("KMG")) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1)
    most = max(r["max_round_bytes"] for r in json.load(open(report))["per_rank"])
    plan = json.loads(subprocess.run([binary, fixture, "--plan-only", "--json", "--ranks", str(ranks)] + extra,
                                     capture_output=True, text=True, check=True).stdout)
    print(f"rounds: {plan['rounds']}, at most {most} bytes in flight per rank (--buffer {buffer}; "
          f"the plan said {plan.get('in_flight_bytes')})")
    if most > buffer or most != plan.get("in_flight_bytes"):
        sys.exit("the rounds broke the buffer's bound, or the plan's count of them")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_zygote import python_command  # noqa: E402
check = os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_atomic.py")
sys.exit(subprocess.run(python_command(check, fixture, out)).returncode)
