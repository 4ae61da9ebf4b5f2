// The Megatron-Core target (ucp-reshard ATOMIC -o ROOT --format mcore --tp T --pp P [--dp D]): an
// atomic checkpoint of a Megatron-Core GPT / Llama model as the files Megatron-LM's save_checkpoint
// writes with --ckpt-format torch_dist, so that the job's ordinary --load resumes it at that layout:
//   ROOT/iter_NNNNNNN/__<rank>_0.distcp  each rank's chunks (rank t + T * (d + D * p), DP rank 0's:
//                                        every value saved once), layers stacked on a leading axis,
//                                        each layer and each TP piece a chunk, as the model's
//                                        sharded_state_dict cuts them (legacy_names.h's table)
//   ROOT/iter_NNNNNNN/common.pt          the source's common state (args at the new layout, iteration,
//                                        the scheduler) with the optimizer's param groups and step
//   ROOT/iter_NNNNNNN/metadata.json, .metadata
//   ROOT/latest_checkpointed_iteration.txt  last: the commit point
// The model keys in the job's dtype, the optimizer's state in fp32 in the form the job's optimizer
// loads at any TP / PP: the distributed optimizer's `fully_reshardable` (optimizer.state.param /
// exp_avg / exp_avg_sq.<key>), the mixed-precision optimizer's (optimizer.state.fp32_param / ...), or
// FP32Optimizer's (optimizer.state.exp_avg / exp_avg_sq). No RNG state travels (args.no_save_rng:
// Megatron-LM then keeps its own). A model under another family's names (Megatron-DeepSpeed, a Hugging
// Face import, torchtitan; mcore_keys.h re-joins its tensors) has args from its facts; a DeepSpeed
// checkpoint's optimizer travels with it (mcore_cross_optimizer.h), else it is written as Megatron-LM's
// release checkpoint (ROOT/release/, the tracker 'release'): the model alone.
#pragma once

#include <string>

#include "layout/export_plan.h"
#include "layout/reshard_plan.h"
#include "source/source_index.h"

namespace ucp::formats::megatron {

reshard::ExportPlan PlanMcore(const reshard::Source& S, const reshard::ExportOptions& options);

// File `f` of the plan at `path` (its iteration folder made first).
void WriteMcoreFile(const reshard::ExportPlan& P, size_t f, reshard::RowSource& rows, const std::string& path);

// A source refused before any conversion: names of no family --format mcore writes, a layout its facts do
// not divide, optimizer state that cannot travel (torchtitan's) without --weights-only.
void CheckMcoreSource(const source::SourceIndex& L, const reshard::ExportOptions& options);

}  // namespace ucp::formats::megatron
