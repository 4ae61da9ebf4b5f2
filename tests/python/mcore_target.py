"""The Megatron-Core target (ucp-reshard --format mcore --tp T --pp P [--dp D]), from Megatron-Core 0.17.1's own
saves (tests/data/real-mcore, make_mcore.py there): its torch_dist form with each of its optimizers (FP32Optimizer;
the distributed optimizer in bf16; Float16OptimizerWithFloat16Params in bf16, from the legacy form), a
weights-only save (--no-save-optim), a GPT with its output layer tied to the word embedding (at PP=2, where
the last stage holds the embedding's copy) and Mixture-of-Experts models (SequentialMLP experts at new TP, PP and
EP: at EP 1 the job has no expert param group), each written at layouts other than the source's.

    mcore_target.py UCP_BIN_DIR CASES_DIR WORK RECORD [mpiexec]

Each output is Megatron-LM's root: latest_checkpointed_iteration.txt naming the source's iteration, and
iter_NNNNNNN/ holding .metadata, common.pt, metadata.json and one __<rank>_0.distcp per rank of DP rank 0.
- Round trip: ucp-convert of the output root (the iteration its tracker names) gives back the atomic checkpoint it was written from, every weight,
  exp_avg, exp_avg_sq and step byte for byte, and the param groups (the weights alone for weights-only).
- Real reader: RECORD (tests/data/real-mcore/mcore_target_readers.json, written by mcore_load_check.py in the
  trixie chroot) holds the sha256 of every file of each output that Megatron-LM's own load_checkpoint loaded
  at its layout, with what it found; every output here must be those bytes, and the record must say every
  tensor was equal (and, where it trained on, steps 4-5 within 1e-5 of the reference run's losses).
- Refused by name, nothing written: a layout that does not divide the layers or the heads (or the experts: --ep,
  and an EP that does not divide DP), no --tp / --pp, layout flags of DeepSpeed's.
"""
import hashlib
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from atomic_files import same_bytes  # noqa: E402
from checklist import check, finish, fresh_folder, tool_runner  # noqa: E402
from mcore_atomic import same_atomic  # noqa: E402

BIN, CASES, WORK, RECORD = sys.argv[1:5]
run = tool_runner(BIN, sys.argv[5] if len(sys.argv) > 5 else None)
fresh_folder(WORK)
record = json.load(open(RECORD))

# (label, source folder, layouts written: tp, pp, dp[, ep: a MoE model's experts over ep of the DP ranks, else
# the source's EP])
SOURCES = [
    ("llama_tp2", "llama_tp2/checkpoint", [(1, 2, 1), (2, 2, 1), (1, 1, 2)]),
    ("llama_tp2_dp2_distopt_bf16", "llama_tp2_dp2_distopt_bf16/checkpoint", [(1, 2, 1), (2, 1, 2)]),
    ("gpt_tp2_pp2_bf16_legacy", "gpt_tp2_pp2_bf16_legacy/legacy", [(1, 1, 1), (2, 1, 1)]),
    ("gpt_weights_only", "gpt_tp2_pp2_bf16_legacy/checkpoint_weights_only", [(1, 2, 1)]),
    ("gpt_tp2_tied", "gpt_tp2_tied/checkpoint", [(1, 2, 1)]),
    # Mixture of Experts (SequentialMLP; the source at TP=2 x EP=2, 3 param groups: dense, expert, no weight decay)
    ("moe_tp2_ep2_logits", "moe_tp2_ep2_logits/checkpoint", [(1, 1, 1, 1), (1, 2, 2, 2), (2, 1, 2), (1, 1, 4, 4)]),
    ("moe_ep2", "moe_ep2/checkpoint", [(2, 2, 1, 1)]),
    # Megatron-LM's own optimizer at EP 2: a ChainedOptimizer (dense, expert), written as one again at EP > 1
    ("moe_ep2_chained", "moe_ep2_chained/checkpoint", [(1, 1, 1, 1), (1, 2, 2), (2, 1, 2, 2), (1, 1, 4, 4)]),
    # Megatron-LM's own optimizer at EP 1 (one, 2 groups), at EP > 1: the chain, its expert group made as Megatron-Core builds it
    ("moe_ep1_dp2", "moe_ep1_dp2/checkpoint", [(1, 1, 2, 2), (2, 1, 2, 2), (1, 2, 4, 4)]),
    # Megatron-LM's default bf16 MoE run, from its dp_reshardable save: a chain of distributed optimizers at EP 2, one at EP 1
    ("moe_ep2_dp4_distopt_bf16", "moe_ep2_dp4_distopt_bf16/checkpoint_dp_reshardable",
     [(1, 1, 2, 2), (2, 1, 2, 2), (1, 1, 2, 1), (1, 2, 2, 2), (1, 1, 4, 2)]),
    ("moe_ep1_dp2_distopt_bf16", "moe_ep1_dp2_distopt_bf16/checkpoint_dp_reshardable", [(1, 1, 2, 2), (1, 2, 4, 4)]),
]
SOURCE_EP = {"moe_tp2_ep2_logits": 2, "moe_ep2": 2, "moe_ep2_chained": 2, "moe_ep1_dp2": 1, "moe_ep2_dp4_distopt_bf16": 2,
             "moe_ep1_dp2_distopt_bf16": 1}
# The sources whose job ran Megatron-LM's own get_megatron_optimizer: at EP > 1 it chains a dense and an expert optimizer
MEGATRON_OPTIMIZER = ("moe_ep2_chained", "moe_ep1_dp2", "moe_ep2_dp4_distopt_bf16", "moe_ep1_dp2_distopt_bf16")


def with_expert_groups(groups):
    """An EP 1 save's 2 default groups at EP > 1: Megatron-Core's experts (their weights: the decayed group's
    options) get a group of their own, is_expert_parallel (the chain's second optimizer)."""
    return groups + [dict(g, is_expert_parallel=True) for g in groups if g.get("wd_mult") == 1.0]


def without_expert_groups(groups):
    """Megatron-Core marks experts expert-parallel only at EP > 1 (tensor_parallel/layers.py: allreduce = not
    (is_expert and expert_model_parallel_size > 1)): at EP 1 _get_param_groups has no expert groups."""
    return [g for g in groups if not g.get("is_expert_parallel")]


def sha256(path):  # the files here are small
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def files_of(root):
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            p = os.path.join(d, n)
            out[os.path.relpath(p, root)] = p
    return out


def same_weights(label, a, b):
    """Weights-only atomic checkpoints a and b: the same parameters, each weight byte for byte, no moments."""
    za, zb = os.path.join(a, "zero"), os.path.join(b, "zero")
    names = sorted(d for d in os.listdir(za) if os.path.isdir(os.path.join(za, d)))
    def fp32(z, n):
        v = torch.load(os.path.join(z, n, "fp32.pt"), map_location="cpu")
        return v["param"] if isinstance(v, dict) else v
    bad = [n for n in names if not same_bytes(fp32(za, n), fp32(zb, n))]
    check(f"{label}: the same weights byte for byte, no moments ({len(names)})",
          names == sorted(d for d in os.listdir(zb) if os.path.isdir(os.path.join(zb, d))) and not bad and
          not any(os.path.exists(os.path.join(zb, n, "exp_avg.pt")) for n in names), str(bad[:5]))


for label, folder, layouts in SOURCES:
    atomic = os.path.join(WORK, label, "atomic")
    r = run("ucp-convert", [os.path.join(CASES, folder), "-o", atomic], ranks=2)
    check(f"{label}: converts", r.returncode == 0, r.stderr[-1200:])
    if r.returncode != 0:
        continue
    for tp, pp, dp, *given_ep in layouts:
        ep = given_ep[0] if given_ep else SOURCE_EP.get(label, 1)
        layout = f"tp{tp}_pp{pp}_dp{dp}" + (f"_ep{ep}" if ep > 1 else "")
        out = os.path.join(WORK, label, layout)
        for ranks in (1, 2):
            if ranks == 2:
                fresh_folder(out)
                os.rmdir(out)
            r = run("ucp-reshard", [atomic, "-o", out, "--format", "mcore", "--tp", str(tp), "--pp", str(pp), "--dp", str(dp)] +
                    (["--ep", str(given_ep[0])] if given_ep else []), ranks=ranks)
            check(f"{label} -> {layout}: written at {ranks} rank(s)", r.returncode == 0 and "Megatron-Core GPTModel" in r.stderr, r.stderr[-1500:])
        if r.returncode != 0:
            continue
        files = files_of(out)
        want = {"latest_checkpointed_iteration.txt", "iter_0000003/.metadata", "iter_0000003/common.pt", "iter_0000003/metadata.json"}
        # DP rank 0's ranks, and the experts' EP ranks (expert DP rank 0): t + tp * (e + dp * p)
        want |= {f"iter_0000003/__{t + tp * (e + dp * p)}_0.distcp" for t in range(tp) for p in range(pp) for e in range(ep)}
        check(f"{label} -> {layout}: Megatron-LM's root, one file per rank of DP rank 0" + (f" and of EP ranks 1-{ep - 1}" if ep > 1 else ""),
              set(files) - {".ucp-reshard.json"} == want,
              str(sorted(files)))
        check(f"{label} -> {layout}: latest_checkpointed_iteration.txt names iteration 3",
              open(os.path.join(out, "latest_checkpointed_iteration.txt")).read() == "3")
        back = os.path.join(WORK, label, layout + "-back")
        r = run("ucp-convert", [out, "-o", back], ranks=2)  # the root, read as Megatron-LM's --load reads it
        check(f"{label} -> {layout}: the output root converts back, its tracker's iteration read", r.returncode == 0 and
              "is a Megatron-LM checkpoint root: reading " + os.path.join(out, "iter_0000003") in r.stderr, r.stderr[-1500:])
        if label in SOURCE_EP:  # Megatron-LM's chain of a dense and an expert optimizer where its job builds one
            chain = label in MEGATRON_OPTIMIZER and ep > 1
            check(f"{label} -> {layout}: " + ("a ChainedOptimizer of 2 in common.pt" if chain else "one optimizer in common.pt"),
                  r.returncode == 0 and ("optimizer: ChainedOptimizer of 2" in r.stderr) == chain, r.stderr[-1500:])
        if r.returncode == 0:
            regroup = (without_expert_groups if label in SOURCE_EP and ep == 1 else
                       with_expert_groups if SOURCE_EP.get(label) == 1 and ep > 1 else None)
            (same_weights if label.endswith("weights_only") else lambda l, a, b: same_atomic(check, l, a, b, regroup))(
                f"{label} -> {layout} -> atomic", atomic, back)
        seen = record["outputs"].get(f"{label}:{layout}")
        check(f"{label} -> {layout}: the bytes Megatron-LM's load_checkpoint loaded at {layout} (RECORD)", seen is not None and
              seen["sha256"] == {k: sha256(p) for k, p in files.items() if k != ".ucp-reshard.json"},
              "not in the record" if seen is None else "the files differ from the ones recorded: rerun mcore_load_check.py")
        if seen is not None:
            flags = " ".join(seen.get("flags") or []) or "the job's default flags"
            check(f"{label} -> {layout}: Megatron-LM ({flags}) found every tensor equal ({seen.get('tensors_equal')} of "
                  f"{seen.get('tensors')}), iteration 3", seen.get("tensors") and seen.get("tensors_equal") == seen.get("tensors") and
                  seen.get("iteration") == 3 and not seen.get("error"), json.dumps(seen)[:800])
            if seen.get("max_loss_diff") is not None:
                check(f"{label} -> {layout}: training on after the load: steps 4-5 within 1e-5 of the reference run's losses "
                      f"({seen['max_loss_diff']:.1e})", seen["max_loss_diff"] <= 1e-5, json.dumps(seen.get("losses")))

# Refusals, nothing written.
atomic = os.path.join(WORK, "llama_tp2", "atomic")
for args, expect in ((["--tp", "1", "--pp", "3"], "does not divide the model's 4 layers"),
                     (["--tp", "3", "--pp", "1"], "does not divide the model's 4 attention heads"),
                     (["--tp", "4", "--pp", "1"], "does not divide the model's 2 query groups (of its 4 attention heads)"),
                     (["--tp", "1"], "give the layout to write"),
                     (["--tp", "1", "--pp", "1", "--zero-stage", "1"], "(only --tp, --pp, --dp, --ep, --make-vocab-size-divisible-by, --weights-only, --use-distributed-optimizer, --model-config)"),
                     (["--tp", "1", "--pp", "1", "--dtype", "bf16"], "in the job's dtype (fp32)")):
    out = os.path.join(WORK, "refused")
    r = run("ucp-reshard", [atomic, "-o", out, "--format", "mcore"] + args)
    check(f"--format mcore {' '.join(args)}: refused by name, nothing written", r.returncode != 0 and expect in r.stderr and
          not os.path.exists(os.path.join(out, "latest_checkpointed_iteration.txt")), r.stderr[-800:])
# The vocabulary rows (64: 63 tokens padded for TP=2 with make_vocab_size_divisible_by 32) at TP=4, where Megatron-LM
# would pad them to 128: refused, naming the divisor that keeps them; with it, written and recorded in the args.
legacy_atomic = os.path.join(WORK, "gpt_tp2_pp2_bf16_legacy", "atomic")
r = run("ucp-reshard", [legacy_atomic, "-o", os.path.join(WORK, "vocab-tp4"), "--format", "mcore", "--tp", "4", "--pp", "1"])
check("--tp 4 on a vocabulary Megatron-LM would pad to 128 rows: refused, naming --make-vocab-size-divisible-by 16", r.returncode != 0 and
      "pads the vocabulary (63 tokens) to a multiple of make_vocab_size_divisible_by (32) x TP = 128 rows" in r.stderr and
      "--make-vocab-size-divisible-by 16" in r.stderr and
      not os.path.exists(os.path.join(WORK, "vocab-tp4", "latest_checkpointed_iteration.txt")), r.stderr[-800:])
r = run("ucp-reshard", [legacy_atomic, "-o", os.path.join(WORK, "vocab-tp4"), "--format", "mcore", "--tp", "4", "--pp", "1",
                        "--make-vocab-size-divisible-by", "16"])
check("... with --make-vocab-size-divisible-by 16: written", r.returncode == 0, r.stderr[-800:])
r = run("ucp-reshard", [legacy_atomic, "-o", os.path.join(WORK, "vocab-tp4-64"), "--format", "mcore", "--tp", "4", "--pp", "1",
                        "--make-vocab-size-divisible-by", "64"])
check("... with a divisor that pads 63 tokens to 256 rows: refused", r.returncode != 0 and "would refuse its shape" in r.stderr, r.stderr[-800:])

# Args no launch validated (no padded_vocab_size: llama_tp2's, 128 rows, make_vocab_size_divisible_by 128 at TP=2, which
# did not make these rows): a divisor the user gives is taken where the rows are a multiple of it x TP, and refused where
# they are not; without one the rows are written as they are, said in a note.
for tp, divisor, ok in ((1, "128", True), (1, "64", True), (1, "3", False), (2, "128", False), (2, "64", True)):
    out = os.path.join(WORK, f"vocab-unvalidated-{tp}-{divisor}")
    r = run("ucp-reshard", [atomic, "-o", out, "--format", "mcore", "--tp", str(tp), "--pp", "1", "--make-vocab-size-divisible-by", divisor])
    check(f"args without padded_vocab_size, --tp {tp} --make-vocab-size-divisible-by {divisor}: " + ("written" if ok else "refused, not a multiple"),
          (r.returncode == 0 and "written as they are" in r.stderr) if ok else
          (r.returncode != 0 and "not a multiple" in r.stderr and not os.path.exists(os.path.join(out, "latest_checkpointed_iteration.txt"))),
          r.stderr[-600:])
r = run("ucp-reshard", [atomic, "-o", os.path.join(WORK, "launch-note"), "--format", "mcore", "--tp", "1", "--pp", "2", "--plan-only"])
check("the launch flags said: --tensor-model-parallel-size 1 --pipeline-model-parallel-size 2 ... --ckpt-format torch_dist --load",
      r.returncode == 0 and "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 2 --ckpt-format torch_dist --load" in r.stderr,
      r.stderr[-600:])

# --force replaces an earlier run's output (its iteration folder recorded as one entry of the claim).
out = os.path.join(WORK, "llama_tp2", "tp1_pp2_dp1")
r = run("ucp-reshard", [os.path.join(WORK, "llama_tp2", "atomic"), "-o", out, "--format", "mcore", "--tp", "1", "--pp", "2"])
check("the same -o again: refused, offering --force", r.returncode != 0 and "use --force to replace it" in r.stderr, r.stderr[-600:])
before = {k: sha256(p) for k, p in files_of(out).items() if k != ".ucp-reshard.json"}
r = run("ucp-reshard", [os.path.join(WORK, "llama_tp2", "atomic"), "-o", out, "--format", "mcore", "--tp", "1", "--pp", "2", "--force"])
check("... with --force: replaced, the same bytes", r.returncode == 0 and
      {k: sha256(p) for k, p in files_of(out).items() if k != ".ucp-reshard.json"} == before, r.stderr[-600:])
r = run("ucp-reshard", [os.path.join(CASES, "llama_tp2", "checkpoint"), "-o", os.path.join(WORK, "src-in"), "--format", "mcore",
                        "--tp", "1", "--pp", "1"])
check("a source checkpoint given to ucp-reshard: convert it first, the command named", r.returncode != 0 and "convert it first" in r.stderr,
      r.stderr[-600:])
r = run("ucp-reshard", [out, "-o", os.path.join(WORK, "root-in"), "--format", "mcore", "--tp", "1", "--pp", "1"])
check("a Megatron-LM root given to ucp-reshard: convert it first, the command named", r.returncode != 0 and
      "a Megatron-LM checkpoint root" in r.stderr and "convert it first" in r.stderr, r.stderr[-600:])

# Mixture of Experts: layouts that do not place the experts, refused by name, nothing written.
moe = os.path.join(WORK, "moe_tp2_ep2_logits", "atomic")
ep1_back = os.path.join(WORK, "moe_tp2_ep2_logits", "tp1_pp1_dp1-back")  # the EP 1 output converted back: no expert group
for source, args, expect in ((moe, ["--tp", "1", "--pp", "1"], "the source's EP 2 does not divide DP 1 (--dp not given)"),
                             (moe, ["--tp", "1", "--pp", "1", "--dp", "3", "--ep", "3"], "--ep 3 does not divide the model's 4 experts"),
                             (moe, ["--tp", "1", "--pp", "1", "--dp", "2", "--ep", "4"], "--ep 4 does not divide --dp 2"),
                             (atomic, ["--tp", "1", "--pp", "1", "--dp", "2", "--ep", "2"], "a dense model has no experts")):
    out = os.path.join(WORK, "refused")
    r = run("ucp-reshard", [source, "-o", out, "--format", "mcore"] + args)
    check(f"{os.path.relpath(source, WORK)} --format mcore {' '.join(args)}: refused by name, nothing written", r.returncode != 0 and expect in r.stderr and
          not os.path.exists(os.path.join(out, "latest_checkpointed_iteration.txt")), r.stderr[-800:])
r = run("ucp-reshard", [ep1_back, "-o", os.path.join(WORK, "moe-ep2-weights"), "--format", "mcore", "--tp", "1", "--pp", "1", "--dp", "2",
                        "--ep", "2", "--weights-only"])
check("an EP 1 save at EP 2 with --weights-only: the model alone, written", r.returncode == 0 and
      os.path.exists(os.path.join(WORK, "moe-ep2-weights", "latest_checkpointed_iteration.txt")), r.stderr[-800:])
r = run("ucp-reshard", [ep1_back, "-o", os.path.join(WORK, "moe-ep2-made"), "--format", "mcore", "--tp", "1", "--pp", "1", "--dp", "2",
                        "--ep", "2"])
check("an EP 1 save at EP 2 with its optimizer: Megatron-LM's chain, the experts' groups made from the EP 1 groups (said)",
      r.returncode == 0 and "ChainedOptimizer" in r.stderr and "made from the source's EP 1 groups" in r.stderr, r.stderr[-800:])

# (a real Megatron-DeepSpeed-style DeepSpeed checkpoint, its optimizer state carried: deepspeed_to_mcore.py)

finish("mcore_target")
