"""Checkpoints of the paper's scale, planned without their data: scripts/make_sparse_fixture.py writes
them with real zip and pickle headers and tensor data as holes; the generator knows every parameter's
full shape and every file's size, which is what the checks compare with.

    sparse_scale.py BIN_DIR WORK SCHEMA_DIR [MPIEXEC]

- A small shape (tp=2 pp=2 dp=2) reads and converts for real: ucp-inspect --verify checks every
  record's CRC-32 (of holes: zero bytes), ucp-convert on 2 ranks writes every parameter's fp32,
  exp_avg and exp_avg_sq in its full (unpadded) shape, all zero.
- BLOOM-176B as the paper ran it (tp=4 pp=12 dp=8, 2.5 TB apparent): the folder takes under 100 MB
  of disk; `ucp-convert --plan-only --ranks N --json` at 48 and 384 ranks validates against its
  schema, reads every tensor record of the optimizer files once (bytes in = their sizes, from the zip
  central directories; the 4-byte step scalars aside), with the files cut between ranks, at most
  10% above an even share per rank at 384, writes 12 bytes per parameter (fp32 and two moments),
  carries the model-states files, keeps every round within the shuffle buffer, and says its balance
  (max / mean bytes written per rank), printed here.
"""
import json
import math
import os
import shutil
import subprocess
import sys
import zipfile

import jsonschema
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklist import check, finish, tool_runner  # noqa: E402

BIN, WORK, SCHEMAS = sys.argv[1:4]
run = tool_runner(BIN, sys.argv[4] if len(sys.argv) > 4 else None)
GENERATOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "make_sparse_fixture.py")
shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)


def generate(name, *args):
    out = os.path.join(WORK, name)
    subprocess.run([sys.executable, GENERATOR, out, *args], check=True)
    return out, json.load(open(os.path.join(out, "fixture.json")))


# 1. A small shape, converted for real.
small, fx = generate("small", "--layers", "4", "--hidden", "256", "--heads", "8", "--vocab", "1000",
                     "--tp", "2", "--pp", "2", "--dp", "2")
r = run("ucp-inspect", ["--verify", "--json", small])
check("small: ucp-inspect --verify reads every record, CRC-32s as recorded", r.returncode == 0, r.stdout[-2000:] + r.stderr)
if r.returncode == 0:
    rep = json.loads(r.stdout)
    shapes = {p["name"]: p["shape"] for p in rep["params"]}
    check("small: inspect finds the generator's parameters and shapes",
          shapes == {n: p["shape"] for n, p in fx["params"].items()}, f"{shapes}")
atomic = os.path.join(WORK, "small-atomic")
r = run("ucp-convert", [small, "-o", atomic, "-q"], ranks=2)
check("small: ucp-convert on 2 ranks", r.returncode == 0, r.stderr)
if r.returncode == 0:
    wrong = []
    for name, p in fx["params"].items():
        for state in ("fp32", "exp_avg", "exp_avg_sq"):
            t = torch.load(os.path.join(atomic, "zero", name, state + ".pt"))["param"]
            if list(t.shape) != p["shape"] or t.dtype != torch.float32 or t.count_nonzero().item() != 0:
                wrong.append(f"{name}/{state}: {t.dtype} {list(t.shape)}")
    check(f"small: {len(fx['params'])} parameters x 3 states in full shape, all zero", not wrong, "; ".join(wrong[:5]))

# 2. BLOOM-176B, planned.
bloom, fx = generate("bloom", "--model", "bloom-176b")
ckpt = os.path.join(bloom, fx["tag"])
apparent = sum(fx["files"].values())
disk = sum(os.stat(os.path.join(ckpt, n)).st_blocks * 512 for n in fx["files"])
check(f"bloom: {apparent / 1e12:.2f} TB apparent in {disk / 2**20:.1f} MiB of disk", apparent > 2e12 and disk < 100 << 20)
numel = sum(math.prod(p["shape"]) for p in fx["params"].values())
records = 0  # the optimizer files' tensor records, step scalars aside
for name in fx["files"]:
    if "optim_states" in name:
        with zipfile.ZipFile(os.path.join(ckpt, name)) as z:
            records += sum(i.file_size for i in z.infolist() if "/data/" in i.filename and i.file_size > 8)
model_states = sum(v for k, v in fx["files"].items() if k.startswith("mp_rank_"))
validator = jsonschema.Draft202012Validator(json.load(open(os.path.join(SCHEMAS, "convert-plan.schema.json"))))
for ranks in (48, 384):
    r = run("ucp-convert", [bloom, "--plan-only", "--json", "--ranks", str(ranks)])
    check(f"bloom, {ranks} ranks: --plan-only", r.returncode == 0, r.stderr)
    if r.returncode != 0:
        continue
    plan = json.loads(r.stdout)
    errors = [e.message for e in validator.iter_errors(plan)]
    check(f"bloom, {ranks} ranks: the plan validates against convert-plan.schema.json", not errors, "; ".join(errors[:3]))
    per = plan["per_rank"]
    check(f"bloom, {ranks} ranks: bytes in = the optimizer files' tensor records, {records}",
          plan["bytes_in"] == records == sum(p["bytes_in"] for p in per), f"{plan['bytes_in']}")
    check(f"bloom, {ranks} ranks: files cut between ranks, {plan['shared_records']} records read in ranges; "
          f"max / mean bytes read per rank {plan['read_imbalance']:.3f} <= 1.10", plan["shared_records"] > 0 and plan["read_imbalance"] <= 1.10)
    check(f"bloom, {ranks} ranks: bytes out = 12 x {numel} parameters", plan["bytes_out"] == 12 * numel == sum(p["bytes_out"] for p in per),
          f"{plan['bytes_out']}")
    check(f"bloom, {ranks} ranks: the model-states files carried", sum(p["bytes_carried"] for p in per) == model_states)
    check(f"bloom, {ranks} ranks: {plan['rounds']} rounds, {plan.get('in_flight_bytes')} bytes in flight at most "
          f"(--buffer {plan['buffer_bytes']})", 0 < plan.get("in_flight_bytes", -1) <= plan["buffer_bytes"])
    written = [p["bytes_out"] + p["bytes_carried"] for p in per]
    print(f"bloom, {ranks} ranks: max / mean bytes written per rank {plan['imbalance']:.3f} "
          f"(max {max(written) / 1e9:.1f} GB, mean {sum(written) / len(written) / 1e9:.1f} GB; largest item "
          f"{4 * max(math.prod(p['shape']) for p in fx['params'].values()) / 1e9:.1f} GB)")
finish("sparse_scale")
