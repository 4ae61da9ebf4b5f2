// The source driver of Megatron-LM's legacy checkpoints (`--ckpt-format torch`, legacy_folder.h):
// each (TP, PP) rank's model_optim_rng.pt holds its part of the model (one tensor per layer, TP-local)
// with the optimizer's state, and under the distributed optimizer distrib_optim.pt beside it holds the
// fp32 masters and Adam's moments of every parameter of that rank as Megatron's DDP buffers lay them
// out. Every tensor is placed as a box of the global tensor Megatron-Core's torch_dist format saves
// (legacy_names.h: layers stacked), so that the atomic checkpoint of a legacy save equals the one of
// the same state saved as torch_dist, bit for bit.
//
// The optimizer, as model_optim_rng.pt's `optimizer` holds it:
// - FP32Optimizer: torch Adam's state_dict, each position's moments; the fp32 weights are the masters;
// - Float16OptimizerWithFloat16Params (bf16 / fp16 without the distributed optimizer): {optimizer:
//   torch's state_dict, fp32_from_fp16_params: the masters per group, in the group's order};
// - DistributedOptimizer: {optimizer: {param_groups}}, the state in distrib_optim.pt: per grad buffer
//   the buckets' unpadded parts concatenated (each bucket's end padding dropped), the layout rebuilt
//   as formats/dcp/bucket_layout.h rebuilds it and proven by the buffer's recorded size and by the
//   masters against the model's own tensors.
// Positions of torch's state carry no names: each group's positions are matched to the rank's
// parameters in model order, every parameter to the one group whose next position has its shape;
// where two would, the checkpoint is refused (which one holds it cannot be told).
#pragma once

#include <string>

#include "source/source_index.h"

namespace ucp::formats::megatron {

// Throws ucp::Error when `dir` is no legacy folder at all; every other finding goes to the index's
// errors / problems / notes.
source::SourceIndex IndexLegacy(const std::string& dir, const source::IndexOptions& options = {});

// A weights-only save (--no-save-optim: no 'optimizer' in the rank files), which ucp-convert reads as a
// model (formats/driver.h: SourceDriver::weights_only); false for anything else, or unreadable.
bool LegacyWeightsOnly(const std::string& dir);
// Such a save's parameter `param` (IndexLegacy's order) whole, as fp32 (bf16 / fp16 widened exactly),
// each rank's part placed, every record read checked against its CRC-32.
void ReadLegacyParam(const source::SourceIndex& L, int param, float* dst);

}  // namespace ucp::formats::megatron
