// The model-states file: the source's, with its module, and each record DeepSpeed and
// Megatron-DeepSpeed keep there made the target's: the optimizer's records, the rank's own RNG
// state, the parallel degrees, ds_config, Megatron's args and universal_checkpoint_info.
#include "formats/deepspeed/writer_files.h"

#include <algorithm>
#include <set>
#include <string>
#include <utility>

#include "formats/deepspeed/names.h"
#include "formats/deepspeed/writer_optimizer.h"
#include "formats/deepspeed/writer_values.h"
#include "patterns/rules.h"
#include "pt/torch_file.h"

namespace ucp::deepspeed {
using nlohmann::json;
using pt::IntList;
using pt::SetItem;
using pt::Value;
using pt::ValuePtr;
using reshard::Naming;

namespace {

// The parameters of each optimizer group on DP rank 0 (the rank that saves this file): under
// Mixture of Experts (DeepSpeed 0.19.3+ records them), the experts of its expert-parallel rank,
// by their local names.
// Under ZeRO-3, one per sub-group (Zero3SubGroups), as its engine lists its flat partitions.
ValuePtr ParamShapes(const TargetUnit& u) {
  auto shapes = Value::Make(Value::Kind::List);
  const bool plain_tuples = PlainTupleShapes(*u.S.model_states.root);
  auto shapes_of = [&](const std::vector<int>& members) {
    auto m = OrderedDict();
    for (int k : members) SetItem(*m, u.OptimizerName(k), TorchSize(u.U.params[k].copy.shape, plain_tuples));
    shapes->items.push_back(m);
  };
  if (u.T.zero_stage == 3) {
    for (const SubGroup& sub : Zero3SubGroups(u)) shapes_of(sub.members);
  } else {
    for (size_t g = 0; g < u.U.groups.size(); ++g) shapes_of(u.GroupMembers(g, u.Groups().EpRank(0, u.U.tp)));
  }
  return shapes;
}

// What the file says of the optimizer: param_shapes, the torch optimizer's state, shared_params,
// the frozen parameters.
void PutOptimizerRecords(const TargetUnit& u, Value& root, const ValuePtr& torch_optimizer) {
  auto shapes = ParamShapes(u);
  // A Mixture-of-Experts save (engine._save_moe_checkpoint) records no param_shapes or ds_config
  // before DeepSpeed 0.19.3. Without ZeRO DeepSpeed records no param_shapes or shared_params, and
  // the optimizer's state_dict instead; under ZeRO the optimizer state is in the ZeRO files.
  if (u.TorchOptimizer()) shapes = Value::None();
  if (u.S.moe) PutIfPresent(root, "param_shapes", shapes);
  else SetItem(root, "param_shapes", shapes);
  PutIfPresent(root, "optimizer", torch_optimizer ? torch_optimizer : Value::None());
  // shared_params likewise: None without ZeRO; under ZeRO the source's, or, from a source saved
  // without ZeRO (None), {}: the parameters the model ties are one parameter (a tied module, an
  // output layer reusing the embedding), which is what DeepSpeed's own ZeRO saves of these models.
  // zero_to_fp32.py reads its items().
  if (auto shared = root.Get("shared_params")) {
    if (u.TorchOptimizer()) SetItem(root, "shared_params", Value::None());
    else if (shared->kind == Value::Kind::None && u.T.zero_stage > 0)
      SetItem(root, "shared_params", Value::Make(Value::Kind::Dict));
  }
  // DeepSpeed records frozen parameters (none here) when ZeRO partitions gradients (stage 2, 3).
  for (const char* key : {"frozen_param_shapes", "frozen_param_fragments"})
    PutIfPresent(root, key, u.T.zero_stage >= 2 ? OrderedDict() : Value::None());
}

// Megatron's rng_state is a rank's own (its model-parallel RNG tracker is seeded per TP rank), the
// rest of the carried client state is the job's. Where the target's model-parallel layout is the
// source's (same TP and PP degrees), each rank gets its own source rank's rng_state from the
// atomic checkpoint's carried model-states file of that rank (read into `own`, which holds it
// until the file is written); otherwise rank 0's, with the rest (no source rank is the same rank
// then: DeepSpeed's universal load restores no RNG state at all).
void PutOwnRngState(const TargetUnit& u, Value& root, pt::TorchFile& own) {
  const auto& source = u.S.manifest["source"];
  if (!root.Get("rng_state") || u.T.tp != u.S.tp || u.T.pp != source.value("pp", 1) || u.T.zero_stage == 3 ||
      source.value("zero_stage", 0) == 3)
    return;
  const std::string rel = ModelStatesFileName(u.U.pp * u.T.tp + u.U.tp);
  if (!u.S.reader->Lists(rel)) return;
  own = u.S.reader->ReadCheckedFile(rel, "the rng_state of (pp=" + std::to_string(u.U.pp) + ", tp=" +
                                             std::to_string(u.U.tp) + ")");
  if (auto rng = own.root->Get("rng_state")) SetItem(root, "rng_state", rng);
}

// The world sizes DeepSpeed records, and (DeepSpeed >= 0.19.5) the model-parallel degrees, which
// its checkpoint readers trust.
void PutParallelDegrees(const TargetUnit& u, Value& root) {
  // One save's files repeat one release (ucp-convert refuses a tag whose files disagree): with
  // --ds-version, the optimizer files'; else the carried file's, which the optimizer files repeat, where
  // it records one (a weights-only import records none: then the optimizer files' too, never empty,
  // which DeepSpeed refuses).
  const auto carried = root.Get("ds_version");
  if (!u.T.ds_version.empty() || (carried && (carried->kind != Value::Kind::Str || carried->s.empty())))
    SetItem(root, "ds_version", DsVersion(u));
  SetItem(root, "dp_world_size", Value::Int(u.T.SeqDp()));  // DeepSpeed's seq_dp_world_size
  SetItem(root, "mp_world_size", Value::Int(u.T.tp * u.T.pp));
  if (auto dims = root.Get("checkpoint_parallel_dimensions"); dims && dims->kind == Value::Kind::Dict) {
    auto d = Copied(*dims);
    PutIfPresent(*d, "pp_degree", Value::Int(u.T.pp));
    PutIfPresent(*d, "tp_degree", Value::Int(u.T.tp));
    SetItem(root, "checkpoint_parallel_dimensions", d);
  }
}

// Megatron's args (an argparse Namespace) with the target's degrees, vocabulary and dtype.
ValuePtr TargetArgs(const TargetUnit& u, const Value& args) {
  const auto& T = u.T;
  auto a = Copied(args);
  a->state = Copied(*args.state);
  Value& st = *a->state;
  PutIfPresent(st, "tensor_model_parallel_size", Value::Int(T.tp));
  PutIfPresent(st, "pipeline_model_parallel_size", Value::Int(T.pp));
  PutIfPresent(st, "data_parallel_size", Value::Int(T.dp));
  PutIfPresent(st, "world_size", Value::Int(T.SeqDp() * T.tp * T.pp));
  // Megatron-DeepSpeed's Ulysses degrees: said when the target runs SP, kept true where recorded.
  for (auto [key, value] : {std::pair{"ds_sequence_parallel_size", T.Sp()}, std::pair{"sequence_data_parallel_size", T.SeqDp()}}) {
    if (T.Sp() > 1) SetItem(st, key, Value::Int(value));
    else PutIfPresent(st, key, Value::Int(value));
  }
  if (u.P.padded_vocab > 0) PutIfPresent(st, "padded_vocab_size", Value::Int(u.P.padded_vocab));
  PutIfPresent(st, "fp16", Value::Bool(T.dtype == "fp16"));
  PutIfPresent(st, "bf16", Value::Bool(T.dtype == "bf16"));
  PutIfPresent(st, "params_dtype", TorchDtype(T.dtype));
  PutIfPresent(st, "zero_stage", Value::Int(T.zero_stage));
  PutIfPresent(st, "no_pipeline_parallel", Value::Bool(NamingOf(T) == Naming::Plain));
  return a;
}

// Megatron-DeepSpeed names the TP rules (replicated, averaged, row-parallel) in its info only at
// TP > 1. A TP > 1 target of a source whose info lacks one of them gets it from the rules that
// decided the parameters (the manifest's, the model family's where the checkpoint was silent), in
// the model's order, placed before the sub-parameter keys as Megatron-DeepSpeed places them.
ValuePtr WithTpRules(const TargetUnit& u, const Value& info) {
  const auto& atoms = u.S.atoms;
  std::vector<std::pair<std::string, ValuePtr>> missing;
  std::vector<size_t> order(atoms.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return InModelOrder(atoms[x].place, atoms[y].place); });
  for (const char* key : {patterns::kAverageKey, patterns::kReplicateKey, patterns::kRowParallelKey}) {
    if (info.Get(key)) continue;
    auto list = Value::Make(Value::Kind::List);
    std::set<std::string> seen;
    for (size_t k : order) {
      const auto& rule = atoms[k].meta.value("rule", json::object());
      if (!rule.is_object() || rule.value("key", "") != key) continue;
      const std::string re = rule.value("regex", "");
      if (!re.empty() && seen.insert(re).second) list->items.push_back(Value::Str(re));
    }
    if (!list->items.empty()) missing.emplace_back(key, list);
  }
  auto out = Copied(info);
  if (missing.empty()) return out;
  out->dict = pt::Dict();
  auto put_missing = [&] {
    for (auto& [key, list] : missing) SetItem(*out, key, list);
    missing.clear();
  };
  for (const auto& item : info.dict.items()) {
    const std::string key = item.key->kind == Value::Kind::Str ? item.key->s : "";
    if (key == patterns::kTwoSubParamsKey || key == patterns::kSubParamsKey || key == "sub_param_shard_widths") put_missing();
    out->dict.Set(item.key, item.value);
  }
  put_missing();
  return out;
}

// sub_param_shard_widths: each sub-parameter's width cut evenly over the target's TP ranks.
ValuePtr TargetShardWidths(const TargetUnit& u, const Value& widths) {
  auto w = Copied(widths);
  w->dict = pt::Dict();
  for (const auto& item : widths.dict.items()) {
    auto per = Value::Make(Value::Kind::List);
    for (const auto& sub : item.value->AsSequence()) {
      int64_t size = 0;
      for (const auto& x : sub->AsSequence()) size += x->AsInt();
      per->items.push_back(IntList(std::vector<int64_t>(u.T.tp, size / u.T.tp)));
    }
    w->dict.Set(item.key, per);
  }
  return w;
}

// universal_checkpoint_info for the target: its TP rules, vocabulary and shard widths, its rules
// under the target's names.
ValuePtr TargetInfo(const TargetUnit& u, const Value& info) {
  auto i = u.T.tp > 1 ? WithTpRules(u, info) : Copied(info);
  if (u.P.padded_vocab > 0) PutIfPresent(*i, "padded_vocab_size", Value::Int(u.P.padded_vocab));
  if (auto widths = info.Get("sub_param_shard_widths"); widths && widths->kind == Value::Kind::Dict)
    SetItem(*i, "sub_param_shard_widths", TargetShardWidths(u, *widths));
  if (u.S.naming == Naming::Module) return i;  // (a module's names are kept: its rules stand)
  std::vector<std::pair<std::string, std::string>> names;
  for (size_t k = 0; k < u.S.atoms.size(); ++k) names.emplace_back(u.S.atoms[k].name, u.P.names[k]);
  return RenameRules(*i, names, u.S.naming, NamingOf(u.T), u.S.layers, u.S.untied);
}

}  // namespace

void WriteModelStatesFile(const TargetUnit& u, ShardFiles& files, const std::string& name, ValuePtr module,
                          const ValuePtr& torch_optimizer) {
  pt::TorchFile own_rank;  // the source rank's model-states file its rng_state comes from
  auto root = Copied(*u.S.model_states.root);
  SetItem(*root, "module", std::move(module));
  PutOptimizerRecords(u, *root, torch_optimizer);
  PutOwnRngState(u, *root, own_rank);
  PutParallelDegrees(u, *root);
  if (u.S.moe) PutIfPresent(*root, "ds_config", DsConfig(u));
  else SetItem(*root, "ds_config", DsConfig(u));
  if (auto args = root->Get("args"); args && args->kind == Value::Kind::Object && args->state)
    SetItem(*root, "args", TargetArgs(u, *args));
  if (auto info = root->Get("universal_checkpoint_info"); info && info->kind == Value::Kind::Dict)
    SetItem(*root, "universal_checkpoint_info", TargetInfo(u, *info));
  files.Write(name, *root);
}

}  // namespace ucp::deepspeed
