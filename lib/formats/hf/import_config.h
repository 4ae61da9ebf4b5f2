// A Hugging Face model folder's config.json, read as the facts of the class ucp imports from it.
// The class is said by `architectures` (else `model_type`): LlamaForCausalLM, MixtralForCausalLM,
// GPT2LMHeadModel; a class ucp does not import, or a setting Megatron's model cannot compute
// (rope_scaling, an activation other than SiLU or GPT-2's two GeLUs, a sliding window, router
// jitter, ...), is refused by name: the atomic checkpoint would load and compute something else.
#pragma once

#include <string>
#include <vector>

#include "formats/hf/gpt2.h"
#include "formats/hf/model.h"

namespace ucp::formats::hf {

struct HfConfig {
  std::string path;          // dir/config.json, for messages
  std::string architecture;  // "LlamaForCausalLM", "MixtralForCausalLM" (llama.experts > 0), "GPT2LMHeadModel"
  std::string dtype;         // ucp's name of config.json's dtype / torch_dtype; "" where it says none
  LlamaFacts llama;  // LlamaForCausalLM and MixtralForCausalLM
  Gpt2Facts gpt2;    // GPT2LMHeadModel
  bool Gpt2() const { return architecture == "GPT2LMHeadModel"; }
  bool Tied() const { return Gpt2() || llama.tied; }
  std::string EmbeddingName() const { return Gpt2() ? "transformer.wte.weight" : "model.embed_tokens.weight"; }
  std::vector<std::string> notes;  // facts taken from the class's defaults
};

// Throws ucp::Error naming config.json and the key.
HfConfig ReadHfConfig(const std::string& dir);
// The same of config.json's text; `path` names it in messages.
HfConfig ParseHfConfig(const std::string& text, const std::string& path);

}  // namespace ucp::formats::hf
