#include "formats/megatron/legacy_names.h"

#include <regex>

#include "core/error.h"
#include "source/megatron_stacking.h"

namespace ucp::formats::megatron {

namespace {

bool EndsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// SequentialMLP's experts as torch_dist keys them (its local_experts.J under the global-expert axis).
const std::string kExpertFc1 = "mlp.experts.experts.linear_fc1", kExpertFc2 = "mlp.experts.experts.linear_fc2";

// A decoder layer's module path (after decoder.layers.N.) and parameter: how TP ranks cut it.
std::optional<DistName::Split> LayerSplit(const std::string& module, const std::string& param) {
  using S = DistName::Split;
  if (param.rfind("layer_norm_", 0) == 0) return S::Whole;  // TE's norm fused into the next linear
  if (module == "self_attention.linear_qkv" || module == "mlp.linear_fc1" || module == kExpertFc1) return S::Rows;
  if (module == "self_attention.linear_proj" || module == "mlp.linear_fc2" || module == kExpertFc2) return param == "bias" ? S::Whole : S::Columns;
  if (module == "self_attention.q_layernorm" || module == "self_attention.k_layernorm") return S::Whole;
  if (module == "mlp.router" && (param == "weight" || param == "expert_bias")) return S::Whole;  // every TP and EP rank's
  return std::nullopt;
}

// The fields of a decoder layer's tensor beyond its split: SwiGLU's halves, the experts' axis.
void LayerFacts(DistName& d, const std::string& module, bool gated) {
  d.gated = gated && (module == "mlp.linear_fc1" || module == kExpertFc1) && d.split == DistName::Rows;
  d.experts = module == kExpertFc1 || module == kExpertFc2;
}

// A tensor outside the decoder's layers, by its name (the same in both forms).
DistName GlobalName(const std::string& name) {
  DistName d;
  if (name == "embedding.word_embeddings.weight" || name == "output_layer.weight" || name == "output_layer.bias") d.split = DistName::Rows;
  else if (name == "embedding.position_embeddings.weight" || name.rfind("decoder.final_layernorm.", 0) == 0) d.split = DistName::Whole;
  else
    throw Error("'" + name + "': a tensor not in ucp's table of Megatron-Core models (how tensor parallelism cuts it is not known, "
                "so it is not guessed)");
  d.key = name;
  return d;
}

}  // namespace

std::optional<DistName> DistNameOf(const std::string& name, bool gated) {
  if (EndsWith(name, "._extra_state") || name == "_extra_state") return std::nullopt;
  DistName d;
  static const std::regex layer(R"(^decoder\.layers\.(\d{1,7})\.(.+)\.([A-Za-z_0-9]+)$)");
  std::smatch m;
  if (std::regex_match(name, m, layer)) {
    d.layer = std::stoi(m[1]);
    std::string module = m[2], param = m[3];
    // the local spec's separate norms, saved by torch_dist under the TE spec's fused names
    if (module == "input_layernorm") module = "self_attention.linear_qkv", param = "layer_norm_" + param;
    else if (module == "pre_mlp_layernorm") module = "mlp.linear_fc1", param = "layer_norm_" + param;
    const auto split = LayerSplit(module, param);
    if (!split)
      throw Error("'" + name + "': a module not in ucp's table of Megatron-Core layers (how tensor parallelism cuts it is not "
                  "known, so it is not guessed)");
    d.key = "decoder.layers." + module + "." + param;
    d.split = *split;
    LayerFacts(d, module, gated);
    return d;
  }
  return GlobalName(name);
}

DistName DistNameOfKey(const std::string& key, bool gated) {
  constexpr std::string_view stacked = source::kStackedPrefix;
  if (source::StackedDims(key) == 0) return GlobalName(key);
  const size_t dot = key.rfind('.');
  const std::string module = key.substr(stacked.size(), dot - stacked.size()), param = key.substr(dot + 1);
  const auto split = dot > stacked.size() ? LayerSplit(module, param) : std::nullopt;
  if (!split)
    throw Error("'" + key + "': a module not in ucp's table of Megatron-Core layers (how tensor parallelism cuts it is not known, so "
                "it is not guessed)");
  DistName d;
  d.key = key, d.split = *split;
  LayerFacts(d, module, gated);
  return d;
}

}  // namespace ucp::formats::megatron
