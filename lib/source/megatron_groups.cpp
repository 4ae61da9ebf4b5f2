#include "source/megatron_groups.h"

#include <algorithm>

#include "source/megatron_stacking.h"
#include "source/source_index.h"

namespace ucp::source {
namespace {

using pt::Value;

// An option of a group as Megatron's default rule leaves it: absent, or equal to `want`.
bool Is(const Value& group, const char* key, double want) {
  const auto v = group.Get(key);
  if (!v || v->kind == Value::Kind::None) return true;
  if (v->kind == Value::Kind::Bool) return (v->b ? 1.0 : 0.0) == want;
  return v->IsNumber() && v->AsFloat() == want;
}

// The one group of wd_mult `wd`, lr_mult 1, not expert-parallel, no decoupled learning rate; -1 if none or several.
int GroupOf(const std::vector<pt::ValuePtr>& groups, double wd) {
  int found = -1;
  for (size_t g = 0; g < groups.size(); ++g) {
    const Value& group = *groups[g];
    if (!group.Get("wd_mult") || !Is(group, "wd_mult", wd) || !Is(group, "lr_mult", 1) || !Is(group, "is_expert_parallel", 0) ||
        !Is(group, "is_decoupled_lr", 0))
      continue;
    if (found >= 0) return -1;
    found = static_cast<int>(g);
  }
  return found;
}

// The same option in both groups (absent in both, or equal): what a default group takes from the job's config.
bool Same(const Value& a, const Value& b, const char* key) {
  const auto x = a.Get(key), y = b.Get(key);
  if (!x || !y) return !x && !y;
  if (x->kind == Value::Kind::None || y->kind == Value::Kind::None) return x->kind == y->kind;
  return x->IsNumber() && y->IsNumber() && x->AsFloat() == y->AsFloat();
}

// Whether the saved args ask for a grouping other than the default rule's, and which: "" where not.
std::string OtherRule(const pt::Value* args) {
  if (!args) return "";
  if (ArgSet(args, "use_mup")) return "the job's use_mup (MuP's per-parameter learning rates)";
  if (auto opt = args->Get("optimizer"); opt && opt->kind == Value::Kind::Str && opt->s != "adam" && opt->s != "sgd")
    return "the job's optimizer '" + opt->s + "'";
  if (auto cond = args->Get("no_weight_decay_cond_type"); cond && cond->kind == Value::Kind::Str && cond->s != "apply_wd_to_qk_layernorm")
    return "the job's no_weight_decay_cond_type '" + cond->s + "'";
  return "";
}

}  // namespace

MegatronGroups MegatronGroupsOf(const pt::Value* param_groups, const pt::Value* args,
                                const std::vector<std::pair<std::string, std::vector<int64_t>>>& params) {
  MegatronGroups out;
  if (!param_groups || !param_groups->IsSequence() || param_groups->items.size() < 2) return out;
  const auto& groups = param_groups->items;
  for (const auto& g : groups)
    if (!g || g->kind != Value::Kind::Dict) return out;
  const std::string count = std::to_string(groups.size()) + " param groups";
  const std::string unassigned = "; Megatron-Core does not save which parameter is in which, so every atomic parameter records "
                                 "group 0: --format mcore and --format hf are as the job had them (Megatron rebuilds its groups), "
                                 "--format dcp, which writes each group's parameters, refuses";
  const int decayed = GroupOf(groups, 1), kept = GroupOf(groups, 0);
  if (groups.size() != 2 || decayed < 0 || kept < 0 || !Same(*groups[0], *groups[1], "max_lr") || !Same(*groups[0], *groups[1], "min_lr")) {
    out.note = count + " kept as saved, not Megatron-Core's default pair (wd_mult 1 and 0, lr_mult 1, the same max_lr and min_lr, "
               "no expert-parallel or decoupled learning rate)" + unassigned;
    return out;
  }
  if (const std::string other = OtherRule(args); !other.empty()) {
    out.note = count + " kept as saved, built by " + other + ", not by Megatron-Core's default rule" + unassigned;
    return out;
  }
  // --no-weight-decay-cond-type apply_wd_to_qk_layernorm: Megatron-LM's validate_args turns it into this flag.
  const bool qk_decayed = ArgSet(args, "apply_wd_to_qk_layernorm") ||
                          (args && args->Get("no_weight_decay_cond_type") && args->Get("no_weight_decay_cond_type")->kind == Value::Kind::Str);
  int none_decayed = 0;
  for (const auto& [name, shape] : params) {
    const auto stacked = static_cast<size_t>(StackedDims(name));
    const bool bias = name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    const bool qk_norm = name.find("q_layernorm.") != std::string::npos || name.find("k_layernorm.") != std::string::npos;
    const bool no_decay = (bias || shape.size() - std::min(stacked, shape.size()) == 1) && !(qk_decayed && qk_norm);
    out.group_of[name] = no_decay ? kept : decayed;
    none_decayed += no_decay;
  }
  out.note = count + " kept as saved, each parameter in the one Megatron-Core's default rule gives it, as Megatron rebuilds "
             "them at every launch (the torch_dist form saves no parameter's group): the biases and one-dimensional parameters" +
             std::string(qk_decayed ? " but the q and k layernorms (the job's apply_wd_to_qk_layernorm)" : "") + " (" +
             std::to_string(none_decayed) + " of " + std::to_string(params.size()) + ") in group " + std::to_string(kept) +
             " (wd_mult 0), the others in group " + std::to_string(decayed) + " (wd_mult 1)";
  return out;
}

}  // namespace ucp::source
