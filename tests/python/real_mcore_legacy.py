"""Megatron-LM's legacy checkpoints (--ckpt-format torch), written by Megatron-LM's own save_checkpoint
beside a torch_dist save of the same trained state from the same process (tests/data/real-mcore/<case>/legacy
and checkpoint, make_mcore.py there; Megatron-LM loaded both back and found the trained state, bitwise).

    real_mcore_legacy.py UCP_BIN_DIR CASES_DIR WORK [mpiexec]

For every case holding legacy/, at 1 and 2 MPI ranks: ucp-convert of the legacy root equals, byte for
byte, ucp-convert of the torch_dist checkpoint/ (every weight, exp_avg, exp_avg_sq and step, the param
groups), whose tensors real_mcore.py proves equal to torch's own reading; where Megatron's own torch_dist
save wrote another state than the trained one (reference_trained.pt), against the trained state. The
root, the iteration folder and the iteration latest_checkpointed_iteration.txt names are read alike;
one rank's folder is refused naming the iteration folder. The Hugging Face export of the legacy
atomic checkpoint is the export of the torch_dist one, byte for byte. Damaged copies are refused by
name: a rank file of another iteration, a missing rank folder, two ranks' distrib_optim.pt swapped
(every CRC-32 holds; the masters disagree with the model's tensors), a truncated distrib_optim.pt, a
flipped byte in a tensor record of model_optim_rng.pt. A weights-only save (--no-save-optim) gives a
weights-only atomic checkpoint of the model's own tensors, whose export equals the full save's.
"""
import filecmp
import importlib.abc
import importlib.machinery
import json
import os
import re
import shutil
import sys
import types
import zipfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from atomic_files import same_bytes  # noqa: E402
from checklist import cases_holding, check, finish, fresh_folder, refused_when_damaged, tool_runner  # noqa: E402
from mcore_atomic import same_atomic, weights_only_converts  # noqa: E402

BIN, CASES, WORK = sys.argv[1:4]
run = tool_runner(BIN, sys.argv[4] if len(sys.argv) > 4 else None)

fresh_folder(WORK)
cases = [c for c in cases_holding(CASES, "reference.pt") if os.path.isdir(os.path.join(CASES, c, "legacy"))]
check("Megatron-LM legacy cases found", len(cases) >= 3, str(cases))


def trained_state(case):
    """The trained optimizer state where Megatron's own torch_dist save wrote another, else {}."""
    path = os.path.join(CASES, case, "reference_trained.pt")
    return torch.load(path, map_location="cpu") if os.path.exists(path) else {}


def equals_trained(label, atomic, ref, trained):
    """Every atomic weight / moment equals the trained state's tensor (its master where it keeps one)."""
    zero = os.path.join(atomic, "zero")
    bad = []
    for name in sorted(d for d in os.listdir(zero) if os.path.isdir(os.path.join(zero, d))):
        both = {**ref, **trained}
        master = both.get("optimizer.state.param." + name, both.get("optimizer.state.fp32_param." + name, both[name]))
        for state, want in (("fp32", master), ("exp_avg", both["optimizer.state.exp_avg." + name]),
                            ("exp_avg_sq", both["optimizer.state.exp_avg_sq." + name])):
            got = torch.load(os.path.join(zero, name, state + ".pt"), map_location="cpu")
            if not same_bytes(got["param"] if isinstance(got, dict) else got, want):
                bad.append(f"{name}/{state}")
    check(f"{label}: every tensor equals the trained state's", not bad, str(bad[:5]))


class _Stand:  # any class of Megatron's a legacy file pickles (its args' enums, ...): never needed here
    def __init__(self, *a, **k):
        pass

    def __setstate__(self, state):
        pass


class _Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """megatron.* modules whose every attribute is _Stand: torch.load of a legacy file without Megatron-LM."""
    def find_spec(self, name, path, target=None):
        return importlib.machinery.ModuleSpec(name, self, is_package=True) if name.split(".")[0] == "megatron" else None

    def create_module(self, spec):
        m = types.ModuleType(spec.name)
        m.__path__ = []
        m.__getattr__ = lambda attr: _Stand
        return m

    def exec_module(self, module):
        pass


sys.meta_path.append(_Stubs())
try:  # the RNG state pickles numpy 2's arrays (numpy._core); Debian bookworm's numpy 1 names them numpy.core
    import numpy._core  # noqa: F401
except ImportError:
    import numpy.core.multiarray
    sys.modules["numpy._core"], sys.modules["numpy._core.multiarray"] = numpy.core, numpy.core.multiarray


def groups_are_the_saves(label, legacy, atomic):
    """The torch optimizer form saves each group's parameters (ids in its param_groups; the mixed-precision
    optimizer's fp32 masters per group): in every rank file, group g's tensors, in order, have the shapes of
    the rank's model parameters whose atomic parameter the manifest puts in group g (Megatron-Core's
    default rule, which the torch_dist form needs, checked here against what this form saved)."""
    group_of = {p["name"]: p["group"] for p in json.load(open(os.path.join(atomic, "ucp_manifest.json")))["params"]}
    bad, files = [], 0
    for dirpath, _, names in os.walk(legacy):
        if "model_optim_rng.pt" not in names:
            continue
        d = torch.load(os.path.join(dirpath, "model_optim_rng.pt"), map_location="cpu", weights_only=False)
        opt = d["optimizer"]
        sd = opt["optimizer"] if "fp32_from_fp16_params" in opt else opt
        if "state" not in sd:
            return  # the distributed optimizer: its groups' parameters are not in this file
        files += 1
        if "fp32_from_fp16_params" in opt:
            saved = [[tuple(t.shape) for t in g] for g in opt["fp32_from_fp16_params"]]
        else:
            saved = [[tuple(sd["state"][i]["exp_avg"].shape) for i in g["params"]] for g in sd["param_groups"]]
        mine = [[] for _ in saved]
        for key, t in d["model"].items():
            if key.endswith("_extra_state") or not isinstance(t, torch.Tensor):
                continue
            name = re.sub(r"^decoder\.layers\.\d+\.", "decoder.layers.", key)  # the torch_dist key: layers stacked,
            name = re.sub(r"\.input_layernorm\.(weight|bias)$", r".self_attention.linear_qkv.layer_norm_\1", name)  # the local
            name = re.sub(r"\.pre_mlp_layernorm\.(weight|bias)$", r".mlp.linear_fc1.layer_norm_\1", name)  # spec's norms fused
            mine[group_of[name]].append(tuple(t.shape))
        if mine != saved:
            bad.append(f"{os.path.relpath(dirpath, legacy)}: saved {[len(g) for g in saved]}, manifest {[len(g) for g in mine]}")
    check(f"{label}: each parameter in the param group the save put it in ({files} rank files)", files > 0 and not bad, str(bad[:3]))


for case in cases:
    legacy = os.path.join(CASES, case, "legacy")
    if case.startswith("moe_"):  # expert-parallel rank folders: not read yet, refused by name
        r = run("ucp-convert", [legacy, "-o", os.path.join(WORK, f"{case}-legacy")], ranks=2)
        check(f"{case}: the legacy Mixture-of-Experts save is refused by name, nothing written", r.returncode != 0 and
              "Mixture-of-Experts" in r.stderr and "not read yet" in r.stderr and
              not os.path.exists(os.path.join(WORK, f"{case}-legacy", "ucp_manifest.json")), r.stderr[-800:])
        continue
    r = run("ucp-inspect", [legacy])
    check(f"{case}: inspect names Megatron-LM's legacy form, its layout and what Megatron itself could reshard", r.returncode == 0 and
          "Megatron-LM legacy checkpoint (--ckpt-format torch), iter_0000003" in r.stdout and
          "only at the TP and PP it was saved with" in r.stdout and "iteration    3" in r.stdout, r.stdout[-1500:] + r.stderr[-800:])
    trained = trained_state(case)
    ref = torch.load(os.path.join(CASES, case, "reference.pt"), map_location="cpu")
    for np in (1, 2):
        full = os.path.join(WORK, f"{case}-torch_dist-np{np}")
        if not trained:
            r = run("ucp-convert", [os.path.join(CASES, case, "checkpoint"), "-o", full], ranks=np)
            check(f"{case}: the torch_dist copy converts at {np} rank(s)", r.returncode == 0, r.stderr[-1500:])
        atomic = os.path.join(WORK, f"{case}-legacy-np{np}")
        r = run("ucp-convert", [legacy, "-o", atomic], ranks=np)
        check(f"{case}: the legacy root converts at {np} rank(s)", r.returncode == 0, r.stderr[-1500:])
        if r.returncode != 0:
            continue
        if trained:
            equals_trained(f"{case} legacy np{np}", atomic, ref, trained)
        else:
            same_atomic(check, f"{case} legacy np{np} vs torch_dist", atomic, full)
    groups_are_the_saves(case, legacy, os.path.join(WORK, f"{case}-legacy-np1"))
    r = run("ucp-inspect", ["--verify", os.path.join(WORK, f"{case}-legacy-np2")])
    check(f"{case}: the legacy atomic checkpoint verifies", r.returncode == 0, r.stdout[-800:] + r.stderr[-800:])

# The iteration folder reads as the root does; one rank's folder is refused naming the iteration folder.
case = "llama_tp2_dp2_distopt_bf16"
iteration = os.path.join(CASES, case, "legacy", "iter_0000003")
r = run("ucp-convert", [iteration, "-o", os.path.join(WORK, "from-iter")])
check("the iteration folder converts", r.returncode == 0, r.stderr[-800:])
if r.returncode == 0:
    same_atomic(check, "the iteration folder vs the root", os.path.join(WORK, "from-iter"), os.path.join(WORK, f"{case}-legacy-np1"))
for tool in ("ucp-inspect", "ucp-convert"):
    r = run(tool, [os.path.join(iteration, "mp_rank_01")] + (["-o", os.path.join(WORK, "rank-out")] if tool == "ucp-convert" else []))
    check(f"{tool} of one rank's folder: refused, naming the iteration folder", r.returncode != 0 and "one rank's folder" in r.stderr and
          iteration in r.stderr and not os.path.exists(os.path.join(WORK, "rank-out")), r.stderr[-800:])

# The Hugging Face export of the legacy atomic checkpoint is the torch_dist one's, byte for byte.
for case in ("llama_tp2_legacy", "llama_tp2_dp2_distopt_bf16", "gpt_tp2_pp2_bf16_legacy"):
    outs = []
    for form in ("legacy", "torch_dist"):
        out = os.path.join(WORK, f"{case}-{form}-hf")
        r = run("ucp-reshard", [os.path.join(WORK, f"{case}-{form}-np2"), "-o", out, "--format", "hf"])
        check(f"{case}: {form} atomic exported to Hugging Face", r.returncode == 0, r.stderr[-800:])
        outs.append(out)
    names = sorted(os.listdir(outs[0]))
    check(f"{case}: the legacy export equals the torch_dist export byte for byte ({len(names)} files)",
          names == sorted(os.listdir(outs[1])) and all(filecmp.cmp(os.path.join(outs[0], n), os.path.join(outs[1], n), shallow=False) for n in names),
          str(names))


# A weights-only save (--no-save-optim; legacy_weights_only/, made from legacy/ by weights_only_legacy.py as
# Megatron-LM's save_checkpoint writes it: no 'optimizer', no 'opt_param_scheduler', no distrib_optim.pt): a
# weights-only atomic checkpoint whose weights are the model's own tensors widened to fp32, whose Hugging Face
# export (in the job's bf16) equals the full save's export byte for byte.
case = "gpt_tp2_pp2_bf16_legacy"
wo = os.path.join(CASES, case, "legacy_weights_only")
r = run("ucp-inspect", [wo])
check("weights-only legacy: inspect says weights only", r.returncode == 0 and "model weights only" in r.stdout, r.stdout[-1000:] + r.stderr[-600:])
ref = torch.load(os.path.join(CASES, case, "reference.pt"), map_location="cpu")
weights_only_converts(run, check, "weights-only legacy", wo, ref, WORK)
out = os.path.join(WORK, "weights-only-hf")
r = run("ucp-reshard", [os.path.join(WORK, "weights-only-np2"), "-o", out, "--format", "hf"])
full = os.path.join(WORK, f"{case}-legacy-hf")
check("weights-only legacy: exported to Hugging Face", r.returncode == 0, r.stderr[-800:])
if r.returncode == 0:
    st = [n for n in sorted(os.listdir(out)) if n.endswith(".safetensors")]
    check("weights-only legacy: the export's safetensors equal the full save's byte for byte", st and
          all(filecmp.cmp(os.path.join(out, n), os.path.join(full, n), shallow=False) for n in st), str(st))

# Damaged copies of a legacy root.
def other_iteration(folder):
    os.rename(os.path.join(folder, "iter_0000003"), os.path.join(folder, "iter_0000004"))
    open(os.path.join(folder, "latest_checkpointed_iteration.txt"), "w").write("4")


def no_rank(name):
    def mutate(folder):
        shutil.rmtree(os.path.join(folder, "iter_0000003", name))
    return mutate


def swap(a, b):
    def mutate(folder):
        pa, pb = (os.path.join(folder, "iter_0000003", x) for x in (a, b))
        os.rename(pa, pa + ".x"), os.rename(pb, pa), os.rename(pa + ".x", pb)
    return mutate


def truncate(name):
    def mutate(folder):
        p = os.path.join(folder, "iter_0000003", name)
        os.truncate(p, os.path.getsize(p) // 2)
    return mutate


def flip_tensor_byte(name):
    def mutate(folder):
        p = os.path.join(folder, "iter_0000003", name)
        with zipfile.ZipFile(p) as z:
            info = next(i for i in z.infolist() if i.filename.endswith("/data/0"))
        data = bytearray(open(p, "rb").read())
        h = info.header_offset
        n, e = int.from_bytes(data[h + 26:h + 28], "little"), int.from_bytes(data[h + 28:h + 30], "little")
        data[h + 30 + n + e + min(8, info.file_size - 1)] ^= 0x40
        open(p, "wb").write(bytes(data))
    return mutate


SRC = os.path.join(CASES, "llama_tp2_dp2_distopt_bf16", "legacy")
refused_when_damaged(run, WORK, "legacy rank files of another iteration", SRC, other_iteration,
                     ["holds iteration 3 in the folder of iteration 4", "another save"])
refused_when_damaged(run, WORK, "legacy rank folder missing", SRC, no_rank("mp_rank_01"),
                     ["no rank folder of tp=1, pp=0", "model_optim_rng.pt is missing"])
refused_when_damaged(run, WORK, "legacy distrib_optim.pt of two TP ranks swapped", SRC,
                     swap("mp_rank_00/distrib_optim.pt", "mp_rank_01/distrib_optim.pt"),
                     ["distrib_optim.pt", "disagree with the model's own tensors"])
refused_when_damaged(run, WORK, "legacy distrib_optim.pt truncated", SRC, truncate("mp_rank_01/distrib_optim.pt"),
                     ["mp_rank_01/distrib_optim.pt"])
refused_when_damaged(run, WORK, "legacy flipped byte in a tensor record", os.path.join(CASES, "llama_tp2_legacy", "legacy"),
                     flip_tensor_byte("mp_rank_01/model_optim_rng.pt"), ["mp_rank_01/model_optim_rng.pt", "CRC"])
# Rank files swapped whole: every CRC-32 holds. A launched job's args name the global rank that wrote each
# file; the stages' own tensors (the embedding first, the output layer last) say where a file belongs.
GPT = os.path.join(CASES, "gpt_tp2_pp2_bf16_legacy", "legacy")
refused_when_damaged(run, WORK, "legacy TP ranks' folders swapped", GPT, swap("mp_rank_00_000", "mp_rank_01_000"),
                     ["written by global rank 1", "swapped or renamed"])
refused_when_damaged(run, WORK, "legacy stages' model files swapped", os.path.join(CASES, "llama_pp2_dp2_distopt_bf16", "legacy"),
                     swap("mp_rank_00_000/model_optim_rng.pt", "mp_rank_00_001/model_optim_rng.pt"),
                     ["mp_rank_00_000/model_optim_rng.pt: 'decoder.final_layernorm.weight' in the files of pp=0, where Megatron keeps it on the last", "swapped or renamed"])
d = refused_when_damaged(run, WORK, "legacy distrib_optim.pt of a TP rank flipped", SRC, flip_tensor_byte("mp_rank_01/distrib_optim.pt"),
                         ["mp_rank_01/distrib_optim.pt", "CRC"])
r = run("ucp-convert", [d, "-o", os.path.join(WORK, "coords")])
check("errors name a legacy file by its path alone (no grid coordinates, which mean nothing off a grid)",
      r.returncode != 0 and "(pp=0, tp=0, dp=0)" not in r.stderr, r.stderr[-600:])
# --in-place writes a DeepSpeed layout beside a DeepSpeed run's tags: a legacy root is told what to do instead.
r = run("ucp-reshard", [legacy_root := os.path.join(CASES, "llama_tp2_legacy", "legacy"), "--in-place", "--gpus", "2"])
check("ucp-reshard --in-place of a legacy root: refused, naming ucp-convert and --format hf", r.returncode != 0 and
      "a megatron checkpoint" in r.stderr and "ucp-convert " + legacy_root in r.stderr and "--format hf" in r.stderr and
      "deepspeed checkpoint" not in r.stderr, r.stderr[-600:])
finish("real_mcore_legacy")
