"""DeepSpeed Ulysses sequence parallelism as a layout dimension (issue 31), on the real SP=2 x DP=2 case
that DeepSpeed 0.14.5 wrote through the harness (`--sp 2`), and on a real case without SP.

    sp_layout.py UCP_BIN_DIR CASES_DIR WORK MOE_CASE_CKPT [mpiexec]

Ground truth: DeepSpeed's own files. Under SP, DeepSpeed partitions ZeRO state over the DP x SP ranks
and numbers the files by that rank; it records SP only in Megatron's args (ds_sequence_parallel_size,
sequence_data_parallel_size). So:
- ucp-inspect must read SP=2 from the args (text and JSON), and say on a case without args that dp
  counts DP x SP ranks;
- SP=4 x DP=1 has DeepSpeed's four partitions: its optimizer files must equal the real SP=2 x DP=2
  files tensor for tensor (the partitioning does not depend on how the ranks split into DP and SP),
  and its args must record the new degrees;
- every written layout numbers dp x sp files and records dp x sp as dp_world_size, partition_count;
- SP that does not divide the query heads per TP rank, SP with a pipeline or with Mixture of Experts
  are refused by name, nothing written;
- --in-place tells an SP change from a DP change and names the tag with SP, refuses an SP layout the
  step would refuse before converting anything, and with --gpus re-plans when a degree given differs;
- the planner (--gpus) shows the activation estimate from the args' sequence length and micro-batch.
real_reshard.py checks SP=2 x DP=2 and SP=1 x DP=4 against DeepSpeed's files of those layouts and
values; DeepSpeed itself resumed from each layout here (the closing note of issue 31).
"""
import json
import os
import shutil
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklist import check, finish  # noqa: E402
import ds_stubs  # noqa: E402,F401

BIN, CASES, WORK, MOE = sys.argv[1:5]
LAUNCH = sys.argv[5:6]
CASE = os.path.join(CASES, "sp2_dp2_zero1_fp32", "ckpt")


def run(tool, *args, mpi=0):
    cmd = [os.path.join(BIN, tool), *args]
    if mpi and LAUNCH:
        cmd = [LAUNCH[0], "--oversubscribe", "-np", str(mpi)] + cmd
    return subprocess.run(cmd, capture_output=True, text=True)


def load(path):
    return torch.load(path, map_location="cpu")


shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)

# 1. inspect reads SP from the args; a case without args says what dp counts.
r = run("ucp-inspect", CASE)
check("inspect text says dp=2 sp=2", r.returncode == 0 and "dp=2 sp=2 tp=1 pp=1" in r.stdout and "DP x SP = 4" in r.stdout,
      r.stdout[:600] + r.stderr[-400:])
r = run("ucp-inspect", "--json", CASE)
d = json.loads(r.stdout)["degrees"] if r.returncode == 0 else {}
check("inspect JSON degrees", d.get("dp") == 2 and d.get("sp") == 2 and d.get("sp_recorded") is True, str(d))
r = run("ucp-inspect", "--json", os.path.join(CASES, "zero1_dp4_fp32", "ckpt"))
j = json.loads(r.stdout) if r.returncode == 0 else {}
check("a case without args: sp 1, unrecorded, said",
      j.get("degrees", {}).get("dp") == 4 and j["degrees"].get("sp") == 1 and j["degrees"].get("sp_recorded") is False and
      any("SP not recorded" in n for n in j.get("notes", [])), str(j.get("degrees")) + str(j.get("notes")))

# 2. the atomic checkpoint keeps the source's degrees.
atomic = os.path.join(WORK, "atomic")
r = run("ucp-convert", CASE, "-o", atomic, "-q", mpi=2)
check("convert", r.returncode == 0, r.stderr[-800:])
src = json.load(open(os.path.join(atomic, "ucp_manifest.json")))["source"]
check("manifest source dp=2 sp=2", src.get("dp") == 2 and src.get("sp") == 2, str(src))
r = run("ucp-inspect", atomic)
check("inspect of the atomic checkpoint says sp=2", "dp=2 sp=2 tp=1" in r.stdout, r.stdout[:400])


# 3. layouts: files over DP x SP, the degrees recorded.
def reshard(name, dp, sp, zero, *extra, mpi=0):
    out = os.path.join(WORK, name)
    r = run("ucp-reshard", atomic, "-o", out, "-q", "--dp", str(dp), "--sp", str(sp), "--tp", "1", "--pp", "1",
            "--zero-stage", str(zero), *extra, mpi=mpi)
    check(f"{name}: written", r.returncode == 0, r.stderr[-800:])
    return os.path.join(out, "global_step6")


def degrees_recorded(name, tag_dir, dp, sp, zero):
    files = sorted(os.listdir(tag_dir))
    prefix = "zero_pp_rank_" if zero < 3 else "zero_pp_rank_"
    ranks = sorted(int(f.split("_")[3]) for f in files if f.startswith(prefix) and f.endswith("optim_states.pt"))
    check(f"{name}: one optimizer file per DP x SP rank", ranks == list(range(dp * sp)), str(files))
    ms = "mp_rank_00_model_states.pt" if zero < 3 else "zero_pp_rank_0_mp_rank_00_model_states.pt"
    m = load(os.path.join(tag_dir, ms))
    a = vars(m["args"])
    want = {"data_parallel_size": dp, "ds_sequence_parallel_size": sp, "sequence_data_parallel_size": dp * sp,
            "world_size": dp * sp}
    check(f"{name}: args record the degrees", all(a.get(k) == v for k, v in want.items()),
          str({k: a.get(k) for k in want}))
    check(f"{name}: dp_world_size = DP x SP", m["dp_world_size"] == dp * sp, str(m["dp_world_size"]))
    o = load(os.path.join(tag_dir, [f for f in files if f.endswith("optim_states.pt")][0]))["optimizer_state_dict"]
    check(f"{name}: partition_count = DP x SP", o.get("partition_count") in (dp * sp, [dp * sp] * 2), str(o.get("partition_count")))
    return m


sp4 = reshard("sp4_dp1", 1, 4, 1, mpi=2)
degrees_recorded("sp4_dp1", sp4, 1, 4, 1)
# DeepSpeed's SP=2 x DP=2 files are four ZeRO partitions, as SP=4 x DP=1's are: tensor for tensor equal,
# but for the vocabulary padding rows of the word embedding (rows 300-383: trained values in DeepSpeed's
# files, zeros in any reshard, as in DeepSpeed's own universal load; no layout uses them).
shapes = load(os.path.join(CASE, "global_step6", "mp_rank_00_model_states.pt"))["param_shapes"]
PADDED = {"language_model.embedding.word_embeddings.weight": 300 * 64}  # first padding element
same, masked = True, 0
for f in sorted(os.listdir(CASE + "/global_step6")):
    if not f.endswith("optim_states.pt"):
        continue
    rank = int(f.split("_")[3])
    ours = load(os.path.join(sp4, f))["optimizer_state_dict"]
    theirs = load(os.path.join(CASE, "global_step6", f))["optimizer_state_dict"]
    same &= ours["param_slice_mappings"] == theirs["param_slice_mappings"]
    for g, (x, y) in enumerate(zip(ours["single_partition_of_fp32_groups"], theirs["single_partition_of_fp32_groups"])):
        size = load(os.path.join(CASE, "global_step6", "zero_pp_rank_0_mp_rank_00_optim_states.pt"))[
            "optimizer_state_dict"]["single_partition_of_fp32_groups"][g].numel()
        offset, begin = 0, {}
        for name, shape in shapes[g].items():
            begin[name] = offset
            offset += torch.Size(shape).numel()
        keep = torch.ones(x.numel(), dtype=torch.bool)
        for name, frag in theirs["param_slice_mappings"][g].items():
            if name in PADDED:  # partition elements [start, start + numel) are the parameter's from local
                local = rank * size + frag.start - begin[name]
                first = max(0, PADDED[name] - local)
                if first < frag.numel:
                    keep[frag.start + first:frag.start + frag.numel] = False
        masked += int((~keep).sum())
        same &= x.shape == y.shape and torch.equal(x[keep], y[keep])
    for gx, gy in zip(ours["base_optimizer_state"]["state"].values(), theirs["base_optimizer_state"]["state"].values()):
        for k in ("exp_avg", "exp_avg_sq"):
            same &= torch.equal(gx[k], gy[k])
check("sp4_dp1: the optimizer partitions equal DeepSpeed's SP=2 x DP=2 files", same and masked == (384 - 300) * 64,
      f"equal: {same}; padding elements left out: {masked}")

dp4 = reshard("sp1_dp4", 4, 1, 1)
m = degrees_recorded("sp1_dp4", dp4, 4, 1, 1)
z2 = reshard("sp2_dp1_zero2", 1, 2, 2)
degrees_recorded("sp2_dp1_zero2", z2, 1, 2, 2)
z3 = reshard("sp2_dp2_zero3", 2, 2, 3)
degrees_recorded("sp2_dp2_zero3", z3, 2, 2, 3)
# The source's SP unless --sp: --dp 2 alone is SP=2 x DP=2 again.
out = os.path.join(WORK, "default_sp")
r = run("ucp-reshard", atomic, "-o", out, "-q", "--dp", "2", "--tp", "1", "--pp", "1", "--zero-stage", "1")
check("no --sp keeps the source's sp=2", r.returncode == 0 and
      vars(load(os.path.join(out, "global_step6", "mp_rank_00_model_states.pt"))["args"]).get("ds_sequence_parallel_size") == 2,
      r.stderr[-400:])

# 4. refusals, by name, nothing written.
for name, flags, words in [
        ("sp=3", ["--dp", "1", "--sp", "3", "--tp", "1", "--pp", "1"], "sp=3 does not divide the 4 query heads"),
        ("tp=2 sp=4", ["--dp", "1", "--sp", "4", "--tp", "2", "--pp", "1"], "sp=4 does not divide the 4 query heads per TP rank (2 at tp=2)"),
        ("sp with a pipeline", ["--dp", "1", "--sp", "2", "--tp", "1", "--pp", "2"], "without a pipeline"),
        ("sp with model pipe", ["--dp", "1", "--sp", "2", "--tp", "1", "--pp", "1", "--model", "pipe"], "not a PipelineModule")]:
    out = os.path.join(WORK, "refused")
    r = run("ucp-reshard", atomic, "-o", out, "--zero-stage", "1", *flags)
    check(f"refused: {name}", r.returncode == 1 and words in r.stderr and not os.path.exists(os.path.join(out, "latest")),
          f"exit {r.returncode}: {r.stderr[-500:]}")
    shutil.rmtree(out, ignore_errors=True)
r = run("ucp-reshard", atomic, "-o", os.path.join(WORK, "bad"), "--dp", "1", "--sp", "0", "--tp", "1", "--pp", "1", "--zero-stage", "1")
check("--sp 0 is a command-line error", r.returncode == 2 and "--sp" in r.stderr, r.stderr[-300:])
if MOE:  # a real Mixture-of-Experts case
    matom = os.path.join(WORK, "moe_atomic")
    r = run("ucp-convert", MOE, "-o", matom, "-q")
    check("MoE case converted", r.returncode == 0, r.stderr[-400:])
    r = run("ucp-reshard", matom, "-o", os.path.join(WORK, "moe_out"), "--dp", "1", "--sp", "2", "--tp", "1", "--pp", "1",
            "--zero-stage", "1")
    check("refused: sp with Mixture of Experts", r.returncode == 1 and "sp=2 with Mixture of Experts" in r.stderr,
          r.stderr[-400:])

# 5. the planner: SP among the candidates, the activation estimate from the args (s=32, b=6).
r = run("ucp-reshard", atomic, "--gpus", "4", "--plan-only", "--json")
j = json.loads(r.stdout) if r.returncode == 0 else {}
am = j.get("activation_model") or {}
check("planner: activation estimate from the args", am.get("seq_length") == 32 and am.get("micro_batch_size") == 6 and
      am.get("hidden_size") == 64 and am.get("num_layers") == 4, str(am) + r.stderr[-300:])
cands = [c["layout"] for c in j.get("candidates", [])]
check("planner: SP layouts considered, each dp x sp x tp x pp = 4",
      any(c.get("sp", 1) == 4 for c in cands) and all(c["dp"] * c.get("sp", 1) * c["tp"] * c["pp"] == 4 for c in cands), str(cands))
acts = {(c["layout"]["tp"], c["layout"].get("sp", 1)): c["memory_per_gpu"]["activations"] for c in j.get("candidates", [])}
# 4 layers x s*b*h*(34 + 5*a*s/h) / (tp*sp), fp32: twice the 16-bit count.
formula = lambda tp, sp: round(4 * 32 * 6 * 64 * (34 + 5 * 4 * 32 / 64) / (tp * sp) * 4 / 2)  # noqa: E731
check("planner: activations per candidate by the formula", acts and all(v == formula(*k) for k, v in acts.items()), str(acts))
r = run("ucp-reshard", atomic, "--gpus", "4", "--plan-only", "--seq-length", "4096", "--micro-batch-size", "1", "--recompute", "full")
check("planner: --seq-length, --micro-batch-size, --recompute said", r.returncode == 0 and "s=4096 b=1" in r.stdout and
      "full recomputation" in r.stdout, r.stdout[:500] + r.stderr[-300:])

# 6. --in-place: an SP change is not a DP change; the tag names SP.
root = os.path.join(WORK, "root")
shutil.copytree(CASE, root, ignore=shutil.ignore_patterns("*_universal"))
r = run("ucp-reshard", root, "--in-place", "-q", "--dp", "2", "--tp", "1", "--pp", "1", "--zero-stage", "1")
check("in place: dp=2 is the source's SP=2 x DP=2: nothing to do", r.returncode == 0 and
      open(os.path.join(root, "latest")).read().strip() == "global_step6", r.stderr[-400:])
r = run("ucp-reshard", root, "--in-place", "-q", "--dp", "1", "--sp", "4", "--tp", "1", "--pp", "1", "--zero-stage", "1")
tag = open(os.path.join(root, "latest")).read().strip()
check("in place: to SP=4 x DP=1, the tag names sp", r.returncode == 0 and tag == "global_step6_dp1_sp4_tp1_pp1_z1_fp32",
      tag + r.stderr[-400:])
r = run("ucp-reshard", root, "--in-place", "-q", "--dp", "4", "--sp", "1", "--tp", "1", "--pp", "1", "--zero-stage", "1")
tag = open(os.path.join(root, "latest")).read().strip()
check("in place: then SP=1 x DP=4, another layout", r.returncode == 0 and tag == "global_step6_dp4_tp1_pp1_z1_fp32",
      tag + r.stderr[-400:])
r = run("ucp-reshard", root, "--in-place", "--dp", "4", "--sp", "1", "--tp", "1", "--pp", "1", "--zero-stage", "1")
check("in place: the same again: nothing to do", r.returncode == 0 and "nothing to do" in r.stderr, r.stderr[-400:])


# 7. before a conversion, --in-place refuses what the step after it would refuse, dry run and step alike.
fresh = os.path.join(WORK, "fresh_root")
shutil.copytree(CASE, fresh, ignore=shutil.ignore_patterns("*_universal"))
before = sorted(os.listdir(fresh))
for extra in ([], ["--plan-only"]):
    for flags, words in [(["--sp", "3", "--pp", "1"], "sp=3 does not divide the 4 query heads"),
                         (["--sp", "2", "--pp", "2"], "without a pipeline")]:
        r = run("ucp-reshard", fresh, "--in-place", "--dp", "1", "--tp", "1", "--zero-stage", "1", *flags, *extra)
        check(f"in place {' '.join(flags + extra)}: refused before converting", r.returncode == 1 and words in r.stderr + r.stdout
              and sorted(os.listdir(fresh)) == before, f"exit {r.returncode}: {os.listdir(fresh)} {r.stderr[-400:]}")
# --gpus on as many GPUs re-plans when a degree given differs from the current layout's.
r = run("ucp-reshard", fresh, "--in-place", "-q", "--gpus", "4", "--sp", "4")
check("in place --gpus 4 --sp 4 from SP=2 x DP=2: resharded, not 'nothing to do'",
      r.returncode == 0 and open(os.path.join(fresh, "latest")).read().strip().startswith("global_step6_dp1_sp4_"),
      open(os.path.join(fresh, "latest")).read() + r.stderr[-400:])
r = run("ucp-reshard", fresh, "--in-place", "--gpus", "4")
check("in place --gpus 4 again: nothing to do", r.returncode == 0 and "nothing to do" in r.stderr, r.stderr[-300:])

# 8. the planner's words for degrees given.
r = run("ucp-reshard", atomic, "--gpus", "4", "--sp", "3", "--plan-only")
check("--sp 3 on 4 GPUs: a command-line error that says why nothing is valid",
      r.returncode == 2 and "--gpus 4: sp = 3 does not divide 4 GPUs" in r.stderr, r.stdout[-300:] + r.stderr[-300:])
# The same contradiction with --in-place, which converts first: refused before anything is written.
before = sorted(os.listdir(fresh))
r = run("ucp-reshard", fresh, "--in-place", "--gpus", "4", "--dp", "3")
check("--in-place --gpus 4 --dp 3: refused on the command line, nothing written",
      r.returncode == 2 and "dp = 3 does not divide 4 GPUs" in r.stderr and sorted(os.listdir(fresh)) == before,
      r.stderr[-300:] + str(sorted(set(os.listdir(fresh)) ^ set(before))))
r = run("ucp-reshard", atomic, "--gpus", "4", "--sp", "4", "--plan-only")
check("planner: a given SP is said as given", r.returncode == 0 and "sp=4 as given" in r.stdout, r.stdout[-400:])

# 9. the wrong kind of folder for each tool, said as such.
r = run("ucp-convert", atomic, "-o", os.path.join(WORK, "again"))
check("ucp-convert of an atomic checkpoint: converted already", r.returncode == 1 and "converted already" in r.stderr, r.stderr[-300:])
# A training root given to -o: its atomic checkpoint reused (or converted in a scratch folder under OUT,
# removed after), the root left as it was.
before = sorted(os.listdir(root))
out = os.path.join(WORK, "from_root")
r = run("ucp-reshard", root, "-o", out, "--dp", "1", "--tp", "1", "--pp", "1", "--zero-stage", "1")
check("ucp-reshard -o of a training root: written from its atomic checkpoint, the root as it was",
      r.returncode == 0 and os.path.exists(os.path.join(out, "latest")) and
      not os.path.exists(os.path.join(out, ".ucp-scratch-atomic")) and sorted(os.listdir(root)) == before, r.stderr[-300:])

finish()
