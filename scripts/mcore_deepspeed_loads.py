#!/usr/bin/python3
"""Megatron-Core checkpoints written by ucp-reshard as DeepSpeed layouts, with their Adam state, and loaded by real
DeepSpeed (0.19.5, the trixie chroot): the table of tests/data/real-mcore/mcore_deepspeed_loads.json. Run from the
HOST as root, after a build:

    scripts/mcore_deepspeed_loads.py BUILD_DIR SCRATCH [--out tests/data/real-mcore/mcore_deepspeed_loads.json]

SCRATCH must lie under /work/scratch (seen in the chroot). For each real Megatron-Core 0.17.1 Llama save of
tests/data/real-mcore (its checkpoint/: `llama_tp2_legacy` fp32 with FP32Optimizer, `llama_tp2_dp2_distopt_bf16` bf16
with the distributed optimizer):
1. ucp-convert CHECKPOINT -o ATOMIC; ucp-reshard ATOMIC -o HF --format hf --dtype fp32 (the reference model);
2. ucp-reshard ATOMIC to each row's layout (its optimizer state carried: no --optimizer-config);
3. DeepSpeed loads it into the harness's Megatron-style Llama (scripts/harness_logits.py: engine.load_checkpoint with
   the optimizer's state; no scheduler state, which Megatron-Core's files do not hold for DeepSpeed's scheduler, so
   load_lr_scheduler_states=False) and computes the logits of a fixed batch; rows with train steps train on;
4. transformers computes the reference model's logits on the same batch (tests/hf/transformers_check.py);
each row records max |DeepSpeed - transformers|, the losses, and the sha256 of every file DeepSpeed read, which
tests/python/mcore_to_deepspeed.py (ctest mcore_to_deepspeed) checks ucp still writes. A row that trains also
trains from the same files without the optimizer's state (load_optimizer_states=False, a fresh Adam): the losses
part, so the carried moments are what DeepSpeed stepped from.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from hf_import_deepspeed import model_flags, unmount_under, CHROOT  # noqa: E402
from weights_only_logits import max_diff  # noqa: E402

CASES = ["llama_tp2_legacy", "llama_tp2_dp2_distopt_bf16"]
# name: (layout, train steps)
ROWS = {
    "tp2_dp1_z1": ({"tp": 2, "pp": 1, "dp": 1, "zero": 1}, 3),
    "tp1_pp2_dp1_z1": ({"tp": 1, "pp": 2, "dp": 1, "zero": 1}, 0),
    "tp1_dp2_z2": ({"tp": 1, "pp": 1, "dp": 2, "zero": 2}, 3),
    "tp1_dp2_z3": ({"tp": 1, "pp": 1, "dp": 2, "zero": 3}, 0),
}


def reshard_args(layout):
    """ucp-reshard's flags of a row (also tests/python/mcore_to_deepspeed.py's)."""
    return ["--dp", str(layout["dp"]), "--tp", str(layout["tp"]), "--pp", str(layout["pp"]), "--zero-stage", str(layout["zero"]),
            "--ds-version", "0.19.5"]


def divisible_by(root):
    """The vocabulary divisor the written layout's Megatron args carry (the source job's)."""
    import glob
    import torch
    sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
    import ds_stubs  # noqa: F401  (DeepSpeed's pickled classes)
    tag = open(os.path.join(root, "latest")).read().strip()
    first = sorted(glob.glob(os.path.join(root, tag, "*mp_rank_00_model_states.pt")))[0]
    return torch.load(first)["args"].make_vocab_size_divisible_by


def main():
    p = argparse.ArgumentParser()
    p.add_argument("build")
    p.add_argument("scratch")
    p.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "real-mcore", "mcore_deepspeed_loads.json"))
    a = p.parse_args()
    scratch = os.path.abspath(a.scratch)
    if not scratch.startswith("/work/scratch/"):
        sys.exit("SCRATCH must lie under /work/scratch (the chroot sees it there)")
    unmount_under(CHROOT + scratch)
    shutil.rmtree(scratch, ignore_errors=True)
    ckpts, outs = os.path.join(scratch, "ckpt"), os.path.join(scratch, "out")
    os.makedirs(ckpts)
    os.makedirs(outs)
    tests = os.path.join(ROOT, "tests")  # transformers_check.py, inside the chroot at the same path, read-only
    os.makedirs(CHROOT + tests, exist_ok=True)
    subprocess.run(["mount", "--bind", tests, CHROOT + tests], check=True)
    subprocess.run(["mount", "-o", "remount,bind,ro", CHROOT + tests], check=True)
    tool = lambda name: os.path.join(os.path.abspath(a.build), "apps", name)  # noqa: E731
    table = {"deepspeed": "0.19.5", "megatron_core": "0.17.1", "cases": {}}
    for case in CASES:
        atomic = os.path.join(scratch, case + "-atomic")
        subprocess.run([tool("ucp-convert"), os.path.join(ROOT, "tests", "data", "real-mcore", case, "checkpoint"), "-o", atomic, "-q"],
                       check=True)
        hf = os.path.join(outs, case + "-hf")
        subprocess.run([tool("ucp-reshard"), atomic, "-o", hf, "--format", "hf", "--dtype", "fp32", "-q"], check=True)
        config = json.load(open(os.path.join(hf, "config.json")))
        dtype = json.load(open(os.path.join(atomic, "ucp_manifest.json")))["source"]["dtype"]
        rows = table["cases"][case] = {"dtype": dtype, "rows": {}}
        for name, (layout, steps) in ROWS.items():
            out = os.path.join(ckpts, case + "-" + name)
            subprocess.run([tool("ucp-reshard"), atomic, "-o", out, "-q"] + reshard_args(layout), check=True)
            flags = model_flags(config) + ["--dtype", dtype, "--no-load-lr-scheduler-states",
                                           "--make-vocab-divisible-by", str(divisible_by(out))]
            flags += [x for k, v in layout.items() for x in ("--" + k, str(v))]
            got_path = os.path.join(outs, case + "-" + name + ".json")
            harness = lambda path, extra: subprocess.run(  # noqa: E731
                [sys.executable, os.path.join(HERE, "harness_logits.py"), out, "--out", path] + flags + extra, check=True)
            harness(got_path, ["--train-steps", str(steps)] if steps else [])
            got = json.load(open(got_path))
            ref_path = os.path.join(outs, case + "-" + name + "-transformers.json")
            subprocess.run(["chroot", CHROOT, "/bin/bash", "-c", f". /opt/hf/hfenv.sh; cd /tmp; python3 "
                            f"{ROOT}/tests/hf/transformers_check.py --record {hf} {ref_path} --ids-from {got_path}"],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            ref = json.load(open(ref_path))
            assert ref["ids"] == got["ids"]
            row = rows["rows"][name] = {"reshard_args": reshard_args(layout), "harness_flags": flags, "layout": got["layout"],
                                        "load": got["load"], "max_abs_diff_logits_vs_transformers": max_diff(got["logits"], ref["logits"]),
                                        "losses": got["losses"], "ckpt_sha256": got["ckpt_sha256"]}
            if steps:  # the same files, Adam's state not loaded: a fresh optimizer's steps
                fresh_path = os.path.join(outs, case + "-" + name + "-fresh.json")
                harness(fresh_path, ["--train-steps", str(steps), "--no-load-optimizer-states"])
                row["losses_without_optimizer_state"] = json.load(open(fresh_path))["losses"]
            print(f"{case} {name}: max |DeepSpeed - transformers| = {row['max_abs_diff_logits_vs_transformers']:.3g} "
                  f"losses {row['losses']} (fresh Adam: {row.get('losses_without_optimizer_state')})", flush=True)
    unmount_under(CHROOT + scratch)
    subprocess.run(["umount", CHROOT + os.path.join(ROOT, "tests")], check=False)
    with open(a.out, "w") as f:
        json.dump(table, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
