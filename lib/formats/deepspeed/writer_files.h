// The files of one unit, a kind a file; writer.cpp writes a unit by calling them in turn.
//   writer_zero.cpp             ZeRO-1/2 and the BF16 optimizer: a DP rank's flat partitions
//   writer_zero3.cpp            ZeRO-3: a DP rank's sub-groups and their optimizer file
//   writer_torch_optimizer.cpp  without ZeRO: the model's torch optimizer state (expp_rank files)
//   writer_experts.cpp          Mixture of Experts: expert files, expp_rank files under ZeRO
//   writer_module.cpp           the model's weights: layer files, a plain module, ZeRO-3's placeholders
//   writer_model_states.cpp     the model-states file
#pragma once

#include <string>
#include <vector>

#include "formats/deepspeed/writer_unit.h"
#include "pt/value.h"

namespace ucp::deepspeed {

// ZeRO-1/2 (or the BF16 optimizer): DP rank d's optimizer file; fills the training-dtype weights
// from the fp32 weights on the way.
void WriteZeroOptimizerFile(const TargetUnit& u, UnitWeights& weights, ShardFiles& files, int d);

// ZeRO-3 cuts each param group into sub-groups of about sub_group_size partition elements, a flat
// partition and an optimizer state each, numbered across the groups (stage3.py's
// _create_fp16_sub_groups: parameters are added until the sum of their partitions reaches the
// size; a group whose partitions sum to no more is one sub-group).
struct SubGroup {
  int group;
  std::vector<int> members;  // unit param indices, in the group's order
};
std::vector<SubGroup> Zero3SubGroups(const TargetUnit& u);
// ZeRO-3: the unit's DP rank's optimizer file.
void WriteZero3OptimizerFile(const TargetUnit& u, UnitWeights& weights, ShardFiles& files);

// Without ZeRO: the model's torch optimizer state (TargetUnit::TorchOptimizer), the weights read
// whole first. Returns the state the model-states file holds too.
pt::ValuePtr WriteTorchOptimizerFiles(const TargetUnit& u, UnitWeights& weights, ShardFiles& files);

// Mixture of Experts: the expert files this unit's TP rank saves, and their expp_rank files.
void WriteExpertFiles(const TargetUnit& u, const UnitWeights& weights, ShardFiles& files);

// A pipeline's layer files: each layer spec's weights in the training dtype.
void WriteLayerFiles(const TargetUnit& u, const UnitWeights& weights, ShardFiles& files);
// A model that is not a PipelineModule: its state_dict, this TP rank's weights in the training
// dtype under GPTModel's names, in the model's order (embedding, layers, final norm).
pt::ValuePtr PlainModule(const TargetUnit& u, const UnitWeights& weights);
// DeepSpeed saves module.state_dict() under ZeRO-3 too: GPTModel's flat names, every parameter
// an empty placeholder of the training dtype (the weights are in the optimizer files).
pt::ValuePtr Zero3Module(const TargetUnit& u);

// The model-states file `name`: the source's, its module `module` (None for a pipeline's), its
// records made the target's; `torch_optimizer` the state WriteTorchOptimizerFiles returned, or null.
void WriteModelStatesFile(const TargetUnit& u, ShardFiles& files, const std::string& name, pt::ValuePtr module,
                          const pt::ValuePtr& torch_optimizer);

}  // namespace ucp::deepspeed
