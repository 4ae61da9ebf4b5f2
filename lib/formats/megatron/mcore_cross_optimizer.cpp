#include "formats/megatron/mcore_cross_optimizer.h"

#include <map>
#include <set>

#include "core/error.h"
#include "pt/torch_file.h"
#include "source/source_index.h"

namespace ucp::formats::megatron {
using pt::Value;
using pt::ValuePtr;

namespace {

// Megatron-Core's default rule (get_standard_config_overrides): no weight decay on biases and 1-D
// tensors (per layer: the stacked keys' shape is a layer's). 0: the default group, 1: the one without.
int MegatronGroupOf(const McoreKey& k) { return k.key.ends_with(".bias") || k.shape.size() == 1 ? 1 : 0; }

// The source's group options a Megatron group keeps: all but its members, step, and DeepSpeed's and
// Megatron-DeepSpeed's own keys (its name, the experts' flag, the multipliers ucp writes as Megatron's).
bool Kept(const std::string& key) {
  return key != "params" && key != "step" && key != "name" && key != "moe" && key != "wd_mult" && key != "lr_mult";
}

bool SameOptions(const Value& a, const Value& b) {
  std::map<std::string, const Value*> x, y;
  for (const auto& kv : a.AsDict().items())
    if (kv.key->kind == Value::Kind::Str && Kept(kv.key->s)) x[kv.key->s] = kv.value.get();
  for (const auto& kv : b.AsDict().items())
    if (kv.key->kind == Value::Kind::Str && Kept(kv.key->s)) y[kv.key->s] = kv.value.get();
  if (x.size() != y.size()) return false;
  for (const auto& [key, v] : x) {
    auto it = y.find(key);
    if (it == y.end() || !v || !it->second || !pt::SameValue(*v, *it->second)) return false;
  }
  return true;
}

double Option(const Value& group, const char* key, double otherwise) {
  auto v = group.Get(key);
  return v && v->IsNumber() ? v->AsFloat() : otherwise;
}

std::string Number(double v) {
  std::string s = std::to_string(v);
  while (s.size() > 1 && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

// Whether Megatron's OptimizerParamScheduler saved `v` (its state_dict's keys, or their older names).
bool MegatronSchedule(const Value* v) {
  if (!v || v->kind != Value::Kind::Dict) return false;
  for (const char* key : {"min_lr", "lr_decay_style"})
    if (!v->Get(key)) return false;
  return (v->Get("max_lr") || v->Get("start_lr")) && (v->Get("num_steps") || v->Get("num_iters"));
}

}  // namespace

CrossOptimizer DeepSpeedOptimizerForMcore(const reshard::Source& S, const std::vector<McoreKey>& keys) {
  const std::string dir = S.reader->dir();
  const ValuePtr saved = S.optimizer.root ? S.optimizer.root->Get("param_groups") : nullptr;
  if (!saved || !saved->IsSequence() || saved->items.empty())
    throw Error(dir + "/zero/optimizer_state.pt: no param_groups list");
  const std::vector<ValuePtr>& groups = saved->items;
  for (const ValuePtr& g : groups)
    if (!g || g->kind != Value::Kind::Dict) throw Error(dir + "/zero/optimizer_state.pt: a param group is not a dict");
  const auto remedy = std::string("; --weights-only writes the model alone (Megatron-LM then starts a fresh optimizer)");

  // Which of Megatron's groups each source group's parameters go to (one each), a parameter of each for messages.
  std::map<int, int> target;
  std::map<int, std::string> example;
  for (const McoreKey& k : keys)
    for (const auto& layer : k.layers)
      for (const Segment& s : layer) {
        const reshard::Atom& a = S.atoms.at(static_cast<size_t>(s.rows.atom));
        if (a.group < 0 || static_cast<size_t>(a.group) >= groups.size())
          throw Error(dir + ": parameter '" + a.name + "' is in param group " + std::to_string(a.group) + " of " +
                      std::to_string(groups.size()));
        const int m = MegatronGroupOf(k);
        auto [it, fresh] = target.emplace(a.group, m);
        if (fresh) example[a.group] = a.name + " (Megatron-Core's " + k.key + ")";
        if (it->second != m)
          throw Error(dir + ": the source's param group " + std::to_string(a.group) + " holds '" + example[a.group] + "' and '" + a.name +
                      "' (" + k.key + "), which Megatron-LM's job puts in different groups (with and without weight decay: biases and "
                      "1-D tensors have none): their decay would change" + remedy);
      }

  // The decay each source group applied against the group Megatron-LM's job gives its parameters.
  auto decays = [&](const Value& g) {
    if (auto w = g.Get("wd_mult"); w && w->IsNumber()) return w->AsFloat() != 0.0;
    return Option(g, "weight_decay", 0.0) != 0.0;
  };
  bool any_decay = false;
  for (const auto& [g, m] : target) any_decay = any_decay || decays(*groups[static_cast<size_t>(g)]);
  for (const auto& [g, m] : target) {
    const Value& group = *groups[static_cast<size_t>(g)];
    if (auto w = group.Get("wd_mult"); w && w->IsNumber() && w->AsFloat() != 0.0 && w->AsFloat() != 1.0)
      throw Error(dir + ": the source's param group " + std::to_string(g) + " has wd_mult " + Number(w->AsFloat()) +
                  ": Megatron-LM's default groups decay by 1 or 0" + remedy);
    if (auto l = group.Get("lr_mult"); l && l->IsNumber() && l->AsFloat() != 1.0)
      throw Error(dir + ": the source's param group " + std::to_string(g) + " has lr_mult " + Number(l->AsFloat()) +
                  ": Megatron-LM's default groups train at the schedule's rate (lr_mult 1)" + remedy);
    if (any_decay && decays(group) != (m == 0))
      throw Error(dir + ": parameter '" + example[g] + "' is in the source's param group " + std::to_string(g) + " (weight_decay " +
                  Number(Option(group, "weight_decay", 0.0)) + "), and Megatron-LM's job puts it in its group " +
                  (m == 0 ? "with weight decay" : "without weight decay (biases and 1-D tensors)") + ": its decay would change" + remedy);
  }
  const Value& first = *groups[static_cast<size_t>(target.begin()->first)];
  for (const auto& [g, m] : target) {
    const Value& group = *groups[static_cast<size_t>(g)];
    auto a = first.Get("lr"), b = group.Get("lr");
    if (!a || !b || !pt::SameValue(*a, *b))
      throw Error(dir + ": the source's param groups " + std::to_string(target.begin()->first) + " and " + std::to_string(g) +
                  " train at different learning rates: Megatron-LM's default groups share the schedule's" + remedy);
  }

  CrossOptimizer out;
  const Value* states = S.model_states.root.get();
  const ValuePtr schedule = states ? states->Get("lr_scheduler") : nullptr;
  out.schedule_carried = MegatronSchedule(schedule.get());

  // Megatron's groups, in _get_param_groups' order: the default first, then the override (wd_mult 0).
  out.groups = Value::Make(Value::Kind::List);
  for (int m = 0; m < 2; ++m) {
    const Value* options = nullptr;
    int from = -1;
    for (const auto& [g, to] : target) {
      if (to != m) continue;
      const Value& group = *groups[static_cast<size_t>(g)];
      if (options && !SameOptions(*options, group))
        throw Error(dir + ": the source's param groups " + std::to_string(from) + " and " + std::to_string(g) + " hold options that differ, "
                    "and Megatron-LM's job puts their parameters ('" + example[from] + "', '" + example[g] + "') in one group" + remedy);
      if (!options) options = &group, from = g;
    }
    if (!options) continue;
    auto group = Value::Make(Value::Kind::Dict);
    pt::SetItem(*group, "is_expert_parallel", Value::Bool(false));
    pt::SetItem(*group, "default_config", Value::Bool(true));
    pt::SetItem(*group, "wd_mult", Value::Float(m == 0 ? 1.0 : 0.0));
    pt::SetItem(*group, "lr_mult", Value::Float(1.0));
    pt::SetItem(*group, "is_decoupled_lr", Value::Bool(false));
    if (out.schedule_carried) {  // the bounds Megatron keeps per group: the schedule's
      pt::SetItem(*group, "max_lr", schedule->Get("max_lr") ? schedule->Get("max_lr") : schedule->Get("start_lr"));
      pt::SetItem(*group, "min_lr", schedule->Get("min_lr"));
    }
    for (const auto& kv : options->AsDict().items())
      if (kv.key->kind == Value::Kind::Str && Kept(kv.key->s)) group->dict.Set(kv.key, kv.value);
    out.groups->items.push_back(group);
  }

  // The iteration and the samples the run consumed: Megatron-DeepSpeed's records, else DeepSpeed's engine's.
  const Value* args = states ? states->Get("args").get() : nullptr;
  auto record = [&](const char* key) -> int64_t {
    auto v = states ? states->Get(key) : nullptr;
    return v && v->kind == Value::Kind::Int ? v->i : -1;
  };
  out.iteration = record("iteration") >= 0 ? record("iteration") : record("global_steps");
  if (out.iteration < 0) out.iteration = S.manifest["source"].value("iteration", int64_t{-1});
  out.consumed_samples = source::ArgInt(args, "consumed_train_samples", record("global_samples"));
  if (out.iteration < 0 || out.consumed_samples < 0)
    throw Error(dir + ": the source records no iteration or samples consumed (Megatron-DeepSpeed's iteration and "
                "consumed_train_samples, DeepSpeed's global_steps and global_samples): Megatron-LM's job resumes its data and "
                "schedule from them" + remedy);

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
    std::string kind = !schedule || schedule->kind == Value::Kind::None ? "none" : "DeepSpeed's";
    out.notes.push_back("the source's learning-rate scheduler is " + kind + ", not Megatron's: the schedule is the job's flags from " +
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
