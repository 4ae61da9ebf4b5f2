#!/usr/bin/python3
"""Writes a Hugging Face Trainer + DeepSpeed ZeRO-3 checkpoint of a Llama-shaped model at any size, for
benchmarks: the file names, keys and value types DeepSpeed 0.19.5 writes under ZeRO-3 with Hugging Face
parameter names, as the real case ../shared/real-hftrainer/cases/zero3_dp2_fp32 records them
(layout_checkpoint-4.md / .json, pickle_globals.json). Only what a converter reads is written: no
rng_state_*.pth, scheduler.pt, trainer_state.json or training_args.bin.

  OUT/checkpoint-N/latest                    "global_stepN"
  OUT/checkpoint-N/config.json               LlamaForCausalLM's, as transformers 5.3 writes it
  OUT/checkpoint-N/generation_config.json
  OUT/checkpoint-N/global_stepN/zero_pp_rank_R_mp_rank_00_model_states.pt   per rank: 0-element placeholders
                                                                            in `module`, param_shapes (two groups)
  OUT/checkpoint-N/global_stepN/zero_pp_rank_R_mp_rank_00_optim_states.pt   per rank: fp32_flat_groups and
                                                                            Adam's exp_avg / exp_avg_sq, flat

ZeRO-3's partitioning: each parameter flattened, padded to a multiple of the DP degree, rank r owning its
r-th chunk; a rank's flat group is its chunks in the group's order. Groups as Trainer builds them: the
matrices (weight decay), then the norm weights (none).

  scripts/make_hftrainer_fixture.py OUT [--hidden 2048 --ffn 5632 --layers 2 --vocab 32000 --dp 2]
  (the defaults: 221M parameters, 2.65 GB of optimizer files)
"""
import argparse
import collections
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
import ds_stubs  # noqa: E402  (DeepSpeed classes under their real module paths)

STEP = 4

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("out")
ap.add_argument("--hidden", type=int, default=2048)
ap.add_argument("--ffn", type=int, default=5632)
ap.add_argument("--layers", type=int, default=2)
ap.add_argument("--vocab", type=int, default=32000)
ap.add_argument("--heads", type=int, default=16)
ap.add_argument("--kv-heads", type=int, default=4)
ap.add_argument("--dp", type=int, default=2)
ap.add_argument("--seed", type=int, default=0)
a = ap.parse_args()

head_dim = a.hidden // a.heads
names = [("model.embed_tokens.weight", (a.vocab, a.hidden))]
for i in range(a.layers):
    p = f"model.layers.{i}."
    names += [(p + "self_attn.q_proj.weight", (a.heads * head_dim, a.hidden)),
              (p + "self_attn.k_proj.weight", (a.kv_heads * head_dim, a.hidden)),
              (p + "self_attn.v_proj.weight", (a.kv_heads * head_dim, a.hidden)),
              (p + "self_attn.o_proj.weight", (a.hidden, a.heads * head_dim)),
              (p + "mlp.gate_proj.weight", (a.ffn, a.hidden)),
              (p + "mlp.up_proj.weight", (a.ffn, a.hidden)),
              (p + "mlp.down_proj.weight", (a.hidden, a.ffn)),
              (p + "input_layernorm.weight", (a.hidden,)),
              (p + "post_attention_layernorm.weight", (a.hidden,))]
names += [("model.norm.weight", (a.hidden,)), ("lm_head.weight", (a.vocab, a.hidden))]
groups = [[n for n in names if len(n[1]) == 2], [n for n in names if len(n[1]) == 1]]

ckpt = os.path.join(a.out, f"checkpoint-{STEP}")
tag = os.path.join(ckpt, f"global_step{STEP}")
os.makedirs(tag, exist_ok=True)
with open(os.path.join(ckpt, "latest"), "w") as f:
    f.write(f"global_step{STEP}")
config = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1,
          "dtype": "float32", "eos_token_id": 2, "head_dim": head_dim, "hidden_act": "silu", "hidden_size": a.hidden,
          "initializer_range": 0.02, "intermediate_size": a.ffn, "max_position_embeddings": 2048, "mlp_bias": False,
          "model_type": "llama", "num_attention_heads": a.heads, "num_hidden_layers": a.layers,
          "num_key_value_heads": a.kv_heads, "pad_token_id": None, "pretraining_tp": 1, "rms_norm_eps": 1e-06,
          "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "tie_word_embeddings": False,
          "transformers_version": "5.3.0", "use_cache": False, "vocab_size": a.vocab}
with open(os.path.join(ckpt, "config.json"), "w") as f:
    f.write(json.dumps(config, indent=2, sort_keys=True) + "\n")
with open(os.path.join(ckpt, "generation_config.json"), "w") as f:
    f.write(json.dumps({"_from_model_config": True, "bos_token_id": 1, "eos_token_id": 2, "output_attentions": False,
                        "output_hidden_states": False, "transformers_version": "5.3.0", "use_cache": True},
                       indent=2, sort_keys=True) + "\n")

ds_config = {"fp16": {"enabled": False}, "bf16": {"enabled": False},
             "zero_optimization": {"stage": 3, "overlap_comm": True, "contiguous_gradients": True,
                                   "sub_group_size": 1e9, "reduce_bucket_size": 4096,
                                   "stage3_prefetch_bucket_size": 3686, "stage3_param_persistence_threshold": 640,
                                   "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
                                   "stage3_gather_16bit_weights_on_model_save": False},
             "gradient_accumulation_steps": 1, "gradient_clipping": 1.0, "train_batch_size": 2 * a.dp,
             "train_micro_batch_size_per_gpu": 2, "steps_per_print": float("inf"), "wall_clock_breakdown": False,
             "zero_allow_untested_optimizer": True}


def param_group(wd, idx):
    return {"weight_decay": wd, "lr": 0.001, "betas": (0.9, 0.999), "eps": 1e-08, "amsgrad": False, "foreach": None,
            "maximize": False, "capturable": False, "differentiable": False, "fused": None, "initial_lr": 0.002,
            "params": [idx]}


def chunk(name, numel, r):
    """Rank r's chunk of a parameter's flat values padded to a multiple of the DP degree (the padding
    zero), drawn for that rank alone: the full tensor is never held."""
    per = -(-numel // a.dp)
    lo, hi = r * per, min((r + 1) * per, numel)
    out = torch.zeros(per)
    if hi > lo:
        g = torch.Generator().manual_seed(a.seed * 1000003 + sum(map(ord, name)) * 7919 + len(name) * 101 + r)
        out[:hi - lo] = torch.randn(hi - lo, generator=g) * 0.02
    return out


for r in range(a.dp):
    module = collections.OrderedDict((n, torch.empty(0)) for n, _ in names)
    param_shapes = [collections.OrderedDict((n, torch.Size(s)) for n, s in g) for g in groups]
    model_states = {
        "module": module, "buffer_names": [], "optimizer": None, "param_shapes": param_shapes,
        "frozen_param_shapes": collections.OrderedDict(), "shared_params": {},
        "frozen_param_fragments": collections.OrderedDict(), "lr_scheduler": None, "data_sampler": None,
        "random_ltd": None, "sparse_tensor_module_names": set(), "skipped_steps": 0, "global_steps": STEP,
        "global_samples": STEP * 2 * a.dp, "dp_world_size": a.dp, "mp_world_size": 1,
        "checkpoint_parallel_dimensions": {"pp_degree": 1, "tp_degree": 1}, "ds_config": ds_config, "ds_version": "0.19.5"}
    torch.save(model_states, os.path.join(tag, f"zero_pp_rank_{r}_mp_rank_00_model_states.pt"))
    flats = []
    for g in groups:
        parts = []
        for n, s in g:
            numel = 1
            for d in s:
                numel *= d
            parts.append(chunk(n, numel, r))
        flats.append(torch.cat(parts))
        del parts
    state = {g: {"step": torch.tensor(float(STEP)), "exp_avg": flats[g] * 0.5, "exp_avg_sq": flats[g] * flats[g]}
             for g in range(len(groups))}
    optim = {"optimizer_state_dict": {
        "zero_stage": ds_stubs.ZeroStageEnum(3), "loss_scaler": ds_stubs.LossScaler(1.0), "dynamic_loss_scale": False,
        "overflow": False, "partition_count": a.dp,
        "optimizer_state_dict": {"state": state, "param_groups": [param_group(0.01, 0), param_group(0.0, 1)]},
        "fp32_flat_groups": flats}, "ds_config": ds_config, "ds_version": "0.19.5"}
    torch.save(optim, os.path.join(tag, f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt"))
    del optim, state, flats
    print(f"rank {r} written", flush=True)
total = sum(os.path.getsize(os.path.join(tag, f)) for f in os.listdir(tag))
print(f"{ckpt}: {sum(1 for _ in names)} tensors, {total / 1e9:.2f} GB in {tag}")
