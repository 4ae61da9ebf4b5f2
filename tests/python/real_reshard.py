"""Reshard the atomic checkpoint of one real DeepSpeed case to the layout of every other case, and
compare what ucp-reshard writes with the files DeepSpeed itself wrote for that layout.

    real_reshard.py UCP_RESHARD UCP_CONVERT ATOMIC_DIR SOURCE_CASE CASES_DIR WORK [mpiexec RANKS]

All fp32 cases of one model (case.json's --arch: the GPT-style and the Llama-style ones; same seed, same
batches) trained the same job, so a target case's files (of the same model only) are an
independent ground truth up to the training noise between layouts.
- Structure, from the native files: the same file names; per file the same keys in the same order,
  value types, tensor shapes and dtypes, param_slice_mappings, group_paddings, partition counts.
- Values: ucp-reshard's output converted back (ucp-convert, whose output equals DeepSpeed's
  ds_to_universal.py on real files: real_universal.py) against DeepSpeed's own universal checkpoint
  of the target case, parameter by parameter, within tolerances measured on these cases (the noise
  of fp32 training on different layouts). Not the native tensors directly: their vocabulary padding
  rows hold trained values in DeepSpeed's files and zeros in a reshard (as in DeepSpeed's universal
  loader); no layout uses them.
Resharded to the source's own layout, the values must come back exactly. The bf16 case trained in
bf16: between it and the fp32 cases only the structure is compared. A case trained with another
number of optimizer parameter groups (zero3_dp4_fp32: one, so weight decay on every parameter) is
another job, not another layout: that pair is skipped, saying so; such a case is still checked
against its own layout.

Not compared, and why: the client state Megatron adds to the model-states files (args but their
parallel degrees, which must be the target's, rng states,
iteration, universal_checkpoint_info, ...) is the source run's, carried over (a plain DeepSpeed
engine saves none of it); ds_config is the job's own (batch sizes differ per layout), of which the
ZeRO stage and dtype are compared; ds_version is the source's.
"""
import json
import os
import re
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ds_stubs  # noqa: E402,F401
from atomic_files import atomic_tensor  # noqa: E402

# Largest differences allowed between two layouts' training runs of the same job, by what the tensor
# is. Measured on these cases (max over all pairs of fp32 cases with 2 parameter groups): weights
# 5.0e-5, exp_avg 1.0e-7, exp_avg_sq 4.5e-9; set at about twice that. A reshard to the source's own
# layout must give the source's values exactly (tolerance 0).
TOLERANCE = {"weight": 1e-4, "exp_avg": 2e-7, "exp_avg_sq": 1e-8}
EXACT = {k: 0.0 for k in TOLERANCE}
ENGINE_KEYS_SKIPPED = {"ds_config", "ds_version"}
DEGREE_ARGS = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "data_parallel_size", "world_size",
               "ds_sequence_parallel_size", "sequence_data_parallel_size")
CLIENT_KEYS = {"args", "checkpoint_version", "iteration", "tokens", "rng_state", "universal_checkpoint_info"}


def case_info(case, cases_dir):
    """case.json, or {} for a folder without one."""
    path = os.path.join(cases_dir, case, "case.json")
    return json.load(open(path)) if os.path.exists(path) else {}


def deepspeed_version(case, cases_dir):
    """The DeepSpeed that wrote the case (case.json files of the first corpus predate the field: 0.14.5)."""
    return case_info(case, cases_dir).get("deepspeed", {}).get("version", "0.14.5")


def model_of(case, cases_dir):
    """The model a case trained: the harness's --arch (gpt unless it says llama, ...). Another model is
    another job, never another layout of this one."""
    args = case_info(case, cases_dir).get("train_args", "").split()
    return args[args.index("--arch") + 1] if "--arch" in args else "gpt"


def sp_of(case, cases_dir):
    """The Ulysses sequence-parallel degree the case trained with (the harness's --sp), 1 without."""
    args = case_info(case, cases_dir).get("train_args", "").split()
    return int(args[args.index("--sp") + 1]) if "--sp" in args else 1


def not_comparable(case, source, cases_dir):
    """Why `case` is no target to compare `source`'s reshard with, or None."""
    if not os.path.isdir(os.path.join(cases_dir, case, "ckpt", "global_step6")):
        return "no global_step6 checkpoint"
    if "--moe-layers" in case_info(case, cases_dir).get("train_args", "") or \
            any("_expert_" in f for f in os.listdir(os.path.join(cases_dir, case, "ckpt", "global_step6"))):
        return "a Mixture-of-Experts model, another model (real_moe_reshard.py reshards those)"
    if model_of(case, cases_dir) != model_of(source, cases_dir):
        return (f"another model ({model_of(case, cases_dir)}, the source a {model_of(source, cases_dir)}): "
                "its files are another job's, not another layout of this one")
    if deepspeed_version(case, cases_dir) != deepspeed_version(source, cases_dir):
        return (f"written by DeepSpeed {deepspeed_version(case, cases_dir)}, the source by "
                f"{deepspeed_version(source, cases_dir)}: a reshard follows its source's DeepSpeed, so the files differ")
    if not os.path.isdir(os.path.join(cases_dir, case, "ckpt", "global_step6_universal")):
        return "DeepSpeed's ds_to_universal.py failed on it: no universal checkpoint to compare values with"
    return None


def layout_of(case, cases_dir):
    tok = dict(re.findall(r"(tp|pp|dp|zero)(\d+)", case))
    files = os.listdir(os.path.join(cases_dir, case, "ckpt", "global_step6"))
    dtype = "bf16" if "bf16" in case else "fp32"
    # The target job's gradient-accumulation dtype (with bf16 at ZeRO-1 it picks DeepSpeed's
    # optimizer): its configuration's, else the training dtype, DeepSpeed's default under ZeRO.
    config = os.path.join(cases_dir, case, "ds_config.json")
    accum = json.load(open(config)).get("data_types", {}).get("grad_accum_dtype") if os.path.exists(config) else None
    # Under Ulysses SP DeepSpeed partitions ZeRO state over DP x SP ranks, numbered as DP ranks:
    # ucp-reshard's --dp 2 --sp 2 must write what DeepSpeed's SP=2 x DP=2 job wrote.
    return {"tp": int(tok.get("tp", 1)), "pp": int(tok.get("pp", 1)), "dp": int(tok["dp"]), "sp": sp_of(case, cases_dir),
            "zero": int(tok["zero"]), "dtype": dtype, "grad_accum": accum or dtype,
            "model": "pipe" if any(f.startswith("layer_") for f in files) else "plain"}


def load(path):
    return torch.load(path, map_location="cpu")


class Compare:
    def __init__(self, values, tolerance=TOLERANCE):
        self.values = values
        self.tolerance = tolerance
        self.problems = []
        self.largest = {k: 0.0 for k in TOLERANCE}

    def kind(self, where):
        return "exp_avg_sq" if "exp_avg_sq" in where else "exp_avg" if "exp_avg" in where else "weight"

    def __call__(self, a, b, where):
        if len(self.problems) > 20:
            return
        if torch.is_tensor(b):
            if not torch.is_tensor(a):
                return self.problems.append(f"{where}: {type(a).__name__}, DeepSpeed has a tensor")
            if a.dtype != b.dtype or a.shape != b.shape:
                return self.problems.append(f"{where}: {a.dtype}{list(a.shape)} vs DeepSpeed's {b.dtype}{list(b.shape)}")
            if self.values and a.numel() and a.is_floating_point():
                d = (a.detach().double() - b.detach().double()).abs().max().item()
                k = self.kind(where)
                self.largest[k] = max(self.largest[k], d)
                if d > self.tolerance[k]:
                    self.problems.append(f"{where}: differs by {d:.3g} (tolerance {self.tolerance[k]:.0e} for {k})")
            elif a.numel() and not torch.equal(a, b) and not a.is_floating_point():
                self.problems.append(f"{where}: integer tensor differs")
            return
        if type(a) is not type(b):
            return self.problems.append(f"{where}: {type(a).__name__} vs DeepSpeed's {type(b).__name__}")
        if isinstance(b, dict):
            if list(a.keys()) != list(b.keys()):
                return self.problems.append(f"{where}: keys {list(a.keys())} vs DeepSpeed's {list(b.keys())}")
            for k in b:
                self(a[k], b[k], f"{where}.{k}")
            return
        if isinstance(b, (list, tuple)):
            if len(a) != len(b):
                return self.problems.append(f"{where}: {len(a)} items vs DeepSpeed's {len(b)}")
            for i, (x, y) in enumerate(zip(a, b)):
                self(x, y, f"{where}[{i}]")
            return
        if hasattr(b, "__dict__") and not isinstance(b, type):
            return self(vars(a), vars(b), f"{where}<{type(b).__name__}>")
        if isinstance(b, float) and self.values is False:
            return
        if a != b:
            self.problems.append(f"{where}: {a!r} vs DeepSpeed's {b!r}")


def compare_values(atomic, ds_universal, tolerance):
    c = Compare(True, tolerance)
    zero = os.path.join(ds_universal, "zero")
    shapes = {p["name"]: p["shape"] for p in json.load(open(os.path.join(atomic, "ucp_manifest.json")))["params"]}

    def param(v, name):
        return atomic_tensor(v, shapes[name])

    for name in sorted(os.listdir(zero)):
        if not os.path.isdir(os.path.join(zero, name)):
            continue
        for state in ("fp32", "exp_avg", "exp_avg_sq"):
            ours = param(load(os.path.join(atomic, "zero", name, state + ".pt")), name)
            c(ours, param(load(os.path.join(zero, name, state + ".pt")), name), f"{name}/{state}")
    return c


def same_value(a, b):
    """Exact equality of nested containers of numpy arrays, tensors and plain values (RNG states)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if torch.is_tensor(a):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if hasattr(a, "tobytes") and hasattr(a, "dtype"):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    return a == b


def compare_case(ucp_dir, ds_dir, values, own_layout=False):
    """On the source's own layout each rank's rng_state must be its own source rank's, exactly
    (issue 29, finding 5); on another layout the client state is the source run's, not compared."""
    c = Compare(values)
    ours, theirs = sorted(os.listdir(ucp_dir)), sorted(os.listdir(ds_dir))
    if ours != theirs:
        c.problems.append(f"files {ours} vs DeepSpeed's {theirs}")
        return c
    for f in theirs:
        a, b = load(os.path.join(ucp_dir, f)), load(os.path.join(ds_dir, f))
        if isinstance(b, dict) and "param_shapes" in b:  # a model-states file: engine keys compared
            if own_layout and not same_value(a.get("rng_state"), b.get("rng_state")):
                c.problems.append(f"{f}.rng_state: not the source rank's own")
            # Megatron's args are the source job's, except the degrees, which must be the target's.
            x, y = a.get("args"), b.get("args")
            if x is not None and y is not None:
                for key in DEGREE_ARGS:
                    if key in vars(y) and key in vars(x) and getattr(x, key) != getattr(y, key):
                        c.problems.append(f"{f}.args.{key}: {getattr(x, key)} vs DeepSpeed's {getattr(y, key)}")
            for k in CLIENT_KEYS:
                a.pop(k, None), b.pop(k, None)
            for key, path in (("stage", ("zero_optimization", "stage")), ("bf16", ("bf16", "enabled"))):
                x, y = a["ds_config"], b["ds_config"]
                for p in path:
                    x, y = x.get(p), y.get(p)
                if x != y:
                    c.problems.append(f"{f}.ds_config {key}: {x} vs DeepSpeed's {y}")
            for k in ENGINE_KEYS_SKIPPED:
                a.pop(k, None), b.pop(k, None)
        if isinstance(b, dict) and "optimizer_state_dict" in b:
            for k in ENGINE_KEYS_SKIPPED:
                a.pop(k, None), b.pop(k, None)
            a["optimizer_state_dict"].pop("ds_version", None), b["optimizer_state_dict"].pop("ds_version", None)
        c(a, b, f)
    return c


def main():
    reshard, convert, atomic, source, cases_dir, work = sys.argv[1:7]
    launcher = sys.argv[7:]
    groups = lambda d: len(load(os.path.join(d, "zero", "optimizer_state.pt"))["param_groups"])  # noqa: E731
    failed, compared = 0, set()
    for case in sorted(os.listdir(cases_dir)):
        why = not_comparable(case, source, cases_dir)
        if why:
            print(f"skip {source} -> {case}: {why}")
            continue
        L = layout_of(case, cases_dir)
        out = os.path.join(work, source, case)
        ds_universal = os.path.join(cases_dir, case, "ckpt", "global_step6_universal")
        # Another number of optimizer parameter groups is another job, not another layout: the flat
        # groups cannot match, the parameters' values still must.
        same_groups = groups(atomic) == groups(ds_universal)
        if not same_groups:
            print(f"skip {source} -> {case}: another job, not another layout: {case} trained with "
                  f"{groups(ds_universal)} optimizer parameter groups (weight decay on every parameter), {source} "
                  f"with {groups(atomic)}; neither its flat groups nor its values are {source}'s")
            continue
        compared.add(case)
        cmd = [reshard, atomic, "-o", out, "--force", "-q", "--dp", str(L["dp"]), "--sp", str(L["sp"]), "--tp", str(L["tp"]), "--pp",
               str(L["pp"]), "--zero-stage", str(L["zero"]), "--dtype", L["dtype"], "--model", L["model"],
               "--grad-accum-dtype", L["grad_accum"]]
        if launcher:
            cmd = [launcher[0], "--oversubscribe", "-np", launcher[1]] + cmd
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"FAIL {source} -> {case}: ucp-reshard exit {r.returncode}: {r.stderr.strip()[-800:]}")
            failed += 1
            continue
        values = case == source or (L["dtype"] == "fp32" and "bf16" not in source)
        c = compare_case(os.path.join(out, "global_step6"), os.path.join(cases_dir, case, "ckpt", "global_step6"), False,
                         own_layout=case == source)
        largest = "structure only (bf16)"
        if values and not c.problems:
            back = out + "_atomic"
            r = subprocess.run([convert, out, "-o", back, "--force", "-q"], capture_output=True, text=True)
            if r.returncode != 0:
                c.problems.append(f"ucp-convert of the reshard: exit {r.returncode}: {r.stderr.strip()[-600:]}")
            else:
                v = compare_values(back, ds_universal, EXACT if case == source else TOLERANCE)
                c.problems += v.problems
                largest = ", ".join(f"{k} {x:.2g}" for k, x in v.largest.items())
        if c.problems:
            failed += 1
            print(f"FAIL {source} -> {case}:")
            for p in c.problems[:12]:
                print("   ", p if len(p) < 400 else p[:400] + " ...")
        else:
            what = f"{len(os.listdir(out + '/global_step6'))} files as DeepSpeed's" + \
                (" (its own layout: values exact)" if case == source and values else "")
            print(f"ok   {source} -> {case}: {what}; largest differences: {largest}")
    print(f"{source}: {failed} target layouts differ from DeepSpeed's files")
    if source not in compared:  # its own layout is always a target: a run that compared nothing fails
        print(f"FAIL {source}: not even its own layout was compared")
        failed += 1
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
