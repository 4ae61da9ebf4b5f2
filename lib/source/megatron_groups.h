// Which of Megatron-Core's optimizer param groups each parameter is in. Megatron saves the groups'
// options without their `params` and rebuilds the groups on load from its configuration
// (`get_standard_config_overrides`, `_get_param_groups`): a parameter whose name ends in ".bias" or
// that is one-dimensional in its layer (the norms) goes to the group of wd_mult 0, every other to the
// group of wd_mult 1, both of lr_mult 1, neither expert-parallel nor of a decoupled learning rate; with
// the job's `apply_wd_to_qk_layernorm` (--no-weight-decay-cond-type apply_wd_to_qk_layernorm) the q
// and k layernorms stay in the group of wd_mult 1. A target of another family (torch's AdamW in a DCP)
// takes the groups as written, so who is in which is written out from that rule.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "pt/value.h"

namespace ucp::source {

struct MegatronGroups {
  std::map<std::string, int> group_of;  // parameter -> its group; empty where the rule does not apply
  std::string note;                     // what was assigned, or why not
};

// `params`: each model tensor's key and global shape (decoder.layers.* stacked on dimension 0).
// `param_groups`: common.pt's optimizer.param_groups (nullptr: none); `args`: Megatron-LM's saved args
// (nullptr: none). With one group, or groups or args the rule does not describe (expert-parallel,
// decoupled or scaled learning rates, MuP, Muon), nothing is assigned and the note says so.
MegatronGroups MegatronGroupsOf(const pt::Value* param_groups, const pt::Value* args,
                                const std::vector<std::pair<std::string, std::vector<int64_t>>>& params);

// The key of the atomic checkpoint's zero/optimizer_state.pt that records a ChainedOptimizer's group
// counts, in order (Megatron-LM's dense and expert optimizers at EP > 1), which --format mcore writes again.
inline constexpr const char* kMegatronChained = "megatron_chained";

}  // namespace ucp::source
