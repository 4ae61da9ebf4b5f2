"""A real DeepSpeed Mixture-of-Experts checkpoint (expert parallelism, ZeRO-0/1/2) through ucp-inspect
and ucp-convert, on 1 and 2 ranks, checked against what DeepSpeed itself wrote:

    real_moe.py INSPECT CONVERT CASE_DIR WORK MPIEXEC

- ucp-inspect reads it cleanly and reports the expert-parallel degree the case was trained with
  (case.json's --ep-size) and every expert file;
- bf16: every atomic fp32 tensor equals the fp32 master reassembled from the optimizer files (the
  ZeRO partitions, or without ZeRO the fp32_groups of DeepSpeed's bf16 wrapper), and the weight
  DeepSpeed saved is its bf16 copy;
- fp32: every atomic tensor equals, byte for byte, the weight DeepSpeed saved for that parameter
  (fp32 training: the master weights are the model's): the non-expert parameters from
  mp_rank_00_model_states.pt's module (vocabulary padding rows dropped), each expert parameter from
  its layer_<L>_expert_<E>_mp_rank_00_model_states.pt under its global id E. An expert mapped to the
  wrong global id, or a fragment placed wrongly, fails here;
- exp_avg / exp_avg_sq: equal to the moments reassembled here from the ZeRO optimizer files
  (param_slice_mappings; expert groups partitioned over dp / ep ranks, their local expert ids made
  global by the file's expert-parallel rank), or without ZeRO from the expp_rank files' torch state
  by position (positions named by the harness's own group rule), nonzero for every parameter that
  trained;
(real_moe_reshard.py reshards the same cases.)
"""
import json
import os
import re
import shutil
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ds_stubs  # noqa: E402,F401  DeepSpeed's pickled classes, without DeepSpeed
import tp_join  # noqa: E402
from atomic_files import same_bytes  # noqa: E402

EXPERT = re.compile(r"^(.*\.deepspeed_experts\.)(\d+)(\..*)$")


def load(path):
    return torch.load(path, map_location="cpu", weights_only=False) if "weights_only" in \
        torch.load.__code__.co_varnames else torch.load(path, map_location="cpu")


def run(cmd, what):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{what} failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
    return r




def tp_of(info):
    m = re.search(r"--tp (\d+)", info["train_args"])
    return int(m.group(1)) if m else 1


def saved_weights(shard, tp):
    """name -> the tensor DeepSpeed saved: the module (its TP pieces joined by the checkpoint's own
    rules), and every expert file, at whichever TP rank saved it, under global ids."""
    modules = [load(os.path.join(shard, f"mp_rank_{t:02d}_model_states.pt")) for t in range(tp)]
    info = modules[0].get("universal_checkpoint_info") or {}
    # (the vocabulary padding rows kept, as at tp=1: the caller drops them)
    info = {k: v for k, v in info.items() if k != "vocabulary_parameter_patterns"}
    # DeepSpeed's MoE gate is whole on every TP rank (its [experts, hidden] at each; join checks the
    # copies are equal), which the harness's rules do not list
    info["tp_replicated_parameter_patterns"] = list(info.get("tp_replicated_parameter_patterns", [])) + \
        [r".*\.deepspeed_moe\.gate\.wg\.weight$"]
    out = {name: tp_join.join(info, name, [m["module"][name] for m in modules]) if tp > 1 else t0
           for name, t0 in modules[0]["module"].items()}
    for f in sorted(os.listdir(shard)):
        if re.fullmatch(r"layer_\d+_expert_\d+_mp_rank_\d+_model_states\.pt", f):
            for name, t in load(os.path.join(shard, f)).items():
                assert name not in out, f"{name}: saved twice"
                out[name] = t
    return out, info, [{n: t.shape for n, t in m["module"].items()} for m in modules]


def flat_pieces(shard, ep, tp):
    """(name, ep rank or -1, tp rank or -1) -> [(flat position in the parameter's group, start, numel,
    file's group state, fp32 partition)], from every ZeRO file of `shard`. DeepSpeed's partitioning
    (its expert groups are runs of ep consecutive global ranks r = dp_rank * tp + tp_rank): an expert
    group of rank r belongs to expert-parallel rank r % ep, partitioned over the ranks with the same
    remainder (partition r // ep); every other group over the DP ranks of its TP rank."""
    pieces = {}
    for f in sorted(os.listdir(shard)):
        m = re.fullmatch(r"(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt", f)
        if not m:
            continue
        d, t = int(m.group(1)), int(m.group(2))
        r = d * tp + t
        osd = load(os.path.join(shard, f))["optimizer_state_dict"]
        groups = osd["base_optimizer_state"]["param_groups"]
        state = osd["base_optimizer_state"]["state"]
        for g, mapping in enumerate(osd["param_slice_mappings"]):
            moe = bool(groups[g].get("moe", False))
            part = r // ep if moe else d
            size = state[g]["exp_avg"].numel()
            for name, frag in mapping.items():
                key = (name, r % ep, -1) if moe else (name, -1, t)
                pieces.setdefault(key, []).append((part * size + frag.start, frag.start, frag.numel, state[g],
                                                   osd["single_partition_of_fp32_groups"][g]))
    return pieces


def reassembled(shard, ep, tp, shapes, info, local_shapes):
    """global name -> {fp32, exp_avg, exp_avg_sq} (flat), from the ZeRO files of `shard`; a
    non-expert parameter's TP pieces joined by the checkpoint's own rules."""
    per_layer = {}
    for name in shapes:
        m = EXPERT.match(name)
        if m:
            per_layer.setdefault(m.group(1), set()).add(int(m.group(2)))
    out, by_tp = {}, {}
    for (name, ep_rank, t), runs in flat_pieces(shard, ep, tp).items():
        if ep_rank >= 0:
            m = EXPERT.match(name)
            local = int(m.group(2))
            per_rank = len(per_layer[m.group(1)]) // ep
            assert local < per_rank, f"{name}: local id {local} on an expert-parallel rank of {per_rank} experts"
            name = f"{m.group(1)}{ep_rank * per_rank + local}{m.group(3)}"
        first = min(r[0] for r in runs)
        numel = shapes[name].numel() if ep_rank >= 0 else local_shapes[t][name].numel()
        got = {s: torch.full((numel,), float("nan")) for s in ("fp32", "exp_avg", "exp_avg_sq")}
        for flat, start, n, st, fp32 in runs:
            at = flat - first
            got["exp_avg"][at:at + n] = st["exp_avg"][start:start + n]
            got["exp_avg_sq"][at:at + n] = st["exp_avg_sq"][start:start + n]
            got["fp32"][at:at + n] = fp32[start:start + n]
        for s, x in got.items():
            assert not bool(torch.isnan(x).any()), f"{name}: {s} not covered by the ZeRO files' fragments"
        if ep_rank >= 0:
            assert name not in out, f"{name}: in the ZeRO files twice"
            out[name] = got
        else:
            assert t not in by_tp.setdefault(name, {}), f"{name}: at tp={t} in the ZeRO files twice"
            by_tp[name][t] = got
    for name, pieces in by_tp.items():
        assert sorted(pieces) == list(range(tp)), f"{name}: ZeRO state at TP ranks {sorted(pieces)}"
        full = {s: [pieces[t][s].reshape(local_shapes[t][name]) for t in range(tp)] for s in pieces[0]}
        out[name] = {s: (tp_join.join(info, name, x) if tp > 1 else x[0]).reshape(-1) for s, x in full.items()}
    return out


def decays(name, shape):
    """The harness's weight-decay rule (train.py --param-groups 2): biases, layernorms and 1-d
    parameters have none."""
    return not (name.endswith(".bias") or "layernorm" in name or len(shape) == 1)


def reassembled_without_zero(shard, ep, tp=1, info=None):
    """global name -> {exp_avg, exp_avg_sq} (flat; in bf16 also the fp32 masters), from the
    expp_rank_R files of a case trained without ZeRO: torch's optimizer state by position. The
    positions are named here from what the harness builds, not from their shapes: each group lists,
    in the model's parameter order, the parameters of its weight-decay kind (train.py's rule), the
    non-expert ones from the module of the file's TP rank and an expert group the experts of rank R
    (MoE layer by layer, local expert by local expert, each expert's tensors in its file's order), as
    split_params_into_different_moe_groups_for_optimizer moves them. Rank R saves its file at TP
    rank R % tp (its global rank R: expert-parallel groups are runs of ep consecutive global ranks);
    a non-expert parameter's TP pieces are joined by the checkpoint's own rules (`info`)."""
    modules = [list(load(os.path.join(shard, f"mp_rank_{t:02d}_model_states.pt"))["module"].items()) for t in range(tp)]
    files = {}
    for f in os.listdir(shard):
        m = re.fullmatch(r"layer_(\d+)_expert_(\d+)_mp_rank_\d+_model_states\.pt", f)
        if m:
            files[(int(m.group(1)), int(m.group(2)))] = f
    layers = sorted({layer for layer, _ in files})
    out, by_tp = {}, {}
    for r in range(ep):
        t = r % tp
        opt = load(os.path.join(shard, f"expp_rank_{r}_mp_rank_{t:02d}_optim_states.pt"))["optimizer"]
        # bf16: DeepSpeed's DDP bf16 wrapper around torch's state, the fp32 masters beside it
        wrapped = "optimizer_state_dict" in opt and "fp32_groups" in opt
        osd = opt["optimizer_state_dict"] if wrapped else opt
        experts = []
        for layer in layers:
            total = sum(1 for (l, _) in files if l == layer)
            for j in range(total // ep):
                experts += list(load(os.path.join(shard, files[(layer, r * (total // ep) + j)])).items())
        for gi, g in enumerate(osd["param_groups"]):
            decay = g["weight_decay"] > 0
            moe = g.get("moe", False)
            pool = experts if moe else modules[t]
            names = [n for n, x in pool if decays(n, x.shape) == decay]
            assert len(names) == len(g["params"]), f"expp_rank_{r}: group {g.get('name')}: {len(g['params'])} " \
                f"positions, {len(names)} parameters of its kind"
            for k, (name, pos) in enumerate(zip(names, g["params"])):
                st = osd["state"][pos]
                assert st["exp_avg"].shape == dict(pool)[name].shape, f"{name}: position {pos} has another shape"
                got = {s: st[s] for s in ("exp_avg", "exp_avg_sq")}
                if wrapped:
                    got["fp32"] = opt["fp32_groups"][gi][k]
                if moe:
                    assert name not in out, f"{name}: in two expp_rank files"
                    out[name] = {s: x.reshape(-1) for s, x in got.items()}
                elif name in by_tp.setdefault(t, {}):  # every expert-parallel rank at TP rank t holds the same state
                    assert all(same_bytes(by_tp[t][name][s], got[s]) for s in got), \
                        f"{name}: expp_rank_{r} differs from the first rank at tp={t}"
                else:
                    by_tp[t][name] = got
    assert sorted(by_tp) == list(range(tp)), f"non-expert state at TP ranks {sorted(by_tp)}"
    for name in by_tp[0]:
        pieces = [by_tp[t][name] for t in range(tp)]
        out[name] = {s: (tp_join.join(info, name, [x[s] for x in pieces]) if tp > 1 else pieces[0][s]).reshape(-1)
                     for s in pieces[0]}
    return out


def main():
    inspect, convert, case, work, mpiexec = sys.argv[1:6]
    src = os.path.join(case, "ckpt")
    info = json.load(open(os.path.join(case, "case.json")))
    without_zero = re.search(r"--zero 0\b", info["train_args"]) is not None
    bf16 = re.search(r"--dtype bf16\b", info["train_args"]) is not None
    ep = int(re.search(r"--ep-size (\d+)", info["train_args"]).group(1))
    tag = open(os.path.join(src, "latest")).read().strip()
    shard = os.path.join(src, tag)

    report = json.loads(run([inspect, src, "--json"], "ucp-inspect --json").stdout)
    assert report["degrees"].get("ep") == ep, f"ucp-inspect says ep={report['degrees'].get('ep')}, the case trained with {ep}"
    experts = [f for f in report["files"] if f["kind"] == "expert_states"]
    assert len(experts) == len([f for f in os.listdir(shard) if "_expert_" in f]), "expert files missing from the report"
    per_layer = {}
    for p in report["params"]:
        m = EXPERT.match(p["name"])
        if m:
            per_layer.setdefault(m.group(1), set()).add(int(m.group(2)))
    for p in report["params"]:
        m = EXPERT.match(p["name"])
        if not m:
            assert p["pattern"] != "Expert", p["name"]
            continue
        owner = int(m.group(2)) // (len(per_layer[m.group(1)]) // ep)
        assert p["pattern"] == "Expert" and p["expert"] == {"id": int(m.group(2)), "ep_rank": owner}, \
            f"{p['name']}: pattern {p['pattern']}, {p.get('expert')}; expected Expert on expert-parallel rank {owner}"
    print(f"inspect: dp={report['degrees']['dp']} ep={ep} ZeRO-{report['zero_stage']}, {len(experts)} expert files, "
          f"{len(report['params'])} parameters")

    tp = tp_of(info)
    assert report["degrees"].get("tp", 1) == tp, f"ucp-inspect says tp={report['degrees'].get('tp')}, the case trained with {tp}"
    saved, uci, local_shapes = saved_weights(shard, tp)
    # The weights and moments, reassembled from the optimizer files (independently of ucp).
    moments = reassembled_without_zero(shard, ep, tp, uci) if without_zero else \
        reassembled(shard, ep, tp, saved, uci, local_shapes)
    assert sorted(moments) == sorted(saved), f"moments for {sorted(set(moments) ^ set(saved))[:4]} missing" 

    shutil.rmtree(work, ignore_errors=True)
    for ranks in (1, 2):
        out = os.path.join(work, f"np{ranks}")
        cmd = [convert, src, "-o", out, "-q"]
        if ranks > 1:
            cmd = [mpiexec, "--oversubscribe", "-np", str(ranks)] + cmd
        run(cmd, f"ucp-convert on {ranks} rank(s)")
        zero = os.path.join(out, "zero")
        params = sorted(p for p in os.listdir(zero) if os.path.isdir(os.path.join(zero, p)))
        zeros = set()
        assert sorted(saved) == params, f"atomic parameters differ: {sorted(set(saved) ^ set(params))[:6]}"
        for name in params:
            fp32 = load(os.path.join(zero, name, "fp32.pt"))["param"]
            want = saved[name]
            if want.shape != fp32.shape:  # the vocabulary padding rows, dropped in the atomic tensor
                assert want.shape[1:] == fp32.shape[1:] and want.shape[0] > fp32.shape[0], name
                want = want[:fp32.shape[0]]
            if bf16:  # the masters from the optimizer files; the saved weight is their bf16 copy
                master = moments[name]["fp32"].reshape(saved[name].shape)[:fp32.shape[0]]
                assert same_bytes(master, fp32), f"{name}: fp32 differs from DeepSpeed's fp32 master"
                assert same_bytes(want, fp32.to(torch.bfloat16)), f"{name}: the saved bf16 weight is not the master's bf16 copy"
            else:
                assert want.dtype == torch.float32 and same_bytes(want, fp32), f"{name}: fp32 differs from DeepSpeed's saved weight"
            for s in ("exp_avg", "exp_avg_sq"):
                got = load(os.path.join(zero, name, f"{s}.pt"))["param"].reshape(-1)
                ref = moments[name][s]
                if got.numel() != ref.numel():  # vocabulary rows dropped: the moments of the rows kept
                    ref = ref.reshape(saved[name].shape)[:fp32.shape[0]].reshape(-1)
                assert same_bytes(got, ref), f"{name}: {s} differs"
                if not bool(got.abs().sum() > 0):
                    zeros.add(name)
        # A moment of zeros is a parameter that never had a gradient: only an expert the router sent no
        # token (top-1 routing can starve one), and then every tensor of that expert, none other.
        idle = {EXPERT.match(n).group(1) + EXPERT.match(n).group(2) for n in zeros if EXPERT.match(n)}
        for name in params:
            m = EXPERT.match(name)
            starved = m is not None and m.group(1) + m.group(2) in idle
            assert (name in zeros) == starved, f"{name}: " + \
                ("moments all zeros" if name in zeros else "nonzero moments in an expert whose other tensors had none")
        n_exp = sum(1 for p in params if EXPERT.match(p))
        weights = "fp32 masters (its saved bf16 weights their copies)" if bf16 else "saved weights"
        print(f"np{ranks}: {len(params)} parameters ({n_exp} expert tensors under global ids) equal DeepSpeed's "
              f"{weights}; moments equal the reassembled optimizer state"
              + (f"; {len(idle)} expert(s) never routed a token, moments zero" if idle else ""))
    print("ok")


if __name__ == "__main__":
    main()
