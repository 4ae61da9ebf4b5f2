"""An independent check of moe_tp2_ep2_logits (not part of CI): Hugging Face transformers' MixtralForCausalLM
holding reference.pt's tensors, mapped to Mixtral's names by hand, against the logits Megatron-Core computed
(megatron_logits.json). Run in the Debian trixie chroot with transformers' venv:

    . /opt/hf/hfenv.sh; python3 mixtral_check.py CASE_DIR [SCRATCH_DIR]

The config is built from what megatron_logits.json records of the model's TransformerConfig (hidden, ffn per
expert, experts, top-k, heads, query groups, RMSNorm epsilon, rotary base, padded vocabulary, untied output
layer, max positions). The weights are written as one model.safetensors with the names of Mistral AI's
released Mixtral checkpoints (`block_sparse_moe.experts.{j}.w1/w2/w3.weight`, `block_sparse_moe.gate.weight`)
and read by from_pretrained (transformers 5 fuses each layer's experts on load: w1, w3 -> gate_up_proj,
w2 -> down_proj); the mapping, per layer i of the stacked tensors:
  embedding.word_embeddings.weight                       -> model.embed_tokens.weight
  decoder.layers.self_attention.linear_qkv.layer_norm_weight[i] -> model.layers.i.input_layernorm.weight
  decoder.layers.self_attention.linear_qkv.weight[i]      -> q_proj, k_proj, v_proj: per query group g, rows
      [g*(q+2)*d, ...): its q heads (q = heads / groups, d = kv_channels), then its k, then its v
  decoder.layers.self_attention.linear_proj.weight[i]     -> self_attn.o_proj.weight
  decoder.layers.mlp.linear_fc1.layer_norm_weight[i]      -> model.layers.i.post_attention_layernorm.weight
  decoder.layers.mlp.router.weight[i]                     -> block_sparse_moe.gate.weight
  decoder.layers.mlp.experts.experts.linear_fc1.weight[i, j] = [gate; up] -> experts.j.w1 = gate, w3 = up
  decoder.layers.mlp.experts.experts.linear_fc2.weight[i, j] -> experts.j.w2
  decoder.final_layernorm.weight -> model.norm.weight; output_layer.weight -> lm_head.weight
Prints one JSON line: the loading problems, max |logits - megatron_logits|, and how decided the routing was
(the smallest gap between a token's 2nd and 3rd router logit, in the Hugging Face model's own forward).
"""
import json
import os
import sys
import tempfile

import torch
from safetensors.torch import save_file
import transformers
from transformers import MixtralConfig, MixtralForCausalLM

case = sys.argv[1]
scratch = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="mixtral_check_")
ref = torch.load(os.path.join(case, "reference.pt"))
meg = json.load(open(os.path.join(case, "megatron_logits.json")))
assert meg["moe_router_score_function"] == "softmax" and not meg["moe_router_pre_softmax"]
assert meg["moe_router_topk_scaling_factor"] is None and meg["moe_expert_capacity_factor"] is None
assert not meg["moe_router_enable_expert_bias"] and meg["moe_shared_expert_intermediate_size"] is None
assert meg["normalization"] == "RMSNorm" and meg["gated_linear_unit"] and meg["activation_func"] == "silu"
assert not meg["add_bias_linear"] and meg["position_embedding_type"] == "rope" and meg["rotary_percent"] == 1.0
assert not meg["rotary_interleaved"] and not meg["share_embeddings_and_output_weights"]

L, H, F = meg["num_layers"], meg["hidden_size"], meg["moe_ffn_hidden_size"]
E, heads, groups, d = meg["num_moe_experts"], meg["num_attention_heads"], meg["num_query_groups"], meg["kv_channels"]
config = MixtralConfig(vocab_size=meg["vocab_size"], hidden_size=H, intermediate_size=F, num_hidden_layers=L,
                       num_attention_heads=heads, num_key_value_heads=groups, head_dim=d, hidden_act="silu",
                       max_position_embeddings=meg["max_sequence_length"], rms_norm_eps=meg["layernorm_epsilon"],
                       tie_word_embeddings=False, num_local_experts=E, num_experts_per_tok=meg["moe_router_topk"],
                       router_jitter_noise=0.0, attention_dropout=0.0, sliding_window=None,
                       rope_parameters={"rope_type": "default", "rope_theta": float(meg["rotary_base"])},
                       torch_dtype="float32")

sd = {"model.embed_tokens.weight": ref["embedding.word_embeddings.weight"],
      "model.norm.weight": ref["decoder.final_layernorm.weight"], "lm_head.weight": ref["output_layer.weight"]}
q = heads // groups
for i in range(L):
    p, s = f"model.layers.{i}.", "decoder.layers."
    qkv = ref[s + "self_attention.linear_qkv.weight"][i].view(groups, (q + 2) * d, H)
    sd[p + "self_attn.q_proj.weight"] = qkv[:, :q * d].reshape(heads * d, H)
    sd[p + "self_attn.k_proj.weight"] = qkv[:, q * d:(q + 1) * d].reshape(groups * d, H)
    sd[p + "self_attn.v_proj.weight"] = qkv[:, (q + 1) * d:].reshape(groups * d, H)
    sd[p + "self_attn.o_proj.weight"] = ref[s + "self_attention.linear_proj.weight"][i]
    sd[p + "input_layernorm.weight"] = ref[s + "self_attention.linear_qkv.layer_norm_weight"][i]
    sd[p + "post_attention_layernorm.weight"] = ref[s + "mlp.linear_fc1.layer_norm_weight"][i]
    sd[p + "block_sparse_moe.gate.weight"] = ref[s + "mlp.router.weight"][i]
    for j in range(E):
        fc1 = ref[s + "mlp.experts.experts.linear_fc1.weight"][i, j]
        assert fc1.shape == (2 * F, H)
        sd[p + f"block_sparse_moe.experts.{j}.w1.weight"] = fc1[:F]
        sd[p + f"block_sparse_moe.experts.{j}.w3.weight"] = fc1[F:]
        sd[p + f"block_sparse_moe.experts.{j}.w2.weight"] = ref[s + "mlp.experts.experts.linear_fc2.weight"][i, j]
save_file({k: v.contiguous().clone() for k, v in sd.items()}, os.path.join(scratch, "model.safetensors"),
          metadata={"format": "pt"})
config.save_pretrained(scratch)

model, info = MixtralForCausalLM.from_pretrained(scratch, output_loading_info=True)
model.eval()
ids = torch.tensor(meg["ids"])
gaps = []
hooks = [layer.mlp.gate.register_forward_hook(lambda m, a, out: gaps.append(out[0].sort(-1, descending=True).values))
         for layer in model.model.layers] if hasattr(model.model.layers[0], "mlp") else \
        [layer.block_sparse_moe.gate.register_forward_hook(lambda m, a, out: gaps.append(out[0].sort(-1, descending=True).values))
         for layer in model.model.layers]
with torch.no_grad():
    logits = model(ids).logits
for h in hooks:
    h.remove()
# out[0] is the softmax over all experts; the 2nd vs 3rd logit gap is log(p2 / p3)
gap = min((torch.log(g[:, 1]) - torch.log(g[:, 2])).min().item() for g in gaps)
diff = (logits - torch.tensor(meg["logits"])).abs().max().item()
print(json.dumps({"case": os.path.basename(os.path.normpath(case)), "transformers": transformers.__version__,
                  "torch": torch.__version__, "class": type(model).__name__,
                  "loading_problems": {k: [str(x) for x in v] for k, v in info.items() if v} or None,
                  "max_abs_logits": logits.abs().max().item(),
                  "min_router_logit_gap_2nd_3rd": gap, "max_abs_diff": diff}))
