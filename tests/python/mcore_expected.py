"""Megatron-Core's keys of models other programs wrote, built from those programs' own files: the ground truth
of the --format mcore tests (mcore_cross_family.py, deepspeed_to_mcore.py). Megatron-LM's own Llama converter's
joins: linear_qkv per query group (its query heads, its key head, its value head), linear_fc1 = [gate; up], the
layers stacked on a leading axis."""
import json
import os

import torch

from harness_logits import load_pt

LINEARS = ["self_attention.linear_qkv", "self_attention.linear_proj", "mlp.linear_fc1", "mlp.linear_fc2"]


def qkv(q, k, v, groups):
    """Megatron-Core's linear_qkv rows: per query group, its query heads, its key head, its value head."""
    h = q.shape[-1]
    return torch.cat([q.reshape(groups, -1, h), k.reshape(groups, -1, h), v.reshape(groups, -1, h)], dim=1).reshape(-1, h)


def expected_from_hf(t, layers, groups, dtype):
    """The Megatron-Core keys of a LlamaForCausalLM's tensors `t`."""
    L = range(layers)
    at = "model.layers.{}."
    out = {
        "embedding.word_embeddings.weight": t["model.embed_tokens.weight"],
        "decoder.layers.self_attention.linear_qkv.layer_norm_weight": torch.stack([t[at.format(i) + "input_layernorm.weight"] for i in L]),
        "decoder.layers.self_attention.linear_qkv.weight": torch.stack(
            [qkv(*[t[at.format(i) + f"self_attn.{p}_proj.weight"] for p in "qkv"], groups) for i in L]),
        "decoder.layers.self_attention.linear_proj.weight": torch.stack([t[at.format(i) + "self_attn.o_proj.weight"] for i in L]),
        "decoder.layers.mlp.linear_fc1.layer_norm_weight": torch.stack([t[at.format(i) + "post_attention_layernorm.weight"] for i in L]),
        "decoder.layers.mlp.linear_fc1.weight": torch.stack(
            [torch.cat([t[at.format(i) + "mlp.gate_proj.weight"], t[at.format(i) + "mlp.up_proj.weight"]]) for i in L]),
        "decoder.layers.mlp.linear_fc2.weight": torch.stack([t[at.format(i) + "mlp.down_proj.weight"] for i in L]),
        "decoder.final_layernorm.weight": t["model.norm.weight"],
    }
    if "lm_head.weight" in t:
        out["output_layer.weight"] = t["lm_head.weight"]
    return {k: v.to(dtype) for k, v in out.items()}


def owner(key, offsets, sizes, shape, tp, pp, dp, layers):
    """The rank that must hold a chunk: its TP piece and its pipeline stage (None where it spans pieces)."""
    stacked = key.startswith("decoder.layers.")
    if stacked:
        stage = offsets[0] * pp // layers
        offsets, sizes, shape = offsets[1:], sizes[1:], shape[1:]
    else:
        stage = 0 if key.startswith("embedding.") else pp - 1
    name = key.split(".")[-2] + "." + key.split(".")[-1]
    if ("layer_norm" in key or key.startswith("decoder.final_layernorm") or key == "embedding.position_embeddings.weight"
            or name in ("linear_proj.bias", "linear_fc2.bias")):  # whole on every TP rank, saved by TP rank 0
        t = 0
    elif name in ("linear_proj.weight", "linear_fc2.weight"):
        n = shape[1] // tp
        t = offsets[1] // n if (offsets[1] + sizes[1] - 1) // n == offsets[1] // n else None
    else:
        rows = shape[0] // 2 if name in ("linear_fc1.weight", "linear_fc1.bias") else shape[0]  # SwiGLU: per [gate; up] half
        n = rows // tp
        r = offsets[0] % rows
        t = r // n if (r + sizes[0] - 1) // n == r // n else None
    return None if t is None else t + tp * dp * stage


def expected_from_deepspeed_llama(case, state="fp32"):
    """Megatron-Core's keys of a real case's Llama (GPTModel names) from DeepSpeed's own universal output
    (ds_to_universal's zero/<name>/<state>.pt: query_key_value = [q; k; v], dense_h_to_4h = [gate; up]), through
    the Hugging Face names; the vocabulary's padding rows dropped."""
    cfg = json.load(open(os.path.join(case, "model_config.json")))
    uni = os.path.join(case, "ckpt", "global_step6_universal", "zero")
    u = {name: load_pt(os.path.join(uni, name, state + ".pt"))["param"] for name in os.listdir(uni) if os.path.isdir(os.path.join(uni, name))}
    heads, groups, hidden = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]
    d = hidden // heads
    t = {"model.embed_tokens.weight": u["language_model.embedding.word_embeddings.weight"][:cfg["vocab_size"]],
         "model.norm.weight": u["language_model.encoder.final_layernorm.weight"],
         "lm_head.weight": u["language_model.output_layer.weight"][:cfg["vocab_size"]]}
    for i in range(cfg["num_layers"]):
        p = f"language_model.encoder.layers.{i}."
        q, k, v = u[p + "self_attention.query_key_value.weight"].split([heads * d, groups * d, groups * d])
        gate, up = u[p + "mlp.dense_h_to_4h.weight"].chunk(2)
        t.update({f"model.layers.{i}.self_attn.q_proj.weight": q, f"model.layers.{i}.self_attn.k_proj.weight": k,
                  f"model.layers.{i}.self_attn.v_proj.weight": v,
                  f"model.layers.{i}.self_attn.o_proj.weight": u[p + "self_attention.dense.weight"],
                  f"model.layers.{i}.mlp.gate_proj.weight": gate, f"model.layers.{i}.mlp.up_proj.weight": up,
                  f"model.layers.{i}.mlp.down_proj.weight": u[p + "mlp.dense_4h_to_h.weight"],
                  f"model.layers.{i}.input_layernorm.weight": u[p + "input_layernorm.weight"],
                  f"model.layers.{i}.post_attention_layernorm.weight": u[p + "post_attention_layernorm.weight"]})
    return cfg, expected_from_hf(t, cfg["num_layers"], groups, torch.float32)


# Megatron-DeepSpeed-style GPTs of the real cases: LayerNorm with biases, learned positions, SwiGLU, GQA, biases on
# every linear layer, the output tied to the embedding; GPTModelPipe's names (TP=2 x PP=2) and GPTModel's (ZeRO-3)
LAYER_KEYS = [("input_layernorm.weight", "self_attention.linear_qkv.layer_norm_weight"),
              ("input_layernorm.bias", "self_attention.linear_qkv.layer_norm_bias"),
              ("self_attention.query_key_value.weight", "self_attention.linear_qkv.weight"),
              ("self_attention.query_key_value.bias", "self_attention.linear_qkv.bias"),
              ("self_attention.dense.weight", "self_attention.linear_proj.weight"),
              ("self_attention.dense.bias", "self_attention.linear_proj.bias"),
              ("post_attention_layernorm.weight", "mlp.linear_fc1.layer_norm_weight"),
              ("post_attention_layernorm.bias", "mlp.linear_fc1.layer_norm_bias"),
              ("mlp.dense_h_to_4h.weight", "mlp.linear_fc1.weight"), ("mlp.dense_h_to_4h.bias", "mlp.linear_fc1.bias"),
              ("mlp.dense_4h_to_h.weight", "mlp.linear_fc2.weight"), ("mlp.dense_4h_to_h.bias", "mlp.linear_fc2.bias")]


def expected_from_deepspeed_gpt(case, state="fp32", facts=None):
    """Megatron-Core's keys of a real case's GPT from DeepSpeed's own universal output (ds_to_universal): the
    layer tensors renamed, query_key_value's [q; k; v] (its sub-parameter sizes) re-joined per query group. `state`:
    the universal file read, fp32 (the weights), exp_avg or exp_avg_sq (Adam's moments, the same shapes). `facts`: the
    case whose model_config.json gives the sizes, where `case` has none (the same harness model)."""
    from harness_logits import non_pipeline_name
    cfg = json.load(open(os.path.join(facts or case, "model_config.json")))
    L, heads, groups, hidden = cfg["num_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]
    d = hidden // heads
    uni = os.path.join(case, "ckpt", "global_step6_universal", "zero")
    u = {}
    for n in os.listdir(uni):
        if not os.path.isdir(os.path.join(uni, n)):
            continue
        t = load_pt(os.path.join(uni, n, state + ".pt"))
        t, n = t["param"] if isinstance(t, dict) else t, non_pipeline_name(n, L)
        if t.dim() == 1 and n.endswith(".weight") and "norm" not in n:  # ZeRO-3's universal tensors are flat
            t = t.view(hidden, -1) if n.endswith(("dense.weight", "dense_4h_to_h.weight")) else t.view(-1, hidden)
        u[n] = t
    out = {"embedding.word_embeddings.weight": u["language_model.embedding.word_embeddings.weight"][:cfg["vocab_size"]],
           "embedding.position_embeddings.weight": u["language_model.embedding.position_embeddings.weight"],
           "decoder.final_layernorm.weight": u["language_model.encoder.final_layernorm.weight"],
           "decoder.final_layernorm.bias": u["language_model.encoder.final_layernorm.bias"]}
    for ds_key, key in LAYER_KEYS:
        per_layer = [u[f"language_model.encoder.layers.{i}.{ds_key}"] for i in range(L)]
        if "query_key_value" in ds_key:
            per_layer = [qkv(*t.split([heads * d, groups * d, groups * d]), groups) if t.dim() == 2 else
                         qkv(*[x.unsqueeze(1) for x in t.split([heads * d, groups * d, groups * d])], groups).squeeze(1) for t in per_layer]
        out["decoder.layers." + key] = torch.stack(per_layer)
    return cfg, out
