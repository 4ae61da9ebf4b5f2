// MixtralForCausalLM from a Megatron-Core Mixture-of-Experts model (SequentialMLP experts, torch_dist
// keys, or Megatron-LM's legacy files read as them): the router `decoder.layers.mlp.router.weight`
// [layers, experts, hidden] becomes each layer's `block_sparse_moe.gate`, expert E's stacked
// `linear_fc1` rows [gate; up] its `w1` and `w3`, its `linear_fc2` its `w2` (names.h places them).
// What the router computes must be Mixtral's: softmax over the top-k logits (Megatron's softmax
// score function without pre-softmax equals Mixtral's softmax over every expert renormalised over the
// top k), every token to its k experts. Megatron-LM's args that route otherwise are refused by name:
// a sigmoid score, pre-softmax, a top-k scaling factor, capacity (token dropping), expert bias,
// group-limited routing, shared experts, dense layers between the MoE ones.
#pragma once

#include <string>
#include <vector>

#include "formats/hf/model.h"

namespace ucp::formats::hf {

// Whether the model's parameters are Megatron-Core's MoE layers (a stacked router).
bool McoreMoe(const ModelView& view);

// Every difference between its MoE layers and Mixtral's sparse MoE block, from the args.
void McoreMixtralDifferences(const ModelView& view, std::vector<std::string>& differs);

// The experts (the router's rows), the experts per token (moe_router_topk) and each expert's FFN
// width (moe_ffn_hidden_size, else ffn_hidden_size) into `m`.
void McoreMoeSizesOf(const ModelView& view, LlamaFacts& m);

}  // namespace ucp::formats::hf
