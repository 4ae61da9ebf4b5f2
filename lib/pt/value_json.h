// A canonical JSON form of a Value tree, bit-exact and independent of our reader: tests build the
// same form in Python from the object torch.load returns (tests/python/canonical.py) and compare.
//   None/bool/str/int -> JSON; float -> {"float": hex of the IEEE bits};
//   bytes -> {"bytes": hex}; list/tuple/set -> {"list"|"tuple"|"set": [...]};
//   dict -> {"dict": [[k, v], ...]}; class or function -> {"global": "module.name"};
//   other objects -> {"object": "module.name", "args": [...], "state": ..., "items": [...], "dict_items": [...]}
//   tensor -> {"tensor": {"dtype", "shape", "hex"}} (hex of the row-major bytes, up to max_tensor_bytes).
#pragma once

#include <nlohmann/json.hpp>

#include "pt/value.h"

namespace ucp::pt {

nlohmann::json CanonicalJson(const Value& value, size_t max_tensor_bytes = 1 << 20);

// Row-major bytes of a (possibly strided) tensor.
std::string TensorBytes(const TensorView& t);

}  // namespace ucp::pt
