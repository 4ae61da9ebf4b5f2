"""ucp-convert of Hugging Face models transformers itself made (tests/data/real-hf/llama_*: save_pretrained of
a small LlamaConfig, fp32, bf16 with tied embeddings, fp32 in shards; gpt2_tiny, mixtral_tiny), checked against what transformers
showed when scripts/hf_import_real.py ran it (tests/data/real-hf/checks.json; CI cannot run transformers).

Usage: hf_import_real.py BIN_DIR DATA WORK [MPIEXEC]

Per model: the source files are the ones recorded (sha256); ucp-convert on 2 ranks, then ucp-reshard
--format hf --dtype <the model's>; every tensor of the export equals the source's byte for byte (read by
safetensors_reader.py), and the export's safetensors files are byte for byte the ones from_pretrained
loaded in the chroot, whose logits equalled transformers' own of the source model exactly (checks.json:
max_abs_diff 0, no loading problems).
"""
import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from atomic_files import same_bytes  # noqa: E402
from checklist import check, finish, fresh_folder, tool_runner  # noqa: E402
from safetensors_reader import read_model_folder as tensors_of  # noqa: E402

BIN, DATA, WORK = sys.argv[1:4]
MPIEXEC = sys.argv[4] if len(sys.argv) > 4 else None
run = tool_runner(BIN, MPIEXEC)
DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main():
    fresh_folder(WORK)
    with open(os.path.join(DATA, "checks.json")) as f:
        checks = json.load(f)
    made = sorted(n for n in os.listdir(DATA) if n.startswith("llama_") or n in ("gpt2_tiny", "mixtral_tiny"))
    check("models recorded", sorted(checks) == made, str(sorted(checks)))
    for name, rec in sorted(checks.items()):
        src = os.path.join(DATA, name)
        got = {f: sha256(os.path.join(src, f)) for f in rec["source_files"]}
        check(f"{name}: the source transformers made", got == rec["source_files"])
        check(f"{name}: transformers' logits of ucp's export equal its own of the source", rec["ok"] and
              rec["max_abs_diff"] == 0 and not rec["loading_problems"], str({k: rec[k] for k in ("max_abs_diff", "loading_problems")}))
        atomic, out = os.path.join(WORK, name, "atomic"), os.path.join(WORK, name, "export")
        r = run("ucp-convert", [src, "-o", atomic], ranks=2)
        check(f"{name}: imported", r.returncode == 0, r.stderr[-2000:])
        dtype = DTYPES[json.load(open(os.path.join(src, "config.json")))["dtype"]]
        r = run("ucp-reshard", [atomic, "-o", out, "--format", "hf", "--dtype", dtype], ranks=2)
        check(f"{name}: exported", r.returncode == 0, r.stderr[-2000:])
        if r.returncode:
            continue
        want, have = tensors_of(src), tensors_of(out)
        bad = [k for k in want if k not in have or not same_bytes(have[k], want[k])]
        check(f"{name}: every tensor byte for byte", not bad and sorted(have) == sorted(want), str(bad[:4]))
        loaded = {f: h for f, h in rec["export_files"].items() if f.endswith(".safetensors") or f.endswith(".index.json")}
        mine = {f: sha256(os.path.join(out, f)) for f in loaded if os.path.exists(os.path.join(out, f))}
        check(f"{name}: the export is the files from_pretrained loaded", mine == loaded, str(sorted(set(mine.items()) ^ set(loaded.items()))[:4]))
    finish("hf_import_real")


if __name__ == "__main__":
    main()
