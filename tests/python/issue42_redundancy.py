"""Issue 42's rows about files that look consistent but are not, each a check on real checkpoints
(../shared/real-deepspeed, ../shared/real-dcp) made wrong the way clusters make them: swapped between
ranks, one file from another run or step. Every CRC-32 stays valid; only a value the checkpoint stores
twice can tell.

  issue42_redundancy.py FINDING UCP_BIN_DIR CASES_DIR WORK [MPIEXEC] [DCP_CASES_DIR]

FINDING is one of:
  tp_swapped   (row 3) TP ranks 0 and 1's optimizer files swapped in a TP=2 PP=2 case: ucp-convert
               and ucp-inspect --verify refuse, one error naming the files and "disagree"; the
               untouched copy verifies, its weight copies counted.
  other_run    (row 4) one optimizer file of a ZeRO-1 DP=4 case re-saved (valid CRCs) as another run
               would have it: another ds_version; fp32 masters that are not the module's (fp32 and
               the bf16 BF16-optimizer case); another step. Each refused naming that file.
  one_fault    (row 16) swapped DP files, a deleted model-states file, swapped DCP files: one error
               line each.
"""
import json
import re
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ds_stubs  # noqa: E402,F401
from checklist import check, finish, fresh_folder, tool_runner  # noqa: E402

finding, bindir, cases, work = sys.argv[1:5]
mpiexec = sys.argv[5] if len(sys.argv) > 5 else None
dcp_cases = sys.argv[6] if len(sys.argv) > 6 else None
run = tool_runner(bindir, mpiexec)


def copy_case(name, label):
    """A writable copy of a real case's tag folder under WORK/label."""
    dst = os.path.join(work, label, "ckpt")
    shutil.rmtree(os.path.join(work, label), ignore_errors=True)
    shutil.copytree(os.path.join(cases, name, "ckpt", "global_step6"), dst)
    for f in os.listdir(dst):
        os.chmod(os.path.join(dst, f), 0o644)
    return dst


def swap(folder, a, b):
    pa, pb, tmp = os.path.join(folder, a), os.path.join(folder, b), os.path.join(folder, "swap.tmp")
    os.rename(pa, tmp)
    os.rename(pb, pa)
    os.rename(tmp, pb)


def resave(path, change):
    """torch.load, change(state), torch.save: the file as a later save of another run would hold it,
    every CRC-32 valid."""
    state = torch.load(path, map_location="cpu")
    change(state)
    torch.save(state, path)


def error_lines(text):
    """The lines of ucp's errors: each 'ucp-...: error' line and the indented lines that continue it
    (mpiexec's own report after them is not ucp's)."""
    lines, inside = [], False
    for line in text.splitlines():
        inside = (line.startswith("ucp-") and ": error" in line) or (inside and line.startswith("  "))
        if inside:
            lines.append(line)
    return lines


def refused(label, folder, must, inspect_code=1):
    """ucp-convert (1 and 2 ranks) and ucp-inspect --verify refuse `folder`, convert in one error line
    holding every string of `must`, the same words whatever the rank count; no manifest is left.
    ucp-inspect exits `inspect_code`: 1 for files that read but disagree, 2 for unreadable ones."""
    out = os.path.join(os.path.dirname(folder), "out")
    said = []
    for ranks in (1, 2):
        r = run("ucp-convert", [folder, "-o", out], ranks=ranks)
        lines = error_lines(r.stderr)
        check(f"{label}: ucp-convert on {ranks} rank(s) refuses", r.returncode == 1 and all(m in r.stderr for m in must),
              f"rc {r.returncode}: {r.stderr[-1500:]}")
        check(f"{label}: ucp-convert on {ranks} rank(s) says it once", len(lines) == 1 and "Traceback" not in r.stderr,
              r.stderr[-1500:])
        check(f"{label}: no manifest", not os.path.exists(os.path.join(out, "ucp_manifest.json")))
        said.append(re.sub(r"error \(rank \d+\)", "error", lines[0]) if lines else "")
    check(f"{label}: the same words on 1 and 2 ranks", said[0] == said[1], f"\n    1: {said[0]}\n    2: {said[1]}")
    v = run("ucp-inspect", [folder, "--verify"])
    check(f"{label}: ucp-inspect --verify refuses (exit {inspect_code})",
          v.returncode == inspect_code and all(m in v.stderr for m in must), f"rc {v.returncode}: {v.stderr[-1500:]}")
    print(f"  {label}: {said[0]}")


def tp_swapped():
    clean = copy_case("tp2_pp2_dp2_zero1_fp32", "clean")
    v = run("ucp-inspect", [clean, "--verify", "--json"])
    copies = json.loads(v.stdout).get("verified", {}).get("weight_copies", 0) if v.returncode == 0 else 0
    check("untouched: ucp-inspect --verify passes and compares the weights", v.returncode == 0 and copies > 0,
          f"rc {v.returncode}, weight_copies {copies}: {v.stderr[-800:]}")
    folder = copy_case("tp2_pp2_dp2_zero1_fp32", "swapped")
    for dp in (0, 1):
        swap(folder, f"zero_pp_rank_{dp}_mp_rank_00_optim_states.pt", f"zero_pp_rank_{dp}_mp_rank_01_optim_states.pt")
    refused("TP ranks 0 and 1 swapped", folder, ["zero_pp_rank_0_mp_rank_00_optim_states.pt", "layer_0", "disagree"])
    # The model's files swapped, the optimizer's right: the model-states file is the odd one.
    folder = copy_case("llama_tp2_dp2_zero1_fp32", "model_swapped")
    swap(folder, "mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt")
    refused("model-states files of TP ranks 0 and 1 swapped", folder,
            ["mp_rank_00_model_states.pt and the fp32 master weights of every optimizer file", "one side is another rank's"])
    # One layer file swapped with another of the same shapes: the layer files are the odd ones.
    folder = copy_case("llama_pp2_dp2_zero1_fp32", "layers_swapped")
    swap(folder, "layer_03-model_00-model_states.pt", "layer_04-model_00-model_states.pt")
    refused("layer files 3 and 4 swapped", folder, ["layer_03-model_00-model_states.pt, layer_04-model_00-model_states.pt",
                                                    "these files are the odd ones"])
    # A layer file of another layout (TP=2's halves in a TP=1 pipeline): its shapes said.
    folder = copy_case("pp2_dp2_zero1_fp32", "layer_of_another_layout")
    shutil.copy(os.path.join(cases, "tp2_pp2_dp2_zero1_fp32", "ckpt", "global_step6", "layer_03-model_00-model_states.pt"),
                os.path.join(folder, "layer_03-model_00-model_states.pt"))
    refused("a layer file of another layout", folder, ["layer_03-model_00-model_states.pt", "has shape"])


def other_run():
    name = "zero_pp_rank_2_mp_rank_00_optim_states.pt"

    def version(state):
        state["ds_version"] = "0.19.5"
    folder = copy_case("zero1_dp4_fp32", "version")
    resave(os.path.join(folder, name), version)
    refused("another ds_version", folder, [name, "ds_version = 0.19.5", "0.14.5"])

    def masters(state):
        for t in state["optimizer_state_dict"]["single_partition_of_fp32_groups"]:
            t.data.add_(1e-3)
    folder = copy_case("zero1_dp4_fp32", "masters")
    resave(os.path.join(folder, name), masters)
    refused("masters of another run (fp32)", folder, [name, "disagree with the model's own weights", "mp_rank_00_model_states.pt"])

    bf16 = "bf16_zero_pp_rank_1_mp_rank_01_optim_states.pt"
    folder = copy_case("tp2_dp2_bf16_zero0", "masters_bf16")
    resave(os.path.join(folder, bf16), masters)
    refused("masters of another run (bf16)", folder, [bf16, "disagree with the model's own weights", "mp_rank_01_model_states.pt"])

    def step(state):
        for s in state["optimizer_state_dict"]["base_optimizer_state"]["state"].values():
            s["step"] = s["step"] + 1 if torch.is_tensor(s["step"]) else s["step"] + 1
    folder = copy_case("zero1_dp4_fp32", "step")
    resave(os.path.join(folder, name), step)
    refused("another step", folder, [name, "step of optimizer group"])


def zero3_said():
    """ZeRO-3 keeps no second copy and no rank in its files: said at run time, not claimed."""
    r = run("ucp-inspect", [os.path.join(cases, "zero3_dp4_fp32", "ckpt")])
    check("ZeRO-3: says a swap between DP ranks cannot be told", r.returncode == 0 and "cannot be told" in r.stdout + r.stderr,
          r.stdout[-800:] + r.stderr[-800:])


def one_fault():
    folder = copy_case("zero1_dp4_fp32", "dp_swapped")
    swap(folder, "zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt")
    refused("DP ranks 0 and 1 swapped", folder, ["zero_pp_rank_1_mp_rank_00_optim_states.pt (pp=0, tp=0, dp=1)", "swapped or renamed"])
    zero3_said()

    folder = copy_case("tp2_pp2_dp2_zero1_fp32", "model_states_deleted")
    os.remove(os.path.join(folder, "mp_rank_03_model_states.pt"))
    refused("mp_rank_03_model_states.pt deleted", folder, ["mp_rank_03_model_states.pt"])

    if dcp_cases:
        folder = os.path.join(work, "dcp_swapped", "checkpoint")
        shutil.rmtree(os.path.dirname(folder), ignore_errors=True)
        shutil.copytree(os.path.join(dcp_cases, "fsdp2_dp2", "checkpoint"), folder)
        for f in os.listdir(folder):
            os.chmod(os.path.join(folder, f), 0o644)
        swap(folder, "__0_0.distcp", "__1_0.distcp")
        refused("DCP __0_0 and __1_0 swapped", folder, ["__1_0.distcp", "another rank's file"], inspect_code=2)


fresh_folder(work)
{"tp_swapped": tp_swapped, "other_run": other_run, "one_fault": one_fault}[finding]()
finish(f"issue42 {finding}")
