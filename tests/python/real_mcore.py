"""Megatron-Core `torch_dist` checkpoints written by Megatron-Core 0.17.1's own dist_checkpointing.save
(tests/data/real-mcore/<case>/checkpoint, make_mcore.py there), against torch's own DCP loader:
reference.pt holds every key's global tensor as torch read it, common.json what torch.load found in
common.pt.

    real_mcore.py UCP_BIN_DIR CASES_DIR WORK [mpiexec]

For every case, at 1 and 2 MPI ranks:
- the atomic parameters are the checkpoint's model keys, stacked layers included, and nothing else;
- every fp32 weight, exp_avg and exp_avg_sq equals reference.pt's tensor (the model key, or the
  optimizer's fp32 master optimizer.state.param.<key> where it keeps one; optimizer.state.exp_avg.<key>,
  optimizer.state.exp_avg_sq.<key>) byte for byte; every step is common.pt's (common_step, or the
  distributed optimizer's param groups' step); zero/optimizer_state.pt holds common.pt's param groups;
- ucp-inspect says Megatron-Core, the iteration and the param groups note.
The distributed optimizer's dp_reshardable form (checkpoint_dp_reshardable, saved beside the
fully_reshardable copy of the same state in the same process): converted at 1 and 2 ranks, its atomic
checkpoint equals the fully_reshardable one's byte for byte, or, where Megatron's own fully_reshardable
save wrote another state (reference_trained.pt: the trained state), equals the trained state, and that
save is refused (its masters disagree with the model's tensors). Damaged dp_reshardable copies: a
layout that disagrees with the chunk edges, a missing domain, a truncated .distcp, each refused by name.
Then damaged copies: a flipped byte in common.pt is refused naming it; a metadata.json naming another
backend, or empty, is refused naming it; a missing common.pt is refused naming it; an optimizer.* key
of no known form is refused naming it (never read as a model tensor); a missing metadata.json or an
unknown backend version is refused naming it; ucp-inspect --verify finds a flipped byte in a chunk's
byteorder record.
"""
import json
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from atomic_files import same_bytes  # noqa: E402
from mcore_atomic import jsonable, same_atomic, weights_only_converts  # noqa: E402
from checklist import cases_holding, check, finish, fresh_folder, refused_when_damaged, tool_runner  # noqa: E402

BIN, CASES, WORK = sys.argv[1:4]
run = tool_runner(BIN, sys.argv[4] if len(sys.argv) > 4 else None)
PREFIX = "optimizer.state."




def compare(case, atomic, ref, common):
    zero = os.path.join(atomic, "zero")
    names = sorted(d for d in os.listdir(zero) if os.path.isdir(os.path.join(zero, d)))
    model = sorted(k for k in ref if not k.startswith("optimizer."))
    check(f"{case}: the parameters are the model keys", names == model, f"{names} vs {model}")
    bad = []
    for name in names:
        # the optimizer's fp32 master where it keeps one (the distributed optimizer's "param", the
        # mixed-precision one's "fp32_param"), else the model tensor
        master = ref.get(PREFIX + "param." + name, ref.get(PREFIX + "fp32_param." + name, ref[name]))
        wants = {"fp32": master, "exp_avg": ref[PREFIX + "exp_avg." + name], "exp_avg_sq": ref[PREFIX + "exp_avg_sq." + name]}
        for state, want in wants.items():
            got = torch.load(os.path.join(zero, name, state + ".pt"), map_location="cpu")
            got = got["param"] if isinstance(got, dict) else got
            if not same_bytes(got, want):
                bad.append(f"{name}/{state}")
        step = torch.load(os.path.join(zero, name, "step.pt"), map_location="cpu")
        step = step["param"] if isinstance(step, dict) else step
        if "common_step" in common:  # a 0-d tensor every parameter shares (a ChainedOptimizer's: each optimizer's, all equal)
            want = common["common_step"]
            if isinstance(want, list) and len(set(want)) == 1:
                want = want[0]
            if float(step) != want or str(step.dtype) != common["common_step_dtype"]:
                bad.append(f"{name}/step {step!r}")
        elif type(step).__name__ != common["step_type"] or step != common["step"]:  # the param groups' step
            bad.append(f"{name}/step {step!r}")
    check(f"{case}: every tensor equals reference.pt's byte for byte, every step common.pt's ({len(names)} x 4)", not bad, str(bad[:5]))
    osd = torch.load(os.path.join(zero, "optimizer_state.pt"), map_location="cpu")
    check(f"{case}: param_groups are common.pt's, in order", jsonable(osd.get("param_groups")) == common["param_groups"] and
          [list(g) for g in osd["param_groups"]] == [list(g) for g in common["param_groups"]], f"{osd.get('param_groups')}")
    if "chained" in common:  # Megatron-LM's ChainedOptimizer (dense, expert): each one's group count, for --format mcore
        check(f"{case}: the chain of optimizers recorded, each one's param groups ({common['chained']})",
              osd.get("megatron_chained") == common["chained"], str(osd.get("megatron_chained")))


# Cases built from Megatron-LM's validated args (make_mcore.py's FROM_ARGS): the layout they ran at, tp, pp, dp, ep
JOB_LAYOUT = {"gpt_tp2": (2, 1, 1, 1), "gpt_tp2_tied": (2, 1, 1, 1), "moe_tp2_ep2_logits": (2, 1, 2, 2)}
# The dp_reshardable MoE cases (README.md), whose args parse_args made without a launcher: their DP, as the files show it
BUCKET_DP = {"moe_ep2_dp4_distopt_bf16": 4, "moe_tp2_ep2_distopt_bf16": 2, "moe_pp2_ep2_distopt_bf16": 2, "moe_ep1_dp2_distopt_bf16": 2}

fresh_folder(WORK)
cases = cases_holding(CASES, "reference.pt")
check("Megatron-Core cases found", len(cases) >= 3, str(cases))
for case in cases:
    ckpt = os.path.join(CASES, case, "checkpoint")
    ref = torch.load(os.path.join(CASES, case, "reference.pt"), map_location="cpu")
    common = json.load(open(os.path.join(CASES, case, "common.json")))
    if case in JOB_LAYOUT:  # the layout the case ran at (README.md), which its validated args record
        r = run("ucp-inspect", [ckpt, "--json"])
        got = json.loads(r.stdout)["degrees"] if r.returncode == 0 else {}
        want = dict(zip(("tp", "pp", "dp", "ep"), JOB_LAYOUT[case]))
        check(f"{case}: inspect --json gives the saving job's degrees from its args ({want})",
              {k: got.get(k) for k in want} == want, str(got) + r.stderr[-300:])
        check(f"{case}: inspect --json says the args record the DP", got.get("dp_recorded") is True, str(got))
    r = run("ucp-inspect", [ckpt])
    check(f"{case}: inspect says Megatron-Core, the optimizer and the iteration", r.returncode == 0 and "Megatron-Core" in r.stdout and
          f"iteration    {common['iteration']}" in r.stdout and "param groups" in r.stdout and
          ("DistributedOptimizer, fully_reshardable" in r.stdout) == ("step_type" in common), r.stdout[-1500:] + r.stderr[-500:])
    # reference_trained.pt: the trained optimizer's state where Megatron's own save wrote another (its
    # fully_reshardable form with several gradient buckets, Megatron-Core 0.17.1): the save is refused,
    # its masters disagreeing with the model's tensors saved beside them.
    trained_path = os.path.join(CASES, case, "reference_trained.pt")
    trained = torch.load(trained_path, map_location="cpu") if os.path.exists(trained_path) else {}
    wrong = sorted(k for k, v in trained.items() if not same_bytes(v, ref[k]))
    for np in (1, 2):
        atomic = os.path.join(WORK, f"{case}-np{np}")
        r = run("ucp-convert", [ckpt, "-o", atomic], ranks=np)
        if wrong:
            check(f"{case}: Megatron's save whose {len(wrong)} optimizer tensors are not the trained state is refused at {np} rank(s), "
                  "naming the masters that disagree with the model's tensors", r.returncode == 1 and
                  "disagree with the model's own tensors saved beside them" in r.stderr and "fully_reshardable" in r.stderr and
                  "Traceback" not in r.stderr and
                  not os.path.exists(os.path.join(atomic, "ucp_manifest.json")), r.stderr[-1500:])
            continue
        check(f"{case}: convert at {np} rank(s)", r.returncode == 0, r.stderr[-1500:])
        if r.returncode == 0:
            compare(f"{case} np{np}", atomic, ref, common)
    if not wrong:
        r = run("ucp-inspect", ["--verify", os.path.join(WORK, f"{case}-np2")])
        check(f"{case}: the atomic checkpoint verifies", r.returncode == 0, r.stdout[-800:] + r.stderr[-800:])
    # The distributed optimizer's default form, saved from the same state in the same process: its
    # atomic checkpoint equals the fully_reshardable one's (whose tensors equal torch's own reading).
    buckets = os.path.join(CASES, case, "checkpoint_dp_reshardable")
    if not os.path.isdir(buckets):
        continue
    if case in BUCKET_DP:  # args that record no DP (unvalidated, as parse_args made them): the least its files show, said so
        r = run("ucp-inspect", [buckets, "--json"])
        got = json.loads(r.stdout)["degrees"] if r.returncode == 0 else {}
        check(f"{case} dp_reshardable: inspect --json gives DP {BUCKET_DP[case]} from its files (every rank saves its buckets), "
              "not recorded by the args", got.get("dp") == BUCKET_DP[case] and got.get("dp_recorded") is False, str(got) + r.stderr[-300:])
    r = run("ucp-inspect", [buckets])
    check(f"{case} dp_reshardable: inspect names the form and what Megatron itself could reshard", r.returncode == 0 and
          "DistributedOptimizer, dp_reshardable" in r.stdout and "only at the TP, PP (and EP) it was saved with" in r.stdout,
          r.stdout[-1500:] + r.stderr[-800:])
    for np in (1, 2):
        atomic = os.path.join(WORK, f"{case}-dp_reshardable-np{np}")
        r = run("ucp-convert", [buckets, "-o", atomic], ranks=np)
        check(f"{case} dp_reshardable: convert at {np} rank(s)", r.returncode == 0, r.stderr[-1500:])
        if r.returncode != 0:
            continue
        if wrong:  # against the trained state itself
            compare(f"{case} dp_reshardable np{np} vs the trained state", atomic, {**ref, **trained}, common)
        else:
            same_atomic(check, f"{case} dp_reshardable np{np} vs fully_reshardable", atomic, os.path.join(WORK, f"{case}-np{np}"))
        if "chained" in common:  # the chain's groups, counted from each optimizer's objects in the DCP
            osd = torch.load(os.path.join(atomic, "zero", "optimizer_state.pt"), map_location="cpu")
            check(f"{case} dp_reshardable np{np}: the chain of optimizers recorded ({common['chained']})",
                  osd.get("megatron_chained") == common["chained"], str(osd.get("megatron_chained")))


def damaged(label, mutate, expect):
    """A copy of the first case changed by mutate(folder), refused naming `expect` (checklist.py)."""
    refused_when_damaged(run, WORK, label, os.path.join(CASES, "llama_tp2", "checkpoint"), mutate, expect)


def flip_common(folder):
    # A byte of common.pt's pickle (data.pkl, the first record): the step and the groups come from it.
    p = os.path.join(folder, "common.pt")
    data = bytearray(open(p, "rb").read())
    n, e = int.from_bytes(data[26:28], "little"), int.from_bytes(data[28:30], "little")
    data[30 + n + e + 40] ^= 0x01
    open(p, "wb").write(bytes(data))


def metadata_json_edit(old, new):
    """A mutation of metadata.json: its text `old` (which must be there) replaced by `new`."""
    def mutate(folder):
        p = os.path.join(folder, "metadata.json")
        text = open(p).read()
        assert old in text, f"{old} in metadata.json"
        open(p, "w").write(text.replace(old, new))
    return mutate


def empty_metadata_json(folder):
    open(os.path.join(folder, "metadata.json"), "w").close()


def no_metadata_json(folder):
    os.remove(os.path.join(folder, "metadata.json"))


def no_common(folder):
    os.remove(os.path.join(folder, "common.pt"))


def unknown_optimizer_key(folder):
    # Every exp_avg_sq key renamed to an optimizer.* name of no known form (same length: the pickle stays whole).
    p = os.path.join(folder, ".metadata")
    data = open(p, "rb").read()
    assert b"optimizer.state.exp_avg_sq." in data
    open(p, "wb").write(data.replace(b"optimizer.state.exp_avg_sq.", b"optimizer.statZ.exp_avg_sq."))


def metadata_rename(old, new):
    """A mutation of .metadata: every `old` (bytes, present) renamed `new` of the same length (the pickle stays whole)."""
    def mutate(folder):
        p = os.path.join(folder, ".metadata")
        data = open(p, "rb").read()
        assert old in data and len(old) == len(new), old
        open(p, "wb").write(data.replace(old, new))
    return mutate


def truncate(name):
    def mutate(folder):
        p = os.path.join(folder, name)
        os.truncate(p, os.path.getsize(p) // 2)
    return mutate


# The dp_reshardable form, damaged: a layer key read as another kind, so that the layout computed from
# the model's tensors is not the saved one (the chunk edges say so; bucket sizes that disagree are
# test_bucket_layout.cpp's); a model-parallel domain missing; a truncated .distcp.
BUCKETS = os.path.join(CASES, "llama_tp2_dp2_distopt_bf16", "checkpoint_dp_reshardable")
refused_when_damaged(run, WORK, "dp_reshardable layout not the saved one", BUCKETS,
                     metadata_rename(b"decoder.layers.mlp.linear_fc2.weight", b"decoderXlayers.mlp.linear_fc2.weight"),
                     ["bucket_idx_0.param", "crosses the edge of", "not the one the files were saved with"])
refused_when_damaged(run, WORK, "dp_reshardable domain missing", BUCKETS, metadata_rename(b"dp_group_idx_1.", b"dp_group_idx_7."),
                     ["dp_group_idx_1 (tp=1, pp=0)", "missing"])
refused_when_damaged(run, WORK, "dp_reshardable truncated distcp", BUCKETS, truncate("__3_0.distcp"), ["__3_0.distcp"])
# Megatron-LM's chain at EP > 1 (a dense and an expert distributed optimizer), damaged: the expert optimizer's
# domain of EP rank 1 missing; the experts' fc1 not read as experts' (walked as a dense layer tensor), so the
# buckets computed are not the saved ones.
MOE_BUCKETS = os.path.join(CASES, "moe_ep2_dp4_distopt_bf16", "checkpoint_dp_reshardable")
refused_when_damaged(run, WORK, "dp_reshardable chain's expert domain missing", MOE_BUCKETS,
                     metadata_rename(b"chained_1.optimizer.distributed.dp_group_idx_1.", b"chained_1.optimizer.distributed.dp_group_idx_7."),
                     ["chained_1.optimizer.distributed.dp_group_idx_1 (the experts' optimizer: expert tp=0, ep=1, pp=0)", "missing"])
refused_when_damaged(run, WORK, "dp_reshardable chain's experts misread", MOE_BUCKETS,
                     metadata_rename(b"mlp.experts.experts.linear_fc1", b"mlp.experts.expertsXlinear_fc1"),
                     ["chained_0.optimizer.distributed.dp_group_idx_0", "not the one the files were saved with"])

def swap_files(a, b):
    def mutate(folder):
        pa, pb = os.path.join(folder, a), os.path.join(folder, b)
        os.rename(pa, pa + ".x"), os.rename(pb, pa), os.rename(pa + ".x", pb)
    return mutate


# Two DP ranks' files of the same size swapped: every record's CRC-32 holds, only the masters and the model's
# tensors disagree. Refused naming both files, never a crash (a run of its message once read past a table).
for attempt in range(3):
    refused_when_damaged(run, WORK, f"dp_reshardable ranks' files swapped {attempt}", BUCKETS, swap_files("__2_0.distcp", "__3_0.distcp"),
                         ["__2_0.distcp, __3_0.distcp disagree with the model's own tensors", "swapped or renamed"])
r = run("ucp-inspect", ["--verify", os.path.join(WORK, "damaged", "dp_reshardable_ranks'_files_swapped_0", "ckpt")])
check("damaged: swapped files: inspect --verify names them and a parameter", r.returncode != 0 and "__2_0.distcp, __3_0.distcp" in r.stderr and
      ("'decoder." in r.stderr or "'embedding." in r.stderr) and " by up to 0)" not in r.stderr, r.stdout[-500:] + r.stderr[-800:])

# A torch_dist root: the iteration latest_checkpointed_iteration.txt names is read, not the newest beside it.
tracked = os.path.join(WORK, "megatron_root")
shutil.rmtree(tracked, ignore_errors=True)
for it in ("iter_0000003", "iter_0000010"):
    shutil.copytree(os.path.join(CASES, "llama_tp2", "checkpoint"), os.path.join(tracked, it))
open(os.path.join(tracked, "latest_checkpointed_iteration.txt"), "w").write("3\n")
r = run("ucp-inspect", [tracked])
check("a Megatron-LM root: read as Megatron-LM's --load reads it, the iteration latest_checkpointed_iteration.txt names, not the newest",
      r.returncode == 0 and "reading " + os.path.join(tracked, "iter_0000003") in r.stderr and "iter_0000010" not in r.stderr + r.stdout and
      "checkpoint   " + os.path.join(tracked, "iter_0000003") in r.stdout, r.stdout[-600:] + r.stderr[-600:])
open(os.path.join(tracked, "latest_checkpointed_iteration.txt"), "w").write("7\n")
r = run("ucp-convert", [tracked, "-o", os.path.join(WORK, "megatron_root_out")])
check("a Megatron-LM root naming an iteration that is not there: refused by name", r.returncode != 0 and
      "names iteration 7" in r.stderr and "iter_0000007" in r.stderr, r.stderr[-600:])

damaged("flipped byte in common.pt", flip_common, ["common.pt", "CRC"])
damaged("optimizer key of no known form", unknown_optimizer_key, ["optimizer.statZ.exp_avg_sq.", "does not know how to read"])
damaged("zarr backend", metadata_json_edit('"torch_dist"', '"zarr"'), ["metadata.json", "zarr"])
damaged("empty metadata.json", empty_metadata_json, ["metadata.json", "JSON"])
damaged("no metadata.json", no_metadata_json, ["metadata.json", "common.pt"])
damaged("sharded_backend_version 2", metadata_json_edit('"sharded_backend_version": 1', '"sharded_backend_version": 2'),
        ["metadata.json", "sharded_backend_version 2"])
damaged("no common.pt", no_common, ["common.pt", "common_state"])
# A flipped byte in a record no tensor is read from (a chunk archive's byteorder): --verify finds it.
d = os.path.join(WORK, "damaged", "byteorder")
shutil.copytree(os.path.join(CASES, "llama_tp2", "checkpoint"), d)
p = os.path.join(d, "__0_0.distcp")
data = bytearray(open(p, "rb").read())
at = data.find(b"PK\x03\x04")
while at >= 0:
    n, e = int.from_bytes(data[at + 26:at + 28], "little"), int.from_bytes(data[at + 28:at + 30], "little")
    if data[at + 30:at + 30 + n].endswith(b"/byteorder"):
        data[at + 30 + n + e] ^= 0x20
        break
    at = data.find(b"PK\x03\x04", at + 4)
assert at >= 0, "a byteorder record"
open(p, "wb").write(bytes(data))
r = run("ucp-inspect", ["--verify", d])
check("damaged: a flipped byte in a chunk's byteorder record: inspect --verify finds it",
      r.returncode != 0 and "byteorder" in r.stdout + r.stderr and "CRC" in r.stdout + r.stderr, r.stdout[-500:] + r.stderr[-500:])
# A weights-only torch_dist save (Megatron-LM's --no-save-optim: no optimizer.* key, common.pt without
# optimizer): a weights-only atomic checkpoint of the model's own tensors widened to fp32, whose Hugging Face
# export in the job's bf16 equals the export of the full save's atomic checkpoint byte for byte.
case = "gpt_tp2_pp2_bf16_legacy"
wo = os.path.join(CASES, case, "checkpoint_weights_only")
check("the weights-only torch_dist case is there", os.path.isdir(wo), wo)
r = run("ucp-inspect", [wo])
check("weights-only torch_dist: inspect says weights only", r.returncode == 0 and "model weights only" in r.stdout, r.stdout[-1000:] + r.stderr[-600:])
ref = torch.load(os.path.join(CASES, case, "reference.pt"), map_location="cpu")
weights_only_converts(run, check, "weights-only torch_dist", wo, ref, WORK)
# Targets a weights-only Megatron-Core atomic checkpoint does not get, each refused for its true reason.
wo_atomic = os.path.join(WORK, "weights-only-np2")
r = run("ucp-reshard", [wo_atomic, "-o", os.path.join(WORK, "wo-ds"), "--dp", "1", "--tp", "2", "--pp", "1", "--zero-stage", "1", "--no-optimizer"])
check("weights-only torch_dist GPT (untied): a DeepSpeed layout is refused as one Megatron-DeepSpeed's tied GPT does not hold, "
      "pointing to --format hf", r.returncode != 0 and "tie_word_embeddings false" in r.stderr and "--format hf" in r.stderr and
      "is not this model's" not in r.stderr and not os.path.exists(os.path.join(WORK, "wo-ds", "latest")), r.stderr[-600:])
r = run("ucp-reshard", [wo_atomic, "-o", os.path.join(WORK, "wo-dcp"), "--format", "dcp", "--mesh", "tp=2"])
check("weights-only torch_dist GPT: --format dcp is refused as GPT-shaped, naming GPT2LMHeadModel", r.returncode != 0 and
      "GPT-shaped" in r.stderr and "GPT2LMHeadModel" in r.stderr and "transformers has a class" not in r.stderr and
      not os.path.exists(os.path.join(WORK, "wo-dcp", ".metadata")), r.stderr[-600:])
hf = {}
for name, atomic in (("weights-only", os.path.join(WORK, "weights-only-np2")), ("full", os.path.join(WORK, f"{case}-np2"))):
    hf[name] = os.path.join(WORK, f"{name}-hf")
    r = run("ucp-reshard", [atomic, "-o", hf[name], "--format", "hf"])
    check(f"{case} {name}: exported to Hugging Face", r.returncode == 0, r.stderr[-800:])
st = sorted(n for n in os.listdir(hf["full"]) if n.endswith(".safetensors")) if os.path.isdir(hf["full"]) else []
check("weights-only torch_dist: the export's safetensors equal the full save's byte for byte", st and os.path.isdir(hf["weights-only"]) and
      all(open(os.path.join(hf["weights-only"], n), "rb").read() == open(os.path.join(hf["full"], n), "rb").read() for n in st), str(st))
finish("real_mcore")
