// The Megatron-Core target's tensors: each torch_dist key of the model, how TP cuts it, and where the
// rows of each of its layers come from. Two kinds of source give them:
// - a Megatron-Core model's own atoms (Megatron-Core torch_dist and Megatron-LM legacy sources): one
//   atom per key, its layers stacked as the key stacks them;
// - a Llama-class model under another family's names (Megatron-DeepSpeed, Hugging Face imports,
//   torchtitan), through the Hugging Face target's cut of its tensors (formats/hf/names.h): each
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
  std::vector<int64_t> shape;  // without the layer axis
  std::vector<std::vector<Segment>> layers;  // per layer (one entry where not stacked): its rows in order
  int64_t Rows() const { return shape.empty() ? 1 : shape[0]; }
};

// The keys of a Megatron-Core model's atoms (their names are the keys); refused where a stacked atom
// does not hold `layers` layers.
std::vector<McoreKey> KeysOfMcoreAtoms(const reshard::Source& S, bool gated, int64_t layers);

// The keys of a Llama-class model whose tensors `tensors` (hf::LlamaTensors, LlamaForCausalLM's names)
// cut from the source's atoms: the local spec's keys Megatron-Core saves, its norms under the fused
// layer_norm_* names. Refused by name: biases (not yet), Mixture of Experts.
std::vector<McoreKey> KeysOfLlama(const std::vector<reshard::ExportTensor>& tensors, const hf::LlamaFacts& m, const std::string& dir);

}  // namespace ucp::formats::megatron
