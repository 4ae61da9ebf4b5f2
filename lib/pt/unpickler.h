// A data-only unpickler: runs the pickle virtual machine (protocols 0-5) into a Value tree without
// importing or calling anything. Classes become inert Object values; the handful of callables
// torch.save relies on (tensor and parameter rebuilds, OrderedDict, set, _codecs.encode) are
// interpreted as data. Every count, length and memo index is checked before it is used.
#pragma once

#include <functional>
#include <span>
#include <string>

#include "pt/value.h"

namespace ucp::pt {

// Resolves a torch persistent id ('storage', <StorageClass>, key, location, numel) to a storage.
using StorageResolver = std::function<std::shared_ptr<Storage>(DType dtype, const std::string& key, uint64_t numel)>;

struct UnpickleLimits {
  size_t max_nesting = 1000;  // deeper trees are refused (their teardown would recurse as deep)
};

// Throws ucp::Error("pickle offset N: ...") on malformed input.
ValuePtr Unpickle(std::span<const uint8_t> bytes, const StorageResolver& storages, UnpickleLimits limits = {});

}  // namespace ucp::pt
