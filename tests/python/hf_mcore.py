"""ucp-reshard --format hf of the real Megatron-Core torch_dist checkpoints (tests/data/real-mcore), against
independent ground truth.

    hf_mcore.py BIN_DIR CASES_DIR WORK DATA_DIR [MPIEXEC]

CASES_DIR is tests/data/real-mcore, DATA_DIR tests/data/hf (fixture mcore_llama_tp2/). For each
Llama-style case, converted on 2 ranks and exported at 1 and 2 ranks with no --model-config (the facts
come from Megatron-LM's args in the carried common.pt):
- every tensor equals reference.pt's (torch's own DCP loader) under Hugging Face's names: layer i of
  each stacked tensor; linear_qkv cut per query group into q (the group's heads), k and v; linear_fc1
  into [gate; up]; read with the tests' own safetensors reader;
- llama_dp2_distopt_bf16 (bf16 weights, fp32 masters in the distributed optimizer): the export is bf16
  by default, and every tensor equals the bf16 model tensor Megatron saved, bit for bit;
- llama_tp2: the export is byte-identical to the fixture transformers 5.3 itself loaded (no missing,
  unexpected or mismatched keys; tests/hf/README.md) and whose logits it recorded, and those logits
  equal the logits Megatron-Core's own GPTModel gave when the checkpoint was written
  (megatron_logits.json) within 1e-5;
- args that change what the model computes (use_rope_scaling set in a copy's common.pt) refuse the
  export by name;
- the GPT-shaped cases (LayerNorm, GeLU, biases, learned positions; untied gpt_tp2, tied gpt_tp2_tied, and
  gpt_dp2_distopt_fp32's dp_reshardable form) export as GPT2LMHeadModel at 1 and 2 ranks: every tensor equals
  reference.pt's under GPT-2's names, and the files are the bytes transformers loaded with no key problems
  and whose logits equal Megatron-Core's own within 1e-5 (transformers_readers.json, by
  scripts/mcore_real_readers.py in the chroot);
- the MoE case is refused as Mixture of Experts, nothing written; a
  DeepSpeed layout from a Megatron-Core atomic checkpoint is refused, pointing to --format hf.
"""
import filecmp
import hashlib
import json
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklist import check, finish, tool_runner  # noqa: E402
from megatron_args_edit import set_flag_in_args  # noqa: E402
from safetensors_reader import read_safetensors  # noqa: E402

BIN, CASES, WORK, DATA = sys.argv[1:5]
run = tool_runner(BIN, sys.argv[5] if len(sys.argv) > 5 else None)
FILES = ["config.json", "model-00001-of-00001.safetensors", "model.safetensors.index.json"]


def expected(ref, args):
    """Hugging Face's tensors from reference.pt, by Megatron-Core's layouts."""
    heads, groups = args["num_attention_heads"], args["num_query_groups"]
    hidden = ref["embedding.word_embeddings.weight"].shape[1]
    d, per = hidden // heads, heads // groups
    out = {"model.embed_tokens.weight": ref["embedding.word_embeddings.weight"],
           "model.norm.weight": ref["decoder.final_layernorm.weight"], "lm_head.weight": ref["output_layer.weight"]}
    L = "decoder.layers."
    for i in range(ref[L + "self_attention.linear_qkv.weight"].shape[0]):
        h = f"model.layers.{i}."
        qkv = ref[L + "self_attention.linear_qkv.weight"][i].view(groups, per + 2, d, hidden)
        out[h + "self_attn.q_proj.weight"] = qkv[:, :per].reshape(-1, hidden)
        out[h + "self_attn.k_proj.weight"] = qkv[:, per].reshape(-1, hidden)
        out[h + "self_attn.v_proj.weight"] = qkv[:, per + 1].reshape(-1, hidden)
        out[h + "self_attn.o_proj.weight"] = ref[L + "self_attention.linear_proj.weight"][i]
        gate, up = ref[L + "mlp.linear_fc1.weight"][i].chunk(2)
        out[h + "mlp.gate_proj.weight"], out[h + "mlp.up_proj.weight"] = gate, up
        out[h + "mlp.down_proj.weight"] = ref[L + "mlp.linear_fc2.weight"][i]
        out[h + "input_layernorm.weight"] = ref[L + "self_attention.linear_qkv.layer_norm_weight"][i]
        out[h + "post_attention_layernorm.weight"] = ref[L + "mlp.linear_fc1.layer_norm_weight"][i]
    return out


shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
ARGS = {"num_attention_heads": 4, "num_query_groups": 2}  # make_mcore.py's Llama-style model
for case in ("llama_tp2", "llama_pp2", "llama_dp2_distopt_bf16"):
    atomic = os.path.join(WORK, case, "atomic")
    r = run("ucp-convert", [os.path.join(CASES, case, "checkpoint"), "-o", atomic, "-q"], ranks=2)
    check(f"{case}: convert", r.returncode == 0, r.stderr[-800:])
    manifest = json.load(open(os.path.join(atomic, "ucp_manifest.json")))
    check(f"{case}: common.pt carried as the args file, no DeepSpeed model-states file",
          manifest["source"].get("args_file") == "common.pt" and "model_states" not in manifest["source"] and
          not os.path.exists(os.path.join(atomic, "..", "latest_universal")), str(manifest["source"]))
    ref = torch.load(os.path.join(CASES, case, "reference.pt"), map_location="cpu")
    # The export keeps the job's precision: a bf16 job's export is its bf16 model tensors, which Megatron
    # rounds from the fp32 masters the atomic checkpoint holds.
    want = expected(ref, ARGS)
    for ranks in (1, 2):
        out = os.path.join(WORK, case, f"hf-np{ranks}")
        r = run("ucp-reshard", [atomic, "-o", out, "--format", "hf"], ranks=ranks)
        check(f"{case}: export at {ranks} rank(s), no --model-config", r.returncode == 0, r.stderr[-1200:])
        if r.returncode != 0:
            continue
        got = read_safetensors(os.path.join(out, FILES[1]))
        bad = sorted(k for k in want if k not in got or not torch.equal(got[k], want[k]))
        check(f"{case} np{ranks}: every tensor is reference.pt's, per layer, q/k/v per query group, [gate; up]",
              not bad and sorted(got) == sorted(want), f"differ: {bad[:5]}; names {sorted(set(got) ^ set(want))[:5]}")
        if case == "llama_tp2":
            fixture = os.path.join(DATA, "mcore_" + case)
            same = [f for f in FILES if filecmp.cmp(os.path.join(out, f), os.path.join(fixture, f), shallow=False)]
            check(f"{case} np{ranks}: byte-identical to the fixture transformers loaded", same == FILES, f"equal: {same}")
    if case == "llama_tp2":
        recorded = json.load(open(os.path.join(DATA, "mcore_" + case, "transformers_logits.json")))
        megatron = json.load(open(os.path.join(CASES, case, "megatron_logits.json")))
        diff = (torch.tensor(recorded["logits"]) - torch.tensor(megatron["logits"])).abs().max().item()
        check(f"{case}: transformers' logits of the export equal Megatron-Core's own (max diff {diff:.2e})",
              recorded["ids"] == megatron["ids"] and recorded["loading_problems"] is None and
              recorded["class"] == "LlamaForCausalLM" and diff <= 1e-5, f"{recorded['loading_problems']} {diff}")
    out = os.path.join(WORK, case, "ds")
    r = run("ucp-reshard", [atomic, "-o", out, "--dp", "1", "--tp", "1", "--pp", "1", "--zero-stage", "1"])
    check(f"{case}: a DeepSpeed layout written under Megatron-DeepSpeed's names (its tensors: mcore_to_deepspeed.py), the scratch gone",
          r.returncode == 0 and os.path.exists(os.path.join(out, "latest")) and
          not os.path.exists(os.path.join(out, ".ucp-scratch-atomic")), r.stderr[-600:])

# A Llama 3.1-style rotary scaling said in the args: the export would compute something else, refused by name.
scaled = os.path.join(WORK, "rope_scaling", "checkpoint")
shutil.copytree(os.path.join(CASES, "llama_tp2", "checkpoint"), scaled)
set_flag_in_args(os.path.join(scaled, "common.pt"), "use_rope_scaling")
atomic = os.path.join(WORK, "rope_scaling", "atomic")
r = run("ucp-convert", [scaled, "-o", atomic, "-q"])
check("use_rope_scaling: convert (the tensors are the same)", r.returncode == 0, r.stderr[-600:])
r = run("ucp-reshard", [atomic, "-o", os.path.join(WORK, "rope_scaling", "hf"), "--format", "hf"])
check("use_rope_scaling in the args: the export is refused naming it, nothing written", r.returncode != 0 and
      "use_rope_scaling" in r.stderr and not os.path.exists(os.path.join(WORK, "rope_scaling", "hf")), r.stderr[-600:])

def expected_gpt2(ref, heads):
    """GPT2LMHeadModel's tensors from reference.pt's model keys: Conv1D weights are Megatron's transposed,
    c_attn's columns every head's q, then k, then v (Megatron-Core's rows: head by head [q_i; k_i; v_i])."""
    L = "decoder.layers."
    wte = ref["embedding.word_embeddings.weight"]
    hidden = wte.shape[1]
    d = hidden // heads
    out = {"transformer.wte.weight": wte, "transformer.wpe.weight": ref["embedding.position_embeddings.weight"],
           "transformer.ln_f.weight": ref["decoder.final_layernorm.weight"], "transformer.ln_f.bias": ref["decoder.final_layernorm.bias"]}
    if "output_layer.weight" in ref:  # untied: lm_head of its own
        out["lm_head.weight"] = ref["output_layer.weight"]
    for i in range(ref[L + "self_attention.linear_qkv.weight"].shape[0]):
        h, x = f"transformer.h.{i}.", lambda key: ref[L + key][i]
        qkv, b = x("self_attention.linear_qkv.weight").view(heads, 3, d, hidden), x("self_attention.linear_qkv.bias").view(heads, 3, d)
        out[h + "attn.c_attn.weight"] = torch.cat([qkv[:, j].reshape(-1, hidden) for j in range(3)]).t().contiguous()
        out[h + "attn.c_attn.bias"] = torch.cat([b[:, j].reshape(-1) for j in range(3)])
        out[h + "attn.c_proj.weight"] = x("self_attention.linear_proj.weight").t().contiguous()
        out[h + "attn.c_proj.bias"] = x("self_attention.linear_proj.bias")
        out[h + "ln_1.weight"], out[h + "ln_1.bias"] = x("self_attention.linear_qkv.layer_norm_weight"), x("self_attention.linear_qkv.layer_norm_bias")
        out[h + "ln_2.weight"], out[h + "ln_2.bias"] = x("mlp.linear_fc1.layer_norm_weight"), x("mlp.linear_fc1.layer_norm_bias")
        out[h + "mlp.c_fc.weight"], out[h + "mlp.c_fc.bias"] = x("mlp.linear_fc1.weight").t().contiguous(), x("mlp.linear_fc1.bias")
        out[h + "mlp.c_proj.weight"], out[h + "mlp.c_proj.bias"] = x("mlp.linear_fc2.weight").t().contiguous(), x("mlp.linear_fc2.bias")
    return out


# GPT-shaped Megatron-Core models (LayerNorm, GeLU, biases, learned positions), tied and untied, and the
# distributed optimizer's dp_reshardable form of one: GPT2LMHeadModel. transformers' own reading of the
# same bytes is recorded by scripts/mcore_real_readers.py (transformers_readers.json).
readers = json.load(open(os.path.join(CASES, "transformers_readers.json")))
for case, folder in (("gpt_tp2", "checkpoint"), ("gpt_tp2_tied", "checkpoint"), ("gpt_dp2_distopt_fp32", "checkpoint_dp_reshardable")):
    if not os.path.isdir(os.path.join(CASES, case, folder)):
        check(f"{case}: the case is there", False, os.path.join(CASES, case, folder))
        continue
    atomic = os.path.join(WORK, case, "atomic")
    r = run("ucp-convert", [os.path.join(CASES, case, folder), "-o", atomic, "-q"], ranks=2)
    check(f"{case}: convert {folder}", r.returncode == 0, r.stderr[-800:])
    ref = torch.load(os.path.join(CASES, case, "reference.pt"), map_location="cpu")
    want = expected_gpt2({k: v for k, v in ref.items() if not k.startswith("optimizer.")}, heads=4)
    for ranks in (1, 2):
        out = os.path.join(WORK, case, f"hf-np{ranks}")
        r = run("ucp-reshard", [atomic, "-o", out, "--format", "hf"], ranks=ranks)
        check(f"{case}: GPT2LMHeadModel export at {ranks} rank(s), no --model-config", r.returncode == 0, r.stderr[-1200:])
        if r.returncode != 0:
            continue
        got = read_safetensors(os.path.join(out, FILES[1]))
        bad = sorted(k for k in want if k not in got or not torch.equal(got[k], want[k]))
        config = json.load(open(os.path.join(out, "config.json")))
        check(f"{case} np{ranks}: every tensor is reference.pt's under GPT-2's names (c_attn q, k, v per head; Conv1D "
              f"transposed; lm_head where untied)", not bad and sorted(got) == sorted(want) and
              config["tie_word_embeddings"] == ("lm_head.weight" not in want),
              f"differ: {bad[:5]}; names {sorted(set(got) ^ set(want))[:5]}; tie {config['tie_word_embeddings']}")
        seen = readers["cases"].get(case)
        if seen and "files" in seen:
            written = {f: hashlib.sha256(open(os.path.join(out, f), "rb").read()).hexdigest() for f in sorted(os.listdir(out)) if not f.startswith(".")}
            check(f"{case} np{ranks}: the bytes transformers read (transformers_readers.json)", written == seen["files"],
                  f"{written} vs {seen['files']}")
    seen = readers["cases"].get(case)
    if folder == "checkpoint":  # Megatron recorded its own logits of this case
        check(f"{case}: transformers {seen and seen.get('transformers')} loaded the export as GPT2LMHeadModel with no missing, "
              f"unexpected or mismatched keys, its logits Megatron-Core's within 1e-5 ({seen and seen.get('max_abs_diff')})",
              seen is not None and seen.get("class") == "GPT2LMHeadModel" and seen.get("loading_problems") is None and
              seen.get("max_abs_diff", 1) <= 1e-5, str(seen)[:1500])
def expected_mixtral(ref, args):
    """MixtralForCausalLM's tensors from reference.pt: the Llama attention and norms, each layer's router as its
    gate, expert E's stacked linear_fc1 [gate; up] as w1 and w3, its linear_fc2 as w2."""
    out = {k: v for k, v in expected({**ref, "decoder.layers.mlp.linear_fc1.weight": ref["decoder.layers.mlp.experts.experts.linear_fc1.weight"][:, 0],
                                      "decoder.layers.mlp.linear_fc2.weight": ref["decoder.layers.mlp.experts.experts.linear_fc2.weight"][:, 0]},
                                     args).items() if ".mlp." not in k}
    L = "decoder.layers."
    for i in range(ref[L + "mlp.router.weight"].shape[0]):
        h = f"model.layers.{i}.block_sparse_moe."
        out[h + "gate.weight"] = ref[L + "mlp.router.weight"][i]
        for e in range(ref[L + "mlp.router.weight"].shape[1]):
            w1, w3 = ref[L + "mlp.experts.experts.linear_fc1.weight"][i, e].chunk(2)
            out[h + f"experts.{e}.w1.weight"], out[h + f"experts.{e}.w3.weight"] = w1, w3
            out[h + f"experts.{e}.w2.weight"] = ref[L + "mlp.experts.experts.linear_fc2.weight"][i, e]
    return out


# Megatron-Core Mixture-of-Experts models (SequentialMLP experts, softmax top-2 router): MixtralForCausalLM.
# moe_tp2_ep2_logits recorded Megatron's own logits; transformers' reading of the same bytes is in
# transformers_readers.json (scripts/mcore_real_readers.py).
for case in ("moe_ep2", "moe_tp2_ep2_logits"):
    atomic = os.path.join(WORK, case, "atomic")
    r = run("ucp-convert", [os.path.join(CASES, case, "checkpoint"), "-o", atomic, "-q"], ranks=2)
    check(f"{case}: convert", r.returncode == 0, r.stderr[-800:])
    ref = torch.load(os.path.join(CASES, case, "reference.pt"), map_location="cpu")
    want = expected_mixtral({k: v for k, v in ref.items() if not k.startswith("optimizer.")}, ARGS)
    out = os.path.join(WORK, case, "hf")
    r = run("ucp-reshard", [atomic, "-o", out, "--format", "hf"], ranks=2)
    check(f"{case}: MixtralForCausalLM export, no --model-config", r.returncode == 0, r.stderr[-1200:])
    if r.returncode != 0:
        continue
    got = read_safetensors(os.path.join(out, FILES[1]))
    bad = sorted(k for k in want if k not in got or not torch.equal(got[k], want[k]))
    config = json.load(open(os.path.join(out, "config.json")))
    check(f"{case}: every tensor is reference.pt's under Mixtral's names (router as gate, experts' [gate; up] as w1, w3)",
          not bad and sorted(got) == sorted(want) and config["architectures"] == ["MixtralForCausalLM"] and
          config["num_local_experts"] == ref["decoder.layers.mlp.router.weight"].shape[1] and config["num_experts_per_tok"] == 2,
          f"differ: {bad[:5]}; names {sorted(set(got) ^ set(want))[:5]}; {config.get('architectures')}")
    seen = readers["cases"].get(case)
    if case == "moe_tp2_ep2_logits":
        written = {f: hashlib.sha256(open(os.path.join(out, f), "rb").read()).hexdigest() for f in sorted(os.listdir(out)) if not f.startswith(".")}
        check(f"{case}: transformers {seen and seen.get('transformers')} loaded the bytes written here as MixtralForCausalLM with no "
              f"missing, unexpected or mismatched keys, its logits Megatron-Core's within 1e-5 ({seen and seen.get('max_abs_diff')})",
              seen is not None and seen.get("files") == written and seen.get("class") == "MixtralForCausalLM" and
              seen.get("loading_problems") is None and seen.get("max_abs_diff", 1) <= 1e-5, str(seen)[:1500])
r = run("ucp-reshard", [os.path.join(WORK, "moe_ep2", "atomic"), "-o", os.path.join(WORK, "moe_dcp"), "--format", "dcp", "--mesh", "tp=2"])
check("moe: --format dcp is refused as Mixture of Experts, naming MixtralForCausalLM", r.returncode != 0 and
      "Mixture-of-Experts" in r.stderr and "MixtralForCausalLM" in r.stderr and "no biases" not in r.stderr and
      not os.path.exists(os.path.join(WORK, "moe_dcp", ".metadata")), r.stderr[-600:])
# A router Mixtral does not compute is refused by name: pre-softmax, in the args.
routed = os.path.join(WORK, "moe_pre_softmax")
shutil.copytree(os.path.join(CASES, "moe_tp2_ep2_logits", "checkpoint"), os.path.join(routed, "ckpt"))
set_flag_in_args(os.path.join(routed, "ckpt", "common.pt"), "moe_router_pre_softmax")
r = run("ucp-convert", [os.path.join(routed, "ckpt"), "-o", os.path.join(routed, "atomic"), "-q"])
r = run("ucp-reshard", [os.path.join(routed, "atomic"), "-o", os.path.join(routed, "hf"), "--format", "hf"]) if r.returncode == 0 else r
check("moe with moe_router_pre_softmax: the export is refused naming it, nothing written", r.returncode != 0 and
      "moe_router_pre_softmax" in r.stderr and not os.path.exists(os.path.join(routed, "hf")), r.stderr[-600:])

finish("hf_mcore")
