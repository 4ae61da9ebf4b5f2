"""What a DCP of torchtitan's Llama made from an atomic checkpoint of a Megatron-DeepSpeed Llama holds,
computed here from the atomic tensors (torch.load of the pt store's files) with the cut and the row
order written out in torch: query_key_value's rows [q; k; v] by the model's sizes, dense_h_to_4h's
[gate; up], the vocabulary padding dropped, q and k rows per head from Megatron's rotate-half to
torchtitan's interleaved pairs (the inverse of the permutation torchtitan's Hugging Face adapter
applies). Used by dcp_target.py (CI) and scripts/dcp_real_check.py (torch 2.6's own reader).
"""
import json
import os

import torch

import ds_stubs  # noqa: F401 - the DeepSpeed classes the atomic files pickle (SubparamShape)


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


def atom(atomic, name, state):
    """An atomic tensor's state as the pt store holds it (DeepSpeed's universal files: {"param": tensor, ...})."""
    v = torch.load(os.path.join(atomic, "zero", name, state + ".pt"), weights_only=False)  # SubparamShape
    return v["param"] if isinstance(v, dict) else v


def to_pairs(w, head_dim):  # Megatron's rotate-half rows to torchtitan's interleaved pairs, per head
    rows, cols = w.shape
    return w.view(rows // head_dim, 2, head_dim // 2, cols).transpose(1, 2).reshape(rows, cols)


def titan_from_megatron(atomic, cfg, state):
    """torchtitan's tensors from the atomic checkpoint's Megatron-named ones (state: fp32, exp_avg, exp_avg_sq)."""
    hd = cfg["hidden_size"] // cfg["num_attention_heads"]
    q, kv, ffn = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd, cfg["ffn_hidden_size"]
    vocab = cfg["vocab_size"]
    out = {"tok_embeddings.weight": atom(atomic, "language_model.embedding.word_embeddings.weight", state)[:vocab],
           "norm.weight": atom(atomic, "language_model.encoder.final_layernorm.weight", state),
           "output.weight": atom(atomic, "language_model.output_layer.weight", state)[:vocab]}
    for i in range(cfg["num_layers"]):
        m, t = f"language_model.encoder.layers.{i}.", f"layers.{i}."
        qkv = atom(atomic, m + "self_attention.query_key_value.weight", state)
        h4 = atom(atomic, m + "mlp.dense_h_to_4h.weight", state)
        out[t + "attention.wq.weight"] = to_pairs(qkv[:q], hd)
        out[t + "attention.wk.weight"] = to_pairs(qkv[q:q + kv], hd)
        out[t + "attention.wv.weight"] = qkv[q + kv:]
        out[t + "attention.wo.weight"] = atom(atomic, m + "self_attention.dense.weight", state)
        out[t + "feed_forward.w1.weight"] = h4[:ffn]
        out[t + "feed_forward.w3.weight"] = h4[ffn:]
        out[t + "feed_forward.w2.weight"] = atom(atomic, m + "mlp.dense_4h_to_h.weight", state)
        out[t + "attention_norm.weight"] = atom(atomic, m + "input_layernorm.weight", state)
        out[t + "ffn_norm.weight"] = atom(atomic, m + "post_attention_layernorm.weight", state)
    return out


def expected_from_megatron(atomic, cfg):
    """The DCP's tensors and objects the atomic checkpoint of the DeepSpeed case gives."""
    manifest = json.load(open(os.path.join(atomic, "ucp_manifest.json")))
    megatron_of = {}  # torchtitan name -> the atomic parameter it comes from (its step and group)
    for i in range(cfg["num_layers"]):
        m, t = f"language_model.encoder.layers.{i}.", f"layers.{i}."
        for a, b in [("attention.wq", "self_attention.query_key_value"), ("attention.wk", "self_attention.query_key_value"),
                     ("attention.wv", "self_attention.query_key_value"), ("attention.wo", "self_attention.dense"),
                     ("feed_forward.w1", "mlp.dense_h_to_4h"), ("feed_forward.w3", "mlp.dense_h_to_4h"),
                     ("feed_forward.w2", "mlp.dense_4h_to_h"), ("attention_norm", "input_layernorm"),
                     ("ffn_norm", "post_attention_layernorm")]:
            megatron_of[t + a + ".weight"] = m + b + ".weight"
    megatron_of.update({"tok_embeddings.weight": "language_model.embedding.word_embeddings.weight",
                        "norm.weight": "language_model.encoder.final_layernorm.weight",
                        "output.weight": "language_model.output_layer.weight"})
    tensors = {"model." + k: v for k, v in titan_from_megatron(atomic, cfg, "fp32").items()}
    for state in ("exp_avg", "exp_avg_sq"):
        for k, v in titan_from_megatron(atomic, cfg, state).items():
            tensors[f"optim.state.{k}.{state}"] = v
    for k, name in megatron_of.items():
        step = atom(atomic, name, "step")
        tensors[f"optim.state.{k}.step"] = torch.tensor(float(step), dtype=torch.float32)
    group_of = {p["name"]: p.get("group", 0) for p in manifest["params"]}
    groups = torch.load(os.path.join(atomic, "zero", "optimizer_state.pt"), weights_only=False)["param_groups"]
    keys = ["attention.wq", "attention.wk", "attention.wv", "attention.wo", "feed_forward.w1", "feed_forward.w2",
            "feed_forward.w3", "attention_norm", "ffn_norm"]  # torchtitan's TransformerBlock, in its state-dict order
    order = ["model.tok_embeddings.weight"] + [f"model.layers.{i}.{k}.weight" for i in range(cfg["num_layers"]) for k in keys] + \
        ["model.norm.weight", "model.output.weight"]
    objects = {}
    for g, group in enumerate(groups):
        for option, value in group.items():
            if option != "params":
                objects[f"optim.param_groups.{g}.{option}"] = value
        objects[f"optim.param_groups.{g}.params"] = [k[6:] for k in order if group_of[megatron_of[k[6:]]] == g]
    return tensors, objects


def flat(tree, prefix=""):
    """A nested state dict's leaves by their dotted keys, lists of dicts (param groups) by index."""
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(flat(v, prefix + str(k) + "."))
        elif isinstance(v, list) and v and all(isinstance(g, dict) for g in v):
            out.update(flat({str(i): g for i, g in enumerate(v)}, prefix + str(k) + "."))
        else:
            out[prefix + str(k)] = v
    return out


def titan_from_mcore(ref, heads, groups, prefix=""):
    """torchtitan's tensors from Megatron-Core's own full state (a real-mcore case's reference.pt, stacked
    decoder.layers.*): linear_qkv's rows per query group [its query heads; its key head; its value head],
    linear_fc1's [gate; up], the fused norms; q and k rows to torchtitan's interleaved pairs. `prefix`:
    "" for the weights, "optimizer.state.exp_avg." or "optimizer.state.exp_avg_sq." for a moment."""
    t = lambda name: ref[prefix + name]
    qkv = t("decoder.layers.self_attention.linear_qkv.weight")
    layers, rows, hidden = qkv.shape
    hd = rows // (heads + 2 * groups)
    per = heads // groups
    fc1 = t("decoder.layers.mlp.linear_fc1.weight")
    ffn = fc1.shape[1] // 2
    out = {"tok_embeddings.weight": t("embedding.word_embeddings.weight"), "norm.weight": t("decoder.final_layernorm.weight"),
           "output.weight": t("output_layer.weight")}
    for i in range(layers):
        g = qkv[i].view(groups, (per + 2) * hd, hidden)
        wq = g[:, :per * hd].reshape(heads * hd, hidden)
        wk = g[:, per * hd:(per + 1) * hd].reshape(groups * hd, hidden)
        wv = g[:, (per + 1) * hd:].reshape(groups * hd, hidden)
        L = f"layers.{i}."
        out[L + "attention.wq.weight"] = to_pairs(wq, hd)
        out[L + "attention.wk.weight"] = to_pairs(wk, hd)
        out[L + "attention.wv.weight"] = wv.contiguous()
        out[L + "attention.wo.weight"] = t("decoder.layers.self_attention.linear_proj.weight")[i]
        out[L + "feed_forward.w1.weight"] = fc1[i][:ffn]
        out[L + "feed_forward.w3.weight"] = fc1[i][ffn:]
        out[L + "feed_forward.w2.weight"] = t("decoder.layers.mlp.linear_fc2.weight")[i]
        out[L + "attention_norm.weight"] = t("decoder.layers.self_attention.linear_qkv.layer_norm_weight")[i]
        out[L + "ffn_norm.weight"] = t("decoder.layers.mlp.linear_fc1.layer_norm_weight")[i]
    return out


def expected_from_mcore(case_dir, heads, groups):
    """The DCP's tensors and param-group options a real-mcore case gives (reference.pt, common.json),
    the groups as Megatron-Core's default rule rebuilds them: biases and one-dimensional tensors in the
    group of wd_mult 0 (written with weight_decay 0, as Megatron's scheduler sets it), the others in
    the group of wd_mult 1."""
    ref = torch.load(os.path.join(case_dir, "reference.pt"), weights_only=False)
    common = json.load(open(os.path.join(case_dir, "common.json")))
    tensors = {"model." + k: v.contiguous() for k, v in titan_from_mcore(ref, heads, groups).items()}
    for state in ("exp_avg", "exp_avg_sq"):
        for k, v in titan_from_mcore(ref, heads, groups, f"optimizer.state.{state}.").items():
            tensors[f"optim.state.{k}.{state}"] = v.contiguous()
    names = [k[6:] for k in tensors if k.startswith("model.")]
    for k in names:
        tensors[f"optim.state.{k}.step"] = torch.tensor(float(common["common_step"]), dtype=torch.float32)
    keys = ["attention.wq", "attention.wk", "attention.wv", "attention.wo", "feed_forward.w1", "feed_forward.w2",
            "feed_forward.w3", "attention_norm", "ffn_norm"]  # torchtitan's TransformerBlock, in its state-dict order
    layers = len([k for k in names if k.endswith("attention.wq.weight")])
    order = ["tok_embeddings.weight"] + [f"layers.{i}.{k}.weight" for i in range(layers) for k in keys] + ["norm.weight", "output.weight"]
    objects = {}
    for g, group in enumerate(common["param_groups"]):
        for option, value in group.items():
            value = tuple(value) if isinstance(value, list) else value
            objects[f"optim.param_groups.{g}.{option}"] = 0.0 if option == "weight_decay" and group["wd_mult"] == 0 else value
        no_decay = group["wd_mult"] == 0
        objects[f"optim.param_groups.{g}.params"] = [k for k in order if (tensors["model." + k].dim() == 1) == no_decay]
    return tensors, objects
