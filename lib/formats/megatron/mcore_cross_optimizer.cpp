#include "formats/megatron/mcore_cross_optimizer.h"

#include <map>
#include <set>
#include <utility>

#include "core/error.h"
#include "formats/megatron/mcore_args.h"
#include "source/source_index.h"

namespace ucp::formats::megatron {
using pt::Value;
using pt::ValuePtr;

namespace {

// Megatron-Core's default rule (get_standard_config_overrides): no weight decay on biases and 1-D tensors
// (per layer: the stacked keys' shape is a layer's). 0: the default group, 1: the one without.
int MegatronGroupOf(const McoreKey& k) { return k.key.ends_with(".bias") || k.shape.size() == 1 ? 1 : 0; }

// The source group's options a Megatron group keeps: its Adam options. Not its members or step, not
// DeepSpeed's and Megatron-DeepSpeed's own keys (its name, the experts' flag), and not the keys Megatron's
// job sets for its groups (the multipliers, the bounds, the flags), which ucp writes as the job's.
bool Kept(const std::string& key) {
  for (const char* k : {"params", "step", "name", "moe", "wd_mult", "lr_mult", "max_lr", "min_lr", "is_decoupled_lr", "is_expert_parallel",
                        "default_config"})
    if (key == k) return false;
  return true;
}

double Option(const Value& group, const char* key, double otherwise) {
  auto v = group.Get(key);
  return v && v->IsNumber() ? v->AsFloat() : otherwise;
}

// A key of Megatron's OptimizerParamScheduler state, under its name or an older one its load_state_dict reads.
ValuePtr ScheduleKey(const Value& v, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (auto x = v.Get(n)) return x;
  return nullptr;
}

// Whether Megatron's OptimizerParamScheduler saved `v`: every value Megatron-LM's load_state_dict reads.
bool MegatronSchedule(const Value* v) {
  if (!v || v->kind != Value::Kind::Dict) return false;
  return ScheduleKey(*v, {"start_lr", "max_lr"}) && v->Get("min_lr") && ScheduleKey(*v, {"warmup_iter", "warmup_steps", "lr_warmup_steps"}) &&
         ScheduleKey(*v, {"end_iter", "decay_steps", "lr_decay_steps"}) && ScheduleKey(*v, {"decay_style", "lr_decay_style"}) &&
         ScheduleKey(*v, {"num_iters", "num_steps"});
}

// Megatron-DeepSpeed's schedule by tokens (lr_warmup_tokens, lr_decay_tokens), which Megatron-LM's has not:
// the key that sets it, or null.
const char* TokenSchedule(const Value& v) {
  for (const char* k : {"lr_decay_tokens", "lr_warmup_tokens"})
    if (auto x = v.Get(k); x && x->kind != Value::Kind::None && !(x->IsNumber() && x->AsFloat() == 0)) return k;
  return nullptr;
}

}  // namespace

CrossOptimizer DeepSpeedOptimizerForMcore(const reshard::Source& S, const std::vector<ValuePtr>& groups, const std::vector<McoreKey>& keys) {
  const std::string dir = S.reader->dir();
  const auto remedy = std::string("; --weights-only writes the model alone (Megatron-LM then starts a fresh optimizer)");

  // The decay each source group applied: by its wd_mult (Megatron-DeepSpeed's groups), else its weight_decay.
  auto decays = [&](const Value& g) {
    if (auto w = g.Get("wd_mult"); w && w->IsNumber()) return w->AsFloat() != 0.0;
    return Option(g, "weight_decay", 0.0) != 0.0;
  };
  // Which of Megatron's groups each source group's parameters go to, a parameter of each for messages. A group
  // that decays nothing may go to both (the job decays none of them either: --weight-decay 0).
  std::map<int, std::set<int>> target;
  std::map<std::pair<int, int>, std::string> example;
  for (const McoreKey& k : keys)
    for (const auto& layer : k.layers)
      for (const Segment& s : layer) {
        const reshard::Atom& a = S.atoms.at(static_cast<size_t>(s.rows.atom));
        if (a.group < 0 || static_cast<size_t>(a.group) >= groups.size())
          throw Error(dir + ": parameter '" + a.name + "' is in param group " + std::to_string(a.group) + ", and zero/optimizer_state.pt "
                      "holds " + std::to_string(groups.size()));
        const int m = MegatronGroupOf(k);
        target[a.group].insert(m);
        example.emplace(std::make_pair(a.group, m), "'" + a.name + "' (Megatron-Core's " + k.key + ")");
      }
  bool any_decay = false;
  for (const auto& [g, ms] : target) any_decay = any_decay || decays(*groups[static_cast<size_t>(g)]);
  auto decay_words = [&](const Value& group) {
    auto w = group.Get("wd_mult");
    return w && w->IsNumber() ? "wd_mult " + FormatNumber(w->AsFloat()) : "weight_decay " + FormatNumber(Option(group, "weight_decay", 0.0));
  };
  for (const auto& [g, ms] : target) {
    const Value& group = *groups[static_cast<size_t>(g)];
    const std::string G = "the source's param group " + std::to_string(g);
    if (auto w = group.Get("wd_mult"); w && w->IsNumber() && w->AsFloat() != 0.0 && w->AsFloat() != 1.0)
      throw Error(dir + ": " + G + " has wd_mult " + FormatNumber(w->AsFloat()) + ": Megatron-LM's default groups decay by 1 or 0" + remedy);
    if (auto l = group.Get("lr_mult"); l && l->IsNumber() && l->AsFloat() != 1.0)
      throw Error(dir + ": " + G + " has lr_mult " + FormatNumber(l->AsFloat()) +
                  ": Megatron-LM's default groups train at the schedule's rate (lr_mult 1)" + remedy);
    for (int m : ms)
      if (any_decay && decays(group) != (m == 0))
        throw Error(dir + ": parameter " + example.at({g, m}) + " is in " + G + " (" + decay_words(group) + "), and Megatron-LM's job "
                    "puts it in its group " + (m == 0 ? "with weight decay" : "without weight decay (biases and 1-D tensors)") +
                    ": its decay would change" + remedy);
    if (auto a = groups[static_cast<size_t>(target.begin()->first)]->Get("lr"), b = group.Get("lr"); !a || !b || !pt::SameValue(*a, *b))
      throw Error(dir + ": the source's param groups " + std::to_string(target.begin()->first) + " and " + std::to_string(g) +
                  (a && b ? " train at different learning rates" : std::string(" do not both record a learning rate (lr)")) +
                  ": Megatron-LM's default groups share the schedule's" + remedy);
  }

  CrossOptimizer out;
  const Value* states = S.model_states.root.get();
  const ValuePtr schedule = states ? states->Get("lr_scheduler") : nullptr;
  const char* by_tokens = MegatronSchedule(schedule.get()) ? TokenSchedule(*schedule) : nullptr;
  out.schedule_carried = MegatronSchedule(schedule.get()) && !by_tokens;

  // Megatron's groups, in _get_param_groups' order: the default first, then the override (wd_mult 0).
  out.groups = Value::Make(Value::Kind::List);
  for (int m = 0; m < 2; ++m) {
    const Value* options = nullptr;
    int from = -1;
    for (const auto& [g, ms] : target) {
      if (!ms.count(m)) continue;
      const Value& group = *groups[static_cast<size_t>(g)];
      if (options && !reshard::SameGroupOptions(*options, group, [](const std::string& k) { return !Kept(k); }))
        throw Error(dir + ": the source's param groups " + std::to_string(from) + " and " + std::to_string(g) + " hold options that differ, "
                    "and Megatron-LM's job puts their parameters (" + example.at({from, m}) + ", " + example.at({g, m}) + ") in one group" +
                    remedy);
      if (!options) options = &group, from = g;
    }
    if (!options) continue;
    if (m == 0 && decays(*options)) out.weight_decay = Option(*options, "weight_decay", 0.0);
    auto group = Value::Make(Value::Kind::Dict);
    pt::SetItem(*group, "is_expert_parallel", Value::Bool(false));
    pt::SetItem(*group, "default_config", Value::Bool(true));
    pt::SetItem(*group, "wd_mult", Value::Float(m == 0 ? 1.0 : 0.0));
    pt::SetItem(*group, "lr_mult", Value::Float(1.0));
    pt::SetItem(*group, "is_decoupled_lr", Value::Bool(false));
    if (out.schedule_carried) {  // the bounds Megatron keeps per group: the schedule's
      pt::SetItem(*group, "max_lr", ScheduleKey(*schedule, {"max_lr", "start_lr"}));
      pt::SetItem(*group, "min_lr", schedule->Get("min_lr"));
    }
    for (const auto& kv : options->AsDict().items())
      if (kv.key->kind == Value::Kind::Str && Kept(kv.key->s)) group->dict.Set(kv.key, kv.value);
    // torch's Adam always corrects its moments' bias and keeps no flag for it; the FusedAdam of Megatron-LM's
    // GPU job (Transformer Engine's, Apex's) reads bias_correction from each group, which replaces its own on load
    if (!group->Get("bias_correction")) pt::SetItem(*group, "bias_correction", Value::Bool(true));
    out.groups->items.push_back(group);
  }

  // The iteration and the samples the run consumed: Megatron-DeepSpeed's records, else DeepSpeed's engine's.
  const Value* args = states ? states->Get("args").get() : nullptr;
  auto record = [&](const char* key) -> int64_t {
    auto v = states ? states->Get(key) : nullptr;
    return v && v->kind == Value::Kind::Int ? v->i : -1;
  };
  out.iteration = record("iteration") >= 0 ? record("iteration") : record("global_steps");
  if (out.iteration < 0 && S.manifest["source"].contains("iteration") && S.manifest["source"]["iteration"].is_number_integer())
    out.iteration = S.manifest["source"]["iteration"].get<int64_t>();
  const std::string states_file = dir + "/" + S.manifest["source"].value("model_states", std::string("mp_rank_00_model_states.pt"));
  try {
    out.consumed_samples = source::ArgInt(args, "consumed_train_samples", record("global_samples"));
    out.consumed_valid_samples = source::ArgInt(args, "consumed_valid_samples", 0);
  } catch (const Error& e) {
    throw Error(states_file + ": " + e.what());
  }
  if (out.iteration < 0 || out.consumed_samples < 0)
    throw Error(states_file + ": no iteration or samples consumed recorded (Megatron-DeepSpeed's iteration and consumed_train_samples, "
                "DeepSpeed's global_steps and global_samples): Megatron-LM's job resumes its data and schedule from them" + remedy);
  if (out.iteration == 0)
    throw Error(states_file + ": the run is at iteration 0 (no step trained): Megatron-LM loads an iteration-0 checkpoint only as its "
                "release checkpoint, the model alone" + remedy);

  ValuePtr scheduler;
  if (out.schedule_carried) {
    scheduler = schedule;
    out.notes.push_back("the learning-rate schedule is the source's (Megatron's OptimizerParamScheduler, carried): Megatron-LM checks it "
                        "against the job's --lr, --min-lr, warm-up and decay flags, as on any resume");
  } else {
    // num_steps is what Megatron-LM's scheduler counts: samples (train_step steps it by the global batch).
    scheduler = Value::Make(Value::Kind::Dict);
    for (const char* key : {"max_lr", "lr_warmup_steps"}) pt::SetItem(*scheduler, key, Value::None());
    pt::SetItem(*scheduler, "num_steps", Value::Int(out.consumed_samples));
    for (const char* key : {"lr_decay_style", "lr_decay_steps", "min_lr"}) pt::SetItem(*scheduler, key, Value::None());
    const std::string kind = by_tokens ? "Megatron-DeepSpeed's by tokens (" + std::string(by_tokens) + " set), which Megatron-LM's is not"
                             : !schedule || schedule->kind == Value::Kind::None ? std::string("none")
                                                                                : std::string("DeepSpeed's, not Megatron's");
    out.notes.push_back("the source's learning-rate scheduler is " + kind + ": the schedule is the job's flags from " +
                        std::to_string(out.consumed_samples) + " samples consumed (opt_param_scheduler num_steps; its other values "
                        "None): launch Megatron-LM with --override-opt_param-scheduler, or its load stops at the first value");
  }
  out.common = Value::Make(Value::Kind::Dict);
  pt::SetItem(*out.common, "checkpoint_version", Value::Float(3.0));
  pt::SetItem(*out.common, "iteration", Value::Int(out.iteration));
  pt::SetItem(*out.common, "opt_param_scheduler", scheduler);
  out.notes.push_back("the optimizer's state carried from the source's: each parameter's fp32 weights and Adam moments, the step, " +
                      std::to_string(out.groups->items.size()) + " param groups as Megatron-Core builds them (weight decay, then none: "
                      "biases and 1-D tensors) with the source groups' options; iteration " + std::to_string(out.iteration) + ", " +
                      std::to_string(out.consumed_samples) + " samples consumed");
  return out;
}

}  // namespace ucp::formats::megatron
