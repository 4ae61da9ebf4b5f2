// Megatron-DeepSpeed names a GPT's parameters two ways, and which one a checkpoint uses depends on
// its ZeRO stage:
//   GPTModelPipe (pipeline engine; ZeRO 0-2)  GPTModel (no pipeline; ZeRO-3)
//   tied_modules.embed.<x>                    language_model.embedding.<x>
//   <i+2>.<x>  (transformer layer i)          language_model.encoder.layers.<i>.<x>
//   <L+2>.<x>  (final norm, L layers)         language_model.encoder.final_layernorm.<x>
// A parameter is placed by its layer spec (GPTModelPipe's index: 1 the embedding, 2..L+1 the
// layers, L+2 the final norm) and its key inside that layer; both namings derive from that place.
// A model whose output layer is its own (Llama-style, untie_embeddings_and_output_weights) has it at
// spec L+3, and its embedding is a plain layer of the pipeline, not a tied module:
//   <1>.word_embeddings.<x>                   language_model.embedding.word_embeddings.<x>
//   <L+3>.lm_head.<x>                         language_model.output_layer.<x>
// The universal_checkpoint_info rules of a checkpoint are regexes over one naming; a reshard to the
// other naming rewrites them, and checks every rewritten rule picks the same parameters.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "pt/value.h"

namespace ucp::reshard {

// Module: a plain DeepSpeed engine around a model that is no Megatron GPT (a Hugging Face model under
// Trainer or Accelerate, any torch module): its parameters keep the names the module gives them, no
// layer structure is known, and a reshard changes only what needs none (DP degree, ZeRO stage).
enum class Naming { Pipe, Plain, Module };
const char* NamingName(Naming n);  // "pipe" / "plain" as the manifest records it; "module"

// Whether parameter names are GPTModel's (language_model.*): a checkpoint without pipeline files
// whose names are not is a plain engine around another model (Naming::Module).
bool GptModelNames(const std::vector<std::string>& names);

struct LayerPlace {
  int spec = -1;      // GPTModelPipe layer spec index
  std::string local;  // key inside the layer ("self_attention.dense.weight"; the output layer's "lm_head.weight")
  bool untied = false;  // in a model whose output layer is its own, not the tied word embedding
  bool embedding() const { return spec == 1; }
};

// Whether a parameter name is an output layer of its own (language_model.output_layer.*, <spec>.lm_head.*)
// or a pipeline's untied embedding (1.word_embeddings.*): the model is Llama-style.
bool UntiedName(const std::string& name);

// Transformer layers of a GPT from its parameter names: GPTModel's language_model.encoder.layers.<i>.*
// (i from 0), or GPTModelPipe's <spec>.* (specs 2..L+1 the layers, L+2 the final norm).
int LayerCountOf(const std::vector<std::string>& names, Naming n);

// Throws ucp::Error for a name that is not a GPT parameter of `layers` layers in naming `n`.
LayerPlace PlaceOf(const std::string& name, Naming n, int layers);
std::string NameAt(const LayerPlace& place, Naming n, int layers);

// An expert parameter of DeepSpeed's MoE layer (deepspeed.moe.experts.Experts):
// <prefix>deepspeed_experts.<id>.<rest>. The model, its model-states and optimizer files name an
// expert by its index on its expert-parallel rank; the expert files by its global id.
struct ExpertName {
  std::string prefix;  // up to and with "deepspeed_experts."
  int id = 0;
  std::string rest;    // from the '.' after the id
  std::string With(int other_id) const { return prefix + std::to_string(other_id) + rest; }
};
std::optional<ExpertName> ExpertOf(const std::string& name);

// DeepSpeed's expert-parallel groups without expert tensor parallelism, in a job that is not a
// pipeline (utils/groups.py, _create_expert_and_data_parallel): global rank r = dp_rank * tp +
// tp_rank; an expert-parallel group is a run of ep consecutive global ranks (r's expert-parallel
// rank is r % ep, across TP ranks), an expert-data-parallel group the ranks with the same remainder
// (r holds partition r / ep of world / ep of its experts' ZeRO state). Expert-parallel rank R's
// expert files (and, without ZeRO, its expp_rank file) are saved by its expert-data-parallel rank 0,
// global rank R, at TP rank R % tp. At tp = 1 this is DP rank d: ep rank d % ep, partition d / ep.
struct ExpertGroups {
  int dp = 1, tp = 1, ep = 1;
  int World() const { return dp * tp; }
  int Rank(int dp_rank, int tp_rank) const { return dp_rank * tp + tp_rank; }
  int EpRank(int dp_rank, int tp_rank) const { return Rank(dp_rank, tp_rank) % ep; }
  int Partition(int dp_rank, int tp_rank) const { return Rank(dp_rank, tp_rank) / ep; }
  int Partitions() const { return World() / ep; }
  int SaverTp(int ep_rank) const { return ep_rank % tp; }
  // Whether some DP rank at `tp_rank` belongs to expert-parallel rank `ep_rank` (holds its experts).
  bool AtTp(int tp_rank, int ep_rank) const {
    for (int d = 0; d < dp; ++d)
      if (EpRank(d, tp_rank) == ep_rank) return true;
    return false;
  }
};

// universal_checkpoint_info with every rule rewritten from one naming to the other. `names` pairs
// each parameter's name in `from` with its name in `to`; a rule whose plain rewrite would not match
// exactly the parameters it matched before becomes the list of those parameters' escaped names.
pt::ValuePtr RenameRules(const pt::Value& info, const std::vector<std::pair<std::string, std::string>>& names,
                         Naming from, Naming to, int layers, bool untied = false);

}  // namespace ucp::reshard
