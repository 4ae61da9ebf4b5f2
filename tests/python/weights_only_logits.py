"""What real DeepSpeed 0.19.5 showed on ucp's output from a weights-only atomic checkpoint
(tests/data/weights-only/logits.json, written by scripts/weights_only_logits.py in the trixie chroot, which
CI has not), and that ucp still writes the bytes DeepSpeed read then:

    weights_only_logits.py BIN_DIR CASE_DIR WORK LOGITS_JSON

- the record: every row's logits within 1e-5 of the real case's own (DeepSpeed at the case's layout), the
  training row's losses finite and falling, the reference's files the case's (sha256);
- ucp now: the case converted, made weights-only (weights_only.py), resharded with each row's arguments:
  every file of the written tag has the sha256 DeepSpeed read.
"""
import json
import math
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from harness_logits import files_differing, sha256_of  # noqa: E402  (the record's own hash of a tag's files)
from checklist import check, finish, tool_runner  # noqa: E402
from weights_only import make_weights_only  # noqa: E402

bindir, case, work, record_path = sys.argv[1:5]
run = tool_runner(bindir)
record = json.load(open(record_path))


def check_record():
    tag = open(os.path.join(case, "ckpt", "latest")).read().strip()
    check("reference: the case's own files", record["reference"]["ckpt_sha256"] == sha256_of(os.path.join(case, "ckpt", tag)))
    for name, row in record["rows"].items():
        check(f"{name}: logits within 1e-5 of the case's", row["max_abs_diff_logits"] <= 1e-5, str(row["max_abs_diff_logits"]))
        losses = row["losses"]
        if losses:
            check(f"{name}: trains on (losses finite, falling)", all(math.isfinite(x) for x in losses) and
                  all(b < a for a, b in zip(losses, losses[1:])), str(losses))
    check("a row trains on", any(r["losses"] for r in record["rows"].values()))


def check_bytes():
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    atomic, wo = os.path.join(work, "atomic"), os.path.join(work, "weights-only")
    r = run("ucp-convert", [os.path.join(case, "ckpt"), "-o", atomic, "-q"])
    check("convert the case", r.returncode == 0, r.stderr[-600:])
    make_weights_only(atomic, wo)
    config = os.path.join(work, "ds_config.json")
    json.dump(record["optimizer_config"], open(config, "w"))
    for name, row in record["rows"].items():
        out = os.path.join(work, name)
        args = [config if a == "CONFIG" else a for a in row["reshard_args"]]
        r = run("ucp-reshard", [wo, "-o", out, "-q"] + args)
        check(f"{name}: resharded", r.returncode == 0, r.stderr[-600:])
        if r.returncode != 0:
            continue
        differ, n = files_differing(out, row["ckpt_sha256"])
        check(f"{name}: the bytes DeepSpeed read ({n} files)", not differ, str(differ))


check_record()
check_bytes()
finish("weights_only_logits")
