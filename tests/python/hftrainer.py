"""A Hugging Face Trainer checkpoint (transformers + accelerate + DeepSpeed ZeRO, real files) through ucp.

    hftrainer.py BIN_DIR CASE_DIR WORK RECORD MPIEXEC

CASE_DIR holds checkpoint-4/ as Trainer wrote it and case.json (shared/real-hftrainer/cases,
tests/data/real-hftrainer). RECORD is tests/data/real-hftrainer/resumes.json (scripts/trainer_resume.py):
the real Trainer resumed from ucp's output for each target layout, with the sha256 of every file it read.
Checked against independent ground truth:
- the same layout written back equals Trainer's own files: every global_step4 file value for value
  (compare_shards: tensors byte for byte, layout-defining values exactly), Trainer's files byte for byte;
- every recorded target is written byte-identical to the bytes the real Trainer resumed from, and that
  resume's losses (steps 5-8) were within 1e-5 of the uninterrupted run's: the recorded resume holds of
  this build (2 ranks write the same bytes as 1); bf16 within 1.5x DeepSpeed's own universal resume there (a stage change: 1.5x what the target layout's own
  uninterrupted run differs by);
- a target at another ZeRO stage converted back gives the first conversion's tensors bit for bit;
- --format hf: zero_to_fp32.py's tensors bit for bit (--dtype fp32), and by default (the job's dtype)
  Trainer's own model.safetensors bit for bit, where it wrote one;
- RNG files by the documented rule; no Megatron iteration file; `latest` names the tag;
- refused by name: TP or PP changes (no layer structure known), a folder whose Trainer files disagree
  with DeepSpeed's (a missing rng_state file, trainer_state.json of another step);
- --in-place --gpus on a copy: the new tag equals the -o output's, the new ranks' RNG files added,
  nothing of the folder changed.
"""
import hashlib
import json
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ds_stubs  # noqa: E402,F401
from atomic_files import atomic_tensor, same_bytes  # noqa: E402
from checklist import check, finish, fresh_folder, tool_runner  # noqa: E402
from compare_shards import compare_roots  # noqa: E402
from safetensors_reader import read_model_folder as tensors  # noqa: E402

BIN, CASE_DIR, WORK, RECORD, MPIEXEC = sys.argv[1:6]
run = tool_runner(BIN, MPIEXEC)
CASE = json.load(open(os.path.join(CASE_DIR, "case.json")))
NAME, WORLD, STAGE = CASE["case"], CASE["world_size"], CASE["zero_stage"]
SRC = os.path.join(CASE_DIR, "checkpoint-4")
fresh_folder(WORK)


def sha(p):
    return hashlib.sha256(open(p, "rb").read()).hexdigest()


def tree(d):
    out = {}
    for root, dirs, files in os.walk(d):
        dirs[:] = [x for x in dirs if not x.startswith(".ucp")]
        for f in files:
            if not f.startswith(".ucp"):
                out[os.path.relpath(os.path.join(root, f), d)] = sha(os.path.join(root, f))
    return out


def reshard(atomic, out, dp, stage, ranks=1, extra=()):
    return run("ucp-reshard", [atomic, "-o", out, "--dp", str(dp), "--tp", "1", "--pp", "1", "--zero-stage", str(stage), *extra],
               ranks=ranks)


def writable_copy(src, dst):
    """A copy of `src` the test may change (the cases' files are read-only)."""
    shutil.copytree(src, dst)
    for root, dirs, files in os.walk(dst):
        for x in dirs:
            os.chmod(os.path.join(root, x), 0o755)
        for x in files:
            os.chmod(os.path.join(root, x), 0o644)
    os.chmod(dst, 0o755)


def rng_name(rank, world):
    return "rng_state.pth" if world == 1 else f"rng_state_{rank}.pth"


# --- the conversion: the job's files carried, checked -------------------------------------------------
atomic = os.path.join(WORK, "atomic")
r = run("ucp-convert", [SRC, "-o", atomic], ranks=2)
check("convert", r.returncode == 0, r.stderr[-2000:])
manifest = json.load(open(os.path.join(atomic, "ucp_manifest.json")))
job = manifest["source"].get("job", {})
listed = sorted(f for f in os.listdir(SRC) if os.path.isfile(os.path.join(SRC, f)) and f != "latest")
weights = [f for f in listed if f.endswith(".safetensors")]
check("manifest: a Trainer job, its files carried, the weights copy not",
      job.get("kind") == "hf-trainer" and job.get("files") == [f for f in listed if f not in weights] and
      job.get("weights_not_carried") == weights and job.get("rng_world") == WORLD and job.get("global_step") == 4, json.dumps(job))
check("carried files byte for byte", all(sha(os.path.join(atomic, "job", f)) == sha(os.path.join(SRC, f)) for f in job.get("files", [])))
# The tag folder given itself: the Trainer folder around it (its latest names it) is the job's all the same.
tag_only = os.path.join(WORK, "tag_only")
r = run("ucp-convert", [os.path.join(SRC, "global_step4"), "-o", tag_only])
check("convert of global_step4 itself: the Trainer files around it carried too", r.returncode == 0 and
      json.load(open(os.path.join(tag_only, "ucp_manifest.json")))["source"].get("job") == job, r.stderr[-800:])
r = run("ucp-inspect", ["--verify", atomic])
check("inspect --verify", r.returncode == 0, r.stdout[-800:] + r.stderr[-800:])

# --- the same layout: Trainer's own files back --------------------------------------------------------
same = os.path.join(WORK, "same", "checkpoint-4")
r = reshard(atomic, same, WORLD, STAGE)
check("reshard to its own layout", r.returncode == 0, r.stderr[-1500:])
found, compared = compare_roots(SRC, same)
check(f"own layout: {compared} DeepSpeed files equal Trainer's", compared > 0 and not found, "\n".join(found[:10]))
check("own layout: Trainer's files byte for byte",
      all(sha(os.path.join(same, f)) == sha(os.path.join(SRC, f)) for f in job.get("files", [])))
check("own layout: latest names global_step4, no Megatron iteration file",
      open(os.path.join(same, "latest")).read().strip() == "global_step4" and
      not os.path.exists(os.path.join(same, "latest_checkpointed_iteration.txt")))

# --- the targets the real Trainer resumed from ----------------------------------------------------------
record = json.load(open(RECORD)).get(NAME, {})
check("record: this case's resumes are recorded", len(record) >= 5, f"{len(record)} targets in {RECORD}")
ref = CASE["steps"]["full"]["losses"]
for key, rec in sorted(record.items()):
    dp, stage = (int(x) for x in key[2:].split("_z"))
    out = os.path.join(WORK, key, "checkpoint-4")
    r = reshard(atomic, out, dp, stage, ranks=2 if key == sorted(record)[0] else 1)
    check(f"{key}: written", r.returncode == 0, r.stderr[-1500:])
    got = tree(out)
    check(f"{key}: byte-identical to what the real Trainer resumed from", got == rec["files"],
          f"differ: {sorted(k for k in set(got) | set(rec['files']) if got.get(k) != rec['files'].get(k))[:6]}")
    # The bound: the same layout resumes exactly; another one within 1e-5 in fp32, and in bf16 (whose
    # reduction order changes with the world) within 1.5x DeepSpeed's own universal resume there.
    universal = ((CASE["steps"].get(f"resume_univ_w{dp}") or {}).get("vs_full") or {}).get("max_abs_diff")
    # (a change of ZeRO stage has no universal resume to set beside it: the target layout's own
    # uninterrupted run, recorded as layout_noise, says what bf16 differs by there)
    noise = max(universal or 0, rec.get("layout_noise") or 0)
    bound = 0.0 if (dp, stage) == (WORLD, STAGE) else 1e-5 if CASE["dtype"] == "fp32" else max(1e-5, 1.5 * noise)
    diffs = [abs(x - ref[str(s)]) for s, x in zip(range(5, 9), rec["losses_5_8"])] if rec["rc"] == 0 else [float("inf")]
    check(f"{key}: the real Trainer resumed, steps 5-8 within {bound:.1e} of the uninterrupted run", max(diffs) <= bound,
          f"rc {rec['rc']}, diffs {diffs}, {rec.get('error')}")
    for rank in range(dp):  # the RNG rule: own file where the rank existed, else rank r mod the old world's
        mine, theirs = os.path.join(out, rng_name(rank, dp)), os.path.join(SRC, rng_name(rank % WORLD, WORLD))
        check(f"{key}: {rng_name(rank, dp)} is {rng_name(rank % WORLD, WORLD)}", os.path.exists(mine) and sha(mine) == sha(theirs))
    if stage != STAGE and dp == WORLD:  # another ZeRO stage, converted back: the same tensors
        back = os.path.join(WORK, key, "back")
        r = run("ucp-convert", [out, "-o", back])
        check(f"{key}: converts back", r.returncode == 0, r.stderr[-1500:])
        if r.returncode == 0:
            bad = []
            for p in manifest["params"]:
                for state in ("fp32", "exp_avg", "exp_avg_sq"):
                    a = atomic_tensor(torch.load(os.path.join(atomic, "zero", p["name"], state + ".pt")), p["shape"])
                    b = atomic_tensor(torch.load(os.path.join(back, "zero", p["name"], state + ".pt")), p["shape"])
                    if not same_bytes(a, b):
                        bad.append(f"{p['name']}/{state}")
            check(f"{key}: converted back, every tensor bit for bit", not bad, str(bad[:5]))

# --- checkpoint-4 itself given to ucp-reshard -o: converted in a scratch folder, the same bytes ---------
if record:
    key = sorted(record)[-1]
    dp, stage = (int(x) for x in key[2:].split("_z"))
    out = os.path.join(WORK, "from_root", "checkpoint-4")
    r = run("ucp-reshard", [SRC, "-o", out, "--gpus" if stage == STAGE else "--dp", str(dp), *([] if stage == STAGE else
            ["--tp", "1", "--pp", "1", "--zero-stage", str(stage)])])
    check(f"from checkpoint-4 itself ({key}): the bytes the real Trainer resumed from, no scratch left",
          r.returncode == 0 and tree(out) == record[key]["files"] and not os.path.exists(os.path.join(out, ".ucp-scratch-atomic")),
          r.stderr[-1500:])

# --- the Hugging Face export: zero_to_fp32.py's tensors, and Trainer's own model.safetensors -------------
z2f = os.path.join(CASE_DIR, "zero_to_fp32")
if os.path.isdir(z2f):
    out = os.path.join(WORK, "hf_fp32")
    r = run("ucp-reshard", [atomic, "-o", out, "--format", "hf", "--dtype", "fp32"])
    ours, theirs = (tensors(out), tensors(z2f)) if r.returncode == 0 else ({}, {})
    check("--format hf --dtype fp32: zero_to_fp32.py's tensors bit for bit", r.returncode == 0 and sorted(ours) == sorted(theirs) and
          all(same_bytes(ours[k], theirs[k]) for k in theirs), r.stderr[-800:])
if weights:  # Trainer's own save_pretrained of the model, in the job's dtype
    out = os.path.join(WORK, "hf_job_dtype")
    r = run("ucp-reshard", [atomic, "-o", out, "--format", "hf"])
    ours, theirs = (tensors(out), tensors(SRC)) if r.returncode == 0 else ({}, {})
    check(f"--format hf: Trainer's own {weights[0]} bit for bit ({CASE['dtype']})", r.returncode == 0 and
          sorted(ours) == sorted(theirs) and all(same_bytes(ours[k], theirs[k]) for k in theirs), r.stderr[-800:])

# --- refused by name ----------------------------------------------------------------------------------
for flags, expect in ((["--dp", "1", "--tp", "2", "--pp", "1"], "tp=2"), (["--dp", "1", "--tp", "1", "--pp", "2"], "pp=2")):
    out = os.path.join(WORK, "refused", flags[3] + flags[5])
    r = run("ucp-reshard", [atomic, "-o", out, *flags, "--zero-stage", "1"])
    check(f"refused: {expect}", r.returncode == 1 and expect in r.stderr and "carry their own names" in r.stderr and
          not os.path.exists(out), r.stderr[-600:])


def damaged(label, mutate, expect):
    d = os.path.join(WORK, "damaged", label)
    writable_copy(SRC, d)
    mutate(d)
    r = run("ucp-convert", [d, "-o", d + ".atomic"])
    check(f"refused: {label}", r.returncode == 1 and all(e in r.stderr for e in expect) and
          not os.path.exists(d + ".atomic/ucp_manifest.json"), r.stderr[-800:])
    return d


missing = damaged("missing_rng", lambda d: os.remove(os.path.join(d, rng_name(WORLD - 1, WORLD))),
                  ["Trainer's RNG files", "missing " + rng_name(WORLD - 1, WORLD)])
# --no-strict (ucp-reshard's conversion from the root): written, the RNG file it lacks said, not invented.
out = os.path.join(WORK, "no_strict", "checkpoint-4")
r = run("ucp-reshard", [missing, "-o", out, "--dp", str(WORLD), "--tp", "1", "--pp", "1", "--zero-stage", str(STAGE), "--no-strict"])
check("--no-strict: written without the RNG file the source lacks, said", r.returncode == 0 and "not written" in r.stderr and
      not os.path.exists(os.path.join(out, rng_name(WORLD - 1, WORLD))) and os.path.exists(os.path.join(out, "latest")), r.stderr[-800:])


def other_step(d):
    p = os.path.join(d, "trainer_state.json")
    s = json.load(open(p))
    s["global_step"] = 8
    json.dump(s, open(p, "w"))


damaged("other_step", other_step, ["trainer_state.json: global_step is 8", "global_steps 4"])

# --- in place, on a copy of the folder ---------------------------------------------------------------
folder = os.path.join(WORK, "in_place", "checkpoint-4")
writable_copy(SRC, folder)
before = tree(folder)
to = 4 if WORLD != 4 else 2
r = run("ucp-reshard", [folder, "--in-place", "--gpus", str(to)])
check("in place: done", r.returncode == 0, r.stderr[-1500:])
tag = open(os.path.join(folder, "latest")).read().strip()
after = tree(folder)
check("in place: nothing of the folder changed but latest",
      all(after.get(k) == v for k, v in before.items() if k != "latest"), str([k for k, v in before.items() if after.get(k) != v]))
check("in place: every new process has its RNG file",
      all(os.path.exists(os.path.join(folder, rng_name(k, to))) for k in range(to)))
key = f"dp{to}_z{STAGE}"
if key in record:
    step = {k[len(tag) + 1:]: v for k, v in after.items() if k.startswith(tag + "/") and not k.endswith("ucp_reshard.json")}
    want = {k[len("global_step4/"):]: v for k, v in record[key]["files"].items() if k.startswith("global_step4/")}
    check(f"in place: {tag} holds the bytes the real Trainer resumed from ({key})", step == want, f"{sorted(step)} vs {sorted(want)}")
finish(f"hftrainer {NAME}")
