"""ucp-reshard --format hf's GPT2LMHeadModel and MixtralForCausalLM, against real transformers models.

    hf_classes.py BIN_DIR DATA_DIR WORK [MPIEXEC]

DATA_DIR is tests/data/real-hf: tiny models transformers 5.3 made and saved itself
(scripts/hf_classes_oracle.py make), and exports.json, what transformers said of ucp's export of each
(scripts/hf_classes_oracle.py check: its loading report, its logits against the model's own, and the
sha256 of every file it read).

gpt2_tiny: the model's tensors are held as Megatron-DeepSpeed holds them (Conv1D weights transposed
to Linear's [out, in]; c_attn's [q; k; v] columns as ParallelAttention's head-by-head rows [q_i; k_i;
v_i]); scripts/make_fixture.py --weights-from shards exactly those into a DeepSpeed checkpoint (TP 2,
DP 2, ZeRO-1, vocabulary padding; and GPTModelPipe's names over 2 stages), ucp-convert makes the atomic
checkpoint, ucp-reshard --format hf exports it. Checked:
- every tensor of the export equals the model's own, bit for bit, under its own name (lm_head tied,
  not written, as save_pretrained writes it); config.json says the model's sizes and activation;
- the export's files are the bytes transformers loaded (exports.json: nothing missing or unexpected,
  logits equal to the model's own); 2 ranks write the same bytes as 1, and so does the pipeline's naming;
- a checkpoint that does not say which GeLU it computed is refused asking for bias_gelu_fusion;
  with the fused tanh kernel (bias_gelu_fusion true) the activation is "gelu_new", said in a note.

mixtral_ds0195: a real DeepSpeed 0.19.5 checkpoint of the harness's Llama-style model with every MLP a
DeepSpeed MoE layer (4 experts, top-2, no token dropping, second expert by argmax; train.py --arch
llama --moe-layers 0,1, 8 steps), its model_facts.json the harness's settings by Megatron's names
(the harness saves no args). Checked:
- the export's tensors equal DeepSpeed's own saved weights (model-states and expert files), cut as
  the module computes them (QKV by the sub-parameter sizes, each expert's [gate; up] halves -> w1, w3),
  vocabulary padding dropped; config.json says MixtralForCausalLM with 4 experts, 2 per token;
- transformers loaded exactly these files and its logits equal the harness model's own (DeepSpeed's
  load_checkpoint, harness_logits.json) within 1e-5 (exports.json);
- the gate settings unsaid are asked for; top-1, token dropping, sampled second experts refused by name;
  mixtral_dense_ds0195 (the same harness, --moe-layers 1 of 2: layer 0 dense) is refused naming its
  dense layer, from the run's root before a conversion.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys

import jsonschema
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklist import check, finish  # noqa: E402
from safetensors_reader import read_safetensors  # noqa: E402

BIN, DATA, WORK = sys.argv[1:4]
MPIEXEC = sys.argv[4] if len(sys.argv) > 4 else None
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
FIXTURE = os.path.join(ROOT, "scripts", "make_fixture.py")
SCHEMA = os.path.join(ROOT, "schemas", "export-plan.schema.json")
RECORD = json.load(open(os.path.join(DATA, "exports.json")))


def run(tool, args, ranks=1):
    cmd = [os.path.join(BIN, tool)] + args
    if ranks > 1:
        cmd = [MPIEXEC, "--oversubscribe", "-np", str(ranks)] + cmd
    return subprocess.run(cmd, capture_output=True, text=True)


def megatron_of_gpt2(hf, layers, heads):
    """GPT2LMHeadModel's tensors as Megatron-DeepSpeed's GPTModel holds them (its names)."""
    out = {"language_model.embedding.word_embeddings.weight": hf["transformer.wte.weight"],
           "language_model.embedding.position_embeddings.weight": hf["transformer.wpe.weight"],
           "language_model.encoder.final_layernorm.weight": hf["transformer.ln_f.weight"],
           "language_model.encoder.final_layernorm.bias": hf["transformer.ln_f.bias"]}
    for i in range(layers):
        g, m = f"transformer.h.{i}.", f"language_model.encoder.layers.{i}."
        qkv_w, qkv_b = hf[g + "attn.c_attn.weight"].t(), hf[g + "attn.c_attn.bias"]  # rows [q; k; v]
        hidden = qkv_w.shape[1]
        per_head = lambda t: t.reshape(3, heads, hidden // heads, -1).transpose(0, 1).reshape(t.shape)  # noqa: E731
        out.update({m + "input_layernorm.weight": hf[g + "ln_1.weight"], m + "input_layernorm.bias": hf[g + "ln_1.bias"],
                    m + "self_attention.query_key_value.weight": per_head(qkv_w),
                    m + "self_attention.query_key_value.bias": per_head(qkv_b.unsqueeze(1)).squeeze(1),
                    m + "self_attention.dense.weight": hf[g + "attn.c_proj.weight"].t(),
                    m + "self_attention.dense.bias": hf[g + "attn.c_proj.bias"],
                    m + "post_attention_layernorm.weight": hf[g + "ln_2.weight"],
                    m + "post_attention_layernorm.bias": hf[g + "ln_2.bias"],
                    m + "mlp.dense_h_to_4h.weight": hf[g + "mlp.c_fc.weight"].t(), m + "mlp.dense_h_to_4h.bias": hf[g + "mlp.c_fc.bias"],
                    m + "mlp.dense_4h_to_h.weight": hf[g + "mlp.c_proj.weight"].t(), m + "mlp.dense_4h_to_h.bias": hf[g + "mlp.c_proj.bias"]})
    return {k: v.contiguous().clone() for k, v in out.items()}


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


os.makedirs(WORK, exist_ok=True)
name = "gpt2_tiny"
model_dir = os.path.join(DATA, name)
config = json.load(open(os.path.join(model_dir, "config.json")))
hf = read_safetensors(os.path.join(model_dir, "model.safetensors"))
weights = os.path.join(WORK, f"{name}_megatron.pt")
torch.save(megatron_of_gpt2(hf, config["n_layer"], config["n_head"]), weights)
ckpt, atomic = os.path.join(WORK, f"{name}_ds"), os.path.join(WORK, f"{name}_atomic")
r = subprocess.run([sys.executable, FIXTURE, ckpt, "--family", "gpt", "--model", "plain", "--tp", "2", "--dp", "2",
                    "--zero-stage", "1", "--dtype", "fp32", "--weights-from", weights], capture_output=True, text=True)
check("the DeepSpeed checkpoint of the model's weights: written", r.returncode == 0, r.stderr[-600:])
r = run("ucp-convert", [ckpt, "-o", atomic, "-q", "--force"])
check("ucp-convert: runs", r.returncode == 0, r.stderr[-600:])

# Which GeLU Megatron computed is no fact of the weights: asked for.
out = os.path.join(WORK, f"{name}_unsaid")
r = run("ucp-reshard", [atomic, "-o", out, "--format", "hf", "-q"])
check("no bias_gelu_fusion in the args: refused asking for it", r.returncode == 1 and "bias_gelu_fusion" in r.stderr and
      "--model-config" in r.stderr and not os.path.exists(out), r.stderr[-400:])
facts = os.path.join(WORK, "facts.json")
json.dump({"bias_gelu_fusion": True}, open(facts, "w"))
r = run("ucp-reshard", [atomic, "-o", out, "--format", "hf", "--model-config", facts, "--plan-only", "--json"])
check("bias_gelu_fusion true: gelu_new, said in a note", r.returncode == 0 and "gelu_new" in r.stdout, r.stdout[-400:] + r.stderr[-400:])
plan = json.loads(r.stdout) if r.returncode == 0 else {"files": []}
errors = list(jsonschema.Draft202012Validator(json.load(open(SCHEMA))).iter_errors(plan))
c_attn = [t for f in plan["files"] for t in f["tensors"] if t["name"].endswith("attn.c_attn.weight")]
check("--plan-only --json: conforms to export-plan.schema.json; c_attn transposed, its rows in parts",
      not errors and c_attn and all(t.get("transposed") and "rows_in_parts" in t for t in c_attn), str(errors[:2]) + str(c_attn[:1]))
json.dump({"bias_gelu_fusion": False}, open(facts, "w"))

one = os.path.join(WORK, f"{name}_np1")
r = run("ucp-reshard", [atomic, "-o", one, "--format", "hf", "--model-config", facts, "--force"])
check("export: runs", r.returncode == 0, r.stderr[-600:])
got = {}
for f in sorted(os.listdir(one)):
    if f.endswith(".safetensors"):
        got.update(read_safetensors(os.path.join(one, f)))
want = {k: v for k, v in hf.items() if k != "lm_head.weight"}
check("tensors: GPT2LMHeadModel's names, lm_head tied", sorted(got) == sorted(want), f"{sorted(set(got) ^ set(want))[:6]}")
bad = [k for k in want if k in got and not (got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]))]
check(f"tensors: {len(want)} equal transformers' own bit for bit", not bad, f"differ: {bad[:6]}")
written = json.load(open(os.path.join(one, "config.json")))
keys = ["model_type", "vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner", "activation_function",
        "layer_norm_epsilon", "tie_word_embeddings"]
check("config.json: the model's sizes and activation", all(written.get(k) == config.get(k) for k in keys),
      str({k: (written.get(k), config.get(k)) for k in keys if written.get(k) != config.get(k)}))

rec = RECORD.get(name, {})
check("transformers loaded ucp's export: GPT2LMHeadModel, no key missing or unexpected",
      rec.get("class") == "GPT2LMHeadModel" and not any(rec.get("loading_info", {"x": [1]}).values()), str(rec.get("loading_info")))
check("transformers' logits of the export equal the model's own", rec.get("equal") is True, str(rec.get("max_abs_diff")))
files = {f: sha256(os.path.join(one, f)) for f in sorted(os.listdir(one)) if f.endswith((".json", ".safetensors")) and not f.startswith(".")}
check("the export's files are the bytes transformers read", files == rec.get("files"), f"{files} vs {rec.get('files')}")

if MPIEXEC:
    two = os.path.join(WORK, f"{name}_np2")
    r = run("ucp-reshard", [atomic, "-o", two, "--format", "hf", "--model-config", facts, "--force", "--max-shard-size", "20KB"], 2)
    r1 = run("ucp-reshard", [atomic, "-o", one + "_cut", "--format", "hf", "--model-config", facts, "--force", "--max-shard-size", "20KB"])
    same = r.returncode == 0 and r1.returncode == 0 and sorted(os.listdir(two)) == sorted(os.listdir(one + "_cut")) and all(
        sha256(os.path.join(two, f)) == sha256(os.path.join(one + "_cut", f)) for f in os.listdir(two) if not f.startswith("."))
    check("2 ranks, files cut at 20KB: the same bytes as 1 rank", same, r.stderr[-400:] + r1.stderr[-400:])

# The same weights under GPTModelPipe's names (tied_modules.embed.*, <spec>.*), over 2 pipeline stages.
pipe_ckpt, pipe_atomic, pipe_out = (os.path.join(WORK, f"{name}_pipe_{x}") for x in ("ds", "atomic", "hf"))
r = subprocess.run([sys.executable, FIXTURE, pipe_ckpt, "--family", "gpt", "--pp", "2", "--zero-stage", "1", "--dtype", "fp32",
                    "--weights-from", weights], capture_output=True, text=True)
r = r if r.returncode else run("ucp-convert", [pipe_ckpt, "-o", pipe_atomic, "-q", "--force"])
r = r if r.returncode else run("ucp-reshard", [pipe_atomic, "-o", pipe_out, "--format", "hf", "--model-config", facts, "--force"])
check("GPTModelPipe names over 2 stages: the same bytes", r.returncode == 0 and all(
    sha256(os.path.join(pipe_out, f)) == sha256(os.path.join(one, f)) for f in os.listdir(one) if not f.startswith(".")), r.stderr[-400:])


def load_ds(path):
    import ds_stubs  # noqa: F401  (DeepSpeed's classes in the pickles)
    return torch.load(path, map_location="cpu")


def deepspeed_weights(step_dir):
    """Every weight as DeepSpeed saved it: the model-states file's module and each expert's file."""
    weights = dict(load_ds(os.path.join(step_dir, "mp_rank_00_model_states.pt"))["module"])
    for f in sorted(os.listdir(step_dir)):
        if f.startswith("layer_") and "_expert_" in f:
            weights.update(load_ds(os.path.join(step_dir, f)))
    return weights


def mixtral_of_megatron(w, cfg):
    """The Mixtral tensors the harness's model computes with: its module's own layout."""
    hd, v = cfg["hidden_size"] // cfg["num_attention_heads"], cfg["vocab_size"]
    q, kv, ffn = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd, cfg["moe_ffn_hidden_size"]
    out = {"model.embed_tokens.weight": w["language_model.embedding.word_embeddings.weight"][:v],
           "model.norm.weight": w["language_model.encoder.final_layernorm.weight"],
           "lm_head.weight": w["language_model.output_layer.weight"][:v]}
    for i in range(cfg["num_layers"]):
        m, h = f"language_model.encoder.layers.{i}.", f"model.layers.{i}."
        qkv = w[m + "self_attention.query_key_value.weight"]
        out.update({h + "input_layernorm.weight": w[m + "input_layernorm.weight"],
                    h + "post_attention_layernorm.weight": w[m + "post_attention_layernorm.weight"],
                    h + "self_attn.q_proj.weight": qkv[:q], h + "self_attn.k_proj.weight": qkv[q:q + kv],
                    h + "self_attn.v_proj.weight": qkv[q + kv:], h + "self_attn.o_proj.weight": w[m + "self_attention.dense.weight"],
                    h + "block_sparse_moe.gate.weight": w[m + "mlp.deepspeed_moe.gate.wg.weight"]})
        for e in range(cfg["num_experts"]):
            x = f"{m}mlp.deepspeed_moe.experts.deepspeed_experts.{e}."
            up = w[x + "dense_h_to_4h.weight"]  # the harness's SwiGLU: chunk(2) -> silu(first) * second
            out.update({f"{h}block_sparse_moe.experts.{e}.w1.weight": up[:ffn], f"{h}block_sparse_moe.experts.{e}.w3.weight": up[ffn:],
                        f"{h}block_sparse_moe.experts.{e}.w2.weight": w[x + "dense_4h_to_h.weight"]})
    return out


name = "mixtral_ds0195"
case = os.path.join(DATA, name)
cfg = json.load(open(os.path.join(case, "model_config.json")))
facts = json.load(open(os.path.join(case, "model_facts.json")))
atomic = os.path.join(WORK, f"{name}_atomic")
# (strict: the harness's universal_checkpoint_info names the dense MLPs' [gate; up] rule, as
# Megatron-DeepSpeed's does, and this model has no dense MLP for it to match: a note, its other rules match)
r = run("ucp-convert", [os.path.join(case, "ckpt"), "-o", atomic, "-q", "--force"])
check(f"{name}: ucp-convert runs", r.returncode == 0, r.stderr[-600:])
out = os.path.join(WORK, f"{name}_unsaid")
r = run("ucp-reshard", [atomic, "-o", out, "--format", "hf", "-q"])
check(f"{name}: no args: the gate's settings asked for", r.returncode == 1 and all(
    k in r.stderr for k in ("topk", "moe_token_dropping", "moe_top2_2nd_expert_sampling", "--model-config")) and not os.path.exists(out),
      r.stderr[-500:])
for change, word in (({"topk": 1}, "top-1"), ({"moe_token_dropping": True}, "moe_token_dropping"),
                     ({"moe_top2_2nd_expert_sampling": True}, "Gumbel")):
    given = os.path.join(WORK, "facts_changed.json")
    json.dump(dict(facts, **change), open(given, "w"))
    r = run("ucp-reshard", [atomic, "-o", out, "--format", "hf", "-q", "--model-config", given])
    check(f"{name}: {change} refused naming {word!r}", r.returncode == 1 and word in r.stderr and not os.path.exists(out), r.stderr[-400:])
given = os.path.join(WORK, "facts.json")
json.dump(facts, open(given, "w"))
one = os.path.join(WORK, f"{name}_np1")
r = run("ucp-reshard", [atomic, "-o", one, "--format", "hf", "--model-config", given, "--force"])
check(f"{name}: export runs", r.returncode == 0, r.stderr[-600:])
got = {}
for f in sorted(os.listdir(one)):
    if f.endswith(".safetensors"):
        got.update(read_safetensors(os.path.join(one, f)))
want = mixtral_of_megatron(deepspeed_weights(os.path.join(case, "ckpt", "global_step8")), cfg)
check(f"{name}: MixtralForCausalLM's names", sorted(got) == sorted(want), f"{sorted(set(got) ^ set(want))[:6]}")
bad = [k for k in want if k in got and not torch.equal(got[k], want[k].float())]
check(f"{name}: {len(want)} tensors equal DeepSpeed's saved weights bit for bit", not bad, f"differ: {bad[:6]}")
written = json.load(open(os.path.join(one, "config.json")))
check(f"{name}: config.json: MixtralForCausalLM, 4 experts, 2 per token",
      written.get("architectures") == ["MixtralForCausalLM"] and written.get("num_local_experts") == cfg["num_experts"] and
      written.get("num_experts_per_tok") == 2 and written.get("intermediate_size") == cfg["moe_ffn_hidden_size"], str(written))
rec = RECORD.get(name, {})
check(f"{name}: transformers loaded ucp's export, no key missing or unexpected",
      rec.get("class") == "MixtralForCausalLM" and not any(rec.get("loading_info", {"x": [1]}).values()), str(rec.get("loading_info")))
check(f"{name}: transformers' logits equal the harness model's within 1e-5", rec.get("max_abs_diff", 1) < 1e-5, str(rec.get("max_abs_diff")))
files = {f: sha256(os.path.join(one, f)) for f in sorted(os.listdir(one)) if f.endswith((".json", ".safetensors")) and not f.startswith(".")}
check(f"{name}: the export's files are the bytes transformers read", files == rec.get("files"), f"{files} vs {rec.get('files')}")

# Layer 0 dense, layer 1 MoE (train.py --moe-layers 1): Mixtral has no dense layer; refused by name
# from the training run's root, before anything is converted.
root = os.path.join(WORK, "dense_mix_root")
shutil.rmtree(root, ignore_errors=True)
shutil.copytree(os.path.join(DATA, "mixtral_dense_ds0195", "ckpt"), root)
out = os.path.join(WORK, "dense_mix_hf")
r = run("ucp-reshard", [root, "-o", out, "--format", "hf", "--model-config", given])
check("a dense layer among MoE ones: refused naming it, before converting", r.returncode == 1 and "dense MLP layers" in r.stderr and
      "layer index 0" in r.stderr and not os.path.exists(out) and sorted(os.listdir(root)) == ["global_step1", "latest"], r.stderr[-500:])
finish("hf_classes")
