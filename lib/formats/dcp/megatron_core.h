// Megatron-Core's `torch_dist` checkpoints: a DCP whose keys are Megatron's sharded keys, written by
// `dist_checkpointing.save`, with metadata.json (the backends) and common.pt (what is not sharded:
// iteration, args, the optimizer's param groups and common step, the scheduler).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pt/value.h"
#include "source/source_index.h"

namespace ucp::formats::dcp {

struct MegatronCore {
  std::string backend;            // metadata.json: "torch_dist ..., common torch ..."
  int64_t iteration = 0;          // common.pt `iteration`, else 0
  bool has_iteration = false;
  pt::ValuePtr param_groups;      // common.pt `optimizer.param_groups` as saved (Megatron drops their `params`); a chain's, joined
  std::vector<pt::ValuePtr> steps;  // common.pt `optimizer.state.common_step`, the step every parameter
                                    // shares; else each param group's `step` (the distributed optimizer's)
  std::string optimizer_form = "per-parameter state";  // or "DistributedOptimizer, fully_reshardable" / "..., dp_reshardable"
  // A ChainedOptimizer (Megatron-LM's dense and expert optimizers at EP > 1): how many of param_groups
  // each holds, in order; empty for one optimizer.
  std::vector<int64_t> chained;
  // The distributed optimizer's dp_reshardable form: param groups and step are saved per model-parallel
  // domain inside the DCP (optimizer.distributed.dp_group_idx_<G>.optimizer, after chained_<i>. in a
  // chain), not in common.pt; `chained` is then counted from them.
  bool bucket_flat = false;
  int chain_parts = 0;  // in that form, the chain's optimizers common.pt holds (0: one optimizer, no chain)
  std::vector<std::string> common_keys;  // common.pt's top-level keys, for the notes
  pt::ValuePtr args;              // common.pt `args` (Megatron-LM's argparse.Namespace), or nullptr
  // common.pt, carried into the atomic checkpoint (the Hugging Face export reads its args): its zip
  // records, whose CRC-32s the copy checks
  source::ShardFile file;
};

// Whether `dir` holds a metadata.json: Megatron-Core's dist_checkpointing writes one, torch's DCP writer none.
bool IsMegatronCore(const std::string& dir);

// metadata.json and common.pt (its CRC-32s checked). Throws ucp::Error naming the file for a backend
// other than torch_dist, a missing common.pt (Megatron-Core 0.19 keeps the common state inside the
// DCP: not read yet) or a malformed one.
MegatronCore ReadMegatronCore(const std::string& dir);

// What a Megatron-Core key is: `optimizer.state.<state>.<key>` (exp_avg, exp_avg_sq; fp32_param, or
// `param` from the distributed optimizer: the fp32 master copy) is state `state` of parameter `key`;
// `optimizer.distributed.*` (`chained_<i>.optimizer.distributed.*` in a chain) is the distributed
// optimizer's bucket-flat dp_reshardable state; another `optimizer.*` tensor is Unread (a
// form not known here: refused, never taken for a model tensor); any other tensor key is the model's.
struct MegatronKey {
  enum { Model, OptimizerState, BucketFlat, Unread, Other } kind = Other;
  std::string fqn, state;
};
MegatronKey MegatronKeyOf(const std::string& key, bool tensor);

}  // namespace ucp::formats::dcp
