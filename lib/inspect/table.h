// Pieces of the human tables both inspect reports print (source and atomic checkpoints).
#pragma once

#include <algorithm>
#include <string>

#include <nlohmann/json.hpp>

namespace ucp::inspect {

// "[100,32]" from a JSON shape array: compact, for a fixed-width column.
inline std::string CompactShape(const nlohmann::json& shape) {
  std::string s = "[";
  for (size_t k = 0; k < shape.size(); ++k) s += (k ? "," : "") + shape[k].dump();
  return s + "]";
}

// Width of the parameter-name column.
inline size_t NameWidth(const nlohmann::json& params) {
  size_t w = 9;
  for (const auto& p : params) w = std::max(w, p["name"].get<std::string>().size());
  return w;
}

}  // namespace ucp::inspect
