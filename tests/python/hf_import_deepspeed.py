"""What real DeepSpeed 0.19.5 showed on Hugging Face models ucp imported and resharded
(tests/data/real-hf/deepspeed_loads.json, written by scripts/hf_import_deepspeed.py in the trixie chroot,
which CI has not), and that ucp still writes the bytes DeepSpeed read then:

    hf_import_deepspeed.py BIN_DIR MODELS_DIR WORK RECORD_JSON

- the record: every row's logits (DeepSpeed's, the harness's Megatron-style model loaded from ucp's files)
  within 1e-5 of transformers' own logits of the source model, the training row's losses finite;
- ucp now: each model imported (ucp-convert MODEL) and resharded with each row's arguments: every file of
  the written tag has the sha256 DeepSpeed read;
- the round trip: a fresh-optimizer row's output (its fp32 masters) converted back (ucp-convert) and exported
  (ucp-reshard --format hf) gives the model's own safetensors tensors, byte for byte.
"""
import json
import math
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from harness_logits import files_differing  # noqa: E402  (the tag's files against the record's sha256)
from checklist import check, finish, tool_runner  # noqa: E402
from safetensors_reader import read_model_folder  # noqa: E402


def round_trip(label, layout_dir, src):
    back, hf = layout_dir + "-back", layout_dir + "-hf"
    r = run("ucp-convert", [layout_dir, "-o", back, "-q"])
    check(f"{label}: converted back", r.returncode == 0, r.stderr[-600:])
    if r.returncode:
        return
    r = run("ucp-reshard", [back, "-o", hf, "--format", "hf", "-q"])
    check(f"{label}: exported", r.returncode == 0, r.stderr[-600:])
    if r.returncode:
        return
    want, got = read_model_folder(src), read_model_folder(hf)
    differ = sorted(set(want) ^ set(got)) + [k for k in want if k in got and (
        want[k].dtype != got[k].dtype or want[k].shape != got[k].shape or
        want[k].contiguous().view(-1).view(torch.uint8).tolist() != got[k].contiguous().view(-1).view(torch.uint8).tolist())]
    check(f"{label}: HF -> ucp -> layout -> ucp -> HF gives the model's {len(want)} tensors byte for byte", not differ, str(differ))
    same = [f for f in ("config.json", "generation_config.json") if os.path.exists(os.path.join(src, f)) and
            open(os.path.join(src, f), "rb").read() == open(os.path.join(hf, f), "rb").read()]
    check(f"{label}: and its own config.json and generation_config.json, byte for byte", len(same) == 2, str(same))

bindir, models, work, record_path = sys.argv[1:5]
run = tool_runner(bindir)
record = json.load(open(record_path))

shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
config = os.path.join(work, "ds_config.json")
json.dump(record["optimizer_config"], open(config, "w"))
check("the record has rows of both optimizers", all(
    any(r["reshard_args"][-1] == o for r in rows.values()) for rows in record["models"].values()
    for o in ("CONFIG", "--no-optimizer")))
for model, rows in record["models"].items():
    for name, row in rows.items():
        d = row["max_abs_diff_logits_vs_transformers"]
        check(f"{model} {name}: DeepSpeed's logits within 1e-5 of transformers'", d <= 1e-5, str(d))
        if row["losses"]:
            check(f"{model} {name}: trains on (losses finite)", all(math.isfinite(x) for x in row["losses"]), str(row["losses"]))
    atomic = os.path.join(work, model + "-atomic")
    r = run("ucp-convert", [os.path.join(models, model), "-o", atomic, "-q"])
    check(f"{model}: imported", r.returncode == 0, r.stderr[-600:])
    if r.returncode != 0:
        continue
    for name, row in rows.items():
        out = os.path.join(work, model + "-" + name)
        args = [config if a == "CONFIG" else a for a in row["reshard_args"]]
        r = run("ucp-reshard", [atomic, "-o", out, "-q"] + args)
        check(f"{model} {name}: resharded", r.returncode == 0, r.stderr[-600:])
        if r.returncode != 0:
            continue
        differ, n = files_differing(out, row["ckpt_sha256"])
        check(f"{model} {name}: the bytes DeepSpeed read ({n} files)", not differ, str(differ))
        if "--optimizer-config" in args:
            round_trip(f"{model} {name}", out, os.path.join(models, model))
shutil.rmtree(work, ignore_errors=True)
finish("hf_import_deepspeed")
