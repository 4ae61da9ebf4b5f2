// Union + StripPad for one (parameter, state): the atomic tensor being assembled from the runs of
// its stream as they arrive. Each run lands where its copy's pattern puts it in the joined tensor
// (Shard-V / Shard-H / Shard-NC blocks), runs in vocabulary padding rows are dropped, Replicate and
// tied copies are compared with what is already there, Partial copies are summed then averaged.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "plan/convert_plan.h"

namespace ucp::union_ {

class Assembly {
 public:
  Assembly(const plan::ParamPlan& param, plan::State state);

  // Stream elements [stream_start, +numel) of this parameter, as float32 bytes. `where` names the
  // source file and rank coordinates for errors. Runs must arrive in stream order.
  void Apply(int64_t stream_start, int64_t numel, const uint8_t* src, const std::string& where);
  // Checks that every element arrived and returns the tensor (full_shape, float32).
  std::shared_ptr<float[]> Finish();

  const plan::ParamPlan& param() const { return param_; }
  plan::State state() const { return state_; }

 private:
  const plan::ParamPlan& param_;
  plan::State state_;
  std::shared_ptr<float[]> data_;
  int64_t received_ = 0;  // stream elements applied
};

}  // namespace ucp::union_
