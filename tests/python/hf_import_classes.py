"""ucp-convert of GPT2LMHeadModel and MixtralForCausalLM folders (issue 44: one table per class serves
both directions): the import inverts the export's own tensor table.

Usage: hf_import_classes.py BIN_DIR DATA_DIR WORK [MPIEXEC]

DATA_DIR is tests/data/real-hf: gpt2_tiny and mixtral_tiny, models transformers 5.3 made and saved
itself. Besides them a generator's GPT2LMHeadModel (fp32 and bf16 in 3 shards; n_inner None,
"gelu_new"), whose tensors are known before a byte is written. The ground truth of the atomic
checkpoint is written here from the Hugging Face tensors, independently of ucp:
- GPT-2: Conv1D weights [in, out] transposed to Linear's [out, in]; c_attn's [q; k; v] columns as
  Megatron's ParallelAttention holds them, head by head [q_i; k_i; v_i] (the real MHA layout);
- Mixtral: query_key_value = cat(q, k, v); the gate -> mlp.deepspeed_moe.gate.wg; expert E's
  dense_h_to_4h = cat(w1, w3), dense_4h_to_h = w2, under its global id.
Checked:
- every atomic tensor equals the ground truth bit for bit; the manifest (framework hf, weights only,
  moe / ep for Mixtral) and the synthesized args (layernorm, learned positions, openai_gelu, tied;
  num_experts, topk 2, no token dropping);
- HF -> ucp-convert -> ucp-reshard --format hf: the same safetensors tensors byte for byte;
- HF -> ucp -> a DeepSpeed layout with a fresh optimizer (--optimizer-config; GPT-2 TP 2 DP 2 ZeRO-1,
  Mixtral DP 2 with EP 1 and EP 2) -> ucp-convert -> --format hf: the same tensors byte for byte;
- GPT-2 as older transformers saved it (GPT2Model's names without "transformer.", the causal-mask
  buffers attn.bias / attn.masked_bias) imports to the same parameters;
- config.json settings Megatron's model cannot compute are refused by name.
"""
import json
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ds_stubs  # noqa: E402,F401 - DeepSpeed classes the state files pickle
from atomic_files import same_bytes  # noqa: E402
from checklist import check, finish, fresh_folder, refused_when_damaged, tool_runner  # noqa: E402
from safetensors_reader import read_model_folder as tensors_of  # noqa: E402
from safetensors_writer import write_safetensors  # noqa: E402

BIN, DATA, WORK = sys.argv[1:4]
MPIEXEC = sys.argv[4] if len(sys.argv) > 4 else None
run = tool_runner(BIN, MPIEXEC)
OPTIMIZER = {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}}
L = "language_model.encoder.layers."


def gpt2_truth(hf, c):
    """GPT2LMHeadModel's tensors as Megatron-DeepSpeed's GPTModel holds them."""
    heads, h = c["n_head"], c["n_embd"]
    per_head = lambda t: t.reshape(3, heads, h // heads, -1).transpose(0, 1).reshape(t.shape)  # noqa: E731
    out = {"language_model.embedding.word_embeddings.weight": hf["transformer.wte.weight"],
           "language_model.embedding.position_embeddings.weight": hf["transformer.wpe.weight"],
           "language_model.encoder.final_layernorm.weight": hf["transformer.ln_f.weight"],
           "language_model.encoder.final_layernorm.bias": hf["transformer.ln_f.bias"]}
    for i in range(c["n_layer"]):
        g, m = f"transformer.h.{i}.", f"{L}{i}."
        out[m + "self_attention.query_key_value.weight"] = per_head(hf[g + "attn.c_attn.weight"].t())
        out[m + "self_attention.query_key_value.bias"] = per_head(hf[g + "attn.c_attn.bias"].unsqueeze(1)).squeeze(1)
        for mk, gk, transposed in (("input_layernorm", "ln_1", False), ("post_attention_layernorm", "ln_2", False),
                                   ("self_attention.dense", "attn.c_proj", True), ("mlp.dense_h_to_4h", "mlp.c_fc", True),
                                   ("mlp.dense_4h_to_h", "mlp.c_proj", True)):
            w = hf[g + gk + ".weight"]
            out[m + mk + ".weight"], out[m + mk + ".bias"] = (w.t() if transposed else w), hf[g + gk + ".bias"]
    return {k: v.float().contiguous() for k, v in out.items()}


def mixtral_truth(hf, c):
    """MixtralForCausalLM's tensors as Megatron-DeepSpeed's GPTModel with DeepSpeed MoE layers holds them."""
    out = {"language_model.embedding.word_embeddings.weight": hf["model.embed_tokens.weight"],
           "language_model.encoder.final_layernorm.weight": hf["model.norm.weight"],
           "language_model.output_layer.weight": hf["lm_head.weight"]}
    for i in range(c["num_hidden_layers"]):
        p, m = f"model.layers.{i}.", f"{L}{i}."
        out[m + "input_layernorm.weight"] = hf[p + "input_layernorm.weight"]
        out[m + "post_attention_layernorm.weight"] = hf[p + "post_attention_layernorm.weight"]
        out[m + "self_attention.query_key_value.weight"] = torch.cat([hf[p + f"self_attn.{x}_proj.weight"] for x in "qkv"])
        out[m + "self_attention.dense.weight"] = hf[p + "self_attn.o_proj.weight"]
        out[m + "mlp.deepspeed_moe.gate.wg.weight"] = hf[p + "block_sparse_moe.gate.weight"]
        for e in range(c["num_local_experts"]):
            x, d = f"{p}block_sparse_moe.experts.{e}.", f"{m}mlp.deepspeed_moe.experts.deepspeed_experts.{e}."
            out[d + "dense_h_to_4h.weight"] = torch.cat([hf[x + "w1.weight"], hf[x + "w3.weight"]])
            out[d + "dense_4h_to_h.weight"] = hf[x + "w2.weight"]
    return {k: v.float().contiguous() for k, v in out.items()}


def make_gpt2(d, dtype, shards, seed):
    """A generator's GPT2LMHeadModel folder (n_inner None: 4 x n_embd; "gelu_new"); returns its tensors."""
    fresh_folder(d)
    c = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 24, "n_layer": 3, "n_head": 3, "n_inner": None,
         "n_positions": 20, "vocab_size": 70, "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new",
         "tie_word_embeddings": True, "dtype": {"fp32": "float32", "bf16": "bfloat16"}[dtype]}
    g = torch.Generator().manual_seed(seed)
    h, f = c["n_embd"], 4 * c["n_embd"]
    r = lambda *s: torch.randn(*s, generator=g).to(torch.float32 if dtype == "fp32" else torch.bfloat16)  # noqa: E731
    t = {"transformer.wte.weight": r(c["vocab_size"], h), "transformer.wpe.weight": r(c["n_positions"], h)}
    for i in range(c["n_layer"]):
        p = f"transformer.h.{i}."
        for k, shape in (("ln_1.weight", (h,)), ("ln_1.bias", (h,)), ("attn.c_attn.weight", (h, 3 * h)), ("attn.c_attn.bias", (3 * h,)),
                         ("attn.c_proj.weight", (h, h)), ("attn.c_proj.bias", (h,)), ("ln_2.weight", (h,)), ("ln_2.bias", (h,)),
                         ("mlp.c_fc.weight", (h, f)), ("mlp.c_fc.bias", (f,)), ("mlp.c_proj.weight", (f, h)), ("mlp.c_proj.bias", (h,))):
            t[p + k] = r(*shape)
    t["transformer.ln_f.weight"], t["transformer.ln_f.bias"] = r(h), r(h)
    t["transformer.ln_f.weight"][:4] = torch.tensor([1e-39, -0.0, 3e38, -2.5e-40]).to(t["transformer.ln_f.weight"].dtype)
    json.dump(c, open(os.path.join(d, "config.json"), "w"), indent=2)
    names = list(t)
    if shards == 1:
        write_safetensors(os.path.join(d, "model.safetensors"), t)
        return c, t
    weight_map, total = {}, 0
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: t[k] for k in names[s::shards]}
        write_safetensors(os.path.join(d, fname), part)
        weight_map.update({k: fname for k in part})
        total += sum(v.numel() * v.element_size() for v in part.values())
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, open(os.path.join(d, "model.safetensors.index.json"), "w"))
    return c, t


def old_style_gpt2(src, d):
    """The folder `src` as older transformers saved GPT-2 (the hub's gpt2): GPT2Model's names, without
    "transformer.", and each block's causal-mask buffers attn.bias and attn.masked_bias."""
    fresh_folder(d)
    shutil.copy(os.path.join(src, "config.json"), d)
    t = {k[len("transformer."):]: v for k, v in tensors_of(src).items()}
    n = json.load(open(os.path.join(src, "config.json")))["n_positions"]
    for i in range(json.load(open(os.path.join(src, "config.json")))["n_layer"]):
        t[f"h.{i}.attn.bias"] = torch.tril(torch.ones(n, n)).view(1, 1, n, n)
        t[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    write_safetensors(os.path.join(d, "model.safetensors"), t)


def atomic_of(out):
    m = json.load(open(os.path.join(out, "ucp_manifest.json")))
    return m, {p["name"]: torch.load(os.path.join(out, p["files"]["fp32"]))["param"] for p in m["params"]}


def check_import(label, src, truth, ranks, gpt2):
    out = os.path.join(WORK, label, "atomic")
    r = run("ucp-convert", [src, "-o", out, "--force"], ranks=ranks)
    check(f"{label}: imported on {ranks} rank(s)", r.returncode == 0, r.stderr[-2000:])
    if r.returncode:
        return None
    m, got = atomic_of(out)
    check(f"{label}: the parameters", sorted(got) == sorted(truth), str(sorted(set(got) ^ set(truth))[:6]))
    bad = [k for k in truth if k in got and not same_bytes(got[k], truth[k])]
    check(f"{label}: every atomic tensor bit for bit", not bad, str(bad[:4]))
    s, ms = m["source"], torch.load(os.path.join(out, "mp_rank_00_model_states.pt"))
    args = ms["args"]
    check(f"{label}: manifest", s["framework"] == "hf" and s.get("weights_only") is True and s["naming"] == "plain" and
          bool(s.get("moe")) == (not gpt2) and s.get("ep", 1) == 1, str(s))
    if gpt2:
        c = json.load(open(os.path.join(src, "config.json")))
        check(f"{label}: GPT-2's args", (args.normalization, args.position_embedding_type, args.swiglu, args.add_bias_linear,
              args.untie_embeddings_and_output_weights, args.openai_gelu, args.bias_gelu_fusion, args.ffn_hidden_size) ==
              ("layernorm", "learned_absolute", False, True, False, c["activation_function"] == "gelu_new", False,
               c.get("n_inner") or 4 * c["n_embd"]), str(args))
        check(f"{label}: no sub-parameter rule (head-by-head QKV)", not ms["universal_checkpoint_info"].get("parameter_with_sub_params"))
    else:
        check(f"{label}: Mixtral's args", (args.num_experts, args.topk, args.moe_token_dropping, args.moe_top2_2nd_expert_sampling,
              ms["num_experts"]) == ([4], 2, False, False, [4, 4]), str(args))
    return out


def same_export(label, out, want):
    have = tensors_of(out)
    bad = [k for k in want if k not in have or not same_bytes(have[k], want[k])]
    check(f"{label}: the same safetensors tensors byte for byte", not bad and sorted(have) == sorted(want),
          str(bad[:4]) + str(sorted(set(have) ^ set(want))[:4]))


def round_trip(label, atomic, want, dtype):
    out = os.path.join(WORK, label, "hf")
    r = run("ucp-reshard", [atomic, "-o", out, "--format", "hf", "--dtype", dtype, "--force"], ranks=2)
    check(f"{label}: exported --format hf", r.returncode == 0, r.stderr[-2000:])
    if not r.returncode:
        same_export(label + " round trip", out, want)


def through_deepspeed(label, atomic, want, dtype, layout):
    """atomic -> a DeepSpeed layout with a fresh optimizer -> ucp-convert -> --format hf."""
    base = os.path.join(WORK, label, "ds_" + "_".join(layout).replace("--", ""))
    cfg = os.path.join(WORK, "optimizer.json")
    ds, back, out = base + "/ckpt", base + "/atomic", base + "/hf"
    steps = [("ucp-reshard", [atomic, "-o", ds, "--optimizer-config", cfg, "--force"] + layout),
             ("ucp-convert", [ds, "-o", back, "--force"]),
             ("ucp-reshard", [back, "-o", out, "--format", "hf", "--dtype", dtype, "--force"])]
    for tool, args in steps:
        r = run(tool, args, ranks=2)
        check(f"{label} {' '.join(layout)}: {tool}", r.returncode == 0, r.stderr[-2000:])
        if r.returncode:
            return
    same_export(f"{label} via DeepSpeed {' '.join(layout)}", out, want)


def edit_json(path, change):
    j = json.load(open(path))
    change(j)
    json.dump(j, open(path, "w"))


def refusals(gpt2_src, mixtral_src):
    cfg = lambda change: lambda d: edit_json(os.path.join(d, "config.json"), change)  # noqa: E731
    cases = [
        ("gpt2 relu", gpt2_src, cfg(lambda j: j.update(activation_function="relu")), ["config.json", "activation_function", "relu"]),
        ("gpt2 untied", gpt2_src, cfg(lambda j: j.update(tie_word_embeddings=False)), ["config.json", "tie_word_embeddings"]),
        ("gpt2 inverse layer idx", gpt2_src, cfg(lambda j: j.update(scale_attn_by_inverse_layer_idx=True)),
         ["config.json", "scale_attn_by_inverse_layer_idx"]),
        ("gpt2 upcast", gpt2_src, cfg(lambda j: j.update(reorder_and_upcast_attn=True)), ["config.json", "reorder_and_upcast_attn"]),
        ("gpt2 unscaled", gpt2_src, cfg(lambda j: j.update(scale_attn_weights=False)), ["config.json", "scale_attn_weights"]),
        ("mixtral top-1", mixtral_src, cfg(lambda j: j.update(num_experts_per_tok=1)), ["config.json", "num_experts_per_tok"]),
        ("mixtral jitter", mixtral_src, cfg(lambda j: j.update(router_jitter_noise=0.1)), ["config.json", "router_jitter_noise"]),
        ("mixtral sliding window", mixtral_src, cfg(lambda j: j.update(sliding_window=4096)), ["config.json", "sliding_window"]),
        ("mixtral expert count", mixtral_src, cfg(lambda j: j.update(num_local_experts=3)), ["experts.3"]),
    ]
    for label, src, mutate, expect in cases:
        refused_when_damaged(run, WORK, label, src, mutate, expect)


def main():
    fresh_folder(WORK)
    json.dump(OPTIMIZER, open(os.path.join(WORK, "optimizer.json"), "w"))
    gpt2_src = os.path.join(DATA, "gpt2_tiny")
    tiny_c, tiny = json.load(open(os.path.join(gpt2_src, "config.json"))), tensors_of(gpt2_src)
    atomic = check_import("gpt2_tiny", gpt2_src, gpt2_truth(tiny, tiny_c), 2, True)
    if atomic:
        round_trip("gpt2_tiny", atomic, tiny, "fp32")
        through_deepspeed("gpt2_tiny", atomic, tiny, "fp32", ["--tp", "2", "--dp", "2", "--pp", "1", "--zero-stage", "1"])
    for seed, (dtype, shards) in enumerate((("fp32", 1), ("bf16", 3))):
        src = os.path.join(WORK, "models", f"gpt2_{dtype}")
        c, t = make_gpt2(src, dtype, shards, seed)
        atomic = check_import(f"gpt2 generated {dtype} x{shards}", src, gpt2_truth(t, c), 1 + seed, True)
        if atomic:
            round_trip(f"gpt2 generated {dtype} x{shards}", atomic, t, dtype)
    old = os.path.join(WORK, "models", "gpt2_old_style")
    old_style_gpt2(gpt2_src, old)
    atomic = check_import("gpt2 old-style names and mask buffers", old, gpt2_truth(tiny, tiny_c), 2, True)
    if atomic:
        round_trip("gpt2 old-style names and mask buffers", atomic, tiny, "fp32")
    mixtral_src = os.path.join(DATA, "mixtral_tiny")
    c, hf = json.load(open(os.path.join(mixtral_src, "config.json"))), tensors_of(mixtral_src)
    atomic = check_import("mixtral_tiny", mixtral_src, mixtral_truth(hf, c), 2, False)
    if atomic:
        round_trip("mixtral_tiny", atomic, hf, "fp32")
        for ep in ("1", "2"):
            through_deepspeed("mixtral_tiny", atomic, hf, "fp32", ["--dp", "2", "--tp", "1", "--pp", "1", "--ep", ep, "--zero-stage", "1"])
    refusals(gpt2_src, mixtral_src)
    shutil.rmtree(os.path.join(WORK, "damaged"), ignore_errors=True)
    finish("hf_import_classes")


if __name__ == "__main__":
    main()
