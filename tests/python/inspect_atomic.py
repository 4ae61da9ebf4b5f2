"""ucp-inspect on an atomic checkpoint: --verify passes on what ucp-convert wrote, then catches a
flipped byte (same size), a missing file and a stray file, naming each; exit 1.

  inspect_atomic.py UCP_INSPECT ATOMIC_DIR WORK_DIR
"""
import os
import shutil
import subprocess
import sys

binary, atomic, work = sys.argv[1:4]
problems = []
p = subprocess.run([binary, atomic, "--verify"], capture_output=True, text=True)
if p.returncode != 0 or "all files match" not in p.stdout:
    problems.append(f"clean checkpoint: exit {p.returncode}\n{p.stdout}{p.stderr}")
d = os.path.join(work, "tampered")
shutil.rmtree(d, ignore_errors=True)
shutil.copytree(atomic, d)
victims = sorted(os.path.join(dp, n) for dp, _, ns in os.walk(os.path.join(d, "zero")) for n in ns if n == "fp32.pt")
flip = victims[0]
data = bytearray(open(flip, "rb").read())
data[len(data) // 2] ^= 0x01
open(flip, "wb").write(data)
os.remove(victims[1])
open(os.path.join(d, "zero", "stray.pt"), "w").write("x")
p = subprocess.run([binary, d, "--verify"], capture_output=True, text=True)
text = p.stdout + p.stderr
print(text[-1500:])
if p.returncode != 1:
    problems.append(f"tampered checkpoint: exit {p.returncode}, expected 1")
for needle in (os.path.relpath(flip, d) + ": xxh64", os.path.relpath(victims[1], d) + ": missing",
               "zero/stray.pt: not listed"):
    if needle not in text:
        problems.append(f"tampered checkpoint: no '{needle}' in the report")
for m in problems:
    print("FAIL", m)
sys.exit(1 if problems else 0)
