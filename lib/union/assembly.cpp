#include "union/assembly.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace ucp::union_ {

Assembly::Assembly(const plan::ParamPlan& param, const plan::Item& item, std::shared_ptr<float[]> buffer)
    : param_(param), state_(item.state), out_begin_(item.out_begin), out_end_(item.out_begin + item.out_numel),
      expected_(item.numel), data_(std::move(buffer)) {}

void Assembly::Apply(int64_t stream_start, int64_t numel, const uint8_t* src, const std::string& where) {
  const auto& copies = param_.copies;
  const plan::Copy& copy = param_.CopyAt(stream_start);
  if (stream_start + numel > copy.stream_start + copy.numel) throw Error("internal: a run crosses two copies");
  float* out = data_.get();  // the item's elements, from joined offset out_begin_
  const int64_t limit = std::min(param_.full_numel, out_end_);  // past the tensor: vocabulary padding
  const int64_t local0 = stream_start - copy.stream_start;
  plan::ForEachJoinedRun(copy, param_.joined_shape, local0, local0 + numel, [&](int64_t local, int64_t joined, int64_t n) {
    if (joined >= limit) {
      if (joined < param_.full_numel) throw Error("internal: a run of '" + param_.name + "' lands past its part");
      return;
    }
    if (joined < out_begin_) throw Error("internal: a run of '" + param_.name + "' lands before its part");
    n = std::min(n, limit - joined);
    const uint8_t* from = src + (local - local0) * 4;
    float* to = out + (joined - out_begin_);
    switch (copy.mode) {
      case plan::CopyMode::Place:
        if (param_.averaged) {
          for (int64_t k = 0; k < n; ++k) {
            float v;
            std::memcpy(&v, from + 4 * k, 4);
            to[k] = 0.0f + v;  // Python's sum() starts from 0: -0.0 becomes +0.0, as in DeepSpeed
          }
        } else {
          std::memcpy(to, from, static_cast<size_t>(n) * 4);
        }
        break;
      case plan::CopyMode::Accumulate:
        for (int64_t k = 0; k < n; ++k) {
          float v;
          std::memcpy(&v, from + 4 * k, 4);
          to[k] += v;
        }
        break;
      case plan::CopyMode::Compare:
        if (std::memcmp(to, from, static_cast<size_t>(n) * 4) != 0) {
          int64_t k = 0;
          while (std::memcmp(to + k, from + 4 * k, 4) == 0) ++k;
          float v;
          std::memcpy(&v, from + 4 * k, 4);
          const plan::Copy& first = copies.front();
          throw Error(where + ": parameter '" + param_.name + "' " + std::string(plan::StateName(state_)) +
                      ": its copy at (pp=" + std::to_string(copy.pp) + ", tp=" + std::to_string(copy.tp) +
                      ") differs from the copy at (pp=" + std::to_string(first.pp) + ", tp=" + std::to_string(first.tp) +
                      ") at element " + std::to_string(joined + k) + ": " + std::to_string(v) + " vs " +
                      std::to_string(to[k]) + " (replicated copies must be identical)");
        }
        break;
      case plan::CopyMode::Observe:
        for (int64_t k = 0; k < n; ++k) {
          float v;
          std::memcpy(&v, from + 4 * k, 4);
          if (std::memcmp(&v, to + k, 4) == 0) continue;
          ++differing_;
          double d = std::fabs(static_cast<double>(v) - static_cast<double>(to[k]));
          if (std::isnan(d)) d = INFINITY;
          if (largest_at_ < 0 || d > largest_difference_) largest_difference_ = d, largest_at_ = joined + k, largest_pp_ = copy.pp;
        }
        break;
    }
  });
  received_ += numel;
}

void Assembly::ApplyInPlace(int64_t stream_start, int64_t numel, const std::function<void(uint8_t*, int64_t, int64_t)>& read) {
  if (!param_.PlacedAsIs(stream_start)) throw Error("internal: '" + param_.name + "' is not placed as it is");
  const plan::Copy& copy = param_.CopyAt(stream_start);
  if (stream_start + numel > copy.stream_start + copy.numel) throw Error("internal: a run crosses two copies");
  const int64_t limit = std::min(param_.full_numel, out_end_), local0 = stream_start - copy.stream_start;
  plan::ForEachJoinedRun(copy, param_.joined_shape, local0, local0 + numel, [&](int64_t local, int64_t joined, int64_t n) {
    if (joined >= limit) {
      if (joined < param_.full_numel) throw Error("internal: a run of '" + param_.name + "' lands past its part");
      return;
    }
    if (joined < out_begin_) throw Error("internal: a run of '" + param_.name + "' lands before its part");
    read(reinterpret_cast<uint8_t*>(data_.get() + (joined - out_begin_)), local - local0, std::min(n, limit - joined));
  });
  received_ += numel;
}

std::shared_ptr<float[]> Assembly::Finish() {
  if (received_ != expected_)
    throw Error("internal: parameter '" + param_.name + "' " + std::string(plan::StateName(state_)) + " received " +
                std::to_string(received_) + " of " + std::to_string(expected_) + " elements");
  if (param_.averaged) {
    const float n = static_cast<float>(param_.accumulated_copies);
    float* out = data_.get();
    for (int64_t k = 0; k < out_end_ - out_begin_; ++k) out[k] /= n;
  }
  return std::move(data_);
}



std::string Assembly::Divergence() const {
  if (differing_ == 0) return "";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", largest_difference_);
  const plan::Copy& first = param_.copies.front();
  // A part of a split item speaks for its rows.
  const int64_t row = param_.RowNumel();
  const std::string rows = out_end_ - out_begin_ == param_.full_numel || row == 0 ? "" :
      " in rows [" + std::to_string(out_begin_ / row) + ", " + std::to_string(out_end_ / row) + ")";
  return "pipeline-replicated parameter '" + param_.name + "' " + std::string(plan::StateName(state_)) + rows + ": " +
         std::to_string(differing_) + " elements of its copies on later stages differ from the first stage's (pp=" +
         std::to_string(first.pp) + "), the largest by " + buf + " (pp=" + std::to_string(largest_pp_) + ", element " +
         std::to_string(largest_at_) + "); the first stage's copy is kept, as DeepSpeed keeps it";
}

}  // namespace ucp::union_
