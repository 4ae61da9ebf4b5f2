#!/usr/bin/python3
"""A Hugging Face LlamaForCausalLM folder of a chosen size, for benchmarks: config.json and safetensors
shards with model.safetensors.index.json, as save_pretrained lays them out (tensors in the model's order,
shards of at most --max-shard-size bytes, the index's metadata.total_size and weight_map).

The values are random (a seed per tensor name), written tensor by tensor: memory stays at one tensor.
The tests do not use this file: their models come from transformers itself (tests/data/real-hf/) or from
generators that check every tensor.

  scripts/make_hf_fixture.py OUT [--gib 2] [--dtype bf16|fp32] [--max-shard-size 500MB]
"""
import argparse
import json
import os
import struct
import zlib

import torch

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("out")
ap.add_argument("--gib", type=float, default=2.0, help="about this many GiB of tensors")
ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
ap.add_argument("--max-shard-size", default="500MB")
a = ap.parse_args()

units = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
max_shard = next(int(float(a.max_shard_size[:-len(u)]) * m) for u, m in sorted(units.items(), key=lambda x: -len(x[0]))
                 if a.max_shard_size.endswith(u))
esize = 2 if a.dtype == "bf16" else 4
hidden, heads, kv_heads, ffn, vocab = 2048, 16, 4, 5632, 32000
head_dim = hidden // heads
per_layer = hidden * hidden * 2 + 2 * hidden * kv_heads * head_dim + 3 * hidden * ffn + 2 * hidden
fixed = 2 * vocab * hidden + hidden
layers = max(1, round((a.gib * 2**30 / esize - fixed) / per_layer))

config = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
    "intermediate_size": ffn, "num_hidden_layers": layers, "num_attention_heads": heads,
    "num_key_value_heads": kv_heads, "head_dim": head_dim, "vocab_size": vocab, "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False, "attention_bias": False,
    "mlp_bias": False, "hidden_act": "silu", "dtype": "bfloat16" if a.dtype == "bf16" else "float32",
}
tensors = [("model.embed_tokens.weight", (vocab, hidden))]
for i in range(layers):
    p = f"model.layers.{i}."
    tensors += [(p + "self_attn.q_proj.weight", (heads * head_dim, hidden)),
                (p + "self_attn.k_proj.weight", (kv_heads * head_dim, hidden)),
                (p + "self_attn.v_proj.weight", (kv_heads * head_dim, hidden)),
                (p + "self_attn.o_proj.weight", (hidden, heads * head_dim)),
                (p + "mlp.gate_proj.weight", (ffn, hidden)), (p + "mlp.up_proj.weight", (ffn, hidden)),
                (p + "mlp.down_proj.weight", (hidden, ffn)),
                (p + "input_layernorm.weight", (hidden,)), (p + "post_attention_layernorm.weight", (hidden,))]
tensors += [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]


def nbytes(shape):
    n = esize
    for d in shape:
        n *= d
    return n


shards, cur, size = [], [], 0
for name, shape in tensors:
    if cur and size + nbytes(shape) > max_shard:
        shards.append(cur)
        cur, size = [], 0
    cur.append((name, shape))
    size += nbytes(shape)
shards.append(cur)

os.makedirs(a.out, exist_ok=True)
weight_map, total = {}, 0
for k, shard in enumerate(shards):
    fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in shard:
        header[name] = {"dtype": "BF16" if a.dtype == "bf16" else "F32", "shape": list(shape),
                        "data_offsets": [off, off + nbytes(shape)]}
        off += nbytes(shape)
        weight_map[name] = fname
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = os.path.join(a.out, fname + ".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name, shape in shard:
            g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
            t = torch.randn(*shape, generator=g) * 0.02
            if name.endswith("norm.weight"):
                t += 1.0
            t = t.to(torch.bfloat16).view(torch.int16) if a.dtype == "bf16" else t
            f.write(t.numpy().tobytes())
    os.rename(tmp, os.path.join(a.out, fname))
    total += off
with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
with open(os.path.join(a.out, "config.json"), "w") as f:
    json.dump(config, f, indent=2)
print(f"{a.out}: LlamaForCausalLM, {layers} layers, {total / 2**30:.2f} GiB of {a.dtype} in {len(shards)} files")
