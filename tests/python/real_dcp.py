"""PyTorch Distributed Checkpoints written by torch's own DCP writer (../shared/real-dcp), against
torch's own reader: `reference.pt` is what torch.distributed.checkpoint.format_utils.dcp_to_torch_save
made of the same folder, the full unsharded state dict.

    real_dcp.py UCP_BIN_DIR CASES_DIR WORK [mpiexec]

For every case, at 1 and 2 MPI ranks:
- every atomic tensor (fp32 weights, exp_avg, exp_avg_sq, step) equals reference.pt's byte for byte,
  every parameter of reference.pt is there, and nothing else;
- zero/optimizer_state.pt holds reference.pt's param_groups (options in the saved order, the names);
- ucp-inspect (text and --json) names the format and how the tensors are cut.
Then, where the folder holds the fsdp2_dp2 case, damaged copies: a flipped byte inside a chunk's tensor
data is refused naming the file and the record (no atomic checkpoint left; ucp-inspect --verify finds it
too), a truncated .distcp and a damaged .metadata are refused by name, and a .metadata naming a class
DCP never writes is refused naming the class.
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from atomic_files import same_bytes  # noqa: E402
from checklist import cases_holding, check, finish, fresh_folder, refused_when_damaged, tool_runner  # noqa: E402

BIN, CASES, WORK = sys.argv[1:4]
run = tool_runner(BIN, sys.argv[4] if len(sys.argv) > 4 else None)
STATES = {"fp32": None, "exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq", "step": "step"}




def compare(case, atomic, ref):
    zero = os.path.join(atomic, "zero")
    names = sorted(d for d in os.listdir(zero) if os.path.isdir(os.path.join(zero, d)))
    check(f"{case}: the parameters are reference.pt's", names == sorted(ref["model"]), f"{names} vs {sorted(ref['model'])}")
    bad = []
    for name in names:
        for state, key in STATES.items():
            got = torch.load(os.path.join(zero, name, state + ".pt"), map_location="cpu")
            got = got["param"] if isinstance(got, dict) else got
            want = ref["model"][name] if key is None else ref["optim"]["state"][name][key]
            if not same_bytes(got, want):
                bad.append(f"{name}/{state}")
    check(f"{case}: every tensor equals reference.pt byte for byte ({len(names)} x {len(STATES)})", not bad, str(bad[:5]))
    osd = torch.load(os.path.join(zero, "optimizer_state.pt"), map_location="cpu")
    want = ref["optim"]["param_groups"]
    check(f"{case}: param_groups equal reference.pt's, in order", osd.get("param_groups") == want and
          [list(g) for g in osd["param_groups"]] == [list(g) for g in want], f"{osd.get('param_groups')} vs {want}")


fresh_folder(WORK)
cases = cases_holding(CASES, "reference.pt")
check("real DCP cases found", len(cases) >= 1, str(cases))
for case in cases:
    ckpt = os.path.join(CASES, case, "checkpoint")
    ref = torch.load(os.path.join(CASES, case, "reference.pt"), map_location="cpu")
    r = run("ucp-inspect", [ckpt])
    check(f"{case}: inspect says dcp and the chunks", r.returncode == 0 and "dcp" in r.stdout and " chunks along dim" in r.stdout,
          r.stdout[-1500:] + r.stderr[-500:])
    r = run("ucp-inspect", ["--json", ckpt])
    j = json.loads(r.stdout) if r.returncode == 0 else {}
    check(f"{case}: inspect --json lists every parameter", j.get("format") == "dcp" and
          sorted(p["name"] for p in j.get("params", [])) == sorted(ref["model"]), r.stderr[-500:] + str(list(j)[:20]))
    for np in (1, 2):
        atomic = os.path.join(WORK, f"{case}-np{np}")
        r = run("ucp-convert", [ckpt, "-o", atomic], ranks=np)
        check(f"{case}: convert at {np} rank(s)", r.returncode == 0, r.stderr[-1500:])
        if r.returncode == 0:
            compare(f"{case} np{np}", atomic, ref)
    r = run("ucp-inspect", [os.path.join(WORK, f"{case}-np2")])
    check(f"{case}: inspect of the atomic checkpoint verifies", r.returncode == 0, r.stdout[-800:] + r.stderr[-800:])


def damaged(label, src, mutate, expect):
    return refused_when_damaged(run, WORK, label, src, mutate, expect)


# The damaged copies, of the FSDP2 case where the folder has it.
if os.path.isdir(os.path.join(CASES, "fsdp2_dp2")):
    src = os.path.join(CASES, "fsdp2_dp2", "checkpoint")


    def flip_tensor_byte(folder):
        # Inside the payload of a chunk's tensor record (<archive>/data/0, found by its zip local header)
        # in the second half of rank 1's file.
        p = os.path.join(folder, "__1_0.distcp")
        data = bytearray(open(p, "rb").read())
        at = data.find(b"PK\x03\x04", len(data) // 2)
        while at >= 0:
            n, e = int.from_bytes(data[at + 26:at + 28], "little"), int.from_bytes(data[at + 28:at + 30], "little")
            if data[at + 30:at + 30 + n].endswith(b"/data/0"):
                data[at + 30 + n + e + 8] ^= 0x40
                break
            at = data.find(b"PK\x03\x04", at + 4)
        assert at >= 0, "a tensor record in the second half"
        open(p, "wb").write(bytes(data))


    flipped = damaged("flipped byte in a .distcp", src, flip_tensor_byte, ["__1_0.distcp", "CRC"])
    r = run("ucp-inspect", ["--verify", flipped])
    check("damaged: inspect --verify finds the flipped byte", r.returncode == 2 and "CRC" in r.stdout + r.stderr,
          r.stdout[-600:] + r.stderr[-600:])


    def truncate(folder):
        p = os.path.join(folder, "__0_0.distcp")
        data = open(p, "rb").read()
        open(p, "wb").write(data[: len(data) - 5000])


    damaged("truncated .distcp", src, truncate, ["__0_0.distcp"])


    def cut_metadata(folder):
        p = os.path.join(folder, ".metadata")
        data = open(p, "rb").read()
        open(p, "wb").write(data[: len(data) // 3])


    damaged("truncated .metadata", src, cut_metadata, [".metadata", "pickle"])


    def foreign_class(folder):
        # A class DCP never writes, same length as the one it replaces, so the pickle stays well formed.
        p = os.path.join(folder, ".metadata")
        data = open(p, "rb").read()
        assert b"_get_layout" in data, "the metadata names torch.serialization._get_layout"
        open(p, "wb").write(data.replace(b"torch.serialization", b"subprocess.serializ", 1).replace(b"_get_layout", b"check_calls", 1))


    damaged("a foreign class in .metadata", src, foreign_class, [".metadata", "subprocess.serializ.check_calls"])

finish("real_dcp")
