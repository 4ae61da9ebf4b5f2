"""PyTorch Distributed Checkpoints ucp-convert must refuse by name (tests/data/real-dcp-refused/<case>/,
written by torch's own DCP writer: make_refused.py there), each with expect.txt: what the refusal names.

    dcp_refusals.py BIN_DIR CASES_DIR WORK [MPIEXEC]

For each case, at 1 and 2 ranks: ucp-convert exits 1 with every line of expect.txt in its error, no
traceback or abort, and leaves no manifest; ucp-inspect exits non-zero naming the same.
The weights-only cases, once refused here (no expect.txt; reference.pt: torch's own dcp.load of the folder):
at 1 and 2 ranks, a weights-only atomic checkpoint whose every weight is reference.pt's, widened to fp32.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklist import cases_holding, check, finish, fresh_folder, tool_runner  # noqa: E402

BIN, CASES, WORK = sys.argv[1:4]
MPIEXEC = sys.argv[4] if len(sys.argv) > 4 else None
run = tool_runner(BIN, MPIEXEC)


fresh_folder(WORK)
cases = cases_holding(CASES, "expect.txt")
check("refused cases found", len(cases) >= 2, str(cases))
for case in cases:
    ckpt = os.path.join(CASES, case, "checkpoint")
    expect = [line for line in open(os.path.join(CASES, case, "expect.txt")).read().splitlines() if line]
    for ranks in (1, 2):
        out = os.path.join(WORK, f"{case}-np{ranks}")
        r = run("ucp-convert", [ckpt, "-o", out], ranks)
        check(f"{case} np{ranks}: refused naming {expect}", r.returncode == 1 and all(e in r.stderr for e in expect) and
              "Traceback" not in r.stderr and "terminate called" not in r.stderr, f"rc {r.returncode}: {r.stderr[-800:]}")
        check(f"{case} np{ranks}: no manifest", not os.path.exists(os.path.join(out, "ucp_manifest.json")))
    r = run("ucp-inspect", [ckpt])
    check(f"{case}: inspect names it", r.returncode != 0 and all(e in r.stdout + r.stderr for e in expect), r.stdout[-600:] + r.stderr[-600:])
for case in ("weights_only", "megatron_core_weights_only"):
    ref = torch.load(os.path.join(CASES, case, "reference.pt"), map_location="cpu")
    for ranks in (1, 2):
        out = os.path.join(WORK, f"{case}-np{ranks}")
        r = run("ucp-convert", [os.path.join(CASES, case, "checkpoint"), "-o", out], ranks)
        check(f"{case} np{ranks}: converts as model weights only", r.returncode == 0 and "weights only" in r.stderr, r.stderr[-800:])
        if r.returncode != 0:
            continue
        zero = os.path.join(out, "zero")
        names = sorted(d for d in os.listdir(zero) if os.path.isdir(os.path.join(zero, d)))
        bad = []
        for n in names:
            v = torch.load(os.path.join(zero, n, "fp32.pt"), map_location="cpu")
            v = v["param"] if isinstance(v, dict) else v
            want = ref.get(n, ref.get("model." + n))
            if want is None or not torch.equal(v, want.float()) or os.path.exists(os.path.join(zero, n, "exp_avg.pt")):
                bad.append(n)
        check(f"{case} np{ranks}: every weight is torch's own reading, no optimizer state ({len(names)} of {len(ref)})",
              names and len(names) == len(ref) and not bad, str(bad[:5]))
finish("dcp_refusals")
