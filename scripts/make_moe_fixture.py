#!/usr/bin/python3
"""Writes a DeepSpeed Mixture-of-Experts checkpoint of a small GPT (deepspeed.moe.layer.MoE in place
of the MLP of some layers) for a given expert-parallel degree, DP degree and ZeRO stage (0, 1 or 2), with
the files, keys and value types DeepSpeed 0.14.5 writes (checked against the real MoE checkpoints in
tests/data/real-moe), plus the ground truth.

The generator first draws the full model state (fp32 weights, Adam moments, a step), every expert
under its global id, then lays it out:
  OUT/global_stepN/mp_rank_00_model_states.pt   module without the experts, num_experts, no param_shapes
  OUT/global_stepN/layer_L_expert_E_mp_rank_00_model_states.pt   expert E of MoE layer L (global names)
  OUT/global_stepN/expp_rank_R_mp_rank_00_optim_states.pt        {'optimizer': None} (ZeRO), R < ep;
      without ZeRO (fp32) {'optimizer': torch's Adam state_dict()}: per position (numbered group by
      group) its own step tensor and moments in the parameter's shape, each group listing its
      positions; the expert groups hold rank R's experts (MoE layer by layer, local id by local id)
  OUT/global_stepN/[bf16_]zero_pp_rank_D_mp_rank_00_optim_states.pt   (ZeRO) partitions: the two non-expert
      groups over all dp ranks; the two expert groups ('moe': True, 'ep_size_<ep>') hold the experts of
      expert-parallel rank D % ep, named by their local id there, partitioned over its dp / ep ranks
  OUT/truth.pt      {'params': {name: {'fp32','exp_avg','exp_avg_sq'}}, 'step', 'expert_moment_scale'}
  OUT/fixture.json  the layout, for tests

Under ZeRO-1/2, DeepSpeed 0.14.5's expert gradient is ep times the mean gradient, so a job at ep keeps
expert moments ep and ep^2 times those of ep=1 (without ZeRO it averages over the whole DP group
since 0.14.1: no scale): truth.pt holds the ep=1 moments; the files hold them scaled (and the atomic
checkpoint ucp-convert writes holds the files' values, expert_moment_scale says by how much).

  make_moe_fixture.py OUT --dp D --ep E --zero-stage {0,1,2} [--dtype fp32|fp16|bf16] [--experts 4]
"""
import argparse
import collections
import json
import math
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ds_stubs  # noqa: E402  (DeepSpeed classes under their real module paths)
from make_fixture import DS_VERSION, STEP, Model  # noqa: E402

EXPERT_KEYS = ("dense_h_to_4h.weight", "dense_h_to_4h.bias", "dense_4h_to_h.weight", "dense_4h_to_h.bias")


class MoeModel:
    """Model's GPT (GPTModel names) with the MLP of every odd layer a MoE layer of `experts` experts."""

    def __init__(self, layers, experts, expert_ffn=16):
        self.base = Model("gpt-gqa", layers)
        self.experts = experts
        self.expert_ffn = expert_ffn
        self.moe_layers = [i for i in range(layers) if i % 2 == 1]

    def params(self):
        """(name, shape, MoE layer ordinal or -1, global expert id or -1), in the model's order."""
        b, h, out = self.base, self.base.hidden, []
        for name, shape, _, idx in b.params():
            plain = b.plain_name(name)
            layer = idx - 2 if 2 <= idx < b.norm_index() else -1
            if layer in self.moe_layers and ".mlp." in plain:
                if plain.endswith("mlp.dense_h_to_4h.weight"):  # the MoE layer's parameters, in its place
                    prefix = f"language_model.encoder.layers.{layer}.mlp.deepspeed_moe."
                    ordinal = self.moe_layers.index(layer)
                    out.append((prefix + "gate.wg.weight", (self.experts, h), -1, -1))
                    for e in range(self.experts):
                        f = self.expert_ffn
                        for key, s in zip(EXPERT_KEYS, ((2 * f, h), (2 * f,), (h, f), (h,))):
                            out.append((f"{prefix}experts.deepspeed_experts.{e}.{key}", s, ordinal, e))
                continue
            out.append((plain, tuple(shape), -1, -1))
        return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--dp", type=int, required=True)
    ap.add_argument("--ep", type=int, required=True)
    ap.add_argument("--zero-stage", type=int, required=True, choices=[0, 1, 2])
    ap.add_argument("--dtype", default="fp32", choices=["fp16", "bf16", "fp32"])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.dp % a.ep or a.experts % a.ep:
        ap.error("ep must divide dp and the experts")
    if a.zero_stage == 0 and a.dtype != "fp32":
        ap.error("without ZeRO this generator writes fp32 (the model's torch optimizer), not DeepSpeed's FP16/BF16 optimizer")
    if a.dtype == "bf16" and a.zero_stage == 1:
        ap.error("bf16 under ZeRO-1 is DeepSpeed's BF16 optimizer, which this generator does not write for MoE")
    write(a)


def write(a):
    if os.path.isdir(a.out) and os.listdir(a.out):
        if not os.path.exists(os.path.join(a.out, "fixture.json")):
            sys.exit(f"{a.out} exists, is not empty and is not a fixture: refusing to overwrite it")
        shutil.rmtree(a.out)
    model = MoeModel(a.layers, a.experts)
    base = model.base
    lp = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    params = model.params()
    g = torch.Generator().manual_seed(a.seed)
    truth = collections.OrderedDict()
    for name, shape, _, _ in params:
        w = torch.randn(*shape, generator=g) * 0.02
        if len(shape) == 1 and name.endswith("layernorm.weight"):
            w = w + 1.0
        truth[name] = {"fp32": w, "exp_avg": torch.randn(*shape, generator=g) * 1e-3,
                       "exp_avg_sq": torch.rand(*shape, generator=g) * 1e-6}
    vocab_name = "language_model.embedding.word_embeddings.weight"
    pad = base.padded_vocab(1) - base.vocab
    scale = a.ep if a.zero_stage > 0 else 1  # DeepSpeed 0.14.5 scales expert gradients by ep under ZeRO-1/2 only

    def stored(name, key):
        """The tensor as a job at ep keeps it: the vocabulary padded with zeros, expert moments scaled."""
        t = truth[name][key]
        if name == vocab_name:
            t = torch.cat([t, torch.zeros(pad, base.hidden)])
        if ".deepspeed_experts." in name and key != "fp32":
            t = t * (scale if key == "exp_avg" else scale * scale)
        return t.reshape(-1)

    tag = f"global_step{STEP}"
    ckpt = os.path.join(a.out, tag)
    os.makedirs(ckpt)
    with open(os.path.join(a.out, "latest"), "w") as f:
        f.write(tag)
    info = base.universal_checkpoint_info(0.2, 1, "plain")
    ds_config = {"train_batch_size": 4 * a.dp, "train_micro_batch_size_per_gpu": 4, "gradient_clipping": 1.0,
                 "zero_optimization": {"stage": a.zero_stage}, "bf16": {"enabled": a.dtype == "bf16"},
                 "fp16": {"enabled": a.dtype == "fp16"}, "steps_per_print": 10}
    files = []

    def save(obj, name):
        torch.save(obj, os.path.join(ckpt, name))
        files.append(name)

    def shaped(name):
        t = truth[name]["fp32"]
        if name == vocab_name:
            t = torch.cat([t, torch.zeros(pad, base.hidden)])
        return t.to(lp)

    # Expert files, one per expert of each MoE layer, under global names (engine._save_moe_checkpoint).
    for ordinal in range(len(model.moe_layers)):
        for e in range(a.experts):
            save({n: shaped(n) for n, _, o, x in params if o == ordinal and x == e},
                 f"layer_{ordinal}_expert_{e}_mp_rank_00_model_states.pt")
    module = collections.OrderedDict((n, shaped(n)) for n, _, _, x in params if x < 0)
    save({"module": module, "lr_scheduler": {"last_batch_iteration": STEP - 1}, "data_sampler": None,
          "random_ltd": None, "sparse_tensor_module_names": set(), "skipped_steps": 0, "global_steps": STEP,
          "global_samples": STEP * 4 * a.dp, "dp_world_size": a.dp, "mp_world_size": 1,
          "num_experts": [a.experts] * len(model.moe_layers), "iteration": STEP, "universal_checkpoint_info": info},
         "mp_rank_00_model_states.pt")

    per_rank = a.experts // a.ep

    def group_of(name, shape):
        decay = 0 if len(shape) > 1 else 1  # Megatron: weights decay, biases and norms do not
        return decay + (2 if ".deepspeed_experts." in name else 0)

    def param_group(g):
        d = {"weight_decay": 0.01 if g % 2 == 0 else 0.0, "name": ("decay", "no_decay")[g % 2] if g < 2 else f"ep_size_{a.ep}"}
        if g >= 2:
            d["moe"] = True
        d.update({"lr": 0.01, "betas": (0.9, 0.95), "eps": 1e-8, "amsgrad": False, "foreach": None, "maximize": False,
                  "capturable": False, "params": [g]})
        return d

    def members_of(gi, r):
        """Group gi's parameters on expert-parallel rank r, in the model's order."""
        moe = gi >= 2
        return [(n, s, x) for n, s, _, x in params if group_of(n, s) == gi and (not moe or x // per_rank == r)]

    for r in range(a.ep):
        if a.zero_stage > 0:
            save({"optimizer": None}, f"expp_rank_{r}_mp_rank_00_optim_states.pt")
            continue
        state, groups, pos = {}, [], 0
        for gi in range(4):
            group = param_group(gi)
            group["params"] = []
            for n, s, _ in members_of(gi, r):
                state[pos] = {"step": torch.tensor(float(STEP)), "exp_avg": stored(n, "exp_avg").reshape(shaped(n).shape).clone(),
                              "exp_avg_sq": stored(n, "exp_avg_sq").reshape(shaped(n).shape).clone()}
                group["params"].append(pos)
                pos += 1
            groups.append(group)
        save({"optimizer": {"state": state, "param_groups": groups}}, f"expp_rank_{r}_mp_rank_00_optim_states.pt")

    for d in range(a.dp if a.zero_stage > 0 else 0):
        r = d % a.ep
        state, single, paddings, counts, mappings = {}, [], [], [], []
        for gi in range(4):
            moe = gi >= 2
            members = members_of(gi, r)
            parts = a.dp // a.ep if moe else a.dp
            part = d // a.ep if moe else d
            flat = {k: torch.cat([stored(n, k) for n, _, _ in members]) for k in ("fp32", "exp_avg", "exp_avg_sq")}
            total = flat["fp32"].numel()
            alignment = 2 * parts
            padded = int(math.ceil(total / alignment) * alignment)
            ps = padded // parts
            lo, hi = part * ps, (part + 1) * ps
            pad_here = ps if total <= lo else (hi - total if total < hi else 0)
            cut = {k: torch.cat([v, torch.zeros(padded - total)])[lo:hi].clone() for k, v in flat.items()}
            single.append(cut["fp32"][:ps - pad_here].clone())
            state[gi] = {"step": torch.tensor(float(STEP)), "exp_avg": cut["exp_avg"], "exp_avg_sq": cut["exp_avg_sq"]}
            paddings.append(pad_here)
            counts.append(parts)
            m, at = collections.OrderedDict(), 0
            for n, s, x in members:
                numel = math.prod(s) if n != vocab_name else base.padded_vocab(1) * base.hidden
                f0, f1 = max(at, lo), min(at + numel, hi)
                if f0 < f1:
                    local = n.replace(f".deepspeed_experts.{x}.", f".deepspeed_experts.{x % per_rank}.") if moe else n
                    m[local] = ds_stubs.fragment_address(numel=f1 - f0, start=f0 - lo)
                at += numel
            mappings.append(m)
        stage = ds_stubs.ZeroStageEnum.optimizer_states if a.zero_stage == 1 else ds_stubs.ZeroStageEnum.gradients
        scaler = ds_stubs.DynamicLossScaler(init_scale=2 ** 16) if a.dtype == "fp16" else ds_stubs.LossScaler(scale=1.0)
        osd = {"loss_scaler": scaler, "dynamic_loss_scale": a.dtype == "fp16", "overflow": False, "clip_grad": 1.0,
               "base_optimizer_state": {"state": state, "param_groups": [param_group(gi) for gi in range(4)]},
               "single_partition_of_fp32_groups": single, "zero_stage": stage, "group_paddings": paddings,
               "partition_count": counts, "ds_version": DS_VERSION, "param_slice_mappings": mappings}
        save({"optimizer_state_dict": osd, "ds_config": ds_config, "ds_version": DS_VERSION},
             f"{'bf16_' if a.dtype == 'bf16' else ''}zero_pp_rank_{d}_mp_rank_00_optim_states.pt")

    torch.save({"params": truth, "step": STEP, "expert_moment_scale": scale}, os.path.join(a.out, "truth.pt"))
    with open(os.path.join(a.out, "fixture.json"), "w") as f:
        json.dump({"framework": "deepspeed", "naming": "plain", "moe": True, "dp": a.dp, "ep": a.ep, "tp": 1, "pp": 1,
                   "zero_stage": a.zero_stage, "dtype": a.dtype, "experts": a.experts,
                   "moe_layers": model.moe_layers, "iteration": STEP, "tag": tag,
                   "original_vocab_size": base.vocab, "padded_vocab_size": base.padded_vocab(1),
                   "files": sorted(files)}, f, indent=1)
    return a.out


if __name__ == "__main__":
    main()
