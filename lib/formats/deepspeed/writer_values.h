// The pickled values DeepSpeed's files hold that the writer builds anew, not carries from the
// source: dicts, shapes, dtypes, loss scalers, fragment addresses, and the training dtype's width.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pt/value.h"

namespace ucp::deepspeed {

pt::ValuePtr Copied(const pt::Value& v);  // shallow: shares the children
void PutIfPresent(pt::Value& dict, const std::string& key, pt::ValuePtr v);
pt::ValuePtr OrderedDict();
// A shape as the source's files pickle one: torch.Size (torch 1.x), or a plain tuple, which is how
// torch 2.x pickles a torch.Size (DeepSpeed 0.19 files).
pt::ValuePtr TorchSize(const std::vector<int64_t>& shape, bool plain_tuple);
// Whether the source's param_shapes hold plain tuples rather than torch.Size (see TorchSize).
bool PlainTupleShapes(const pt::Value& model_states);
pt::ValuePtr TorchDtype(const std::string& dtype);
pt::ValuePtr Float(double f);
// DeepSpeed's loss scalers, as their __init__ leaves them.
pt::ValuePtr LossScalerFor(const std::string& dtype, const pt::ValuePtr& source);
pt::ValuePtr FragmentAddress(int64_t numel, int64_t start);

struct LowPrecision {
  pt::DType dtype;
  size_t size;
};
LowPrecision LpOf(const std::string& dtype);

}  // namespace ucp::deepspeed
