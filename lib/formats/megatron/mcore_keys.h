// The Megatron-Core target's tensors: each torch_dist key of the model, how TP cuts it, and where the
// rows of each of its layers come from. Three kinds of source give them:
// - a Megatron-Core model's own atoms (Megatron-Core torch_dist and Megatron-LM legacy sources): one
//   atom per key, its layers stacked as the key stacks them;
// - a Megatron-DeepSpeed GPT (a DeepSpeed checkpoint, a Hugging Face import), one atom per layer and
//   tensor: renamed, query_key_value re-joined per query group (mcore_deepspeed_keys.cpp);
// - torchtitan's Llama, through the Hugging Face target's cut of its tensors (formats/hf/names.h): each
//   LlamaForCausalLM tensor a run of rows of a key, Megatron-Core's fused tensors re-joined from them
//   (linear_qkv per query group: the group's query heads, its key head, its value head; linear_fc1
//   [gate; up]).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/hf/model.h"
#include "formats/megatron/legacy_names.h"
#include "layout/export_plan.h"
#include "layout/reshard_plan.h"

namespace ucp::formats::megatron {

// A run of a key's rows: rows [first, first + count) of `rows` (a 1-D tensor's rows are its elements).
struct Segment {
  reshard::ExportTensor rows;
  int64_t first = 0, count = 0;
};

// One torch_dist key of the model.
struct McoreKey {
  std::string key;             // "decoder.layers.self_attention.linear_qkv.weight"
  DistName name;               // how TP cuts it
  bool stacked = false;        // decoder.layers.*: a leading layer axis
  std::vector<int64_t> shape;  // without the layer axis (and the experts' axis)
  // > 0: a MoE layer's experts (DistName::experts), this many after the layer axis; each layer's
  // segments are then its experts, one whole tensor of `shape` each, in order.
  int64_t experts = 0;
  std::vector<std::vector<Segment>> layers;  // per layer (one entry where not stacked): its rows in order
  int64_t Rows() const { return shape.empty() ? 1 : shape[0]; }
};

// The keys of a Megatron-Core model's atoms (their names are the keys); refused where a stacked atom
// does not hold `layers` layers.
std::vector<McoreKey> KeysOfMcoreAtoms(const reshard::Source& S, bool gated, int64_t layers);

// What Megatron-LM's args say of a model from another family: the facts its GPTModel is built from.
struct ModelFacts {
  int64_t layers = 0, hidden = 0, heads = 0, groups = 0, head_dim = 0, ffn = 0, vocab = 0, positions = 0;
  bool tied = false, swiglu = true, rms_norm = true, learned_positions = false;
  bool bias_linear = false, bias_qkv = false;  // add_bias_linear (every linear), add_qkv_bias (linear_qkv alone)
  bool openai_gelu = false, bias_gelu_fusion = false;  // without SwiGLU: the tanh GeLU (either), else exact
  double eps = 1e-5, rope_base = 10000, rotary_percent = 1.0;
};

// A model from another family as Megatron-Core's keys (the local spec's, its norms under the fused
// layer_norm_* names) and its facts.
struct OtherFamilyModel {
  std::vector<McoreKey> keys;
  ModelFacts facts;
};

// A Llama-class model whose tensors `tensors` (hf::LlamaTensors, LlamaForCausalLM's names) cut from the
// source's atoms (torchtitan's names). Refused by name: biases, Mixture of Experts.
OtherFamilyModel ModelOfLlama(const std::vector<reshard::ExportTensor>& tensors, const hf::LlamaFacts& m, const std::string& dir);

// A Megatron-DeepSpeed GPT (GPTModel's or GPTModelPipe's names: a DeepSpeed checkpoint of
// Megatron-DeepSpeed, a Hugging Face import): each layer's tensors as they are but query_key_value,
// [q; k; v] by its sub-parameter sizes (or head by head without them, multi-head attention) re-joined
// per query group; LayerNorm or RMSNorm, learned or rotary positions, biases, SwiGLU or GeLU, tied or
// not, as its weights show and its args (or --model-config) say. The vocabulary's padding rows dropped.
OtherFamilyModel ModelOfMegatronDeepSpeed(const reshard::Source& S, const reshard::ExportOptions& o, std::vector<std::string>& notes);

}  // namespace ucp::formats::megatron
