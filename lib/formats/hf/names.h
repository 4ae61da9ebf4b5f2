// Megatron-DeepSpeed's parameters as LlamaForCausalLM's tensors. Both of Megatron's namings are read
// (GPTModel's language_model.*, GPTModelPipe's <spec>.*, the pipeline's embedding tied or untied), and
// the fused tensors are cut by rows as the checkpoint's own universal_checkpoint_info says they were
// joined (its sub-parameter sizes, never guessed):
//   query_key_value  [q; k; v] (parameter_with_sub_params, sizes heads x head_dim, kv_heads x head_dim
//                    twice)                      -> self_attn.q_proj, k_proj, v_proj
//   dense_h_to_4h    [gate; up] (parameter_with_2_sub_params_cat_dim_0)   -> mlp.gate_proj, up_proj
// torchtitan's Llama names map one to one (q and k rows re-ordered to rotate-half). Megatron-Core's
// (torch_dist) stack the layers on a leading axis, taken layer by layer; its fixed layouts:
//   linear_qkv       per query group: the group's query heads, its key head, its value head
//   linear_fc1       [gate; up]
// The word embedding and the output layer lose their vocabulary padding rows.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "formats/hf/model.h"
#include "layout/export_plan.h"
#include "layout/reshard_plan.h"

namespace ucp::formats::hf {

// Every tensor of the model in LlamaForCausalLM's order (embedding, each layer, norm, head). Throws
// ucp::Error naming the parameter that has no place in it or whose shape or sub-parameters do not
// fit, or the tensor no parameter fills.
std::vector<reshard::ExportTensor> LlamaTensors(const reshard::Source& S, const LlamaFacts& m);

// torchtitan's Llama name of a LlamaForCausalLM tensor ("model.layers.3.self_attn.q_proj.weight" ->
// "layers.3.attention.wq.weight"), and whether its heads' rotary pairs are interleaved there (q and
// k: torchtitan's complex rotary); nullopt for a tensor torchtitan's Llama has no place for (a bias).
struct TitanName {
  std::string name;
  bool rotary = false;
  int64_t order = 0;  // its place in torchtitan's state dict (the embedding, each layer's keys, the norm, the output)
};
std::optional<TitanName> TorchtitanName(const std::string& hf_name);

// Whether `names` are in one of the namings above (a word embedding or stacked layers by Megatron's,
// torchtitan's or Megatron-Core's name): a model this file translates. Names of none of them may be
// Hugging Face's own (a Trainer job's), which pass through unchanged (own_model.h).
bool TranslatedNaming(const std::vector<std::string>& names);

}  // namespace ucp::formats::hf
