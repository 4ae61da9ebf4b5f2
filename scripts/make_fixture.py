#!/usr/bin/python3
"""Writes a DeepSpeed / Megatron-DeepSpeed checkpoint folder of a small GPT- or Llama-like model for
a given layout, with the file names, keys and value types DeepSpeed writes, plus the ground truth.

The generator first draws the full, unpadded model state (fp32 weights, Adam exp_avg and exp_avg_sq,
a step), then shards it: vocabulary padding for TP, TP slices by each parameter's pattern, PP stages,
ZeRO flat partitions with DeepSpeed's alignment padding. Tests compare ucp's output with truth.pt,
never with another run of ucp.

  OUT/latest, OUT/latest_checkpointed_iteration.txt, OUT/global_stepN/*.pt   the checkpoint
  OUT/truth.pt      {'params': {name: {'fp32','exp_avg','exp_avg_sq'}}, 'step', ...} full tensors
  OUT/fixture.json  the layout and model description, for tests
"""
import argparse
import collections
import json
import math
import os
import random
import shutil
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
import ds_stubs  # noqa: E402  (DeepSpeed classes under their real module paths)

DS_VERSION = "0.14.5"
STEP = 12


class Model:
    """Shapes and TP patterns of the fixture model, in Megatron-DeepSpeed GPTModelPipe naming."""

    def __init__(self, family, layers, average_norms=False):
        self.family = family
        self.average_norms = average_norms  # input layer norms are Partial (parameter_to_average_patterns)
        self.layers = layers
        self.hidden = 32
        self.vocab = 100              # original (unpadded) vocabulary
        self.make_divisible_by = 8    # --make-vocab-size-divisible-by
        if family == "llama":          # GQA + SwiGLU + RMSNorm, no biases, no position embeddings
            self.heads, self.kv_heads, self.ffn = 4, 2, 48
            self.swiglu, self.bias, self.layernorm, self.pos = True, False, False, 0
        elif family == "gpt-gqa":      # GPT names, LayerNorm, biases, learned positions WITH GQA and SwiGLU,
            self.heads, self.kv_heads, self.ffn = 4, 2, 48  # as the real DeepSpeed cases (shared/real-deepspeed)
            self.swiglu, self.bias, self.layernorm, self.pos = True, True, True, 16
        else:                          # GPT: MHA, GeLU, LayerNorm, biases, learned positions
            self.heads, self.kv_heads, self.ffn = 4, 4, 128
            self.swiglu, self.bias, self.layernorm, self.pos = False, True, True, 16
        self.head_dim = self.hidden // self.heads
        self.q = self.heads * self.head_dim
        self.kv = self.kv_heads * self.head_dim

    def padded_vocab(self, tp):
        multiple = self.make_divisible_by * tp
        return ((self.vocab + multiple - 1) // multiple) * multiple

    def layer_index(self, i):
        return i + 2                  # spec 0 is a function, 1 the embedding

    def norm_index(self):
        return self.layers + 2

    def params(self):
        """(name, full shape, pattern, layer spec index) in module order."""
        h, out = self.hidden, []
        out.append(("tied_modules.embed.word_embeddings.weight", (self.vocab, h), "vocab", 1))
        if self.pos:
            out.append(("tied_modules.embed.position_embeddings.weight", (self.pos, h), "replicate", 1))
        for i in range(self.layers):
            x = self.layer_index(i)
            norm = ["weight", "bias"] if self.layernorm else ["weight"]
            for n in norm:
                out.append((f"{x}.input_layernorm.{n}", (h,), "average" if self.average_norms else "replicate", x))
            out.append((f"{x}.self_attention.query_key_value.weight", (self.q + 2 * self.kv, h),
                        "qkv" if self.kv != self.q else "col", x))
            if self.bias:
                out.append((f"{x}.self_attention.query_key_value.bias", (self.q + 2 * self.kv,),
                            "qkv" if self.kv != self.q else "col", x))
            out.append((f"{x}.self_attention.dense.weight", (h, self.q), "row", x))
            if self.bias:
                out.append((f"{x}.self_attention.dense.bias", (h,), "replicate", x))
            for n in norm:
                out.append((f"{x}.post_attention_layernorm.{n}", (h,), "replicate", x))
            out.append((f"{x}.mlp.dense_h_to_4h.weight", ((2 if self.swiglu else 1) * self.ffn, h),
                        "swiglu" if self.swiglu else "col", x))
            if self.bias:
                out.append((f"{x}.mlp.dense_h_to_4h.bias", ((2 if self.swiglu else 1) * self.ffn,),
                            "swiglu" if self.swiglu else "col", x))
            out.append((f"{x}.mlp.dense_4h_to_h.weight", (h, self.ffn), "row", x))
            if self.bias:
                out.append((f"{x}.mlp.dense_4h_to_h.bias", (h,), "replicate", x))
        for n in (["weight", "bias"] if self.layernorm else ["weight"]):
            out.append((f"{self.norm_index()}.{n}", (h,), "replicate", self.norm_index()))
        return out

    def plain_name(self, name):
        """GPTModel (non-pipe, used with ZeRO-3) name of a pipe-named parameter."""
        if name.startswith("tied_modules.embed."):
            return "language_model.embedding." + name[len("tied_modules.embed."):]
        idx, rest = name.split(".", 1)
        if int(idx) == self.norm_index():
            return "language_model.encoder.final_layernorm." + rest
        return f"language_model.encoder.layers.{int(idx) - 2}.{rest}"

    def universal_checkpoint_info(self, version, tp, naming):
        """What Megatron-DeepSpeed's model.universal_checkpoint_info() returns, in DeepSpeed's keys. As in
        the real files, the TP patterns (replicated, averaged, row-parallel) are there only at TP > 1, and
        a sub-parameter shape is a tuple holding a tuple: ((q, kv, kv), hidden)."""
        if naming == "pipe":
            L, emb = r"\d+.", "tied_modules.embed."
            norm = [r"\d+.weight"] + ([r"\d+.bias"] if self.layernorm else [])
        else:
            L, emb = r"language_model.encoder.layers.\d+.", "language_model.embedding."
            norm = ["language_model.encoder.final_layernorm.weight"] + (
                ["language_model.encoder.final_layernorm.bias"] if self.layernorm else [])
        info = collections.OrderedDict()
        info["universal_checkpoint_version"] = version
        info["original_vocab_size"] = self.vocab
        info["padded_vocab_size"] = self.padded_vocab(tp)
        info["vocabulary_parameter_patterns"] = [emb + "word_embeddings.weight"]
        info["pipeline_replicated_parameter_patterns"] = [emb + "word_embeddings.weight"] + (
            [emb + "position_embeddings.weight"] if self.pos else [])
        # The rules of each TP pattern, in the model's order of the parameters they name.
        def rules(pattern):
            out = []
            for name, _, p, idx in self.params():
                if p != pattern:
                    continue
                if idx == 1:
                    rule = emb + name[len("tied_modules.embed."):]
                elif idx == self.norm_index():
                    rule = norm[0] if name.endswith(".weight") else norm[-1]
                else:
                    rule = L + name.split(".", 1)[1]
                if rule not in out:
                    out.append(rule)
            return out
        tp_rep = rules("replicate")
        if self.average_norms:  # (the averaged norms of the fixtures: at any TP, to test the TP=1 merge)
            info["parameter_to_average_patterns"] = rules("average")
        if tp > 1:
            info["tp_replicated_parameter_patterns"] = tp_rep
            info["parameter_with_row_parallelism_patterns"] = rules("row")
        if self.swiglu:
            info["parameter_with_2_sub_params_cat_dim_0"] = [L + "mlp.dense_h_to_4h.weight"] + (
                [L + "mlp.dense_h_to_4h.bias"] if self.bias else [])
        if self.kv != self.q:
            sizes = (self.q, self.kv, self.kv)
            info["parameter_with_sub_params"] = [
                {"patterns": [L + "self_attention.query_key_value.weight"], "shape": (sizes, self.hidden),
                 "partition_dim": 0}]
            if self.bias:
                info["parameter_with_sub_params"].append(
                    {"patterns": [L + "self_attention.query_key_value.bias"], "shape": (sizes,), "partition_dim": 0})
            if version >= 0.4:
                info["sub_param_shard_widths"] = {
                    sp["patterns"][0]: [[n // tp] * tp for n in sizes] for sp in info["parameter_with_sub_params"]}
        return info


def draw_truth(model, seed):
    g = torch.Generator().manual_seed(seed)
    truth = collections.OrderedDict()
    for name, shape, _, _ in model.params():
        w = torch.randn(*shape, generator=g) * 0.02
        if name.endswith("layernorm.weight") or (name.split(".")[-1] == "weight" and len(shape) == 1):
            w = w + 1.0
        m = torch.randn(*shape, generator=g) * 1e-3
        v = torch.rand(*shape, generator=g) * 1e-6
        truth[name] = {"fp32": w, "exp_avg": m, "exp_avg_sq": v}
    return truth


def tp_slice(model, pattern, full, tp, rank, pad_rows):
    """This TP rank's piece of a full tensor; pad_rows fills vocabulary padding."""
    if pattern == "vocab":
        full = torch.cat([full, pad_rows], 0)
        return full.chunk(tp, 0)[rank].clone()
    if pattern in ("replicate", "average"):
        return full.clone()
    if pattern == "row":
        return full.chunk(tp, 1)[rank].clone()
    if pattern == "col":
        return full.chunk(tp, 0)[rank].clone()
    if pattern == "swiglu":
        gate, up = full.chunk(2, 0)
        return torch.cat([gate.chunk(tp, 0)[rank], up.chunk(tp, 0)[rank]], 0)
    if pattern == "qkv":
        q, k, v = full.split([model.q, model.kv, model.kv], 0)
        return torch.cat([q.chunk(tp, 0)[rank], k.chunk(tp, 0)[rank], v.chunk(tp, 0)[rank]], 0)
    raise ValueError(pattern)


def stage_of_layers(model, pp):
    """DeepSpeed partition_method 'type:transformer': transformer layers split uniformly."""
    per, extra = divmod(model.layers, pp)
    out, start = [], 0
    for s in range(pp):
        n = per + (1 if s < extra else 0)
        out.append(list(range(start, start + n)))
        start += n
    return out


def stage_params(model, pp, stage):
    """Names a PP stage holds, in module order: tied modules first, then its layer specs."""
    layers = stage_of_layers(model, pp)[stage]
    idxs = {model.layer_index(i) for i in layers}
    if stage == pp - 1:
        idxs.add(model.norm_index())
    names = []
    for name, shape, pattern, idx in model.params():
        if idx == 1:
            if stage == 0 or stage == pp - 1:
                names.append(name)
        elif idx in idxs:
            names.append(name)
    return names


def no_weight_decay(name, shape):
    return name.endswith(".bias") or len(shape) == 1


def write(obj, path):
    torch.save(obj, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--dp", type=int, default=1)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--zero-stage", type=int, default=1, choices=[0, 1, 2, 3],
                    help="0 only with bf16: DeepSpeed's BF16 optimizer, as bf16 with stage 1")
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "bf16", "fp32"])
    ap.add_argument("--family", default="llama", choices=["llama", "gpt", "gpt-gqa"])
    ap.add_argument("--model", choices=["pipe", "plain"], default=None,
                    help="pipe: a PipelineModule (layer_* files, GPTModelPipe names); plain: not one (weights under "
                         "`module` of mp_rank_XX_model_states.pt, GPTModel names). Default: plain for ZeRO-3, else pipe")
    ap.add_argument("--synced-tied-copies", action="store_true",
                    help="every stage holds the first stage's copy of the tied module (as a reshard or DeepSpeed's "
                         "universal load writes them), not the last stage's own position embedding")
    ap.add_argument("--no-args", action="store_true",
                    help="as a plain DeepSpeed engine saves: no Megatron args, rng states or checkpoint_version")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--uc-version", type=float, default=0.4, help="universal_checkpoint_version to record")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--scale", type=int, default=1, help="multiply hidden size (for benchmarks)")
    ap.add_argument("--zero-vocab-padding", action="store_true",
                    help="fill vocabulary padding rows with zeros (as a reshard re-pads) instead of noise")
    ap.add_argument("--weights-from", metavar="FILE.pt",
                    help="the fp32 weights: a torch.save'd {GPTModel name: full tensor} (a real model's) instead of drawn ones")
    ap.add_argument("--average-norms", action="store_true",
                    help="input layer norms differ per TP rank and are averaged (parameter_to_average_patterns)")
    a = ap.parse_args()
    if a.zero_stage == 3 and a.pp > 1:
        ap.error("DeepSpeed does not combine ZeRO-3 with pipeline parallelism")
    if a.zero_stage == 0 and a.dtype != "bf16":
        ap.error("ZeRO stage 0 is written by the BF16 optimizer only: use --dtype bf16")

    if os.path.isdir(a.out) and os.listdir(a.out):
        if not os.path.exists(os.path.join(a.out, "fixture.json")):
            ap.error(f"{a.out} exists, is not empty and is not a fixture: refusing to overwrite it")
        shutil.rmtree(a.out)  # an earlier fixture: regenerate from scratch
    torch.manual_seed(a.seed)  # the saved torch_rng_state: the same for the same seed, run after run
    model = Model(a.family, a.layers, a.average_norms)
    if a.scale > 1:
        model.hidden *= a.scale
        model.ffn *= a.scale
        model.head_dim = model.hidden // model.heads
        model.q, model.kv = model.heads * model.head_dim, model.kv_heads * model.head_dim
        model.vocab *= a.scale
    if a.pp > model.layers:
        ap.error("more pipeline stages than layers")
    naming = a.model or ("plain" if a.zero_stage == 3 else "pipe")
    if naming == "pipe" and a.zero_stage == 3:
        ap.error("DeepSpeed does not run a PipelineModule under ZeRO-3")
    if naming == "plain" and a.pp > 1:
        ap.error("only a PipelineModule runs with pp > 1")
    bf16 = a.dtype == "bf16"
    fp16 = a.dtype == "fp16"
    lp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    # bf16 with ZeRO stage 0 or 1 runs DeepSpeed's BF16_Optimizer (under PP it is the only choice).
    bf16_optimizer = bf16 and a.zero_stage in (0, 1)
    truth = draw_truth(model, a.seed)
    if a.weights_from:  # a known model's weights (Adam's moments stay drawn)
        given = torch.load(a.weights_from)
        for name, state in truth.items():
            w = given.pop(model.plain_name(name))
            if tuple(w.shape) != tuple(state["fp32"].shape):
                ap.error(f"{a.weights_from}: {model.plain_name(name)} is {tuple(w.shape)}, the model's {tuple(state['fp32'].shape)}")
            state["fp32"] = w.float().contiguous()
        if given:
            ap.error(f"{a.weights_from}: {sorted(given)[0]} is no parameter of the fixture's model")
    shapes = {n: s for n, s, _, _ in model.params()}
    patterns = {n: p for n, _, p, _ in model.params()}
    pad = model.padded_vocab(a.tp) - model.vocab
    g = torch.Generator().manual_seed(a.seed + 1000)
    # Vocabulary padding rows hold values of their own: they must never reach an atomic tensor.
    pad_rows = {k: torch.randn(pad, model.hidden, generator=g) for k in ("fp32", "exp_avg", "exp_avg_sq")}
    if a.zero_vocab_padding:
        pad_rows = {k: torch.zeros_like(v) for k, v in pad_rows.items()}
    name_of = (lambda n: n) if naming == "pipe" else model.plain_name

    tag = f"global_step{STEP}"
    ckpt = os.path.join(a.out, tag)
    os.makedirs(ckpt, exist_ok=True)
    with open(os.path.join(a.out, "latest"), "w") as f:
        f.write(tag)
    with open(os.path.join(a.out, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(STEP))

    info = model.universal_checkpoint_info(a.uc_version, a.tp, naming)
    world = a.dp * a.tp * a.pp
    ds_config = {"train_batch_size": 8 * a.dp, "train_micro_batch_size_per_gpu": 8, "gradient_clipping": 1.0,
                 "zero_optimization": {"stage": a.zero_stage}, "bf16": {"enabled": bf16},
                 "fp16": {"enabled": fp16, "loss_scale": 0, "initial_scale_power": 16},
                 "steps_per_print": 10, "wall_clock_breakdown": False,
                 # Megatron-DeepSpeed's bf16 recipe: fp32 gradient accumulation, which is what makes
                 # DeepSpeed pick its BF16 optimizer at ZeRO-1 (with bf16 accumulation, ZeRO's)
                 "data_types": {"grad_accum_dtype": "fp32"}}
    args = argparse.Namespace(
        num_layers=model.layers, hidden_size=model.hidden, ffn_hidden_size=model.ffn,
        num_attention_heads=model.heads, num_key_value_heads=model.kv_heads, kv_channels=model.head_dim,
        max_position_embeddings=model.pos or 64, seq_length=64, micro_batch_size=8, global_batch_size=8 * a.dp,
        tensor_model_parallel_size=a.tp, pipeline_model_parallel_size=a.pp, data_parallel_size=a.dp,
        world_size=world, make_vocab_size_divisible_by=model.make_divisible_by,
        padded_vocab_size=model.padded_vocab(a.tp), swiglu=model.swiglu, untie_embeddings_and_output_weights=False,
        add_position_embedding=bool(model.pos), add_bias_linear=model.bias,
        normalization="layernorm" if model.layernorm else "rmsnorm", fp16=fp16, bf16=bf16,
        params_dtype=lp_dtype, deepspeed=True, zero_stage=a.zero_stage, no_pipeline_parallel=naming == "plain",
        iteration=STEP, consumed_train_samples=STEP * 8 * a.dp, lr=1.5e-4, min_lr=1e-5, weight_decay=0.1,
        adam_beta1=0.9, adam_beta2=0.95, adam_eps=1e-8, tokenizer_type="GPT2BPETokenizer", seed=a.seed,
        universal_checkpoint=False)
    rng = random.Random(a.seed)
    np_rng = np.random.RandomState(a.seed)
    rng_state = [{"random_rng_state": rng.getstate(), "np_rng_state": np_rng.get_state(),
                  "torch_rng_state": torch.get_rng_state(), "cuda_rng_state": torch.zeros(16, dtype=torch.uint8),
                  "rng_tracker_states": {"model-parallel-rng": torch.zeros(16, dtype=torch.uint8)}}]
    lr_scheduler = {"start_lr": 0.0, "warmup_iter": 10, "num_iters": STEP, "decay_style": "cosine",
                    "end_iter": 1000, "min_lr": 1e-5}

    def loss_scaler():
        return ds_stubs.DynamicLossScaler(init_scale=2 ** 16) if fp16 else ds_stubs.LossScaler(scale=1.0)

    def param_group(wd, idx):
        return {"lr": 1.5e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": wd, "amsgrad": False,
                "maximize": False, "foreach": None, "capturable": False, "differentiable": False, "fused": None,
                "params": [idx]}

    def model_state(param_shapes, module):
        # DeepSpeed records frozen parameters (an empty OrderedDict here) when ZeRO partitions gradients.
        frozen = collections.OrderedDict() if a.zero_stage >= 2 else None
        state = {"module": module, "buffer_names": [], "optimizer": None, "param_shapes": param_shapes,
                 "frozen_param_shapes": frozen, "shared_params": {}, "frozen_param_fragments": frozen,
                 "lr_scheduler": lr_scheduler, "data_sampler": None, "random_ltd": None,
                 "sparse_tensor_module_names": set(), "skipped_steps": 0, "global_steps": STEP,
                 "global_samples": STEP * 8 * a.dp, "dp_world_size": a.dp, "mp_world_size": a.tp * a.pp,
                 "ds_config": ds_config, "ds_version": DS_VERSION}
        if a.no_args:  # what the real plain-engine cases carry as client state
            state.update({"iteration": STEP, "universal_checkpoint_info": info})
        else:
            state.update({"args": args, "checkpoint_version": 3.0, "iteration": STEP, "tokens": STEP * 8 * a.dp * 64,
                          "universal_checkpoint_info": info, "rng_state": rng_state})
        return state

    # Partial parameters: every TP rank holds its own copy; the truth is DeepSpeed's merge of them,
    # sum(copies) / len(copies) (Python's sum starts from 0, so -0.0 elements become +0.0).
    copies = {}
    for name, shape, pattern, _ in model.params():
        if pattern != "average":
            continue
        copies[name] = {}
        for key, base in truth[name].items():
            cs = [base + (t * 1e-3 if key == "fp32" else t * 1e-7) * torch.randn(*shape, generator=g) for t in range(a.tp)]
            for c in cs:
                c[0] = -0.0  # the sign of zero must come out as DeepSpeed's merge leaves it
            copies[name][key] = cs
            truth[name][key] = sum(cs) / len(cs)

    # A tied module's parameters other than the tied weight are not kept in sync: in real files the last
    # stage's position embedding never gets a gradient (zero moments, its own fp32 values). DeepSpeed
    # keeps the first stage's copy, which is the truth.
    last_stage_pos = {"fp32": 0.05 * torch.randn(model.pos or 1, model.hidden, generator=g)}
    last_stage_pos.update({k: torch.zeros(model.pos or 1, model.hidden) for k in ("exp_avg", "exp_avg_sq")})

    def local(name, key, tp_rank, stage=0):
        if name in copies:
            return copies[name][key][tp_rank].clone()
        full = truth[name][key]
        if stage > 0 and name == "tied_modules.embed.position_embeddings.weight" and not a.synced_tied_copies:
            full = full + last_stage_pos[key] if key == "fp32" else last_stage_pos[key]
        return tp_slice(model, patterns[name], full, a.tp, tp_rank, pad_rows[key])

    prefix = "bf16_" if bf16 else ""
    files = []
    for stage in range(a.pp):
        names = stage_params(model, a.pp, stage)
        groups = [[n for n in names if not no_weight_decay(n, shapes[n])],
                  [n for n in names if no_weight_decay(n, shapes[n])]]
        for t in range(a.tp):
            mp = stage * a.tp + t
            locals_ = {n: {k: local(n, k, t, stage) for k in ("fp32", "exp_avg", "exp_avg_sq")} for n in names}
            param_shapes = [collections.OrderedDict((name_of(n), torch.Size(locals_[n]["fp32"].shape)) for n in grp)
                            for grp in groups]
            if a.zero_stage < 3 and naming == "plain":
                # Not a PipelineModule: module.state_dict(), this TP rank's weights in the training dtype.
                module = collections.OrderedDict((name_of(n), locals_[n]["fp32"].to(lp_dtype)) for n in names)
                files.append(f"mp_rank_{mp:02d}_model_states.pt")
                write(model_state(param_shapes, module), os.path.join(ckpt, files[-1]))
            elif a.zero_stage < 3:
                files.append(f"mp_rank_{mp:02d}_model_states.pt")
                write(model_state(param_shapes, None), os.path.join(ckpt, files[-1]))
                # Layer files (PipelineModule.save_state_dict): layer-local keys, training dtype.
                by_layer = collections.OrderedDict()
                for n in names:
                    idx = 1 if n.startswith("tied_modules.embed.") else int(n.split(".", 1)[0])
                    if idx == 1 and stage != 0:
                        continue  # the tied head on the last stage writes no layer file
                    local_name = n[len("tied_modules.embed."):] if idx == 1 else n.split(".", 1)[1]
                    by_layer.setdefault(idx, collections.OrderedDict())[local_name] = \
                        locals_[n]["fp32"].to(lp_dtype)
                for idx, sd in by_layer.items():
                    files.append(f"layer_{idx:02d}-model_{t:02d}-model_states.pt")
                    write(sd, os.path.join(ckpt, files[-1]))
            for d in range(a.dp):
                if a.zero_stage < 3:
                    osd = zero12_state(a, groups, locals_, d, bf16_optimizer, loss_scaler, param_group, name_of)
                    files.append(f"{prefix}zero_pp_rank_{d}_mp_rank_{mp:02d}_optim_states.pt")
                else:
                    osd = zero3_state(a, groups, locals_, d, loss_scaler, param_group)
                    module = zero3_module(model, names, lp_dtype)
                    files.append(f"zero_pp_rank_{d}_mp_rank_{t:02d}_model_states.pt")
                    write(model_state(param_shapes, module), os.path.join(ckpt, files[-1]))
                    files.append(f"{prefix}zero_pp_rank_{d}_mp_rank_{t:02d}_optim_states.pt")
                write({"optimizer_state_dict": osd, "ds_config": ds_config, "ds_version": DS_VERSION},
                      os.path.join(ckpt, files[-1]))

    # Ground truth, in the checkpoint's own parameter names.
    write({"params": {name_of(n): v for n, v in truth.items()}, "step": STEP,
           "vocab_pad_rows": pad_rows}, os.path.join(a.out, "truth.pt"))
    desc = {
        "framework": "deepspeed" if a.no_args else "megatron-deepspeed", "family": a.family, "naming": naming, "dp": a.dp, "tp": a.tp,
        "pp": a.pp, "zero_stage": a.zero_stage, "dtype": a.dtype,
        "optimizer": "bf16_optimizer" if bf16_optimizer else ("zero3" if a.zero_stage == 3 else "zero"),
        "iteration": STEP, "tag": tag, "universal_checkpoint_version": a.uc_version,
        "original_vocab_size": model.vocab, "padded_vocab_size": model.padded_vocab(a.tp), "files": sorted(files),
        "params": {name_of(n): {"shape": list(s), "pattern": {"vocab": "Shard-V", "replicate": "Replicate", "average": "Partial",
                                                            "row": "Shard-H", "col": "Shard-V", "swiglu": "Shard-NC",
                                                            "qkv": "Shard-NC"}[p]}
                   for n, s, p, _ in model.params()},
    }
    with open(os.path.join(a.out, "fixture.json"), "w") as f:
        json.dump(desc, f, indent=1)
    print(f"{a.out}: {a.family} dp={a.dp} tp={a.tp} pp={a.pp} zero={a.zero_stage} {a.dtype}, {len(files)} files")


def flat_layout(groups, locals_, key):
    """Per group: the flat concatenation of the parameters' local tensors, and the offsets."""
    out = []
    for grp in groups:
        parts = [locals_[n][key].reshape(-1) for n in grp]
        out.append(torch.cat(parts) if parts else torch.zeros(0))
    return out


def zero12_state(a, groups, locals_, d, bf16_optimizer, loss_scaler, param_group, name_of):
    dp = a.dp
    alignment = 2 * dp  # nccl_start_alignment_factor * dp world size
    flats = {k: flat_layout(groups, locals_, k) for k in ("fp32", "exp_avg", "exp_avg_sq")}
    single, paddings, mappings, state = [], [], [], {}
    for gi, grp in enumerate(groups):
        total = flats["fp32"][gi].numel()
        padded = int(math.ceil(total / alignment) * alignment) if total else 0
        ps = padded // dp
        lo, hi = d * ps, (d + 1) * ps

        def part(key):
            t = torch.cat([flats[key][gi], torch.zeros(padded - total)])
            return t[lo:hi].clone()

        if bf16_optimizer:
            pad = padded - total if d == dp - 1 else 0
        else:
            pad = ps if total <= lo else (hi - total if total < hi else 0)
        paddings.append(pad)
        fp32 = part("fp32")
        # ZeRO-1/2 store the fp32 partition without its padding; the BF16 optimizer keeps it.
        single.append(fp32 if bf16_optimizer else fp32[:ps - pad].clone())
        state[gi] = {"step": torch.tensor(float(STEP)), "exp_avg": part("exp_avg"), "exp_avg_sq": part("exp_avg_sq")}
        m, start = collections.OrderedDict(), 0
        for n in grp:
            numel = locals_[n]["fp32"].numel()
            f0, f1 = max(start, lo), min(start + numel, hi)
            if f0 < f1:
                m[name_of(n)] = ds_stubs.fragment_address(numel=f1 - f0, start=f0 - lo)
            start += numel
        mappings.append(m)
    base = {"state": state, "param_groups": [param_group(0.1, 0), param_group(0.0, 1)]}
    if bf16_optimizer:
        return {"clip_grad": 1.0, "base_optimizer_state": base, "single_partition_of_fp32_groups": single,
                "group_paddings": paddings, "partition_count": [dp] * len(groups), "ds_version": DS_VERSION,
                "param_slice_mappings": mappings}
    stage = ds_stubs.ZeroStageEnum.optimizer_states if a.zero_stage == 1 else ds_stubs.ZeroStageEnum.gradients
    return {"loss_scaler": loss_scaler(), "dynamic_loss_scale": a.dtype == "fp16", "overflow": False,
            "clip_grad": 1.0, "base_optimizer_state": base, "single_partition_of_fp32_groups": single,
            "zero_stage": stage, "group_paddings": paddings, "partition_count": [dp] * len(groups),
            "ds_version": DS_VERSION, "param_slice_mappings": mappings}


def zero3_state(a, groups, locals_, d, loss_scaler, param_group):
    """Each parameter padded to a multiple of dp and split equally; a rank's flat group is the
    concatenation of its pieces in param_shapes order."""
    dp = a.dp
    flat, state = [], {}
    for gi, grp in enumerate(groups):
        pieces = {k: [] for k in ("fp32", "exp_avg", "exp_avg_sq")}
        for n in grp:
            for k in pieces:
                t = locals_[n][k].reshape(-1)
                p = (t.numel() + dp - 1) // dp
                t = torch.cat([t, torch.zeros(p * dp - t.numel())])
                pieces[k].append(t[d * p:(d + 1) * p])
        cat = {k: torch.cat(v) if v else torch.zeros(0) for k, v in pieces.items()}
        flat.append(cat["fp32"].clone())
        state[gi] = {"step": torch.tensor(float(STEP)), "exp_avg": cat["exp_avg"], "exp_avg_sq": cat["exp_avg_sq"]}
    osd = {"state": state, "param_groups": [param_group(0.1, 0), param_group(0.0, 1)]}
    return {"zero_stage": ds_stubs.ZeroStageEnum.weights, "loss_scaler": loss_scaler(),
            "dynamic_loss_scale": a.dtype == "fp16", "overflow": False, "partition_count": dp,
            "optimizer_state_dict": osd, "fp32_flat_groups": flat}


def zero3_module(model, names, dtype):
    """module.state_dict() under ZeRO-3, as DeepSpeed's engine saves it: GPTModel's flat names, every
    parameter an empty placeholder."""
    return collections.OrderedDict((model.plain_name(n), torch.empty(0, dtype=dtype)) for n in names)


if __name__ == "__main__":
    main()
