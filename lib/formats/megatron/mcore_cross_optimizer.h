// The optimizer of a Megatron-DeepSpeed run (a DeepSpeed checkpoint) as Megatron-LM's job keeps it, for
// --format mcore: the Adam state travels by key as the weights do (mcore_keys.h's segments, state 1 and 2);
// this file gives what common.pt says of it.
// - Param groups as Megatron-Core's _get_param_groups builds them for a dense GPT: the default group
//   (wd_mult 1.0), then the one without weight decay (wd_mult 0.0: biases and 1-D tensors), each with the
//   Adam options of the source's group its parameters were in (Megatron's own keys written as its job's).
//   Refused where the source decayed a parameter Megatron-LM's job would not (or the reverse), or trained
//   its groups at different learning rates or multipliers.
// - The scheduler: Megatron's OptimizerParamScheduler state where the source's engine ran it (a
//   Megatron-DeepSpeed job's lr_scheduler) by steps, carried as it is; else (DeepSpeed's own schedulers,
//   Megatron-DeepSpeed's by tokens, which Megatron-LM has not) the samples consumed (num_steps, what
//   Megatron-LM's scheduler counts) and no schedule, which the job's flags give (--override-opt_param-scheduler),
//   said in a note.
// - The iteration and the samples consumed, from the source's records.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/megatron/mcore_keys.h"
#include "layout/reshard_plan.h"
#include "pt/value.h"

namespace ucp::formats::megatron {

struct CrossOptimizer {
  pt::ValuePtr groups;                   // Megatron's param groups: options, no params, no step
  pt::ValuePtr common;                   // checkpoint_version, iteration, opt_param_scheduler (CommonFile's source state)
  int64_t iteration = 0, consumed_samples = 0, consumed_valid_samples = 0;
  double weight_decay = 0;               // the decayed parameters' (the job's --weight-decay)
  bool schedule_carried = false;         // the source ran Megatron's scheduler, by steps
  std::vector<std::string> notes;
};

// Throws ucp::Error naming the parameter and group where the groups cannot be Megatron-LM's, or the
// iteration where the source trained none (Megatron-LM loads iteration 0 only as a release checkpoint).
// `groups`: the source's param groups (zero/optimizer_state.pt's, each a dict).
CrossOptimizer DeepSpeedOptimizerForMcore(const reshard::Source& S, const std::vector<pt::ValuePtr>& groups, const std::vector<McoreKey>& keys);

}  // namespace ucp::formats::megatron
