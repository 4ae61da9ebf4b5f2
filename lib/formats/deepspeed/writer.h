// The DeepSpeed target driver's writer: the shard files of one unit of a reshard plan, as
// DeepSpeed's engine writes them for the target layout. Under ZeRO-3 a unit is one (model-parallel,
// DP) rank: its model-states and optimizer files. Otherwise it is one model-parallel rank: the
// optimizer file of every DP rank (ZeRO-1/2 flat partitions with DeepSpeed's alignment padding, or
// the BF16 optimizer's), the pipeline's layer files or a plain module, and the model-states file.
#pragma once

#include <cstdint>
#include <string>

#include "core/buffer_pool.h"
#include "layout/reshard_plan.h"

namespace ucp::deepspeed {

// Writes the unit's files into `dir`, each without an fsync of its own (the caller syncs the file
// system once before `latest` names the folder). The values come from `slices`, in the order the
// files need them, a few MiB at a time. `arena` holds the unit's training-dtype weights; the caller
// keeps it from unit to unit, so that its pages are faulted in once per run.
reshard::UnitFiles WriteUnit(const reshard::Source& S, const reshard::TargetLayout& T, const reshard::Plan& P,
                    const reshard::Unit& U, reshard::SliceSource& slices, const std::string& dir, ScratchBytes& arena);

}  // namespace ucp::deepspeed
