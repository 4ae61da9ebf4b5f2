"""Loads every file of a Megatron-DeepSpeed checkpoint with Debian's python3-torch and reassembles
the full model from it, the way a reader of DeepSpeed's format would: ZeRO flat partitions by
param_slice_mappings (ZeRO-3: per-parameter pieces padded to a multiple of DP), TP pieces by the
checkpoint's own universal_checkpoint_info, vocabulary padding stripped. Compares fp32 weights,
exp_avg and exp_avg_sq with the ground truth, and the layer files' training-dtype weights with the
truth cast to that dtype. GPTModel (ZeRO-3) and GPTModelPipe names are matched through the layer
they belong to, so the truth may use either naming.

  reassemble.py CHECKPOINT_ROOT FIXTURE_DIR   (FIXTURE_DIR holds truth.pt)
"""
import glob
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import ds_stubs  # noqa: E402,F401
from gpt_names import pipe_name  # noqa: E402
import tp_join  # noqa: E402

root, fixture = sys.argv[1], sys.argv[2]
truth = torch.load(os.path.join(fixture, "truth.pt"))["params"]
tag = open(os.path.join(root, "latest")).read().strip()
d = os.path.join(root, tag)
zero3 = not os.path.exists(os.path.join(d, "mp_rank_00_model_states.pt"))
m0 = torch.load(os.path.join(d, "zero_pp_rank_0_mp_rank_00_model_states.pt" if zero3 else "mp_rank_00_model_states.pt"))
tp, pp, dp = m0["args"].tensor_model_parallel_size, m0["args"].pipeline_model_parallel_size, m0["dp_world_size"]
info = m0["universal_checkpoint_info"]
lp_dtype = m0["args"].params_dtype
layers = m0["args"].num_layers



def join(name, pieces):
    """Full tensor from its TP pieces, by the checkpoint's own rules (ds_to_universal's order)."""
    return tp_join.join(info, name, pieces)


states = {}  # name -> state -> tp -> tensor (first stage holding it)
weights = {}  # name -> tp -> training-dtype tensor
for t in range(tp if zero3 else 0):
    shapes = torch.load(os.path.join(d, f"zero_pp_rank_0_mp_rank_{t:02d}_model_states.pt"))["param_shapes"]
    osds = [torch.load(os.path.join(d, f"{'bf16_' if lp_dtype == torch.bfloat16 else ''}zero_pp_rank_{r}_mp_rank_{t:02d}"
                                       "_optim_states.pt"))["optimizer_state_dict"] for r in range(dp)]
    for g, group in enumerate(shapes):
        offset = 0
        for name, shape in group.items():
            n = shape.numel()
            piece = (n + dp - 1) // dp
            for key in ("fp32", "exp_avg", "exp_avg_sq"):
                parts = [o["fp32_flat_groups"][g] if key == "fp32" else o["optimizer_state_dict"]["state"][g][key] for o in osds]
                full = torch.cat([x[offset:offset + piece] for x in parts])[:n]
                states.setdefault(name, {}).setdefault(key, {})[t] = full.view(shape).clone()
            offset += piece
for s in range(pp if not zero3 else 0):
    for t in range(tp):
        mp = s * tp + t
        shapes = torch.load(os.path.join(d, f"mp_rank_{mp:02d}_model_states.pt"))["param_shapes"]
        files = sorted(glob.glob(os.path.join(d, f"*zero_pp_rank_*_mp_rank_{mp:02d}_optim_states.pt")),
                       key=lambda f: int(re.search(r"zero_pp_rank_(\d+)_", f).group(1)))
        assert len(files) == dp, f"mp_rank {mp}: {len(files)} optimizer files for dp={dp}"
        osds = [torch.load(f)["optimizer_state_dict"] for f in files]
        for g, group in enumerate(shapes):
            flat = {}
            for key in ("fp32", "exp_avg", "exp_avg_sq"):
                parts = []
                for o in osds:
                    x = o["single_partition_of_fp32_groups"][g] if key == "fp32" else o["base_optimizer_state"]["state"][g][key]
                    parts.append(x)
                flat[key] = torch.cat(parts)
            offset = 0
            for name, shape in group.items():
                n = shape.numel()
                for key, buf in flat.items():
                    if name in states and key in states[name] and t in states[name][key]:
                        continue  # tied: the first stage's copy
                    states.setdefault(name, {}).setdefault(key, {})[t] = buf[offset:offset + n].view(shape).clone()
                offset += n
        for lf in glob.glob(os.path.join(d, f"layer_*-model_{t:02d}-model_states.pt")):
            idx = int(re.search(r"layer_(\d+)-", lf).group(1))
            for k, v in torch.load(lf).items():
                name = f"tied_modules.embed.{k}" if idx == 1 else f"{idx}.{k}"
                weights.setdefault(name, {})[t] = v
problems = []
ours = {pipe_name(n, layers): n for n in states}
if len(ours) != len(truth):
    problems.append(f"{len(ours)} parameters in the checkpoint, {len(truth)} in the truth")
for truth_name, want in truth.items():
    name = ours.get(pipe_name(truth_name, layers))
    if name is None:
        problems.append(f"{truth_name}: not in the checkpoint")
        continue
    for key in ("fp32", "exp_avg", "exp_avg_sq"):
        got = join(name, [states[name][key][t] for t in range(tp)])
        if not torch.equal(got.view(torch.int32), want[key].view(torch.int32)):
            problems.append(f"{name} {key}: reassembled tensor differs from the truth")
    if zero3:
        continue  # ZeRO-3 model-states files hold empty placeholders, no weights
    got = join(name, [weights[name][t] for t in range(tp)])
    if not torch.equal(got, want["fp32"].to(lp_dtype)):
        problems.append(f"{name}: layer-file weights differ from the truth cast to {lp_dtype}")
for p in problems[:20]:
    print("FAIL", p)
print(f"{root}: {len(truth)} parameters reassembled with torch from dp={dp} tp={tp} pp={pp}{' ZeRO-3' if zero3 else ''}: "
      f"{'OK' if not problems else str(len(problems)) + ' problems'}")
sys.exit(1 if problems else 0)
