// How a Megatron-Core torch_dist key stacks its tensor: decoder.layers.* holds every layer of the
// decoder on a leading dimension, and a MoE layer's SequentialMLP experts
// (decoder.layers.mlp.experts.experts.*) every expert on the next one. What every reader and writer
// of those keys asks first.
#pragma once

#include <string_view>

namespace ucp::source {

inline constexpr std::string_view kStackedPrefix = "decoder.layers.";

// The leading dimensions the stacking adds to the key's tensor: 0, 1 (the layers) or 2 (the layers,
// then the experts).
inline int StackedDims(std::string_view key) {
  if (key.substr(0, kStackedPrefix.size()) != kStackedPrefix) return 0;
  return key.find(".experts.experts.") != std::string_view::npos ? 2 : 1;
}

}  // namespace ucp::source
