// The DeepSpeed / Megatron-DeepSpeed source driver: indexes a checkpoint folder as DeepSpeed's
// engine wrote it. Which shard files exist at which (pp, tp, dp) coordinates, the layout they were
// written with (from metadata, cross-checked with the files present), every parameter's per-TP-rank
// shape, and where each optimizer file keeps its flat groups. Reads pickles only; tensor bytes stay
// unread in the mapped files.
#pragma once

#include <string>
#include <vector>

#include "formats/deepspeed/names.h"
#include "pt/torch_file.h"
#include "source/source_index.h"

namespace ucp::deepspeed {

// The flat fp32 tensors of one param group in an optimizer file: the master weights and Adam's
// moments, all with the same element layout, plus the group's step.
struct FlatGroup {
  pt::TensorView fp32, exp_avg, exp_avg_sq;
  pt::ValuePtr step;  // 0-dim tensor or number; nullptr when absent
};
// Where ZeRO-1/2 (single_partition_of_fp32_groups + base_optimizer_state) or ZeRO-3
// (fp32_flat_groups + optimizer_state_dict) keep them. Throws ucp::Error naming the missing key.
std::vector<FlatGroup> FlatGroupsOf(const pt::Value& file_root, int zero_stage);

// Throws ucp::Error when `dir` is not a DeepSpeed checkpoint at all; everything else is recorded in
// errors / problems so that one run reports all of it.
source::SourceIndex IndexCheckpoint(const std::string& dir, const source::IndexOptions& options = {});

// Is `dir` (or dir/<latest>) a DeepSpeed checkpoint folder?
bool LooksLikeCheckpoint(const std::string& dir);

}  // namespace ucp::deepspeed
