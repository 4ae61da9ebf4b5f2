"""Issue 42's rows on --in-place, a training run's root and where ucp writes, each a check on a real
DeepSpeed checkpoint (../shared/real-deepspeed), each named after what it guards, each failing on
the build that had the row's fault:

  issue42_inplace.py FINDING UCP_BIN_DIR CASES_DIR WORK

FINDING is one of:
  resaved_tag       (row 1) a tag whose optimizer files were saved again after DeepSpeed's
                    ds_to_universal.py ran: --in-place converts the tag (says why DeepSpeed's folder is
                    not reused, leaves it as it was), and every exp_avg in the new layout is the tag's;
                    --format hf from such a root reads the tag too, not a stale universal folder.
  one_plan          (row 6) --in-place --plan-only --json, then the step, on several targets (fp32 ->
                    bf16 at ZeRO 1 and 2, --gpus): the tag, the layout, the folders and the optimizer
                    files' names are the plan's.
  dtype_target      (row 7) --in-place --gpus 4 --dtype bf16 on a 4-GPU fp32 root writes bf16.
  damaged_reused    (newcomer trial) a damaged atomic checkpoint an earlier run converted is reused by
                    every rerun: the refusal says how to convert the tag again; latest unchanged.
  stale_lock        (row 8) a complete atomic checkpoint holding the lock of a run killed after its
                    manifest: the step reuses it, and the lock is gone (ucp-inspect --verify passes).
  back_to_source    (row 11) --in-place back to the job's own layout points `latest` at the original
                    tag and writes nothing; not when that tag was saved again since.
  recorded_tag      (row 14) a universal folder (DeepSpeed's, ucp's) copied under another name and
                    resharded: the tag is the one its files record, not the folder's name.
  latest_universal  (row 15) ucp-convert writes <parent>/latest_universal only in the tag's own
                    checkpoint root; elsewhere nothing outside -o.
  scratch_export    (row 18) ucp-reshard ROOT -o OUT --format hf writes nothing into ROOT: a conversion
                    it needs goes to OUT/.ucp-scratch-atomic, removed after success and after failure.
"""
import glob
import json
import os
import shutil
import socket
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ds_stubs  # noqa: E402,F401
from damage import flip_in_record, tree_digest as digest  # noqa: E402

finding, bindir, cases, work = sys.argv[1:5]
CONVERT, RESHARD, INSPECT = (os.path.join(bindir, t) for t in ("ucp-convert", "ucp-reshard", "ucp-inspect"))
problems = []


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


def check(label, ok, detail=""):
    print(f"{label}: {'ok' if ok else 'FAIL'} {detail if not ok else ''}")
    if not ok:
        problems.append(label)


def copy_case(case, where, universal=False):
    """The case's checkpoint root, with DeepSpeed's own universal folder (and latest_universal) or without."""
    dst = os.path.join(work, where)
    ignore = None if universal else shutil.ignore_patterns("*_universal", "latest_universal")
    shutil.copytree(os.path.join(cases, case, "ckpt"), dst, ignore=ignore)
    return dst


def latest(root):
    return open(os.path.join(root, "latest")).read().strip()


def load(path):
    return torch.load(path, map_location="cpu")


def resave_moments(tag_dir, scale=1.5):
    """Each ZeRO optimizer file saved again with its exp_avg scaled (valid CRCs: torch.save writes them;
    zeros, the vocabulary's padding rows among them, stay zeros)."""
    for name in sorted(os.listdir(tag_dir)):
        if name.endswith("optim_states.pt"):
            d = load(os.path.join(tag_dir, name))
            for st in d["optimizer_state_dict"]["base_optimizer_state"]["state"].values():
                st["exp_avg"].mul_(scale)
            torch.save(d, os.path.join(tag_dir, name))


def flat_params(tag_dir, stage, dp, key):
    """Each parameter's `key` (exp_avg, ...) in a ZeRO-1/2 stage's flat groups over its DP ranks, cut by
    the stage's param_shapes (the groups' order). A pipeline's tied copies beyond the first stage are
    left out: DeepSpeed keeps the first stage's (its converter too)."""
    parts = [load(os.path.join(tag_dir, f"zero_pp_rank_{d}_mp_rank_{stage:02d}_optim_states.pt"))["optimizer_state_dict"]
             for d in range(dp)]
    shapes = load(os.path.join(tag_dir, f"mp_rank_{stage:02d}_model_states.pt"))["param_shapes"]
    out = {}
    for g, group in enumerate(shapes):
        flat, at = torch.cat([p["base_optimizer_state"]["state"][g][key] for p in parts]), 0
        for name, shape in group.items():
            n = torch.Size(shape).numel()
            if stage == 0 or not name.startswith("tied_modules."):
                out[name] = flat[at:at + n]
            at += n
    return out


def layout_of(tag_dir):
    """The layout rank 0's model-states file records: what DeepSpeed ran (dp, mp, ZeRO stage, dtype)."""
    ms = load(os.path.join(tag_dir, "mp_rank_00_model_states.pt"))
    cfg = ms["ds_config"]
    return {"dp": ms["dp_world_size"], "mp": ms["mp_world_size"], "zero_stage": cfg["zero_optimization"]["stage"],
            "dtype": "bf16" if cfg.get("bf16", {}).get("enabled") else "fp16" if cfg.get("fp16", {}).get("enabled") else "fp32"}


def export_files(d):
    return sorted(n for n in os.listdir(d) if not n.startswith("."))


def same_export(a, b):
    return export_files(a) == export_files(b) and all(
        open(os.path.join(a, n), "rb").read() == open(os.path.join(b, n), "rb").read() for n in export_files(a))


def dead_pid():
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
FP32 = "zero1_dp4_fp32"
LLAMA = "llama_pp2_dp2_zero1_fp32"

if finding == "resaved_tag":
    case = "pp2_dp2_zero1_fp32"
    root = copy_case(case, "root", universal=True)
    tag = os.path.join(root, latest(root))
    theirs = os.path.join(root, latest(root) + "_universal")
    resave_moments(tag)
    before = digest(theirs)
    p = run([RESHARD, root, "--in-place", "--dp", "1", "--tp", "1", "--pp", "2", "--zero-stage", "1"])
    check("resaved_tag: --in-place runs", p.returncode == 0, p.stderr[-600:])
    check("resaved_tag: says why DeepSpeed's universal folder is not reused, in one line",
          sum("not reused" in ln and theirs in ln for ln in p.stderr.splitlines()) == 1, p.stderr[-600:])
    check("resaved_tag: DeepSpeed's folder left as it was", digest(theirs) == before)
    new = os.path.join(root, latest(root))
    for stage in (0, 1):
        want, got = flat_params(tag, stage, 2, "exp_avg"), flat_params(new, stage, 1, "exp_avg")
        stale = [n for n in want if n not in got or not torch.equal(want[n], got[n])]
        check(f"resaved_tag: stage {stage}: each of {len(want)} exp_avg is the re-saved tag's", want.keys() == got.keys() and not stale,
              f"{len(stale)} differ: {stale[:3]}")
    # --format hf from a root whose DeepSpeed folder is stale (its fp32 weights not the tag's): the
    # export is the tag's, byte for byte the export of DeepSpeed's folder as ds_to_universal.py wrote it.
    hf_root = copy_case(LLAMA, "hf_root", universal=True)
    stale = os.path.join(hf_root, "global_step6_universal", "zero")
    victim = os.path.join(stale, sorted(os.listdir(stale))[0], "fp32.pt")
    d = load(victim)
    d["param"] = d["param"].detach() + 0.5
    torch.save(d, victim)
    ref = os.path.join(work, "hf_ref")
    p = run([RESHARD, os.path.join(cases, LLAMA, "ckpt", "global_step6_universal"), "-o", ref, "--format", "hf", "-q"])
    check("resaved_tag: the reference export", p.returncode == 0, p.stderr[-300:])
    out = os.path.join(work, "hf")
    p = run([RESHARD, hf_root, "-o", out, "--format", "hf"])
    check("resaved_tag: --format hf from the root: the tag's weights, not the stale folder's",
          p.returncode == 0 and same_export(ref, out), p.stderr[-600:])

elif finding == "one_plan":
    import jsonschema
    schema = json.load(open(os.path.join(os.path.dirname(__file__), "..", "..", "schemas", "in-place-plan.schema.json")))
    root = copy_case(FP32, "root")
    targets = [["--dp", "2", "--tp", "1", "--pp", "1", "--zero-stage", "1", "--dtype", "bf16"],
               ["--dp", "2", "--tp", "1", "--pp", "1", "--zero-stage", "2", "--dtype", "bf16"],
               ["--gpus", "4"],
               ["--dp", "1", "--tp", "1", "--pp", "1", "--zero-stage", "1", "--dtype", "bf16", "--grad-accum-dtype", "fp32"]]
    for args in targets:
        label = "one_plan " + " ".join(args)
        p = run([RESHARD, root, "--in-place", "--plan-only", "--json"] + args)
        plan = json.loads(p.stdout) if p.returncode == 0 else {}
        try:
            jsonschema.validate(plan, schema)
        except jsonschema.ValidationError as e:
            check(f"{label}: the plan validates", False, str(e)[:300])
        check(f"{label}: the plan names its tag", isinstance(plan.get("target_tag"), str), p.stdout[-400:] + p.stderr[-300:])
        entries = set(os.listdir(root))
        p = run([RESHARD, root, "--in-place", "-q"] + args)
        check(f"{label}: the step runs", p.returncode == 0, p.stderr[-400:])
        tag = latest(root)
        check(f"{label}: the step's tag is the plan's", tag == plan.get("target_tag"), f"{tag} vs {plan.get('target_tag')}")
        added = sorted(set(os.listdir(root)) - entries)
        planned = sorted(os.path.basename(w) for w in plan.get("writes", []))
        check(f"{label}: the folders written are the plan's", added == planned, f"{added} vs {planned}")
        marker = json.load(open(os.path.join(root, tag, "ucp_reshard.json")))
        check(f"{label}: the layout written is the plan's", marker["layout"] == plan.get("target_layout"),
              f"{marker['layout']} vs {plan.get('target_layout')}")
        # DeepSpeed's files: "bf16_" names in bf16; the BF16 optimizer's state (bf16 at ZeRO-0, or ZeRO-1 with
        # fp32 accumulation) has no "zero_stage", ZeRO's has.
        t = plan.get("target_layout") or {}
        bf16_optimizer = t.get("dtype") == "bf16" and (t.get("zero_stage") == 0 or (
            t.get("zero_stage") == 1 and t.get("grad_accum_dtype") == "fp32"))
        optim = sorted(f for f in os.listdir(os.path.join(root, tag)) if f.endswith("optim_states.pt"))
        state = load(os.path.join(root, tag, optim[0]))["optimizer_state_dict"] if optim else {}
        check(f"{label}: the optimizer files are the plan's", optim and all(f.startswith("bf16_") == (t.get("dtype") == "bf16")
              for f in optim) and ("zero_stage" not in state) == bf16_optimizer, f"{optim[:2]}, {sorted(state)[:4]} for {t}")
        check(f"{label}: the precision written is the plan's", layout_of(os.path.join(root, tag))["dtype"] == t.get("dtype"))

elif finding == "dtype_target":
    root = copy_case(FP32, "root")
    was = layout_of(os.path.join(root, latest(root)))
    gpus = str(was["dp"] * was["mp"])
    p = run([RESHARD, root, "--in-place", "--gpus", gpus, "--dtype", "bf16", "--plan-only", "--json"])
    plan = json.loads(p.stdout) if p.returncode == 0 else {}
    check(f"dtype_target: the plan on {gpus} GPUs is not 'nothing'", plan.get("action") not in (None, "nothing"), p.stdout[-300:])
    p = run([RESHARD, root, "--in-place", "--gpus", gpus, "--dtype", "bf16"])
    check("dtype_target: the step runs", p.returncode == 0 and "nothing to do" not in p.stderr, p.stderr[-400:])
    check("dtype_target: latest names a bf16 checkpoint", layout_of(os.path.join(root, latest(root)))["dtype"] == "bf16",
          latest(root))
    p = run([RESHARD, root, "--in-place", "--gpus", gpus, "--dtype", "bf16"])
    check("dtype_target: then nothing to do", p.returncode == 0 and "nothing to do" in p.stderr, p.stderr[-300:])

elif finding == "stale_lock":
    root = copy_case(FP32, "root")
    atomic = os.path.join(root, latest(root) + "_universal")
    p = run([CONVERT, root, "-o", atomic, "-q"])
    check("stale_lock: converted", p.returncode == 0, p.stderr[-300:])
    # What a converter killed after its manifest, before it released its lock, leaves.
    lock = os.path.join(atomic, ".ucp-lock")
    json.dump({"tool": "ucp-convert", "host": socket.gethostname(), "pid": dead_pid(), "start_ticks": "1",
               "started": "2026-11-27T00:00:00Z"}, open(lock, "w"))
    p = run([RESHARD, root, "--in-place", "--dp", "2", "--tp", "1", "--pp", "1", "--zero-stage", "1"])
    check("stale_lock: the step reuses the atomic checkpoint", p.returncode == 0 and "reusing the atomic checkpoint" in p.stderr,
          p.stderr[-400:])
    check("stale_lock: the dead run's lock is gone", not os.path.exists(lock), str(os.listdir(atomic)))
    p = run([INSPECT, atomic, "--verify"])
    check("stale_lock: ucp-inspect --verify passes on it", p.returncode == 0, (p.stdout + p.stderr)[-400:])

elif finding == "damaged_reused":
    # An atomic checkpoint an earlier run converted, damaged since, is reused by every rerun (its source
    # fingerprint is the tag's): the refusal says how to convert it anew (newcomer trial).
    root = copy_case(FP32, "root")
    atomic = os.path.join(root, latest(root) + "_universal")
    p = run([CONVERT, root, "-o", atomic, "-q"])
    check("damaged_reused: converted", p.returncode == 0, p.stderr[-300:])
    atom = sorted(glob.glob(os.path.join(atomic, "zero", "*", "exp_avg.pt")))[0]
    flip_in_record(atom)
    p = run([RESHARD, root, "--in-place", "--dp", "2", "--tp", "1", "--pp", "1", "--zero-stage", "1"])
    check("damaged_reused: refused, saying how to convert the tag again",
          p.returncode == 1 and "the file is damaged" in p.stderr and "ucp-convert " + os.path.join(root, "global_step6") +
          " -o " + atomic + " --force" in p.stderr, p.stderr[-700:])
    check("damaged_reused: latest unchanged", latest(root) == "global_step6")

elif finding == "back_to_source":
    case = "zero2_dp3_fp32"
    root = copy_case(case, "root")
    own_tag = latest(root)
    own = layout_of(os.path.join(root, own_tag))
    back = ["--dp", str(own["dp"]), "--tp", "1", "--pp", "1", "--zero-stage", str(own["zero_stage"])]
    p = run([RESHARD, root, "--in-place", "-q", "--dp", "2", "--tp", "1", "--pp", "1", "--zero-stage", "1"])
    check("back_to_source: resharded away", p.returncode == 0 and latest(root) != own_tag, p.stderr[-300:])
    away = latest(root)
    p = run([RESHARD, root, "--in-place", "--plan-only", "--json"] + back)
    plan = json.loads(p.stdout) if p.returncode == 0 else {}
    check("back_to_source: the plan points back", plan.get("action") == "point_back" and plan.get("target_tag") == own_tag and
          plan.get("writes") == [], p.stdout[-400:] + p.stderr[-300:])
    entries = sorted(os.listdir(root))
    p = run([RESHARD, root, "--in-place"] + back)
    check("back_to_source: latest names the job's own tag again", p.returncode == 0 and latest(root) == own_tag, p.stderr[-400:])
    check("back_to_source: nothing written", sorted(os.listdir(root)) == entries, str(sorted(set(os.listdir(root)) ^ set(entries))))
    check("back_to_source: and says so", own_tag + " again" in p.stderr, p.stderr[-300:])
    # Once the job's tag is saved again, it is not what the atomic checkpoint was made from: a copy is written.
    p = run([RESHARD, root, "--in-place", "-q", "--dp", "2", "--tp", "1", "--pp", "1", "--zero-stage", "1"])
    check("back_to_source: away again", p.returncode == 0 and latest(root) == away, p.stderr[-300:])
    resave_moments(os.path.join(root, own_tag))
    p = run([RESHARD, root, "--in-place"] + back)
    check("back_to_source: a tag saved again since is not pointed back at", p.returncode == 0 and latest(root) != own_tag and
          os.path.exists(os.path.join(root, latest(root), "ucp_reshard.json")), p.stderr[-400:])

elif finding == "recorded_tag":
    want = open(os.path.join(cases, FP32, "ckpt", "latest")).read().strip()
    layout = ["--dp", "2", "--tp", "1", "--pp", "1", "--zero-stage", "1", "-q"]
    theirs = os.path.join(work, "myuni")
    shutil.copytree(os.path.join(cases, FP32, "ckpt", want + "_universal"), theirs)
    out = os.path.join(work, "from_theirs")
    p = run([RESHARD, theirs, "-o", out] + layout)
    check("recorded_tag: DeepSpeed's universal folder as myuni/: the tag its files record",
          p.returncode == 0 and latest(out) == want and os.path.isdir(os.path.join(out, want)), p.stderr[-300:])
    ours = os.path.join(work, "atomic", "universal")
    p = run([CONVERT, os.path.join(cases, FP32, "ckpt"), "-o", ours, "-q"])
    mine = os.path.join(work, "myuni2")
    shutil.copytree(ours, mine)
    out = os.path.join(work, "from_ours")
    p = run([RESHARD, mine, "-o", out] + layout)
    check("recorded_tag: ucp's atomic checkpoint as myuni2/: its manifest's tag",
          p.returncode == 0 and latest(out) == want and os.path.isdir(os.path.join(out, want)), p.stderr[-300:])

elif finding == "latest_universal":
    src = os.path.join(cases, FP32, "ckpt")
    x = os.path.join(work, "x")
    p = run([CONVERT, src, "-o", os.path.join(x, "kc"), "-q"])
    check("latest_universal: -o outside the tag's root: converted", p.returncode == 0, p.stderr[-300:])
    check("latest_universal: ... and nothing written beside it", sorted(os.listdir(x)) == ["kc"], str(os.listdir(x)))
    root = copy_case(FP32, "root")
    p = run([CONVERT, root, "-o", os.path.join(root, "mine"), "-q"])
    lu = os.path.join(root, "latest_universal")
    check("latest_universal: -o in the tag's own root: latest_universal names it", p.returncode == 0 and
          os.path.exists(lu) and open(lu).read() == "mine", p.stderr[-300:])
    h5 = os.path.join(work, "h5", "atomic")
    p = run([CONVERT, src, "-o", h5, "--format", "hdf5", "-q"])
    y = os.path.join(work, "y")
    p = run([CONVERT, "--from-atomic", h5, "-o", os.path.join(y, "pt"), "-q"]) if p.returncode == 0 else p
    check("latest_universal: --from-atomic outside a checkpoint root: nothing beside it",
          p.returncode == 0 and sorted(os.listdir(y)) == ["pt"], p.stderr[-300:] + str(os.listdir(y) if os.path.isdir(y) else ""))

elif finding == "scratch_export":
    root = copy_case(LLAMA, "root")
    before = digest(root)
    ref = os.path.join(work, "hf_ref")
    p = run([RESHARD, os.path.join(cases, LLAMA, "ckpt", "global_step6_universal"), "-o", ref, "--format", "hf", "-q"])
    check("scratch_export: the reference export", p.returncode == 0, p.stderr[-300:])
    # A failure after the conversion: the export's claim meets a live run's lock in OUT.
    out = os.path.join(work, "hf_locked")
    os.makedirs(out)
    json.dump({"tool": "ucp-reshard", "host": socket.gethostname(), "pid": os.getpid(), "start_ticks": "",
               "started": "2026-11-27T00:00:00Z"}, open(os.path.join(out, ".ucp-lock"), "w"))
    p = run([RESHARD, root, "-o", out, "--format", "hf"])
    check("scratch_export: a refused export exits 1", p.returncode == 1, p.stderr[-400:])
    check("scratch_export: ... and leaves the root as it was", digest(root) == before, str(sorted(os.listdir(root))))
    check("scratch_export: ... and no scratch folder", sorted(os.listdir(out)) == [".ucp-lock"], str(os.listdir(out)))
    out = os.path.join(work, "hf")
    p = run([RESHARD, root, "-o", out, "--format", "hf"])
    check("scratch_export: the export from the root", p.returncode == 0 and same_export(ref, out), p.stderr[-400:])
    check("scratch_export: ... says where it converted", os.path.join(out, ".ucp-scratch-atomic") in p.stderr, p.stderr[-400:])
    check("scratch_export: ... leaves the root as it was", digest(root) == before, str(sorted(os.listdir(root))))
    check("scratch_export: ... and no scratch folder in OUT", not os.path.exists(os.path.join(out, ".ucp-scratch-atomic")),
          str(os.listdir(out)))
    p = run([RESHARD, root, "-o", out, "--format", "hf", "--force", "-q"])
    check("scratch_export: --force over its own export", p.returncode == 0 and same_export(ref, out) and
          digest(root) == before, p.stderr[-400:])

else:
    sys.exit(f"unknown finding {finding}")

print(f"{finding}: {len(problems)} problems")
sys.exit(1 if problems else 0)
