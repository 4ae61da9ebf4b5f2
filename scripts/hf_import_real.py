#!/usr/bin/env python3
"""The import of Hugging Face models, checked by transformers itself (issue 44). Run from the HOST as root
(it calls `chroot`); CI cannot run transformers, so what it showed is recorded for CI to check against.

    scripts/hf_import_real.py BIN_DIR [--make] [--scratch DIR]

  --make     first remake tests/data/real-hf/llama_* with transformers (tests/hf/make_llama_models.py in the
             chroot: LlamaConfig, random weights, save_pretrained; transformers' logits beside each).
  BIN_DIR    where ucp-convert and ucp-reshard are (build/apps/...: one folder holding both, or give the
             build's bin folder).

For each tests/data/real-hf/llama_*, gpt2_tiny and mixtral_tiny: ucp-convert it (2 ranks) to a weights-only atomic checkpoint, ucp-reshard
that --format hf --dtype <the model's>, then in the chroot AutoModelForCausalLM.from_pretrained of the export
(tests/hf/transformers_check.py --pair, tolerance 0): its logits against transformers' own of the source model.
Writes tests/data/real-hf/checks.json: per model, the sha256 of the source's files and of the export's files
transformers read, the reader's versions, loading problems, max |logit difference|. CI
(tests/python/hf_import_real.py) remakes the export and checks it has exactly those bytes.

The chroot: /work/oracle-hf/trixie (tests/hf/README.md), transformers 5.3 in /opt/hf/venv. The scratch folder is
bound into it at the same path.
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "real-hf")
CHROOT = os.environ.get("UCP_HF_CHROOT", "/work/oracle-hf/trixie")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def files_of(d):
    return {f: sha256(os.path.join(d, f)) for f in sorted(os.listdir(d)) if os.path.isfile(os.path.join(d, f)) and not f.startswith(".")}


def mount(scratch):
    """proc, and the scratch folder at its own path inside the chroot."""
    if subprocess.run(["mountpoint", "-q", CHROOT + "/proc"]).returncode:
        subprocess.run(["mount", "-t", "proc", "proc", CHROOT + "/proc"], check=True)
    inside = CHROOT + scratch
    os.makedirs(inside, exist_ok=True)
    if subprocess.run(["mountpoint", "-q", inside]).returncode:
        subprocess.run(["mount", "--bind", scratch, inside], check=True)
    return inside


def in_chroot(command):
    r = subprocess.run(["chroot", CHROOT, "/bin/bash", "-c", ". /opt/hf/hfenv.sh; " + command], capture_output=True, text=True)
    sys.stdout.write(r.stdout)
    if r.returncode:
        sys.exit(f"chroot: {command}: rc {r.returncode}\n{r.stderr[-3000:]}")
    return r.stdout


def make(scratch):
    tools = os.path.join(scratch, "tools")
    os.makedirs(tools, exist_ok=True)
    for f in ("make_llama_models.py", "transformers_check.py"):
        shutil.copy(os.path.join(ROOT, "tests", "hf", f), tools)
    shutil.rmtree(os.path.join(scratch, "models"), ignore_errors=True)
    in_chroot(f"python {tools}/make_llama_models.py {scratch}/models")
    for name in sorted(os.listdir(os.path.join(scratch, "models"))):
        shutil.rmtree(os.path.join(DATA, name), ignore_errors=True)
        shutil.copytree(os.path.join(scratch, "models", name), os.path.join(DATA, name))


def export(bin_dir, src, scratch, name):
    dtype = DTYPES[json.load(open(os.path.join(src, "config.json"))).get("dtype", "float32")]
    atomic, out = os.path.join(scratch, "atomic", name), os.path.join(scratch, "export", name)
    for cmd in (["mpirun", "--oversubscribe", "-np", "2", os.path.join(bin_dir, "ucp-convert"), src, "-o", atomic, "--force"],
                [os.path.join(bin_dir, "ucp-reshard"), atomic, "-o", out, "--format", "hf", "--dtype", dtype, "--force"]):
        r = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
        if r.returncode:
            sys.exit(f"{' '.join(cmd)}: rc {r.returncode}\n{r.stderr[-3000:]}")
    return out


def imported_models():
    """The models transformers made that the import reads: llama_* (tests/hf/make_llama_models.py), gpt2_tiny and
    mixtral_tiny (scripts/hf_classes_oracle.py make)."""
    return sorted(n for n in os.listdir(DATA) if n.startswith("llama_") or n in ("gpt2_tiny", "mixtral_tiny"))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("bin_dir")
    p.add_argument("--make", action="store_true")
    p.add_argument("--scratch", default="/work/scratch/hf-import-real")
    a = p.parse_args()
    scratch = os.path.abspath(a.scratch)
    os.makedirs(scratch, exist_ok=True)
    mount(scratch)
    if a.make:
        make(scratch)
    tools = os.path.join(scratch, "tools")
    os.makedirs(tools, exist_ok=True)
    shutil.copy(os.path.join(ROOT, "tests", "hf", "transformers_check.py"), tools)
    names = imported_models()
    pairs, record = [], {}
    for name in names:
        src = os.path.join(DATA, name)
        out = export(a.bin_dir, src, scratch, name)
        refs = os.path.join(scratch, "refs", name)
        os.makedirs(refs, exist_ok=True)
        shutil.copy(os.path.join(src, "transformers_logits.json"), refs)
        pairs.append(f"--pair {out} {refs}/transformers_logits.json")
        record[name] = {"source_files": files_of(src), "export_files": files_of(out)}
    rows_path = os.path.join(scratch, "rows.json")
    printed = in_chroot(f"python {tools}/transformers_check.py --tolerance 0 --json {rows_path} " + " ".join(pairs))
    rows = json.load(open(rows_path))
    reader = next((line for line in printed.splitlines() if line.startswith("transformers ")), "")
    for name, row in zip(names, rows):
        record[name].update(reader=reader, **{k: row[k] for k in ("class", "dtype", "loading_problems", "max_abs_diff", "ok")})
    with open(os.path.join(DATA, "checks.json"), "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {os.path.join(DATA, 'checks.json')}")


if __name__ == "__main__":
    main()
