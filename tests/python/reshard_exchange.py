"""Redundancy-bypassing loading: pieces several target ranks need (TP-replicated parameters, the
tied embedding) are read once by one MPI rank and sent to the others. For each target, with 3 MPI
ranks: the report's bytes read equal the plan's and are 1.000x the atomic tensor bytes (each read
once), its bytes and files written are those of the folder, and the files are byte-identical to a
run with --share-buffer 0, where every unit reads its own pieces (read ratio above 1). The first
target exchanges in rounds of 4 KiB (pieces cut across rounds).

  reshard_exchange.py UCP_RESHARD ATOMIC_DIR WORK_DIR MPIEXEC
"""
import filecmp
import json
import os
import shutil
import subprocess
import sys

binary, atomic, work, mpiexec = sys.argv[1:5]
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
failures = 0
for layout in (["--dp", "2", "--tp", "2", "--pp", "2", "--zero-stage", "1", "--dtype", "bf16", "--buffer", "4K"],
               ["--dp", "3", "--tp", "2", "--pp", "1", "--zero-stage", "3", "--dtype", "fp16"],
               ["--dp", "1", "--tp", "1", "--pp", "2", "--zero-stage", "0", "--dtype", "bf16"]):
    name = "-".join(layout[1:10:2])
    runs = {}
    for share in ("256M", "0"):
        out = os.path.join(work, name, f"share{share}")
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run([mpiexec, "--oversubscribe", "-np", "3", binary, atomic, "-o", out, "-q", "--share-buffer", share,
                        "--report", out + ".json"] + layout, check=True, env=env)
        plan = json.loads(subprocess.run([mpiexec, "--oversubscribe", "-np", "3", binary, atomic, "--plan-only", "--json",
                                          "--share-buffer", share] + layout,
                                         check=True, capture_output=True, text=True, env=env).stdout)
        runs[share] = (out, json.load(open(out + ".json")), plan)
    (shared_out, rep, plan), (own_out, own_rep, _) = runs["256M"], runs["0"]
    tag = open(os.path.join(shared_out, "latest")).read().strip()
    names = sorted(os.listdir(os.path.join(own_out, tag)))
    _, mismatch, errors = filecmp.cmpfiles(os.path.join(own_out, tag), os.path.join(shared_out, tag), names, shallow=False)
    bad = []
    if mismatch or errors:
        bad.append(f"files differ from the --share-buffer 0 run: {mismatch + errors}")
    if abs(rep["read_ratio"] - 1.0) > 1e-9:
        bad.append(f"read {rep['read_ratio']:.4f}x the atomic bytes, not 1.000x")
    if sum(r["planned_bytes"] for r in rep["per_rank"]) != rep["bytes_read"] or rep["bytes_read"] != plan["bytes_read"]:
        bad.append("bytes read differ from the plan's")
    on_disk = sum(os.path.getsize(os.path.join(shared_out, tag, n)) for n in os.listdir(os.path.join(shared_out, tag)))
    if rep["bytes_written"] != on_disk or sum(r["files_written"] for r in rep["per_rank"]) != len(names):
        bad.append(f"report says {rep['bytes_written']} bytes written, the files hold {on_disk}")
    if not plan["shared"] or not any(len(s["ranks"]) > 1 for s in plan["shared"]):
        bad.append("no piece is shared across ranks: the exchange was not exercised")
    sent = sum(r["exchange_bytes_sent"] for r in rep["per_rank"])
    expected = sum(12 * s["elements"] * (len(s["ranks"]) - 1) for s in plan["shared"])
    if sent != expected:
        bad.append(f"{sent} bytes exchanged, the plan's pieces make {expected}")
    rounds = rep["per_rank"][0]["exchange_rounds"]
    if "4K" in layout and rounds < 2:
        bad.append(f"{rounds} exchange round(s) with --buffer 4K")
    print(f"{name}: {len(names)} files identical, read {rep['read_ratio']:.3f}x with the exchange "
          f"({len(plan['shared'])} shared pieces, {sent} bytes sent in {rounds} rounds), {own_rep['read_ratio']:.3f}x without: {'ok' if not bad else 'FAIL ' + '; '.join(bad)}")
    failures += bool(bad)
sys.exit(1 if failures else 0)
