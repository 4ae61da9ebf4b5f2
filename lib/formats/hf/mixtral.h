// MixtralForCausalLM from a Megatron-DeepSpeed Llama-shaped model whose every MLP is a DeepSpeed MoE
// layer (deepspeed.moe.layer.MoE): the gate `mlp.deepspeed_moe.gate.wg` becomes
// `block_sparse_moe.gate`, expert E's `dense_h_to_4h` rows [gate; up] (ParallelMLP's SwiGLU halves)
// become `experts.E.w1` and `w3`, its `dense_4h_to_h` `w2` (names.h places them).
// What the router computes must be Mixtral's: softmax over the experts, the top 2, their weights
// renormalised to sum to 1, every token to both (no capacity). DeepSpeed's top2gating computes that
// only with the second expert by argmax (moe_top2_2nd_expert_sampling false: else Gumbel noise picks
// it, in evaluation too) and without token dropping (moe_token_dropping false: else tokens past an
// expert's capacity skip it). Top-1 gating weighs the one expert by its softmax probability where
// Mixtral's would renormalise it to 1: refused, as are dense layers between the MoE ones, residual
// MoE (PR-MoE), experts with biases. The gate settings are Megatron-DeepSpeed's args (topk,
// moe_token_dropping, moe_top2_2nd_expert_sampling), else asked for in --model-config.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/hf/facts.h"
#include "formats/hf/model.h"

namespace ucp::formats::hf {

// Every difference between the MoE layers and Mixtral's sparse MoE block (`differs`), and the gate
// settings neither the args nor --model-config say (`missing`, Megatron's names).
void MixtralDifferences(const ModelView& view, const Facts& f, std::vector<std::string>& differs, std::vector<std::string>& missing);

// The experts per layer (the gate's rows) and the experts each token goes to (topk).
void MoeSizesOf(const ModelView& view, const Facts& f, LlamaFacts& m);

}  // namespace ucp::formats::hf
