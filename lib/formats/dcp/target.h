// The DCP target (ucp-reshard --format dcp --mesh dp=N | tp=M | dp=N,tp=M): an atomic checkpoint of a Llama-shaped
// model as the files torch.distributed.checkpoint.save writes for torchtitan's Llama on that mesh,
// `{"model": ..., "optim": ...}` as get_state_dict gives them:
//   model.<fqn>                                   each rank's box of the weight (mesh.h)
//   optim.state.<fqn>.step / exp_avg / exp_avg_sq  the step a 0-d float32 tensor, written once
//   optim.param_groups.<g>.<option>               bytes items (torch.save of the value), written once;
//                                                 `params` the group's fqns
// __<rank>_0.distcp holds each rank's items (bytes items first, then tensors, in the state dict's
// order), each a complete torch.save file; a replicated item goes to the rank DCP's planner gives it
// (dedup_save_plans: the rank with the fewest bytes so far, rank 0's items counted first). The
// names and rows come from the Hugging Face target's translation (formats/hf/names.h: Megatron's
// fused QKV and [gate; up] cut by the checkpoint's sub-parameter sizes; Megatron's rotate-half q
// and k rows re-ordered to torchtitan's interleaved pairs; torchtitan's names as they are), so a
// model it refuses (LayerNorm, learned positions, ...) is refused here too, and so are biases and a
// tied output layer, which torchtitan's Llama does not have. `.metadata` is written last (the commit
// point).
#pragma once

#include <string>

#include "layout/export_plan.h"
#include "layout/reshard_plan.h"

namespace ucp::formats::dcp {

reshard::ExportPlan PlanDcp(const reshard::Source& S, const reshard::ExportOptions& options);

// A source checkpoint refused before any conversion is made for it: one whose parameters carry Hugging
// Face's own names (a Trainer or Accelerate job's), which the translation does not read yet.
void CheckDcpSource(const source::SourceIndex& L, const reshard::ExportOptions& options);
// --mesh parsed (mesh.h) before anything is read: a malformed one is a bad command line.
void CheckDcpOptions(const reshard::ExportOptions& options);

// File `f` of the plan at `path`: each item's torch.save file in turn, a chunk's values read from
// `rows` by whole rows (whole heads where rows are re-ordered), its columns cut from them.
void WriteDcpFile(const reshard::ExportPlan& P, size_t f, reshard::RowSource& rows, const std::string& path);

}  // namespace ucp::formats::dcp
