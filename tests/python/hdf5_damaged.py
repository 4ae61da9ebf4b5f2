"""A damaged HDF5 store is refused, naming atoms.h5 (and the dataset where one is to blame):
ucp-inspect --verify exits 1, ucp-convert --from-atomic exits 1 and commits nothing. Cases: atoms.h5
truncated, a flipped byte inside one dataset's raw data (same size), atoms.h5 missing. atoms.h5 is
checked against the manifest's XXH64 before HDF5 opens it. Also the
command-line rules of --format hdf5: a killed run leaves nothing that looks complete, --resume is
refused, --force clears a killed run's temporaries.

  hdf5_damaged.py UCP_CONVERT UCP_INSPECT FIXTURE_DIR WORK_DIR
"""
import os
import shutil
import subprocess
import sys

import h5py

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from refusal import refusal_problems  # noqa: E402

convert, inspect, fixture, work = sys.argv[1:5]
problems = []
shutil.rmtree(work, ignore_errors=True)
good = os.path.join(work, "good")
p = subprocess.run([convert, fixture, "-o", good, "--format", "hdf5", "-q"], capture_output=True, text=True)
if p.returncode != 0:
    sys.exit(f"conversion failed: {p.stderr}")


def damaged(name, damage):
    d = os.path.join(work, name)
    shutil.copytree(good, d)
    damage(os.path.join(d, "atoms.h5"))
    return d


def expect_refusal(d, needles, what):
    for cmd, tool in (([inspect, d, "--verify"], "ucp-inspect --verify"),
                      ([convert, "--from-atomic", d, "-o", d + "-out", "--format", "pt", "-q"], "ucp-convert --from-atomic")):
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        print(f"--- {what}, {tool}: exit {p.returncode}\n{(p.stdout + p.stderr).strip()[-600:]}")
        problems.extend(f"{what}: {tool}: {x}" for x in refusal_problems(p, needles))
    if os.path.exists(os.path.join(d + "-out", "ucp_manifest.json")):
        problems.append(f"{what}: --from-atomic committed a manifest")


def truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


expect_refusal(damaged("truncated", truncate), ["atoms.h5"], "truncated atoms.h5")

# One flipped bit in the middle of the first chunk of the largest fp32 dataset.
with h5py.File(os.path.join(good, "atoms.h5"), "r") as f:
    name = max(f.keys(), key=lambda k: f[k]["fp32"].size)
    ds = f[name]["fp32"]
    info = ds.id.get_chunk_info(0) if ds.chunks else None
    offset = info.byte_offset + info.size // 2 if info else ds.id.get_offset() + ds.size * 2


def flip(path):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x10]))


# Caught by the file's checksum before HDF5 opens it (HDF5 trusts what it reads); the dataset-level
# check (each dataset's XXH64 through HDF5) is the conformance suite's.
expect_refusal(damaged("flipped", flip), ["atoms.h5: xxh64"], "a flipped byte in a dataset")
expect_refusal(damaged("missing", os.remove), ["atoms.h5"], "atoms.h5 missing")

# A run killed while writing atoms.h5 leaves no atoms.h5 and no manifest, only its temporary.
killed = os.path.join(work, "killed")
p = subprocess.run([convert, fixture, "-o", killed, "--format", "hdf5", "-q"], capture_output=True, text=True,
                   env=dict(os.environ, UCP_TEST_KILL_AT="h5-dataset:5"))
left = sorted(os.listdir(killed)) if os.path.exists(killed) else []
if p.returncode != -9 or "ucp_manifest.json" in left or "atoms.h5" in left or \
        not any(n.startswith("atoms.h5.tmp-") for n in left):
    problems.append(f"killed HDF5 run: exit {p.returncode}, left {left}")
p = subprocess.run([convert, fixture, "-o", killed, "--format", "hdf5", "--force", "-q"], capture_output=True, text=True)
left = sorted(os.listdir(killed))
if p.returncode != 0 or any(n.startswith("atoms.h5.tmp-") for n in left) or "ucp_manifest.json" not in left:
    problems.append(f"--force after a killed HDF5 run: exit {p.returncode}, left {left}")

# --resume is refused for hdf5; --force removes the temporaries a killed run leaves.
p = subprocess.run([convert, fixture, "-o", good, "--format", "hdf5", "--resume", "-q"], capture_output=True, text=True)
if p.returncode != 1 or "--resume is not supported with --format hdf5" not in p.stderr:
    problems.append(f"--resume with hdf5: exit {p.returncode}: {p.stderr.strip()}")
open(os.path.join(good, "atoms.h5.tmp-4242"), "w").write("left by a killed run")
p = subprocess.run([convert, fixture, "-o", good, "--format", "hdf5", "--force", "-q"], capture_output=True, text=True)
if p.returncode != 0 or os.path.exists(os.path.join(good, "atoms.h5.tmp-4242")):
    problems.append(f"--force over an HDF5 folder: exit {p.returncode}, temporary left: "
                    f"{os.path.exists(os.path.join(good, 'atoms.h5.tmp-4242'))}")
p = subprocess.run([inspect, good, "--verify"], capture_output=True, text=True)
if p.returncode != 0:
    problems.append(f"--force over an HDF5 folder: the result does not verify: {p.stdout[-400:]}")
# Without --force an existing output is refused, for --from-atomic too.
p = subprocess.run([convert, "--from-atomic", good, "-o", os.path.join(work, "truncated"), "-q"], capture_output=True, text=True)
if p.returncode != 1 or "use --force" not in p.stderr:
    problems.append(f"--from-atomic into a non-empty folder without --force: exit {p.returncode}: {p.stderr.strip()}")

for m in problems:
    print("FAIL", m)
print("OK" if not problems else f"{len(problems)} problems")
sys.exit(1 if problems else 0)
