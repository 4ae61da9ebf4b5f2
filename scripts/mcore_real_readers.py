#!/usr/bin/python3
"""Issue 52's check with a real reader: transformers loads ucp's Hugging Face export of each real
Megatron-Core case that recorded Megatron's own logits (tests/data/real-mcore/<case>/megatron_logits.json)
and computes the logits of the same ids. Run from the HOST as root after a build, with the Debian trixie
chroot /work/oracle-hf/trixie set up (transformers 5.3.0 in /opt/hf/venv: ../shared/real-readers/transformers):

    scripts/mcore_real_readers.py BUILD_DIR [--out tests/data/real-mcore/transformers_readers.json]

For each case: ucp-convert of checkpoint/ (2 ranks), ucp-reshard --format hf; the export copied into the
chroot; transformers' from_pretrained (output_loading_info: missing, unexpected, mismatched keys) and its
logits against Megatron's. The record keeps the sha256 of every file transformers read, so that a test
(hf_mcore) can tell that ucp still writes exactly those bytes.
"""
import argparse
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CHROOT = "/work/oracle-hf/trixie"
CASES = os.path.join(ROOT, "tests", "data", "real-mcore")
INNER = r'''
import json, sys, torch, transformers
from transformers import AutoModelForCausalLM
folder, ref_path = sys.argv[1:3]
ref = json.load(open(ref_path))
model, info = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
model.eval()
with torch.no_grad():
    logits = model(torch.tensor(ref["ids"])).logits
problems = {k: [str(x) for x in v] for k, v in info.items() if v}
print(json.dumps({"transformers": transformers.__version__, "torch": torch.__version__, "class": type(model).__name__,
                  "tie_word_embeddings": model.config.tie_word_embeddings,
                  "activation_function": getattr(model.config, "activation_function", None),
                  "loading_problems": problems or None,
                  "max_abs_diff": (logits - torch.tensor(ref["logits"])).abs().max().item()}))
'''


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("build")
    p.add_argument("--out", default=os.path.join(CASES, "transformers_readers.json"))
    a = p.parse_args()
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    bin_dir = os.path.join(a.build, "apps")
    scratch = os.path.join(CHROOT, "tmp", "mcore_readers")
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    open(os.path.join(scratch, "inner.py"), "w").write(INNER)
    record = {"what": "transformers' from_pretrained and logits of ucp-reshard --format hf of real Megatron-Core "
                      "checkpoints (scripts/mcore_real_readers.py), against Megatron-Core's own logits", "cases": {}}
    for case in sorted(os.listdir(CASES)):
        if not os.path.exists(os.path.join(CASES, case, "megatron_logits.json")):
            continue
        work = os.path.join(scratch, case)
        atomic, hf = os.path.join(work, "atomic"), os.path.join(work, "hf")
        subprocess.run(["mpirun", "--oversubscribe", "-np", "2", os.path.join(bin_dir, "ucp-convert"),
                        os.path.join(CASES, case, "checkpoint"), "-o", atomic, "-q"], check=True, env=env)
        r = subprocess.run([os.path.join(bin_dir, "ucp-reshard"), atomic, "-o", hf, "--format", "hf"], env=env,
                           capture_output=True, text=True)
        entry = {"notes": [line.split("note: ", 1)[1] for line in r.stderr.splitlines() if "note: " in line]}
        if r.returncode != 0:
            entry["refused"] = r.stderr.strip()
        else:
            shutil.copy(os.path.join(CASES, case, "megatron_logits.json"), os.path.join(work, "megatron_logits.json"))
            entry["files"] = {os.path.basename(f): sha256(f) for f in sorted(glob.glob(os.path.join(hf, "*")))}
            inner = subprocess.run(["chroot", CHROOT, "bash", "-c", ". /opt/hf/hfenv.sh; cd /tmp; python3 /tmp/mcore_readers/inner.py "
                                    f"/tmp/mcore_readers/{case}/hf /tmp/mcore_readers/{case}/megatron_logits.json"],
                                   capture_output=True, text=True)
            if inner.returncode != 0:
                entry["reader_failed"] = inner.stderr.strip()[-2000:]
            else:
                entry.update(json.loads(inner.stdout.strip().splitlines()[-1]))
        record["cases"][case] = entry
        print(case, json.dumps({k: v for k, v in entry.items() if k != "files"}))
    with open(a.out, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
