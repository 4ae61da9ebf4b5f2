// Union + StripPad for one (parameter, state): the atomic tensor being assembled from the runs of
// its stream as they arrive. Each run lands where its copy's pattern puts it in the joined tensor
// (Shard-V / Shard-H / Shard-NC blocks), runs in vocabulary padding rows are dropped, Replicate copies
// are compared with what is already there, // tied copies on later stages are measured against the first stage's (a note, as DeepSpeed
// keeps the first stage's), Partial copies are summed then averaged.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "plan/convert_plan.h"

namespace ucp::union_ {

class Assembly {
 public:
  // The item (a whole parameter state, or a part of one: ConvertPlan's Item) of `param`. `buffer`
  // holds at least its out_numel floats; its contents are overwritten (every element arrives exactly
  // once), so a reused buffer needs no clearing.
  Assembly(const plan::ParamPlan& param, const plan::Item& item, std::shared_ptr<float[]> buffer);

  // Stream elements [stream_start, +numel) of this parameter, as float32 bytes. `where` names the
  // source file and rank coordinates for errors. Runs must arrive in stream order.
  void Apply(int64_t stream_start, int64_t numel, const uint8_t* src, const std::string& where);
  // The same for a run of a copy placed as it is (ParamPlan::PlacedAsIs), with no bytes in hand:
  // read(dst, offset, n) stores the run's elements [offset, +n) as float32 bytes at dst, which is
  // their place in the atomic tensor, so they are moved once. Vocabulary padding is not read.
  // May come before the runs of other copies that precede it in the stream.
  void ApplyInPlace(int64_t stream_start, int64_t numel, const std::function<void(uint8_t*, int64_t, int64_t)>& read);
  // Checks that every element arrived and returns the tensor (full_shape, float32; a part: its rows).
  std::shared_ptr<float[]> Finish();

  // Observe copies (a tied parameter's copies on later stages) that differ from the first stage's:
  // a note naming the parameter, the state and the largest difference; empty when they agree.
  std::string Divergence() const;

  const plan::ParamPlan& param() const { return param_; }
  plan::State state() const { return state_; }

 private:
  const plan::ParamPlan& param_;
  plan::State state_;
  int64_t out_begin_, out_end_, expected_;  // the item's elements of the atomic tensor; its stream elements
  std::shared_ptr<float[]> data_;
  int64_t received_ = 0;  // stream elements applied
  int64_t differing_ = 0;  // Observe copies' elements unequal to the placed ones
  double largest_difference_ = 0;
  int64_t largest_at_ = -1;
  int largest_pp_ = -1;
};

}  // namespace ucp::union_
