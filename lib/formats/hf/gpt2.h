// GPT2LMHeadModel from a Megatron-DeepSpeed or Megatron-Core GPT model: LayerNorm with biases, learned
// absolute positions, a GeLU MLP, multi-head attention, biases on every linear layer; the output layer
// the word embedding, or one of its own (GPTModel's output_layer: lm_head, tie_word_embeddings false).
// Megatron-Core's stacked decoder.layers.* tensors give each layer's block tensor. Hugging Face's GPT-2 holds its linear layers as Conv1D, weight [in, out]: the
// transpose of Megatron's [out, in] (ExportTensor::transposed). The fused QKV's rows:
//   with the checkpoint's sub-parameter sizes (universal_checkpoint_info): [q; k; v], as they say;
//   without: Megatron's ParallelAttention order, head by head [q_i; k_i; v_i] ([heads, 3, head_dim]),
// written as c_attn's columns [q; k; v] (every head's q, then k, then v).
// The activation is what Megatron computed: F.gelu (exact) is "gelu"; --openai-gelu and the fused
// bias-GeLU kernel (bias_gelu_fusion, Megatron's default with biases) the tanh approximation, "gelu_new".
// Everything GPT-2 cannot express is refused by name: grouped-query attention, SwiGLU, RMSNorm,
// rotary, linear layers without biases.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/hf/model.h"
#include "layout/export_plan.h"
#include "layout/reshard_plan.h"

namespace ucp::formats::hf {

struct Gpt2Facts {
  int64_t hidden = 0, layers = 0, heads = 0, ffn = 0, vocab = 0, positions = 0;
  double norm_eps = 1e-5;
  std::string activation;  // GPT2Config's activation_function: "gelu" or "gelu_new"
  bool tied = true;        // the output layer is the word embedding; else lm_head.weight of its own
};

// Whether the model has learned absolute position embeddings (Megatron's
// embedding.position_embeddings): GPT-2's shape, the one class written here that has them.
bool Gpt2Shaped(const ModelView& view);

// Refuses, naming every difference, a model GPT2LMHeadModel does not compute. Cheap (names, shapes
// and args), so that ucp-convert can refuse before a conversion.
void RefuseUnlessGpt2(const ModelView& view, const reshard::ExportOptions& options, std::vector<std::string>& notes);

// The facts of the source's GPT-2-shaped model (args, --model-config, the weights' shapes).
Gpt2Facts Gpt2FactsOf(const reshard::Source& S, const reshard::ExportOptions& options, std::vector<std::string>& notes);

// Every tensor of GPT2LMHeadModel in its order (wte, wpe, each block, ln_f; lm_head where it is untied).
std::vector<reshard::ExportTensor> Gpt2Tensors(const reshard::Source& S, const Gpt2Facts& m);

// config.json for `facts`, the weights in `dtype`.
std::string Gpt2ConfigJson(const Gpt2Facts& facts, const std::string& dtype);

}  // namespace ucp::formats::hf
