"""Issue 42's ucp-reshard rows, each a check on real checkpoints (../shared/real-deepspeed, ../shared/real-dcp,
tests/data/real-moe), each named after its finding, each failing on the build that had the finding:

  issue42_reshard.py FINDING UCP_BIN_DIR CASES_DIR WORK

FINDING is one of:
  force_foreign     (row 2) --force on an output training has since written into (a global_step8 of its
                    own, `latest` pointing at it) refuses naming them and leaves the folder as it was;
                    --force still replaces what ucp-reshard itself wrote.
  model_config_trust (row 5) a DCP export says, in one line, which facts it takes on trust from
                    --model-config (the head count among them), whatever their values.
  h5_flipped        (row 9) a flipped byte in atoms.h5 (in its metadata at offset 600, or in a dataset):
                    ucp-reshard (a DeepSpeed layout, and --format hf) refuses naming the file, with no
                    HDF5 error stack and nothing written.
  failed_cleanup    (row 10) a reshard refused on a damaged atom leaves nothing that looks like a start: no
                    claim file, no empty tag folder; an -o folder that was there before stays.
  planner_sp_reason (row 12) --gpus 4 --dp 1 --tp 2 picks sp=2 because the degrees given leave it, not
                    because of activations, and says that Ulysses SP changes the training job.
  moe_scale         (row 13) an expert-parallel change says which expert moments were scaled and by how
                    much (the factors the files show, read back), and the summary shows ep.
  force_keeps_on_damage (newcomer trial) --force over a complete reshard from a .pt atomic checkpoint with
                    a damaged atom: refused before the claim clears anything; the old output as it was.
  universal_from_atomic (row 17) ucp-convert --from-atomic on DeepSpeed's own universal folder says what it
                    is and what reads it.
"""
import glob
import json
import os
import shutil
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ds_stubs  # noqa: E402,F401
from checklist import check, finish  # noqa: E402
from damage import flip, flip_in_record, tree_digest  # noqa: E402
from refusal import refusal_problems  # noqa: E402

finding, bindir, cases, work = sys.argv[1:5]
CONVERT, RESHARD = (os.path.join(bindir, t) for t in ("ucp-convert", "ucp-reshard"))
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data")
DCP_CASES = os.path.join(cases, "..", "..", "real-dcp", "cases")
LAYOUT = ["--dp", "2", "--tp", "1", "--pp", "1", "--zero-stage", "1"]


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


def refused(label, p, must, code=1):
    bad = refusal_problems(p, must, code)
    check(label, not bad, "; ".join(bad) + " | " + (p.stdout + p.stderr).strip()[-600:])


def copy_ckpt(src, where):
    """A writable copy of a real checkpoint folder, without the universal folders made from it."""
    dst = os.path.join(work, where)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*_universal", "latest_universal"))
    return dst


def convert(src, out, *flags):
    p = run([CONVERT, src, "-o", out, "-q"] + list(flags))
    if p.returncode != 0:
        sys.exit(f"ucp-convert {src}: exit {p.returncode}: {p.stderr[-800:]}")
    return out


def real_atomic(case, *flags):
    return convert(copy_ckpt(os.path.join(cases, case, "ckpt"), case), os.path.join(work, case + "_atomic"), *flags)


shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)

if finding == "force_foreign":
    atomic = real_atomic("zero1_dp4_fp32")
    out = os.path.join(work, "R")
    p = run([RESHARD, atomic, "-o", out, "-q"] + LAYOUT)
    check("force_foreign: first reshard", p.returncode == 0, p.stderr[-400:])
    # Training resumed from R and saved step 8 there (the real files of a save, renamed), pointing latest at it.
    shutil.copytree(os.path.join(cases, "zero1_dp4_fp32", "ckpt", "global_step6"), os.path.join(out, "global_step8"))
    for name, text in (("latest", "global_step8"), ("latest_checkpointed_iteration.txt", "8")):
        with open(os.path.join(out, name), "w") as f:
            f.write(text)
    before = tree_digest(out)
    p = run([RESHARD, atomic, "-o", out, "--force", "--dp", "4", "--tp", "1", "--pp", "1", "--zero-stage", "1"])
    refused("force_foreign: --force refuses training's own step", p, [out, "global_step8", "--force"])
    check("force_foreign: nothing removed or rewritten", tree_digest(out) == before)
    # Only `latest` repointed at a tag ucp did not write: refused too.
    shutil.rmtree(os.path.join(out, "global_step8"))
    before = tree_digest(out)
    p = run([RESHARD, atomic, "-o", out, "--force"] + LAYOUT)
    refused("force_foreign: --force refuses a latest naming a tag ucp did not write", p, ["latest", "global_step8"])
    check("force_foreign: latest left as it was", tree_digest(out) == before)
    # What ucp-reshard wrote itself is still replaced by --force, whole: another layout, then the HF export.
    with open(os.path.join(out, "latest"), "w") as f:
        f.write("global_step6")
    p = run([RESHARD, atomic, "-o", out, "--force", "-q", "--dp", "4", "--tp", "1", "--pp", "1", "--zero-stage", "2"])
    files = sorted(os.listdir(os.path.join(out, "global_step6"))) if p.returncode == 0 else []
    check("force_foreign: --force replaces ucp-reshard's own output", p.returncode == 0 and
          sum(f.endswith("optim_states.pt") for f in files) == 4 and open(os.path.join(out, "latest")).read() == "global_step6",
          p.stderr[-400:])
    leftover = os.path.join(out, "zero_to_fp32.py")  # what DeepSpeed copies beside its checkpoints
    shutil.copy(os.path.join(cases, "zero1_dp4_fp32", "ckpt", "latest"), leftover)
    p = run([RESHARD, atomic, "-o", out, "--force"] + LAYOUT)
    refused("force_foreign: --force refuses a file it did not write", p, ["zero_to_fp32.py"])
    check("force_foreign: the foreign file stays", os.path.exists(leftover))

elif finding == "model_config_trust":
    case = "tp2"
    src = copy_ckpt(os.path.join(DCP_CASES, case, "checkpoint"), case)
    atomic = convert(src, os.path.join(work, "atomic"))
    config = json.load(open(os.path.join(DATA, "hf", "dcp_" + case, "model_config.json")))
    for heads in (config["num_attention_heads"], 8):  # the right head count and a wrong one: both said as on trust
        given = dict(config, num_attention_heads=heads)
        path = os.path.join(work, f"config_{heads}.json")
        json.dump(given, open(path, "w"))
        p = run([RESHARD, atomic, "-o", os.path.join(work, f"hf_{heads}"), "--format", "hf", "--model-config", path])
        trust = [line for line in p.stderr.splitlines() if "on trust" in line]
        check(f"model_config_trust heads={heads}: export written", p.returncode == 0, p.stderr[-400:])
        check(f"model_config_trust heads={heads}: one line names every fact taken on trust, with its value",
              len(trust) == 1 and "--model-config" in trust[0] and
              all(f"{k} {json.dumps(v)}" in trust[0] or f"{k} {v}" in trust[0] for k, v in given.items()),
              f"{trust} | {p.stderr[-600:]}")
        written = json.load(open(os.path.join(work, f"hf_{heads}", "config.json"))) if p.returncode == 0 else {}
        check(f"model_config_trust heads={heads}: config.json has the head count given", written.get("num_attention_heads") == heads)

elif finding == "h5_flipped":
    atomic = real_atomic("llama_tp2_dp2_zero1_fp32", "--format", "hdf5")
    size = os.path.getsize(os.path.join(atomic, "atoms.h5"))
    for label, offset in (("metadata byte 600", 600), ("a dataset's byte", size * 2 // 3)):
        damaged = os.path.join(work, "damaged")
        shutil.rmtree(damaged, ignore_errors=True)
        shutil.copytree(atomic, damaged)
        flip(os.path.join(damaged, "atoms.h5"), offset)
        for fmt, flags, marker in (("deepspeed", LAYOUT, "latest"), ("hf", ["--format", "hf"], "model.safetensors.index.json")):
            out = os.path.join(work, "out_" + fmt)
            shutil.rmtree(out, ignore_errors=True)
            p = run([RESHARD, damaged, "-o", out] + flags)
            refused(f"h5_flipped {label}, {fmt}: refused naming atoms.h5", p, [os.path.join(damaged, "atoms.h5"), "XXH64"])
            check(f"h5_flipped {label}, {fmt}: no HDF5 error stack", "HDF5-DIAG" not in p.stderr and "H5D" not in p.stderr,
                  p.stderr[-600:])
            check(f"h5_flipped {label}, {fmt}: nothing committed", not os.path.exists(os.path.join(out, marker)))
    p = run([RESHARD, atomic, "-o", os.path.join(work, "clean"), "-q"] + LAYOUT)
    check("h5_flipped: the intact file reshards", p.returncode == 0, p.stderr[-400:])

elif finding == "failed_cleanup":
    atomic = real_atomic("llama_tp2_dp2_zero1_fp32")
    victim = "language_model.encoder.layers.1.mlp.dense_4h_to_h.weight"
    flip_in_record(os.path.join(atomic, "zero", victim, "fp32.pt"))
    for fmt, flags in (("deepspeed", LAYOUT), ("hf", ["--format", "hf"])):
        out = os.path.join(work, "new_" + fmt)  # not there before: not there after
        p = run([RESHARD, atomic, "-o", out] + flags)
        refused(f"failed_cleanup {fmt}: the damaged atom is refused", p, [victim, "fp32"])
        check(f"failed_cleanup {fmt}: the folder it made is gone", not os.path.exists(out),
              str(sorted(os.listdir(out))) if os.path.isdir(out) else "")
        out = os.path.join(work, "empty_" + fmt)  # there before, empty: stays, empty
        os.makedirs(out)
        p = run([RESHARD, atomic, "-o", out] + flags)
        check(f"failed_cleanup {fmt}: refused into an empty folder", p.returncode == 1, p.stderr[-300:])
        check(f"failed_cleanup {fmt}: the empty folder stays, empty", os.path.isdir(out) and os.listdir(out) == [],
              str(os.listdir(out)) if os.path.isdir(out) else "gone")

elif finding == "planner_sp_reason":
    atomic = real_atomic("zero1_dp4_fp32")
    cmd = [RESHARD, atomic, "--gpus", "4", "--dp", "1", "--tp", "2", "--plan-only"]
    p, pj = run(cmd), run(cmd + ["--json"])
    plan = json.loads(pj.stdout) if pj.returncode == 0 else {}
    chosen = plan.get("chosen") or {}
    check("planner_sp_reason: sp=2 chosen", chosen.get("sp") == 2 and p.returncode == 0, p.stdout[-600:] + p.stderr[-300:])
    # The truth the reason must tell: no candidate of the chosen tp and pp with less SP exists at all.
    less = [c for c in plan.get("candidates", []) + plan.get("refused", [])
            if c["layout"]["tp"] == chosen.get("tp") and c["layout"]["pp"] == chosen.get("pp") and c["layout"].get("sp", 1) < 2]
    check("planner_sp_reason: the degrees given leave no smaller SP", not less, str(less))
    for label, text in (("text", p.stdout), ("json", plan.get("reason", ""))):
        check(f"planner_sp_reason {label}: not blamed on activations", "activations do not fit" not in text, text[-400:])
        check(f"planner_sp_reason {label}: the degrees given named", "dp=1 tp=2" in text and "given" in text, text[-400:])
    check("planner_sp_reason: says SP changes the training job", "Ulysses" in p.stdout and "sp=2" in p.stdout and
          "training job" in p.stdout, p.stdout[-600:])

elif finding == "moe_scale":
    case = os.path.join(DATA, "real-moe", "moe_ep2_dp2_zero2_top1_fp32")  # DeepSpeed 0.14.5: expert gradients scale with ep
    atomic = convert(copy_ckpt(os.path.join(case, "ckpt"), "moe"), os.path.join(work, "atomic"))
    out = os.path.join(work, "ep1")
    p = run([RESHARD, atomic, "-o", out, "--dp", "2", "--tp", "1", "--pp", "1", "--zero-stage", "2", "--ep", "1"])
    check("moe_scale: resharded to ep=1", p.returncode == 0, p.stderr[-600:])
    back = convert(out, os.path.join(work, "ep1_atomic"))
    # The factors the files show: an expert's moments in the new layout over the atomic checkpoint's.
    factors = {}
    for name in sorted(os.listdir(os.path.join(atomic, "zero"))):
        if ".experts." not in name and "deepspeed_experts" not in name:
            continue
        for state in ("exp_avg", "exp_avg_sq"):
            a = torch.load(os.path.join(atomic, "zero", name, state + ".pt"))["param"]
            b = torch.load(os.path.join(back, "zero", name, state + ".pt"))["param"]
            nz = a != 0
            if nz.any():
                factors.setdefault(state, set()).add(round((b[nz] / a[nz]).mean().item(), 4))
    check("moe_scale: the files show one factor per moment", set(factors) == {"exp_avg", "exp_avg_sq"} and
          all(len(v) == 1 for v in factors.values()), str(factors))
    said = [line for line in p.stderr.splitlines() if "exp_avg" in line]
    fa, fs = (next(iter(factors.get(s, {0}))) for s in ("exp_avg", "exp_avg_sq"))
    check("moe_scale: one line says both factors the files show", len(said) == 1 and f"x{fa:g}" in said[0] and
          f"x{fs:g}" in said[0] and "exp_avg_sq" in said[0], f"{factors} {said}")
    summary = next((line for line in p.stderr.splitlines() if "parameters, from" in line), "")
    check("moe_scale: the summary shows ep on both sides", "ep=2" in summary.split(" to ")[0] and "ep=1" in summary.split(" to ")[-1],
          summary)

elif finding == "universal_from_atomic":
    src = os.path.join(cases, "zero1_dp4_fp32", "ckpt")
    universal = os.path.join(work, "global_step6_universal")
    shutil.copytree(os.path.join(src, "global_step6_universal"), universal)
    p = run([CONVERT, "--from-atomic", universal, "-o", os.path.join(work, "X")])
    refused("universal_from_atomic: says what the folder is and what reads it", p,
            [universal, "ds_to_universal.py", "ucp-reshard " + universal])
    check("universal_from_atomic: not the bare missing-manifest error", "cannot open" not in p.stderr, p.stderr[-400:])
    check("universal_from_atomic: nothing written", not os.path.exists(os.path.join(work, "X", "ucp_manifest.json")))

elif finding == "force_keeps_on_damage":
    # --force over a complete reshard from a .pt atomic checkpoint with a damaged atom: refused before
    # the claim clears anything, the old output byte for byte as it was (newcomer trial).
    atomic = real_atomic("zero1_dp4_fp32")
    out = os.path.join(work, "R")
    p = run([RESHARD, atomic, "-o", out, "-q"] + LAYOUT)
    check("force_keeps_on_damage: first reshard", p.returncode == 0, p.stderr[-400:])
    before = tree_digest(out)
    atom = sorted(glob.glob(os.path.join(atomic, "zero", "*", "exp_avg.pt")))[0]
    flip_in_record(atom)
    p = run([RESHARD, atomic, "-o", out, "--force", "-q"] + LAYOUT)
    refused("force_keeps_on_damage: the damaged atom refused", p, [os.path.relpath(atom, atomic), "nothing of it was changed"])
    check("force_keeps_on_damage: the old output kept", tree_digest(out) == before)

else:
    sys.exit(f"unknown finding {finding}")

finish(f"issue42r_{finding}")
