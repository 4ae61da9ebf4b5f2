// Which transformers class a checkpoint's model is, and its config.json. The facts come from the
// checkpoint's own Megatron args (carried in the atomic checkpoint's model-states file), with
// --model-config filling what the checkpoint does not say (a plain DeepSpeed engine saves no args);
// a value given both ways must agree. A model no class describes exactly is refused by name, never
// guessed: transformers would load it and compute something else.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "layout/export_plan.h"
#include "pt/value.h"
#include "layout/reshard_plan.h"

namespace ucp::formats::hf {

// A decoder-only model as LlamaForCausalLM describes it: RMSNorm, rotary embeddings (rotate-half),
// SwiGLU, grouped-query attention; biases on the attention's or the MLP's linear layers or on neither.
struct LlamaFacts {
  int64_t hidden = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn = 0, vocab = 0, max_positions = 0;
  double norm_eps = 1e-5, rope_theta = 10000.0;
  bool tied = false, attention_bias = false, mlp_bias = false;
  // > 0: MixtralForCausalLM, every MLP a sparse MoE block of `experts` (ffn each), `experts_per_token` per token.
  int64_t experts = 0, experts_per_token = 0;
};

// What the class is judged by, from either side of a conversion: parameter names with a shape each
// (an atomic checkpoint's, or a source checkpoint's TP-local ones: only row ratios are read), the
// Megatron args, Mixture of Experts or not.
struct ModelView {
  std::string dir;        // for messages
  std::string args_file;  // where `arg` reads from, for messages
  std::function<const pt::Value*(const char*)> arg;  // Megatron's args.<key>, or nullptr
  bool moe = false;
  std::vector<std::pair<std::string, std::vector<int64_t>>> params;
};

// The view of an atomic checkpoint's model (its parameters, its carried Megatron args).
ModelView ViewOf(const reshard::Source& S);

// Refuses, naming every difference, a model LlamaForCausalLM does not compute (by what the weights
// show or the args and --model-config say), and a --model-config with an unknown key or a value of
// the wrong type. What it read off the weights is said in `notes`. Cheap: names, shapes and args
// only, so that a model the export would refuse is refused before a conversion.
void RefuseUnlessLlama(const ModelView& view, const reshard::ExportOptions& options, std::vector<std::string>& notes);

// The facts of the source's model; throws ucp::Error naming the fact (and --model-config) where
// neither the checkpoint nor the file says it, and naming the feature where the model is not one
// LlamaForCausalLM computes (LayerNorm, learned positions, a GeLU MLP, partial rotary, ...). A fact
// taken from Megatron's defaults (no args.layernorm_epsilon, args.rope_theta) is said in `notes`.
LlamaFacts LlamaFactsOf(const reshard::Source& S, const reshard::ExportOptions& options, std::vector<std::string>& notes);

// config.json's dtype name (torch's) of ucp's fp32, bf16 or fp16 (float32 for another), and ucp's
// name of torch's float32, bfloat16 or float16 ("" for another).
const char* TorchDtypeName(const std::string& dtype);
std::string UcpDtypeName(const std::string& torch_name);

// config.json for `facts` (LlamaForCausalLM, or MixtralForCausalLM with experts), the weights in `dtype`
// (fp32, bf16, fp16).
std::string LlamaConfigJson(const LlamaFacts& facts, const std::string& dtype);

}  // namespace ucp::formats::hf
