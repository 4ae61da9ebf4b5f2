#!/usr/bin/python3
"""Real DeepSpeed checkpoints of Megatron-DeepSpeed-style GPTs written by ucp-reshard --format mcore with their
optimizer state, and resumed by real Megatron-LM (core_v0.17.1, the trixie chroot) for global steps 7-10 against
DeepSpeed's own uninterrupted run: the table of tests/data/real-mcore/mcore_cross_family_resume.json. Run from the
HOST as root, after a build:

    scripts/mcore_cross_family_resume.py BUILD_DIR SCRATCH [--out tests/data/real-mcore/mcore_cross_family_resume.json]

SCRATCH must lie under /work/scratch (seen in the chroot at the same path). For each row: ucp-convert of the case's
checkpoint (../shared/real-deepspeed/cases, tests/data/real-ds0195), ucp-reshard ATOMIC -o OUT --format mcore with the
row's flags, then tests/data/real-mcore/cross_family_resume.py in the chroot (Megatron-LM's own load_checkpoint with
the optimizer and scheduler, and 4 training steps on the harness's batches). The record keeps each row's case and
flags, which tests/python/deepspeed_to_mcore.py (ctest deepspeed_to_mcore) reruns to check ucp still writes the bytes
Megatron-LM loaded.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CHROOT = os.environ.get("CHROOT", "/work/oracle-hf/trixie")
SHARED_CASES = os.path.normpath(os.path.join(ROOT, "..", "shared", "real-deepspeed", "cases"))
DS0195 = os.path.join(ROOT, "tests", "data", "real-ds0195")
LLAMA = {"layers": 4, "hidden": 64, "heads": 4, "groups": 2, "ffn": 128, "eps": 1e-5, "positions": 32, "vocab": 300, "norm": "RMSNorm",
         "position": "rope", "rope_base": 10000, "bias": False, "tied": False}
GPT = dict(LLAMA, norm="LayerNorm", position="learned_absolute", bias=True, tied=True)
# label: (case folder, model facts, tp, pp, dp, extra ucp-reshard flags, bf16, fresh Adam)
ROWS = {
    "llama_tp1_pp1_dp1": ("llama_tp2_dp2_zero1_fp32", LLAMA, 1, 1, 1, [], False, False),
    "llama_tp2_pp1_dp1": ("llama_tp2_dp2_zero1_fp32", LLAMA, 2, 1, 1, [], False, False),
    "llama_tp1_pp2_dp1": ("llama_tp2_dp2_zero1_fp32", LLAMA, 1, 2, 1, [], False, False),
    "llama_tp1_pp1_dp2": ("llama_tp2_dp2_zero1_fp32", LLAMA, 1, 1, 2, [], False, False),
    "llama_tp1_pp1_dp2_distopt": ("llama_tp2_dp2_zero1_fp32", LLAMA, 1, 1, 2, ["--use-distributed-optimizer"], False, False),
    "gpt_tp2_pp2_dp1": ("tp2_pp2_dp2_zero1_fp32", GPT, 2, 2, 1, [], False, False),
    "gpt_tp1_pp1_dp1": ("tp2_pp2_dp2_zero1_fp32", GPT, 1, 1, 1, [], False, False),
    "gpt_bf16_tp1_pp1_dp1": ("tp2_dp2_bf16_zero0", GPT, 1, 1, 1, [], True, False),
    "gpt_bf16_tp2_pp1_dp2_distopt": ("tp2_dp2_bf16_zero0", GPT, 2, 1, 2, ["--use-distributed-optimizer"], True, False),
    "v0195_gpt_bf16_tp1_pp2_dp1": ("v0195_zero1_dp4_bf16", GPT, 1, 2, 1, ["--model-config", "HEADS"], True, False),
    "v0195_gpt_bf16_tp1_pp1_dp2_distopt": ("v0195_zero1_dp4_bf16", GPT, 1, 1, 2, ["--model-config", "HEADS", "--use-distributed-optimizer"],
                                           True, False),
}
FRESH = {"llama_tp1_pp1_dp1": "llama_tp1_pp1_dp1_fresh_adam", "gpt_bf16_tp1_pp1_dp1": "gpt_bf16_tp1_pp1_dp1_fresh_adam"}
# rows whose checkpoint is the case's with Megatron's scheduler state as lr_scheduler (megatron_schedule_fixture.py),
# as a Megatron-DeepSpeed job's engine saves it: the schedule carried, the job launched without --override-opt_param-scheduler
SCHEDULED = {"llama_megatron_schedule_tp2_pp1_dp1": ("llama_tp2_dp2_zero1_fp32", LLAMA, 2, 1, 1, [], False, False)}


def case_dir(case):
    return os.path.join(DS0195, case) if case.startswith("v0195_") else os.path.join(SHARED_CASES, case)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("build")
    p.add_argument("scratch")
    p.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "real-mcore", "mcore_cross_family_resume.json"))
    a = p.parse_args()
    scratch = os.path.abspath(a.scratch)
    if not scratch.startswith("/work/scratch/"):
        sys.exit("SCRATCH must lie under /work/scratch (the chroot sees it there)")
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(os.path.join(scratch, "out"))
    tool = lambda name: os.path.join(os.path.abspath(a.build), "apps", name)  # noqa: E731
    heads = os.path.join(scratch, "heads.json")  # the facts a save without Megatron args lacks, as a user gives them
    json.dump({"num_attention_heads": 4, "num_key_value_heads": 2}, open(heads, "w"))
    for name in ("cross_family_resume.py", "cross_family_check.py", "make_mcore.py"):
        shutil.copy(os.path.join(ROOT, "tests", "data", "real-mcore", name), scratch)
    in_chroot = lambda command: subprocess.run(  # noqa: E731
        ["chroot", CHROOT, "env", "-i", "bash", "-c", "export PATH=/usr/local/bin:/usr/bin:/bin HOME=/root; "
         f"cd {scratch} && PYTHONPATH=/opt/megatron OMP_NUM_THREADS=1 python3 cross_family_resume.py {command}"],
        check=True, stdout=subprocess.DEVNULL)
    in_chroot("--schedule-state schedule.json")  # real Megatron's OptimizerParamScheduler after the job's 6 steps
    schedule = json.load(open(os.path.join(scratch, "schedule.json")))
    sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
    from megatron_schedule_fixture import with_megatron_schedule
    spec, flags_of = {}, {}
    for label, (case, model, tp, pp, dp, extra, bf16, _) in {**ROWS, **SCHEDULED}.items():
        atomic = os.path.join(scratch, case + ("-scheduled" if label in SCHEDULED else "") + "-atomic")
        if not os.path.isdir(atomic):
            ckpt = os.path.join(case_dir(case), "ckpt")
            if label in SCHEDULED:
                ckpt = with_megatron_schedule(ckpt, os.path.join(scratch, case + "-scheduled"), schedule)
            subprocess.run([tool("ucp-convert"), ckpt, "-o", atomic, "-q"], check=True)
        out = os.path.join(scratch, "out", label)
        flags = ["--format", "mcore", "--tp", str(tp), "--pp", str(pp), "--dp", str(dp)] + extra
        r = subprocess.run([tool("ucp-reshard"), atomic, "-o", out] + [heads if f == "HEADS" else f for f in flags],
                           check=True, capture_output=True, text=True)
        divisor = int(r.stderr.split("--make-vocab-size-divisible-by ")[1].split()[0])
        flags_of[label] = flags
        spec[label] = {"root": out, "tp": tp, "pp": pp, "dp": dp, "model": model, "divisor": divisor, "bf16": bf16,
                       "case": case_dir(case), "distributed": "--use-distributed-optimizer" in extra, "schedule": label in SCHEDULED}
        if label in FRESH:
            spec[FRESH[label]] = dict(spec[label], fresh=True)
            flags_of[FRESH[label]] = flags
    json.dump(spec, open(os.path.join(scratch, "spec.json"), "w"), indent=1)
    in_chroot("spec.json record.json")
    record = json.load(open(os.path.join(scratch, "record.json")))
    for label, entry in record["outputs"].items():
        case = next(c for name, (c, *_rest) in {**ROWS, **SCHEDULED}.items() if name == label or FRESH.get(name) == label)
        entry["case"] = os.path.relpath(case_dir(case), ROOT)
        entry["reshard_flags"] = flags_of[label]
        if label in SCHEDULED:
            entry["megatron_schedule"] = schedule  # the case's checkpoint with this lr_scheduler (megatron_schedule_fixture.py)
        print(f"{label}: iteration {entry['iterations']}, losses {entry['losses']}, max |loss - DeepSpeed's| "
              f"{entry['max_abs_loss_diff']:.3g}, error {entry['error'] is not None}", flush=True)
    with open(a.out, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
