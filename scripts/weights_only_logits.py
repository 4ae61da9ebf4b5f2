"""Real DeepSpeed (0.19.5, the trixie chroot) on ucp's output from a weights-only atomic checkpoint: the
table of tests/data/weights-only/logits.json. Run from the HOST as root, after a build:

    scripts/weights_only_logits.py BUILD_DIR SCRATCH [--out tests/data/weights-only/logits.json]

1. The real Llama case (../shared/real-deepspeed/cases/llama_tp2_dp2_zero1_fp32) loaded by DeepSpeed at
   its own layout: the reference logits L (scripts/harness_logits.py).
2. The case converted (ucp-convert), made weights-only (tests/python/weights_only.py: what ucp-convert
   HF_FOLDER writes for these weights), resharded by ucp-reshard to each row's layout with a fresh optimizer
   (--optimizer-config) or none (--no-optimizer), and loaded by DeepSpeed with the row's load flags: each
   row's logits against L (max |diff|); one row trains 3 more steps (losses finite, falling).
The JSON records each row's command, DeepSpeed's numbers and the sha256 of every file DeepSpeed read;
tests/python/weights_only_logits.py (ctest weights_only_logits) checks that ucp still writes those bytes.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CASE = os.path.normpath(os.path.join(ROOT, "..", "shared", "real-deepspeed", "cases", "llama_tp2_dp2_zero1_fp32"))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
from weights_only import make_weights_only  # noqa: E402

OPTIMIZER = {"optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                                       "weight_decay": 0.01}}}
# name: (layout flags of ucp-reshard, harness flags, the optimizer: "fresh" or "none", load flags, train steps)
ROWS = {
    "fresh_tp2_dp1_z1": ({"tp": 2, "pp": 1, "dp": 1, "zero": 1}, "fresh", [], 0),
    "fresh_tp1_pp2_dp1_z1": ({"tp": 1, "pp": 2, "dp": 1, "zero": 1}, "fresh", [], 0),
    "fresh_tp1_dp2_z2": ({"tp": 1, "pp": 1, "dp": 2, "zero": 2}, "fresh", [], 3),
    "fresh_tp1_dp2_z3": ({"tp": 1, "pp": 1, "dp": 2, "zero": 3}, "fresh", [], 0),
    "none_tp1_dp2_z1": ({"tp": 1, "pp": 1, "dp": 2, "zero": 1}, "none", ["--no-load-optimizer-states"], 0),
    "none_tp2_dp1_z2": ({"tp": 2, "pp": 1, "dp": 1, "zero": 2}, "none", ["--load-module-only"], 0),
    "none_tp1_pp2_dp1_z1": ({"tp": 1, "pp": 2, "dp": 1, "zero": 1}, "none", ["--load-module-only"], 0),
}


def reshard_args(layout, optimizer, config):
    flags = ["--dp", str(layout["dp"]), "--tp", str(layout["tp"]), "--pp", str(layout["pp"]),
             "--zero-stage", str(layout["zero"]), "--ds-version", "0.19.5"]
    return flags + (["--optimizer-config", config] if optimizer == "fresh" else ["--no-optimizer"])


def harness(ckpt, layout, extra, out):
    cmd = [sys.executable, os.path.join(HERE, "harness_logits.py"), ckpt, "--out", out] + extra
    for k, v in layout.items():
        cmd += ["--" + k, str(v)]
    subprocess.run(cmd, check=True)
    return json.load(open(out))


def max_diff(a, b):
    return max(abs(x - y) for ra, rb in zip(a, b) for xa, xb in zip(ra, rb) for x, y in zip(xa, xb))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("build")
    p.add_argument("scratch")
    p.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "weights-only", "logits.json"))
    a = p.parse_args()
    shutil.rmtree(a.scratch, ignore_errors=True)
    os.makedirs(a.scratch)
    tool = lambda name: os.path.join(os.path.abspath(a.build), "apps", name)  # noqa: E731
    atomic, wo = os.path.join(a.scratch, "atomic"), os.path.join(a.scratch, "weights-only")
    subprocess.run([tool("ucp-convert"), os.path.join(CASE, "ckpt"), "-o", atomic, "-q"], check=True)
    make_weights_only(atomic, wo)
    config = os.path.join(a.scratch, "ds_config.json")
    json.dump(OPTIMIZER, open(config, "w"))
    ref = harness(os.path.join(CASE, "ckpt"), {"tp": 2, "pp": 1, "dp": 2, "zero": 1}, [],
                  os.path.join(a.scratch, "reference.json"))
    table = {"case": os.path.basename(CASE), "optimizer_config": OPTIMIZER, "deepspeed": "0.19.5",
             "reference": {"layout": ref["layout"], "ckpt_sha256": ref["ckpt_sha256"]}, "rows": {}}
    for name, (layout, optimizer, load, steps) in ROWS.items():
        out = os.path.join(a.scratch, name)
        args = reshard_args(layout, optimizer, "CONFIG")
        subprocess.run([tool("ucp-reshard"), wo, "-o", out, "-q"] + reshard_args(layout, optimizer, config), check=True)
        got = harness(out, layout, load + (["--train-steps", str(steps)] if steps else []),
                      os.path.join(a.scratch, name + ".json"))
        table["rows"][name] = {"reshard_args": args, "harness_load": load, "layout": got["layout"], "load": got["load"],
                               "max_abs_diff_logits": max_diff(got["logits"], ref["logits"]), "losses": got["losses"],
                               "ckpt_sha256": got["ckpt_sha256"]}
        print(f"{name}: max |logits - L| = {table['rows'][name]['max_abs_diff_logits']:.3g} losses {got['losses']}")
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(table, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
