#!/usr/bin/python3
"""A Hugging Face model imported by ucp and loaded by real DeepSpeed (0.19.5, the trixie chroot) on other
layouts: the table of tests/data/real-hf/deepspeed_loads.json. Run from the HOST as root, after a build:

    scripts/hf_import_deepspeed.py BUILD_DIR SCRATCH [--out tests/data/real-hf/deepspeed_loads.json]

SCRATCH must lie under /work/scratch (seen in the chroot). For each model transformers made
(tests/data/real-hf/llama_fp32, llama_sharded: LlamaForCausalLM, untied, as the harness's --arch llama):
1. ucp-convert MODEL -o ATOMIC (the weights-only atomic checkpoint);
2. ucp-reshard ATOMIC to each row's layout, with a fresh optimizer (--optimizer-config: the harness's AdamW)
   or none (--no-optimizer);
3. DeepSpeed loads it into the harness's Megatron-style model (scripts/harness_logits.py, with the row's
   load flags: a fresh optimizer's checkpoint has no scheduler state, so load_lr_scheduler_states=False;
   --no-optimizer's is read with load_module_only, Megatron's --finetune) and computes the logits of a
   fixed batch; one row trains 3 more steps;
4. transformers computes the logits of the source model on the same batch (tests/hf/transformers_check.py);
   each row records max |DeepSpeed - transformers| and the sha256 of every file DeepSpeed read, which
   tests/python/hf_import_deepspeed.py (ctest hf_import_deepspeed) checks ucp still writes.
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
from weights_only_logits import max_diff, reshard_args  # noqa: E402  (the same rows' arguments, the same measure)
CHROOT = "/work/oracle-hf/trixie"
MODELS = ["llama_fp32", "llama_sharded"]
OPTIMIZER = {"optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                                       "weight_decay": 0.01}}}
# name: (layout, optimizer "fresh" or "none", harness load flags, train steps)
ROWS = {
    "fresh_tp2_dp1_z1": ({"tp": 2, "pp": 1, "dp": 1, "zero": 1}, "fresh", ["--no-load-lr-scheduler-states"], 3),
    "fresh_tp1_pp2_dp1_z1": ({"tp": 1, "pp": 2, "dp": 1, "zero": 1}, "fresh", ["--no-load-lr-scheduler-states"], 0),
    "fresh_tp2_pp2_dp1_z1": ({"tp": 2, "pp": 2, "dp": 1, "zero": 1}, "fresh", ["--no-load-lr-scheduler-states"], 0),
    "fresh_tp1_dp2_z2": ({"tp": 1, "pp": 1, "dp": 2, "zero": 2}, "fresh", ["--no-load-lr-scheduler-states"], 0),
    "fresh_tp1_dp2_z3": ({"tp": 1, "pp": 1, "dp": 2, "zero": 3}, "fresh", ["--no-load-lr-scheduler-states"], 0),
    "none_tp2_dp1_z1": ({"tp": 2, "pp": 1, "dp": 1, "zero": 1}, "none", ["--load-module-only"], 0),
    "none_tp1_pp2_dp1_z1": ({"tp": 1, "pp": 2, "dp": 1, "zero": 1}, "none", ["--load-module-only"], 0),
    "none_tp1_dp2_z2": ({"tp": 1, "pp": 1, "dp": 2, "zero": 2}, "none", ["--load-module-only"], 0),
}


def model_flags(config):
    return ["--arch", "llama", "--hidden", str(config["hidden_size"]), "--layers", str(config["num_hidden_layers"]),
            "--heads", str(config["num_attention_heads"]), "--kv-heads", str(config["num_key_value_heads"]),
            "--ffn", str(config["intermediate_size"]), "--vocab", str(config["vocab_size"]), "--seq", "16"]


def unmount_under(path):
    with open("/proc/mounts") as f:
        points = [line.split()[1] for line in f if line.split()[1].startswith(path + "/")]
    for p in sorted(points, reverse=True):
        subprocess.run(["umount", p], check=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("build")
    p.add_argument("scratch")
    p.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "real-hf", "deepspeed_loads.json"))
    a = p.parse_args()
    scratch = os.path.abspath(a.scratch)
    if not scratch.startswith("/work/scratch/"):
        sys.exit("SCRATCH must lie under /work/scratch (the chroot sees it there)")
    unmount_under(CHROOT + scratch)  # harness_logits.py's binds of an earlier run
    shutil.rmtree(scratch, ignore_errors=True)
    ckpts, outs = os.path.join(scratch, "ckpt"), os.path.join(scratch, "out")  # read-only / writable in the chroot
    os.makedirs(ckpts)
    os.makedirs(outs)
    tool = lambda name: os.path.join(os.path.abspath(a.build), "apps", name)  # noqa: E731
    config = os.path.join(outs, "ds_config.json")
    json.dump(OPTIMIZER, open(config, "w"))
    table = {"optimizer_config": OPTIMIZER, "deepspeed": "0.19.5", "models": {}}
    for model in MODELS:
        src = os.path.join(ROOT, "tests", "data", "real-hf", model)
        hf = json.load(open(os.path.join(src, "config.json")))
        atomic = os.path.join(scratch, model + "-atomic")
        subprocess.run([tool("ucp-convert"), src, "-o", atomic, "-q"], check=True)
        rows = table["models"][model] = {}
        for name, (layout, optimizer, load, steps) in ROWS.items():
            out = os.path.join(ckpts, model + "-" + name)
            subprocess.run([tool("ucp-reshard"), atomic, "-o", out, "-q"] + reshard_args(layout, optimizer, config), check=True)
            got_path = os.path.join(outs, model + "-" + name + ".json")
            cmd = [sys.executable, os.path.join(HERE, "harness_logits.py"), out, "--out", got_path] + model_flags(hf) + load
            cmd += [x for k, v in layout.items() for x in ("--" + k, str(v))] + (["--train-steps", str(steps)] if steps else [])
            subprocess.run(cmd, check=True)
            got = json.load(open(got_path))
            ref_path = os.path.join(outs, model + "-" + name + "-transformers.json")
            subprocess.run(["chroot", CHROOT, "/bin/bash", "-c", f". /opt/hf/hfenv.sh; cd /tmp; python3 "
                            f"{ROOT}/tests/hf/transformers_check.py --record {src} {ref_path} --ids-from {got_path}"],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            ref = json.load(open(ref_path))
            assert ref["ids"] == got["ids"]
            rows[name] = {"reshard_args": reshard_args(layout, optimizer, "CONFIG"), "harness_load": load,
                          "layout": got["layout"], "load": got["load"],
                          "max_abs_diff_logits_vs_transformers": max_diff(got["logits"], ref["logits"]),
                          "losses": got["losses"], "ckpt_sha256": got["ckpt_sha256"]}
            print(f"{model} {name}: max |DeepSpeed - transformers| = "
                  f"{rows[name]['max_abs_diff_logits_vs_transformers']:.3g} losses {got['losses']}", flush=True)
    unmount_under(CHROOT + scratch)
    with open(a.out, "w") as f:
        json.dump(table, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
