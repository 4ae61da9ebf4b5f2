// The ZeRO and BF16 optimizers' files of a DeepSpeed checkpoint: each (pp, tp, dp) rank's flat
// partitions of the param groups (fp32 masters, Adam's moments), and every parameter's fragments in
// them, from param_slice_mappings (ZeRO-1/2, the BF16 optimizer) or ZeRO-3's even split.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <tuple>

#include "formats/deepspeed/model_states.h"

namespace ucp::deepspeed {

// What the optimizer files say beyond their fragments.
struct ZeroPartitions {
  std::set<int> stages_seen;                                // the ZeRO stage of each file
  std::set<int> expert_groups;                              // the param groups that hold experts
  std::map<std::tuple<int, int, int>, int64_t> partitions;  // (pp, tp, group) -> flat partition size
};

// Every ZeRO or BF16 optimizer file: L.optimizer and L.zero_stage, each file's flat groups and
// steps, the partition counts checked (and from an expert group's, the expert-parallel degree),
// every parameter's fragments, the ZeRO padding.
ZeroPartitions IndexZeroFiles(source::SourceIndex& L, const SaveVariant& save, const ParamIndex& index,
                              GroupParams& group_params, const MoeShapes& moe_shapes, const ParseFile& parse);

// After every optimizer file: files that disagree on the ZeRO stage; the BF16 optimizer's stage; the
// optimizer a save without optimizer files had.
void SettleZeroStage(source::SourceIndex& L, const ZeroPartitions& zero, int config_stage, bool zero3_files);

}  // namespace ucp::deepspeed
