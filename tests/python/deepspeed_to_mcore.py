"""--format mcore from real DeepSpeed checkpoints of Megatron-DeepSpeed-style GPTs with their optimizer state (issue 53):
a Llama (RMSNorm, rotary, untied) and GPTs (LayerNorm, learned positions, biases, tied) of ../shared/real-deepspeed
and tests/data/real-ds0195, fp32 and bf16, written for Megatron-LM's plain optimizer and its distributed one.

    deepspeed_to_mcore.py UCP_BIN_DIR WORK RECORD [mpiexec]

RECORD (tests/data/real-mcore/mcore_cross_family_resume.json, scripts/mcore_cross_family_resume.py) lists the outputs
real Megatron-LM resumed, each with its case and ucp-reshard flags: each is written again here and checked against
a ground truth this file builds from DeepSpeed's own files:
- every tensor bit for bit: the model in the job's dtype and the fp32 master (optimizer.state.param with the
  distributed optimizer, .fp32_param with the bf16 plain one), exp_avg and exp_avg_sq, from DeepSpeed's own universal
  output of the checkpoint (ds_to_universal's fp32 / exp_avg / exp_avg_sq files) joined as Megatron-LM's converter
  joins them (mcore_expected.py); each chunk in its TP piece and stage's file;
- common.pt: the iteration (DeepSpeed's), the step in the optimizer's form, Megatron-Core's two param groups (wd_mult
  1, then 0) each with the options of DeepSpeed's group (read from DeepSpeed's optimizer file), the scheduler as
  samples consumed (DeepSpeed's global_samples; the schedule None: the job's flags, --override-opt_param-scheduler),
  or, for the row whose checkpoint holds Megatron's OptimizerParamScheduler state (real Megatron-LM's, recorded;
  megatron_schedule_fixture.py puts it in the case's files as a Megatron-DeepSpeed job's engine saves it), that state,
  the args saying the optimizer was saved and the samples consumed; the tracker names the iteration;
- the record: the bytes Megatron-LM loaded, its iteration, and its losses of global steps 7-10 against DeepSpeed's
  uninterrupted run (fp32 within 1e-5, bf16 within 2e-3), a fresh Adam's far off (the carried state made the match).
Also: the training root straight to --format mcore (the scratch conversion keeps the moments), the launch note's
flags, and refusals (--use-distributed-optimizer with --weights-only; with a Megatron-Core source whose args say
otherwise).
"""
import glob
import hashlib
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ds_stubs  # noqa: E402,F401  (DeepSpeed's pickled classes, for its optimizer and model-states files)
from checklist import check, finish, fresh_folder, tool_runner  # noqa: E402
from dcp_files import read_dcp  # noqa: E402
from harness_logits import load_pt  # noqa: E402
from mcore_expected import expected_from_deepspeed_gpt, expected_from_deepspeed_llama, owner  # noqa: E402
from megatron_schedule_fixture import with_megatron_schedule  # noqa: E402

BIN, WORK, RECORD = sys.argv[1:4]
run = tool_runner(BIN, sys.argv[4] if len(sys.argv) > 4 else None)
record = json.load(open(RECORD))["outputs"]
fresh_folder(WORK)
ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
GPT_FACTS = os.path.normpath(os.path.join(ROOT, "..", "shared", "real-deepspeed", "cases", "tp2_pp2_dp2_zero1_fp32"))


def param_groups(case):
    """DeepSpeed's own param groups (its optimizer file's), without their members."""
    def find(x):
        if isinstance(x, dict):
            if isinstance(x.get("param_groups"), list):
                return x["param_groups"]
            for v in x.values():
                found = find(v)
                if found is not None:
                    return found
        return None
    tag = open(os.path.join(case, "ckpt", "latest")).read().strip()
    first = sorted(glob.glob(os.path.join(case, "ckpt", tag, "*optim_states.pt")))[0]
    return [{k: v for k, v in g.items() if k != "params"} for g in find(load_pt(first))]


def engine_records(case):
    tag = open(os.path.join(case, "ckpt", "latest")).read().strip()
    states = load_pt(sorted(glob.glob(os.path.join(case, "ckpt", tag, "mp_rank_*_model_states.pt")))[0])
    return states["global_steps"], states["global_samples"]


def expected_states(case):
    """{state: {key: tensor}} of the case's model, and its facts."""
    cfg_path = os.path.join(case, "model_config.json")
    llama = os.path.exists(cfg_path) and json.load(open(cfg_path)).get("arch") == "llama"
    out = {}
    for state in ("fp32", "exp_avg", "exp_avg_sq"):
        if llama:
            cfg, out[state] = expected_from_deepspeed_llama(case, state)
        else:  # the harness's GPT (a save without model_config.json is the same model: tests/data/real-ds0195)
            cfg, out[state] = expected_from_deepspeed_gpt(case, state, facts=None if os.path.exists(cfg_path) else GPT_FACTS)
    return cfg, out


def sha256s(root):
    return {os.path.relpath(os.path.join(d, n), root): hashlib.sha256(open(os.path.join(d, n), "rb").read()).hexdigest()
            for d, _, names in os.walk(root) for n in names if not os.path.relpath(os.path.join(d, n), root).startswith(".ucp")}


def check_carried(label, out, case, flags, stderr, schedule=None):
    tp, pp, dp = (int(flags[flags.index(f) + 1]) for f in ("--tp", "--pp", "--dp"))
    distributed = "--use-distributed-optimizer" in flags
    cfg, want = expected_states(case)
    steps, samples = engine_records(case)
    bf16 = "bf16" in os.path.basename(case)
    dtype = torch.bfloat16 if bf16 else torch.float32
    folder = os.path.join(out, f"iter_{steps:07d}")
    check(f"{label}: the tracker names DeepSpeed's iteration {steps}",
          open(os.path.join(out, "latest_checkpointed_iteration.txt")).read() == str(steps) and os.path.isdir(folder))
    tensors, _, md = read_dcp(folder)
    expected = {k: v.to(dtype) for k, v in want["fp32"].items()}
    master = "param" if distributed else "fp32_param" if bf16 else None
    for k in want["fp32"]:
        for state in ("exp_avg", "exp_avg_sq"):
            expected[f"optimizer.state.{state}.{k}"] = want[state][k]
        if master:
            expected[f"optimizer.state.{master}.{k}"] = want["fp32"][k]
    check(f"{label}: the model's and the optimizer's keys, no others", sorted(tensors) == sorted(expected),
          str(sorted(set(tensors) ^ set(expected))[:6]))
    bad = [k for k, v in expected.items() if k in tensors and not (tensors[k].dtype == v.dtype and tensors[k].shape == v.shape
                                                                     and torch.equal(tensors[k], v))]
    check(f"{label}: every tensor bit for bit against DeepSpeed's universal output ({len(expected)}: weights, "
          f"{'masters, ' if master else ''}exp_avg, exp_avg_sq)", not bad, str(bad[:4]))
    misplaced = []
    for index, info in md.storage_data.items():
        if getattr(index, "offset", None) is None:
            continue
        chunk = md.state_dict_metadata[index.fqn].chunks[index.index]
        key = index.fqn.split(".", 3)[3] if index.fqn.startswith("optimizer.state.") else index.fqn
        rank = owner(key, list(chunk.offsets), list(chunk.sizes), list(md.state_dict_metadata[index.fqn].size), tp, pp, dp, cfg["num_layers"])
        if rank is None or info.relative_path != f"__{rank}_0.distcp":
            misplaced.append((index.fqn, tuple(chunk.offsets), info.relative_path, rank))
    check(f"{label}: every chunk, the optimizer's too, in its TP piece and stage's file", not misplaced, str(misplaced[:4]))

    common = torch.load(os.path.join(folder, "common.pt"))
    a = common.get("args")
    check(f"{label}: args: the optimizer saved, {samples} samples consumed (none of validation), use_distributed_optimizer {distributed}",
          a is not None and not getattr(a, "no_save_optim", False) and a.consumed_train_samples == samples
          and a.consumed_valid_samples == 0 and a.use_distributed_optimizer == distributed and a.no_save_rng,
          str(vars(a) if a is not None else None)[:600])
    check(f"{label}: iteration {steps}", common.get("iteration") == steps, str(common.get("iteration")))
    opt = common.get("optimizer", {})
    if distributed:
        inner = opt.get("optimizer", {})
        groups = inner.get("param_groups", [])
        step_ok = all(g.get("step") == steps for g in groups) and opt.get("param_state_sharding_type") == "fully_reshardable"
        step_ok = step_ok and common.get("content_metadata", {}).get("distrib_optim_sharding_type") == "fully_reshardable"
    else:
        inner = opt.get("optimizer", {}) if bf16 else opt
        groups = inner.get("param_groups", [])
        step_ok = float(inner.get("state", {}).get("common_step", -1)) == steps and all("step" not in g for g in groups)
    check(f"{label}: the step {steps} where the {'distributed' if distributed else 'plain'} optimizer keeps it", step_ok, str(opt)[:600])
    ds = param_groups(case)
    decayed = [g for g in ds if g["weight_decay"] != 0]
    plain = [g for g in ds if g["weight_decay"] == 0]
    ok = len(groups) == 2 and [g.get("wd_mult") for g in groups] == [1.0, 0.0] and all(g.get("lr_mult") == 1.0 for g in groups)
    for g, source in zip(groups, [decayed[0] if decayed else None, plain[0] if plain else None]):
        ok = ok and source is not None and all(g.get(k) == (list(v) if isinstance(v, tuple) else v) or g.get(k) == v
                                               for k, v in source.items() if k not in ("name", "step"))
        ok = ok and g.get("is_expert_parallel") is False and g.get("is_decoupled_lr") is False and g.get("default_config") is True
        ok = ok and g.get("bias_correction", None) is (source.get("bias_correction", True) if source else None)
    check(f"{label}: Megatron-Core's two groups (wd_mult 1, then 0), each with DeepSpeed's group's options", ok, f"{groups} vs {ds}")
    sched = common.get("opt_param_scheduler")
    launch = next((line for line in stderr.splitlines() if "launch Megatron-LM (pretrain_gpt.py)" in line), "")
    decay = next((g["weight_decay"] for g in ds if g["weight_decay"] != 0), 0)
    words = [f"--weight-decay {decay:g} "] + (["--use-distributed-optimizer"] if distributed else []) + \
        ([] if schedule else ["--override-opt_param-scheduler"])
    check(f"{label}: the launch note gives the optimizer's flags ({' '.join(words)}), no others", all(w in launch + " " for w in words)
          and (not schedule or "--override-opt_param-scheduler" not in launch) and (distributed or "--use-distributed-optimizer" not in launch),
          launch)
    if schedule:  # Megatron's own scheduler state, carried as it is, its bounds in each group as Megatron keeps them
        check(f"{label}: the scheduler: the source's Megatron OptimizerParamScheduler state as it is", sched == schedule, str(sched))
        check(f"{label}: each group's max_lr and min_lr the schedule's", all(g.get("max_lr") == schedule["max_lr"] and
              g.get("min_lr") == schedule["min_lr"] for g in groups), str(groups))
        return
    check(f"{label}: the scheduler: {samples} samples consumed, the schedule left to the job's flags",
          sched == {"max_lr": None, "lr_warmup_steps": None, "num_steps": samples, "lr_decay_style": None, "lr_decay_steps": None,
                    "min_lr": None}, str(sched))
    check(f"{label}: no group bounds the learning rate (the job's schedule does)", all("max_lr" not in g and "min_lr" not in g for g in groups),
          str(groups))


atomics = {}
seen = set()
for label, rec in record.items():
    case = os.path.join(ROOT, rec["case"])
    if not os.path.isdir(case):
        check(f"{label}: the case {rec['case']} beside the checkout", False)
        continue
    schedule = rec.get("megatron_schedule")
    source = case + ("-scheduled" if schedule else "")
    if source not in atomics:
        atomics[source] = os.path.join(WORK, os.path.basename(source))
        ckpt = os.path.join(case, "ckpt")
        if schedule:  # the case's checkpoint as a Megatron-DeepSpeed job saves it: Megatron's scheduler state in it
            ckpt = with_megatron_schedule(ckpt, os.path.join(WORK, os.path.basename(source) + "-ckpt"), schedule)
        r = run("ucp-convert", [ckpt, "-o", atomics[source]], ranks=2)
        check(f"{os.path.basename(source)}: converts", r.returncode == 0, r.stderr[-600:])
    heads = os.path.join(WORK, "heads.json")
    json.dump({"num_attention_heads": 4, "num_key_value_heads": 2}, open(heads, "w"))
    flags = [heads if f == "HEADS" else f for f in rec["reshard_flags"]]
    out = os.path.join(WORK, label)
    r = run("ucp-reshard", [atomics[source], "-o", out] + flags, ranks=2)
    check(f"{label}: written", r.returncode == 0, r.stderr[-800:])
    if r.returncode != 0:
        continue
    seen.add(label)
    if not rec["fresh_adam"]:
        check_carried(label, out, case, flags, r.stderr, schedule)
    # (a checkpoint made here, not the case's: .metadata's save id names the source by its path, so that file
    # differs from the recorded one; its tensors and chunks are checked above)
    got, want = sha256s(out), dict(rec["sha256"])
    if schedule:
        got = {k: v for k, v in got.items() if not k.endswith(".metadata")}
        want = {k: v for k, v in want.items() if not k.endswith(".metadata")}
    check(f"{label}: the bytes real Megatron-LM loaded (the record{', but .metadata' if schedule else ''})", got == want,
          str(sorted(set(got.items()) ^ set(want.items()))[:3]))
    bf16 = "bf16" in label
    bound = 2e-3 if bf16 else 1e-5
    if rec["fresh_adam"]:
        carried = record[label.replace("_fresh_adam", "")]["max_abs_loss_diff"]
        check(f"{label}: the record: a fresh Adam from the same weights ({rec['max_abs_loss_diff']:.3g}) is far from DeepSpeed's run, "
              f"the carried state ({carried:.3g}) at it", rec["error"] is None and rec["max_abs_loss_diff"] > 100 * carried)
    else:
        check(f"{label}: the record: Megatron-LM resumed at iteration 6 and trained steps 7-10 within {bound:g} of DeepSpeed's "
              f"uninterrupted run ({rec['max_abs_loss_diff']:.3g})", rec["error"] is None and rec["iterations"] == [6]
              and rec["scheduler_num_steps"] == [72] and sorted(rec["losses"]) == ["10", "7", "8", "9"]
              and rec["max_abs_loss_diff"] <= bound, str(rec)[:400])
check("every output in the record written and checked here", seen == set(record), str(set(record) - seen))

# straight from the training root: the scratch conversion keeps the moments; the same files as from the atomic
# checkpoint but .metadata, whose save id names the checkpoint written from
llama = os.path.join(ROOT, record["llama_tp1_pp1_dp1"]["case"])
out = os.path.join(WORK, "root-llama")
r = run("ucp-reshard", [os.path.join(llama, "ckpt"), "-o", out, "--format", "mcore", "--tp", "1", "--pp", "1"])
check("the Llama's training root: converts, then writes the optimizer's state at iteration 6, no scratch left", r.returncode == 0
      and os.path.isdir(os.path.join(out, "iter_0000006")) and not any(n.startswith(".ucp-scratch") for n in os.listdir(out)),
      r.stderr[-600:])
if r.returncode == 0:
    a, b = sha256s(out), sha256s(os.path.join(WORK, "llama_tp1_pp1_dp1"))
    meta = os.path.join("iter_0000006", ".metadata")
    check("the Llama's training root: the atomic checkpoint's output byte for byte but .metadata",
          sorted(a) == sorted(b) and all(a[k] == b[k] for k in a if k != meta), str(sorted(set(a.items()) ^ set(b.items()))[:3]))

# refusals, nothing written
atomic = atomics.get(llama)
for flags, words, what in [
        (["--tp", "1", "--pp", "1", "--weights-only", "--use-distributed-optimizer"], ["--use-distributed-optimizer", "the model alone"],
         "--use-distributed-optimizer with --weights-only"),
        (["--tp", "1", "--pp", "1", "--dp", "2", "--zero-stage", "1"], ["--zero-stage"], "a DeepSpeed layout flag")]:
    out = os.path.join(WORK, "refused")
    r = run("ucp-reshard", [atomic, "-o", out, "--format", "mcore"] + flags)
    check(f"{what}: refused by name, nothing written", r.returncode != 0 and all(w in r.stderr for w in words) and not os.path.exists(out),
          r.stderr[-400:])
out = os.path.join(WORK, "refused")
r = run("ucp-reshard", [atomic, "-o", out, "--dp", "2", "--tp", "1", "--pp", "1", "--zero-stage", "1", "--use-distributed-optimizer"])
check("--use-distributed-optimizer with a DeepSpeed layout: refused, naming it and --format mcore", r.returncode != 0
      and "--use-distributed-optimizer goes with --format mcore" in r.stderr and not os.path.exists(out), r.stderr[-400:])
# a run that decayed every parameter in one group (the harness's ZeRO-3 GPTModel): Megatron-LM's job would stop
# decaying its norms and biases; refused naming one, before anything is written
z3 = os.path.join(os.path.dirname(GPT_FACTS), "zero3_dp4_fp32")
z3_atomic = os.path.join(WORK, "zero3_dp4_fp32")
r = run("ucp-convert", [os.path.join(z3, "ckpt"), "-o", z3_atomic], ranks=2)
r = run("ucp-reshard", [z3_atomic, "-o", out, "--format", "mcore", "--tp", "1", "--pp", "1", "--model-config", heads])
check("one decayed group over norms and weights (ZeRO-3 GPTModel): refused, naming a parameter whose decay would change",
      r.returncode != 0 and "decay would change" in r.stderr and "input_layernorm.weight" in r.stderr and "--weights-only" in r.stderr
      and not os.path.exists(out), r.stderr[-500:])
mcore = os.path.join(ROOT, "tests", "data", "real-mcore", "llama_tp2", "checkpoint")
matomic = os.path.join(WORK, "mcore-llama_tp2")
r = run("ucp-convert", [mcore, "-o", matomic], ranks=2)
r = run("ucp-reshard", [matomic, "-o", out, "--format", "mcore", "--tp", "1", "--pp", "1", "--use-distributed-optimizer"])
check("--use-distributed-optimizer for a Megatron-Core source run without it: refused, naming its args", r.returncode != 0
      and "use_distributed_optimizer False" in r.stderr and not os.path.exists(out), r.stderr[-400:])
finish("deepspeed_to_mcore")
