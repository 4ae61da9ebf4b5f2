// A Megatron-Core model's state-dict names as Megatron-LM's legacy format saves them (the module's
// own `state_dict`: one tensor per layer, numbered within the pipeline stage, TP-local) and as its
// `torch_dist` format saves the same tensor (the model's `sharded_state_dict`: layers stacked on a
// leading axis, each TP rank's part a box of the global tensor), so that both forms give one atomic
// checkpoint. One table: Megatron-Core 0.17.1's GPT / Llama modules (gpt_layer_specs.py: the local
// spec's input_layernorm / pre_mlp_layernorm are the TE spec's fused layer_norm_* names; column-parallel
// linears cut on rows, row-parallel ones on columns, norms and row-parallel biases whole on every TP rank;
// a MoE layer's router whole, its SequentialMLP experts' linears cut as the dense ones, expert by expert).
#pragma once

#include <optional>
#include <string>

namespace ucp::formats::megatron {

struct DistName {
  std::string key;  // the torch_dist key: "decoder.layers.self_attention.linear_qkv.weight"
  int layer = -1;   // the layer within its stage for a decoder layer's tensor (stacked), else -1
  enum Split { Whole, Rows, Columns } split = Whole;  // how TP ranks cut it
  bool gated = false;  // rows of [gate; up] on each rank (SwiGLU's linear_fc1 with `gated`): cut per half
  // A Mixture-of-Experts layer's expert (SequentialMLP's decoder.layers.mlp.experts.experts.*): the
  // experts' axis follows the layers, each expert cut by the expert TP ranks as the dense linear is.
  bool experts = false;
};

// The torch_dist form of legacy state-dict name `name`; nullopt for a name that is no tensor
// (`*._extra_state`). Throws ucp::Error for a name not in the table (a module ucp does not know how TP
// cuts: never guessed). `gated`: the job's MLP is gated (args.swiglu).
std::optional<DistName> DistNameOf(const std::string& name, bool gated);

// A torch_dist key itself ("decoder.layers.mlp.linear_fc1.weight": layers stacked, `layer` -1): how
// TP ranks cut it, by the same table. Throws ucp::Error for a key not in it.
DistName DistNameOfKey(const std::string& key, bool gated);

}  // namespace ucp::formats::megatron
