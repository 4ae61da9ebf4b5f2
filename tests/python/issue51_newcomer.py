"""Issue 51's rows (what a newcomer tripped on), each a check on real files: the Trainer checkpoints
transformers + DeepSpeed 0.19.5 wrote (../shared/real-hftrainer), the Hugging Face models transformers
saved (tests/data/real-hf), and the README. Each finding failed on the build before its fix:

  issue51_newcomer.py FINDING BIN_DIR HFTRAINER_CASES REAL_HF README WORK MPIEXEC

FINDING is one of:
  second_copy      (row 1) ZeRO-3 optimizer files swapped between the DP ranks: Trainer's
                   model.safetensors, a second copy of every weight, disagrees with the masters:
                   ucp-convert, ucp-inspect --verify and ucp-reshard --format hf refuse, naming the
                   files; the files as Trainer wrote them pass, and the note says what was compared.
  tag_no_latest    (row 2) a Trainer checkpoint-N without `latest` is not read as a Hugging Face model:
                   refused naming global_step4/ and `latest`; the hint followed, it converts.
  no_trainer_state (row 3) a Trainer folder without trainer_state.json: refused by name (convert and
                   reshard), nothing written.
  ds_version       (row 4) a layout made from an import records a ds_version DeepSpeed accepts (not
                   ''), --ds-version's where given; ucp-inspect flags an empty one.
  n_inner_null     (row 5) a GPT-2 saved with n_inner null: the export gives the model's own
                   config.json and generation_config.json byte for byte, in model.safetensors.
  output_in_root   (row 6) ucp-reshard ROOT -o ROOT/new: refused, nothing written inside ROOT.
  trainer_dcp      (row 7) a Trainer checkpoint to --format dcp: one message that says what is possible.
  trainer_notes    (row 8) converting a Trainer checkpoint: no note of Megatron's sequence parallelism,
                   model families or pattern rules, which say nothing of a plain engine.
  hints_lead       (row 9) a damaged trainer_state.json: the error names it and gives no hint that
                   fails the same way when followed; `latest` naming no folder hints at no universal folder;
                   a tag folder given to --in-place names the folder holding its `latest`.
  gpus_summary     (row 10) --gpus: the summary says where the per-GPU memory comes from (--gpu-memory).
  inplace_pointer  (row 11) --in-place on a Trainer output_dir: points at the newest checkpoint-N; so do
                   ucp-convert and ucp-reshard -o (newcomer trial).
  atomic_reused    (newcomer trial) ucp-convert ROOT -o ROOT/atomic, then ucp-reshard ROOT (-o, --in-place):
                   the atomic checkpoint latest_universal names is read where it is; ucp-convert into an
                   export offers no --force, which would be refused.
  damaged_leaves   (newcomer trial) a damaged record found mid-run: --in-place leaves nothing in the
                   Trainer folder; ucp-convert says what stays in OUT and how to go on.
  misnamed_output  (newcomer trial) -o checkpoint-8 for the checkpoint of step 4: refused before writing
                   (and in a dry run), naming checkpoint-4; -o checkpoint-4 written and read back.
  plan_refuses     (newcomer trial) a dry run from a Trainer root refuses the TP change the run would, and
                   the run refuses it before converting.
  readme           (rows 12, 13) the README says --oversubscribe (and the run-as-root variables) where it
                   first shows mpirun, and that the HF round trip (README.md or docs/) needs --optimizer-config.
"""
import hashlib
import json
import os
import re
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ds_stubs  # noqa: E402,F401
from checklist import check, finish, fresh_folder, tool_runner  # noqa: E402
from safetensors_reader import read_model_folder  # noqa: E402

FINDING, BIN, CASES, REAL_HF, README, WORK, MPIEXEC = sys.argv[1:8]
run = tool_runner(BIN, MPIEXEC)
fresh_folder(WORK)


def writable(d):
    for root, dirs, files in os.walk(d):
        for n in dirs + files:
            os.chmod(os.path.join(root, n), 0o755 if n in dirs else 0o644)
    os.chmod(d, 0o755)


def copy_checkpoint(case, where="ckpt"):
    """The case's checkpoint-4, writable, as WORK/where/checkpoint-4."""
    dst = os.path.join(WORK, where, "checkpoint-4")
    shutil.copytree(os.path.join(CASES, case, "checkpoint-4"), dst)
    writable(os.path.join(WORK, where))
    return dst


def clean(r):
    return "Traceback" not in r.stderr and "terminate called" not in r.stderr and "Sanitizer" not in r.stderr


def refused(label, r, *expect):
    check(label, r.returncode != 0 and clean(r) and all(e in r.stderr for e in expect),
          f"rc {r.returncode}, expected {expect}: {r.stderr[-1500:]}")


def written(label, r):
    check(label, r.returncode == 0 and clean(r), f"rc {r.returncode}: {r.stderr[-1500:]}")


def tree_files(d):
    return sorted(os.path.relpath(os.path.join(a, f), d) for a, _, fs in os.walk(d) for f in fs) if os.path.isdir(d) else []


def second_copy():
    src = copy_checkpoint("zero3_dp2_fp32")
    tag = os.path.join(src, "global_step4")
    a, b = (os.path.join(tag, f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt") for r in (0, 1))
    os.rename(a, a + ".x"), os.rename(b, a), os.rename(a + ".x", b)
    for ranks in (1, 2):
        r = run("ucp-convert", [src, "-o", os.path.join(WORK, f"atomic{ranks}")], ranks=ranks)
        refused(f"swapped: ucp-convert on {ranks} rank(s) refuses naming model.safetensors and the optimizer files, and the fix", r,
                "model.safetensors", "zero_pp_rank_0_mp_rank_00_optim_states.pt", "swapped back")
        check(f"swapped: {ranks} rank(s): no manifest", not os.path.exists(os.path.join(WORK, f"atomic{ranks}", "ucp_manifest.json")))
    r = run("ucp-inspect", [src, "--verify"])
    refused("swapped: ucp-inspect --verify flags it", r, "model.safetensors")
    r = run("ucp-reshard", [src, "-o", os.path.join(WORK, "hf"), "--format", "hf"])
    refused("swapped: ucp-reshard --format hf refuses", r, "model.safetensors")
    check("swapped: no model written", not os.path.exists(os.path.join(WORK, "hf", "config.json")))
    # As Trainer wrote them: converted, the comparison said.
    good = os.path.join(CASES, "zero3_dp2_fp32", "checkpoint-4")
    r = run("ucp-convert", [good, "-o", os.path.join(WORK, "good")], ranks=2)
    written("as written: converted", r)
    check("as written: the note says the masters were compared with model.safetensors",
          re.search(r"model\.safetensors[^\n]*compared|compared[^\n]*model\.safetensors", r.stdout + r.stderr) is not None,
          (r.stdout + r.stderr)[-2000:])
    # Without the second copy, the note says so.
    nocopy = copy_checkpoint("zero3_dp2_fp32", "nocopy")
    os.remove(os.path.join(nocopy, "model.safetensors"))
    r = run("ucp-convert", [nocopy, "-o", os.path.join(WORK, "nocopy_atomic")])
    written("no second copy: converted", r)
    check("no second copy: the note says none exists", "no second copy" in (r.stdout + r.stderr), (r.stdout + r.stderr)[-2000:])


def tag_no_latest():
    src = copy_checkpoint("zero2_dp2_fp32")
    os.remove(os.path.join(src, "latest"))
    out = os.path.join(WORK, "atomic")
    r = run("ucp-convert", [src, "-o", out])
    refused("ucp-convert refuses a Trainer folder without latest, naming the tag and latest", r, "global_step4", "latest")
    check("nothing written", not os.path.exists(os.path.join(out, "ucp_manifest.json")))
    r = run("ucp-reshard", [src, "-o", os.path.join(WORK, "layout"), "--dp", "1", "--tp", "1", "--pp", "1", "--zero-stage", "2", "--no-optimizer"])
    refused("ucp-reshard refuses it too", r, "global_step4", "latest")
    check("ucp-reshard wrote no Megatron files", not os.path.exists(os.path.join(WORK, "layout", "latest")))
    r = run("ucp-inspect", [src])
    refused("ucp-inspect says it too", r, "global_step4")
    # The hint followed: latest restored, it converts as the Trainer checkpoint it is.
    with open(os.path.join(src, "latest"), "w") as f:
        f.write("global_step4")
    r = run("ucp-convert", [src, "-o", out])
    written("the hint followed: converted", r)
    m = json.load(open(os.path.join(out, "ucp_manifest.json"))) if r.returncode == 0 else {}
    check("as the Trainer checkpoint", m.get("source", {}).get("job", {}).get("kind") == "hf-trainer", json.dumps(m.get("source", {}))[:800])


def no_trainer_state():
    src = copy_checkpoint("zero2_dp2_fp32")
    os.remove(os.path.join(src, "trainer_state.json"))
    out = os.path.join(WORK, "atomic")
    r = run("ucp-convert", [src, "-o", out])
    refused("ucp-convert refuses, naming trainer_state.json", r, "trainer_state.json")
    check("no manifest", not os.path.exists(os.path.join(out, "ucp_manifest.json")))
    r = run("ucp-reshard", [src, "-o", os.path.join(WORK, "layout"), "--dp", "1", "--tp", "1", "--pp", "1", "--zero-stage", "2"])
    refused("ucp-reshard refuses, naming trainer_state.json", r, "trainer_state.json")
    check("no layout", not os.path.exists(os.path.join(WORK, "layout", "latest")))
    # Converted anyway (--no-strict): the layout written from it says it has no trainer_state.json (verification trial).
    written("--no-strict: converted with a warning", run("ucp-convert", [src, "-o", os.path.join(WORK, "lenient"), "--no-strict"]))
    r = run("ucp-reshard", [os.path.join(WORK, "lenient"), "-o", os.path.join(WORK, "lenient_out", "checkpoint-4"), "--gpus", "1"])
    written("--no-strict: resharded", r)
    check("--no-strict: the reshard says no trainer_state.json is written", "no trainer_state.json" in r.stderr, r.stderr[-1200:])
    # A state that reads but says no step (Trainer would start again at step 0), found by the newcomer trial.
    for label, text in (("{}", "{}"), ("without global_step", None)):
        state = json.load(open(os.path.join(CASES, "zero2_dp2_fp32", "checkpoint-4", "trainer_state.json")))
        state.pop("global_step")
        with open(os.path.join(src, "trainer_state.json"), "w") as f:
            f.write(text if text is not None else json.dumps(state))
        r = run("ucp-convert", [src, "-o", os.path.join(WORK, "empty_state")])
        refused(f"trainer_state.json {label}: refused naming it", r, "trainer_state.json", "global_step")
        r = run("ucp-reshard", [src, "--in-place", "--gpus", "1"])
        refused(f"trainer_state.json {label}: --in-place refuses too", r, "trainer_state.json")


def ds_versions(layout):
    """Every model-states and optimizer file's ds_version: {file: value}."""
    tag = os.path.join(layout, open(os.path.join(layout, "latest")).read().strip())
    out = {}
    for n in sorted(os.listdir(tag)):
        if n.endswith(".pt") and (n.startswith("mp_rank_") or "optim_states" in n):  # layer files record none
            d = torch.load(os.path.join(tag, n), map_location="cpu", weights_only=False)
            out[n] = d.get("ds_version", d.get("optimizer_state_dict", {}).get("ds_version") if isinstance(d.get("optimizer_state_dict"), dict) else None)
    return out


def ds_version():
    atomic = os.path.join(WORK, "atomic")
    r = run("ucp-convert", [os.path.join(REAL_HF, "llama_fp32"), "-o", atomic])
    written("import", r)
    cfg = os.path.join(WORK, "cfg.json")
    with open(cfg, "w") as f:
        json.dump({"optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01}}}, f)
    layouts = {"fresh": ["--optimizer-config", cfg], "none": ["--no-optimizer"],
               "given": ["--optimizer-config", cfg, "--ds-version", "0.16.9"]}
    for name, extra in layouts.items():
        out = os.path.join(WORK, name)
        r = run("ucp-reshard", [atomic, "-o", out, "--dp", "1", "--tp", "2", "--pp", "2", "--zero-stage", "1", *extra])
        written(f"{name}: written", r)
        if r.returncode:
            continue
        v = ds_versions(out)
        want = "0.16.9" if name == "given" else None
        check(f"{name}: every file records one ds_version DeepSpeed accepts{' (--ds-version)' if want else ''}",
              len(v) > 0 and len(set(v.values())) == 1 and all(isinstance(x, str) and re.fullmatch(r"\d+\.\d+\.\d+.*", x) for x in v.values())
              and (want is None or set(v.values()) == {want}), json.dumps(v))
        if name == "none":  # no optimizer files: one reason (newcomer trial: a missing fragment per parameter)
            r = run("ucp-inspect", [out])
            check("none: ucp-inspect says once that the tag holds the model's files alone",
                  "--no-optimizer" in r.stderr and "missing fragment" not in r.stderr, r.stderr[-1500:])
            continue
        r = run("ucp-inspect", [out])
        check(f"{name}: ucp-inspect finds nothing wrong", r.returncode == 0 and "empty ds_version" not in r.stdout + r.stderr,
              r.stdout[-1500:] + r.stderr[-800:])
    # What real DeepSpeed 0.19.5 loaded (scripts/issue51_real_readers.py, by hand: the layouts without
    # --ds-version, logits within 1.5e-7 of transformers'): ucp still writes those bytes.
    record = json.load(open(os.path.join(REAL_HF, "issue51_readers.json")))
    with open(os.path.join(WORK, "record_cfg.json"), "w") as f:
        json.dump(record["optimizer_config (cfg.json)"], f)
    for name, row in record["A_ds_version_default"]["rows"].items():
        out = os.path.join(WORK, "record_" + name)
        args = [os.path.join(WORK, "record_cfg.json") if a == "cfg.json" else a for a in row["ucp_reshard_args"]]
        r = run("ucp-reshard", [atomic, "-o", out, *args])
        tag = os.path.join(out, "global_step0")
        got = {n: hashlib.sha256(open(os.path.join(tag, n), "rb").read()).hexdigest() for n in sorted(os.listdir(tag))} if r.returncode == 0 else {}
        check(f"{name}: the bytes DeepSpeed loaded ({'ok' if row['deepspeed_loaded'] else 'NOT'} loaded, "
              f"{row['max_abs_diff_deepspeed_vs_transformers']:.2g} from transformers' logits)",
              row["deepspeed_loaded"] and got == row["ckpt_sha256"], str(sorted(k for k in got if got[k] != row["ckpt_sha256"].get(k)))[:600])
    # An empty ds_version in a layout (as earlier imports wrote it) is flagged.
    bad = os.path.join(WORK, "empty")
    shutil.copytree(os.path.join(WORK, "fresh"), bad)
    tag = os.path.join(bad, open(os.path.join(bad, "latest")).read().strip())
    for n in os.listdir(tag):
        p = os.path.join(tag, n)
        if n.startswith("mp_rank_"):
            d = torch.load(p, map_location="cpu", weights_only=False)
            d["ds_version"] = ""
            torch.save(d, p)
        elif "optim_states" in n:
            d = torch.load(p, map_location="cpu", weights_only=False)
            d["optimizer_state_dict"]["ds_version"] = ""
            d["ds_version"] = ""
            torch.save(d, p)
    r = run("ucp-inspect", [bad])
    check("ucp-inspect flags an empty ds_version", "empty ds_version" in (r.stdout + r.stderr) and r.returncode != 0,
          f"rc {r.returncode}: {r.stdout[-1500:]}{r.stderr[-800:]}")


def n_inner_null():
    model = os.path.join(WORK, "gpt2")
    shutil.copytree(os.path.join(REAL_HF, "gpt2_tiny"), model)
    writable(model)
    text = open(os.path.join(model, "config.json")).read()
    assert '"n_inner": 128' in text
    text = text.replace('"n_inner": 128', '"n_inner": null')  # as save_pretrained writes GPT2Config's default
    with open(os.path.join(model, "config.json"), "w") as f:
        f.write(text)
    atomic, layout, atomic2, hf = (os.path.join(WORK, n) for n in ("atomic", "layout", "atomic2", "hf"))
    cfg = os.path.join(WORK, "cfg.json")
    with open(cfg, "w") as f:
        json.dump({"optimizer": {"type": "Adam", "params": {"lr": 1e-3}}}, f)
    written("import", run("ucp-convert", [model, "-o", atomic]))
    written("layout", run("ucp-reshard", [atomic, "-o", layout, "--dp", "1", "--tp", "2", "--pp", "1", "--zero-stage", "1", "--optimizer-config", cfg]))
    written("layout converted back", run("ucp-convert", [layout, "-o", atomic2]))
    for name, src in (("from the import", atomic), ("from the layout", atomic2)):
        out = hf + "_" + name.split()[-1]
        r = run("ucp-reshard", [src, "-o", out, "--format", "hf"])
        written(f"{name}: exported", r)
        for f in ("config.json", "generation_config.json"):
            ok = os.path.isfile(os.path.join(out, f)) and open(os.path.join(out, f), "rb").read() == open(os.path.join(model, f), "rb").read()
            check(f"{name}: {f} is the model's own, byte for byte", ok, r.stdout[-1500:])
        check(f"{name}: the weights in model.safetensors, as save_pretrained names it",
              os.path.isfile(os.path.join(out, "model.safetensors")), str(tree_files(out)))
        check(f"{name}: no note that config.json was written from the facts", "written from the facts" not in r.stdout + r.stderr,
              r.stdout[-1500:])
        # The tensors, byte for byte, that transformers loaded with the source's logits (scripts/issue51_real_readers.py).
        want, got = read_model_folder(model), read_model_folder(out) if r.returncode == 0 else {}
        check(f"{name}: the model's tensors byte for byte", want.keys() == got.keys() and all(
            want[k].dtype == got[k].dtype and want[k].shape == got[k].shape and torch.equal(want[k], got[k]) for k in want),
            str(sorted(set(want) ^ set(got)))[:400])


def output_in_root():
    src = copy_checkpoint("zero2_dp2_fp32")
    before = tree_files(src)
    for args in (["--gpus", "1"], ["--dp", "1", "--tp", "1", "--pp", "1", "--zero-stage", "2"]):
        r = run("ucp-reshard", [src, "-o", os.path.join(src, "new"), *args])
        refused(f"ucp-reshard ROOT -o ROOT/new {' '.join(args)}: refused as inside the input, saying what to do", r, "inside",
                "--in-place")
        check(f"{' '.join(args)}: nothing written inside the checkpoint", tree_files(src) == before,
              str(sorted(set(tree_files(src)) - set(before)))[:800])
        shutil.rmtree(os.path.join(src, "new"), ignore_errors=True)


def plan_refuses():
    """A dry run from a Trainer root refuses what the run would (newcomer trial): TP of a plain engine."""
    src = os.path.join(CASES, "zero2_dp2_fp32", "checkpoint-4")
    for extra in (["--plan-only"], []):
        out = os.path.join(WORK, "pl" + str(len(extra)))
        r = run("ucp-reshard", [src, "-o", out, "--dp", "1", "--tp", "2", "--pp", "1", "--zero-stage", "2", *extra])
        refused(f"tp=2 of a plain engine {' '.join(extra) or '(the run)'}: refused", r, "tp=2")
        check(f"{' '.join(extra) or 'the run'}: refused before converting", "converting it into" not in r.stderr, r.stderr[-800:])
        check(f"{' '.join(extra) or 'the run'}: nothing written", not os.path.exists(out), str(tree_files(out)))


def atomic_reused():
    """ucp-convert ROOT -o ROOT/atomic, as the README shows it, then ucp-reshard ROOT: the atomic checkpoint
    latest_universal names is read where it is, not converted again (newcomer trial)."""
    src = copy_checkpoint("zero2_dp2_fp32")
    written("ucp-convert ROOT -o ROOT/atomic", run("ucp-convert", [src, "-o", os.path.join(src, "atomic")]))
    r = run("ucp-reshard", [src, "-o", os.path.join(WORK, "hf"), "--format", "hf"])
    written("--format hf from the root", r)
    check("--format hf: read ROOT/atomic where it is", "reading the atomic checkpoint " + os.path.join(src, "atomic") in r.stderr and
          "converting" not in r.stderr, r.stderr[-1500:])
    # The dry run lists what the step adds, the RNG files of the new processes among them (newcomer trial).
    four = ["--dp", "4", "--tp", "1", "--pp", "1", "--zero-stage", "2"]
    r = run("ucp-reshard", [src, "--in-place", "--plan-only", "--json", *four])
    plan = json.loads(r.stdout) if r.returncode == 0 else {}
    before = set(os.listdir(src))
    written("--in-place to 4 processes", run("ucp-reshard", [src, "--in-place", *four]))
    added = sorted(set(os.listdir(src)) - before)
    check("--in-place --plan-only: its writes are what the step adds, rng_state_2/3.pth among them",
          added == sorted(os.path.basename(w) for w in plan.get("writes", [])) and "rng_state_3.pth" in added,
          f"{added} vs {plan.get('writes')}")
    r = run("ucp-reshard", [src, "--in-place", "--gpus", "1"])
    written("--in-place", r)
    check("--in-place: reused ROOT/atomic", "reusing the atomic checkpoint " + os.path.join(src, "atomic") in r.stderr, r.stderr[-1500:])
    check("--in-place: latest_universal still names it", open(os.path.join(src, "latest_universal")).read().strip() == "atomic")
    check("--in-place: no second conversion beside the tag", not os.path.exists(os.path.join(src, "global_step4_universal")),
          str(os.listdir(src)))
    # ucp-convert into the export: --force is offered only where it would be taken (newcomer trial).
    r = run("ucp-convert", [src, "-o", os.path.join(WORK, "hf")])
    refused("ucp-convert -o an export: refused", r, "not empty")
    check("ucp-convert -o an export: no --force offered, which would be refused", "--force to overwrite" not in r.stderr, r.stderr[-800:])


def damaged_leaves():
    """A damaged record found mid-run (newcomer trial): --in-place leaves nothing in the Trainer folder;
    ucp-convert says what stays in OUT (its journal, no manifest) and how to go on."""
    from damage import flip_in_record
    src = copy_checkpoint("zero2_dp2_fp32")
    before = tree_files(src)
    flip_in_record(os.path.join(src, "global_step4", "zero_pp_rank_1_mp_rank_00_optim_states.pt"), "/data/2")  # exp_avg_sq
    r = run("ucp-reshard", [src, "--in-place", "--gpus", "1"])
    refused("--in-place: the damaged record refused", r, "CRC-32 mismatch")
    check("--in-place: nothing of the run left in the Trainer folder", tree_files(src) == before,
          str(sorted(set(tree_files(src)) ^ set(before)))[:800])
    out = os.path.join(WORK, "out")
    r = run("ucp-convert", [src, "-o", out], ranks=2)
    refused("ucp-convert: refused, saying what stays and how to go on", r, "CRC-32 mismatch", "restore it", "--force converts it afresh")
    check("ucp-convert: nothing that looks complete", not os.path.exists(os.path.join(out, "ucp_manifest.json")))


def misnamed_output():
    """-o .../checkpoint-8 for the checkpoint of step 4 (newcomer trial: written with a note, then refused by
    ucp-inspect and ucp-convert): refused before anything is written, naming Trainer's name for it."""
    src = os.path.join(CASES, "zero2_dp2_fp32", "checkpoint-4")
    atomic = os.path.join(WORK, "atomic")
    written("converted", run("ucp-convert", [src, "-o", atomic]))
    layout = ["--dp", "1", "--tp", "1", "--pp", "1", "--zero-stage", "2"]
    for label, source in (("from the root", src), ("from the atomic checkpoint", atomic)):
        for extra in ([], ["--plan-only"]):
            out = os.path.join(WORK, label.split()[-1], "checkpoint-8")
            r = run("ucp-reshard", [source, "-o", out, *layout, *extra])
            refused(f"{label}{' --plan-only' if extra else ''}: -o checkpoint-8 refused, naming checkpoint-4", r, "checkpoint-4")
            check(f"{label}: nothing written", not os.path.exists(out), str(tree_files(out)))
    out = os.path.join(WORK, "named", "checkpoint-4")
    written("-o checkpoint-4: written", run("ucp-reshard", [atomic, "-o", out, *layout]))
    written("and ucp-inspect reads it", run("ucp-inspect", [out]))


def trainer_dcp():
    src = os.path.join(CASES, "zero2_dp2_fp32", "checkpoint-4")
    out = os.path.join(WORK, "dcp")
    r = run("ucp-reshard", [src, "-o", out, "--format", "dcp", "--mesh", "dp=2"])
    if r.returncode == 0:
        check("to DCP: written with its metadata", os.path.isfile(os.path.join(out, ".metadata")), str(tree_files(out)))
    else:
        refused("to DCP: one message saying Trainer's models are not a DCP source", r, "Trainer")
        check("to DCP: it asks for no Megatron model facts", "--model-config" not in r.stderr and "model fact" not in r.stderr, r.stderr[-1500:])
        check("to DCP: nothing written", not os.path.exists(os.path.join(out, ".metadata")))


def trainer_notes():
    for case in ("zero2_dp2_fp32", "zero3_dp2_fp32"):
        src = os.path.join(CASES, case, "checkpoint-4")
        r = run("ucp-convert", [src, "-o", os.path.join(WORK, case)], ranks=2)
        written(f"{case}: converted", r)
        text = r.stdout + r.stderr
        for words in ("sequence parallel", "SP ", "Ulysses", "no model family", "match no rule", "--patterns"):
            check(f"{case}: no note mentioning {words!r}", words not in text,
                  "\n".join(line for line in text.splitlines() if words in line)[:1500])


def hints_lead():
    src = copy_checkpoint("zero2_dp2_fp32")
    with open(os.path.join(src, "trainer_state.json"), "w") as f:
        f.write('{"global_step": 4, "log_history": [')  # cut short
    r = run("ucp-convert", [src, "-o", os.path.join(WORK, "a")])
    refused("damaged trainer_state.json: refused naming it", r, "trainer_state.json")
    # Every folder the message tells the user to give, given: it must not fail the same way.
    for hinted in re.findall(r"(\S+) is a \S+ checkpoint: give that folder", r.stderr):
        r2 = run("ucp-convert", [hinted, "-o", os.path.join(WORK, "b")])
        check(f"the hint '{hinted}' leads somewhere", r2.returncode == 0 or "trainer_state.json" not in r2.stderr, r2.stderr[-800:])
    check("the error says how to repair it", re.search(r"trainer_state\.json[^\n]*(Trainer|restore|copy)", r.stderr) is not None, r.stderr[-800:])
    # latest naming a folder that is not there (newcomer trial): no hint towards DeepSpeed's universal folder,
    # which ucp-convert refuses as converted already.
    root = os.path.join(WORK, "ds")
    shutil.copytree(os.path.join(os.path.dirname(os.path.dirname(CASES)), "real-deepspeed", "cases", "llama_tp2_dp2_zero1_fp32", "ckpt"), root)
    writable(root)
    with open(os.path.join(root, "latest"), "w") as f:
        f.write("global_step7")
    r = run("ucp-convert", [root, "-o", os.path.join(WORK, "c")])
    refused("latest naming no folder: refused naming latest", r, "latest", "global_step7")
    check("latest naming no folder: no hint towards the universal folder", "_universal is a" not in r.stderr, r.stderr[-800:])
    # The tag folder given to --in-place: its root named.
    tag = os.path.join(src, "global_step4")
    with open(os.path.join(src, "trainer_state.json"), "w") as f:
        f.write(open(os.path.join(CASES, "zero2_dp2_fp32", "checkpoint-4", "trainer_state.json")).read())
    r = run("ucp-reshard", [tag, "--in-place", "--gpus", "1"])
    refused("global_step4 given to --in-place: the folder holding latest named", r, "give the folder holding its `latest`, " + src)


def gpus_summary():
    src = os.path.join(CASES, "zero2_dp2_fp32", "checkpoint-4")
    r = run("ucp-reshard", [src, "-o", os.path.join(WORK, "out"), "--gpus", "1"])
    written("--gpus 1", r)
    line = next((x for x in (r.stdout + r.stderr).splitlines() if "per GPU" in x), "")
    check("the summary names where the per-GPU memory comes from and --gpu-memory", "--gpu-memory" in line and "default" in line, line or r.stdout[-1500:])


def inplace_pointer():
    od = os.path.join(WORK, "od")
    src = copy_checkpoint("zero2_dp2_fp32", "od")
    # An older checkpoint beside it (Trainer keeps several): the same files under checkpoint-2, its state saying step 2.
    old = os.path.join(od, "checkpoint-2")
    shutil.copytree(src, old)
    st = json.load(open(os.path.join(old, "trainer_state.json")))
    st["global_step"] = 2
    json.dump(st, open(os.path.join(old, "trainer_state.json"), "w"))
    r = run("ucp-reshard", [od, "--in-place", "--gpus", "1"])
    refused("--in-place on output_dir: refused pointing at the newest checkpoint", r, os.path.join(od, "checkpoint-4"))
    r2 = run("ucp-convert", [od, "-o", os.path.join(WORK, "a")])
    check("ucp-convert names it too", os.path.join(od, "checkpoint-4") in r2.stderr, r2.stderr[-800:])
    for args in (["--gpus", "1"], ["--format", "hf"]):
        r3 = run("ucp-reshard", [od, "-o", os.path.join(WORK, "m"), *args])
        refused(f"ucp-reshard OUTPUT_DIR -o M {' '.join(args)} names it too", r3, os.path.join(od, "checkpoint-4"))


def readme():
    text = open(README).read()
    first = text.find("mpirun")
    window = text[max(0, first - 200):first + 1500]
    check("--oversubscribe where mpirun is first shown", "--oversubscribe" in window, window[:600])
    check("the run-as-root variables there too", "OMPI_ALLOW_RUN_AS_ROOT" in window, window[:600])
    docs = os.path.join(os.path.dirname(README), "docs")  # the round trip is told in docs/huggingface.md
    pages = [os.path.join(docs, n) for n in sorted(os.listdir(docs)) if n.endswith(".md")] if os.path.isdir(docs) else []
    text = "\n".join([text] + [open(p).read() for p in pages])
    at = text.find("HF -> ucp -> layout -> ucp -> HF")
    check("the round trip says it needs --optimizer-config", at >= 0 and "--optimizer-config" in text[at - 400:at + 600],
          text[at - 400:at + 600] if at >= 0 else "no round trip in README or docs/")


FINDINGS = {f.__name__: f for f in (second_copy, tag_no_latest, no_trainer_state, ds_version, n_inner_null, output_in_root,
                                    trainer_dcp, trainer_notes, hints_lead, gpus_summary, inplace_pointer, readme, plan_refuses,
                                    atomic_reused, damaged_leaves, misnamed_output)}
FINDINGS[FINDING]()
finish(f"issue51 {FINDING}")
