// What DeepSpeed's optimizer files share, whichever optimizer wrote them: the source job's
// ds_config and DeepSpeed version made the target's, torch's optimizer.state_dict() with the
// source's param_groups, Adam's state over a flat tensor, loss scaling and gradient clipping, and
// the root every ZeRO and BF16 optimizer file has.
#pragma once

#include <cstdint>
#include <vector>

#include "formats/deepspeed/writer_unit.h"
#include "pt/value.h"

namespace ucp::deepspeed {

// The source's ds_config (a Mixture-of-Experts model-states file has none: the atomic
// checkpoint's optimizer state keeps its optimizer files' one), with the target's stage and dtype.
pt::ValuePtr DsConfig(const TargetUnit& u);
pt::ValuePtr DsVersion(const TargetUnit& u);
// The source optimizer's `key`, or `fallback` where it kept none.
pt::ValuePtr SourceOr(const TargetUnit& u, const char* key, pt::ValuePtr fallback);

// The source's param_groups, each listing `positions[g]` (a flat group's one tensor: [g]); under
// Mixture of Experts each expert group named after the target's expert-parallel degree, as
// DeepSpeed names it ('ep_size_<ep>').
pt::ValuePtr ParamGroups(const TargetUnit& u, const std::vector<std::vector<int64_t>>& positions);
// torch's optimizer.state_dict(): the per-group state and the source's param_groups, each listing
// its flat tensors' positions (one per group: [g]; ZeRO-3: its sub-groups').
pt::ValuePtr TorchOptimizerState(const TargetUnit& u, pt::ValuePtr state, std::vector<std::vector<int64_t>> positions = {});
// Group g's Adam state over a flat tensor of `len` elements: the step and the two moments.
pt::ValuePtr AdamState(UnitWeights& weights, int g, std::vector<Segment> segs, int64_t len);

// The fp16 / ZeRO optimizers' loss scaling: the scaler the dtype needs, and the source's overflow flag.
void PutLossScaling(const TargetUnit& u, pt::Value& osd);
// The gradient clipping the job's ds_config sets (DeepSpeed's ZeRO and BF16 optimizers keep it as
// clip_grad, and restore it from their files), for a source whose optimizer kept none (without
// ZeRO, the model's torch optimizer clips nothing itself); 0.0, DeepSpeed's default, if unset.
pt::ValuePtr ConfiguredClipping(const TargetUnit& u);
pt::ValuePtr ZeroStage(const TargetUnit& u);

// DeepSpeed's engine saves {optimizer_state_dict, ds_config, ds_version} per DP rank.
void WriteOptimizerRoot(const TargetUnit& u, ShardFiles& files, int d, pt::ValuePtr osd);

}  // namespace ucp::deepspeed
