#include "formats/deepspeed/writer_optimizer.h"

#include <string>

#include "formats/deepspeed/names.h"
#include "formats/deepspeed/writer_values.h"

namespace ucp::deepspeed {
using pt::IntList;
using pt::SetItem;
using pt::Value;
using pt::ValuePtr;

ValuePtr DsConfig(const TargetUnit& u) {
  auto cfg = u.S.model_states.root->Get("ds_config");
  if (!cfg) cfg = u.S.optimizer.root->Get("ds_config");
  if (!cfg || cfg->kind != Value::Kind::Dict) return cfg ? cfg : Value::None();
  auto out = Copied(*cfg);
  auto section = [&](const char* key, const char* field, ValuePtr v) {
    auto sec = out->Get(key);
    if (!sec || sec->kind != Value::Kind::Dict) return;
    auto copy = Copied(*sec);
    SetItem(*copy, field, std::move(v));
    SetItem(*out, key, copy);
  };
  section("zero_optimization", "stage", Value::Int(u.T.zero_stage));
  section("bf16", "enabled", Value::Bool(u.T.dtype == "bf16"));
  section("fp16", "enabled", Value::Bool(u.T.dtype == "fp16"));
  // The gradient-accumulation dtype that chose the optimizer (TargetLayout::grad_accum_dtype):
  // said where the source said it, and added where DeepSpeed's default would choose another.
  if (out->Get("data_types")) section("data_types", "grad_accum_dtype", Value::Str(u.T.grad_accum_dtype));
  else if (u.T.bf16_optimizer() && u.T.zero_stage == 1) {
    auto dt = Value::Make(Value::Kind::Dict);
    SetItem(*dt, "grad_accum_dtype", Value::Str("fp32"));
    SetItem(*out, "data_types", dt);
  }
  return out;
}

ValuePtr DsVersion(const TargetUnit& u) {
  if (!u.T.ds_version.empty()) return Value::Str(u.T.ds_version);
  // DeepSpeed refuses an empty one ("Empty ds_version in checkpoint"): a weights-only import records none.
  auto recorded = [](const ValuePtr& v) { return v && v->kind == Value::Kind::Str && !v->s.empty(); };
  if (auto v = u.S.optimizer.root->Get("ds_version"); recorded(v)) return v;
  if (auto v = u.S.model_states.root->Get("ds_version"); recorded(v)) return v;
  return Value::Str(reshard::kDefaultRelease);
}

ValuePtr SourceOr(const TargetUnit& u, const char* key, ValuePtr fallback) {
  auto v = u.S.optimizer.root->Get(key);
  return v ? v : fallback;
}

ValuePtr ParamGroups(const TargetUnit& u, const std::vector<std::vector<int64_t>>& positions) {
  auto groups = u.S.optimizer.root->Get("param_groups");
  if (!groups || groups->kind != Value::Kind::List) return groups;
  auto out = Copied(*groups);
  for (size_t k = 0; k < out->items.size(); ++k) {
    auto& g = out->items[k];
    if (g->kind != Value::Kind::Dict) continue;
    g = Copied(*g);
    if (g->Get("params") && k < positions.size()) SetItem(*g, "params", IntList(positions[k]));
    auto moe = g->Get("moe");
    if (u.S.moe && moe && moe->kind == Value::Kind::Bool && moe->b && g->Get("name"))
      SetItem(*g, "name", Value::Str("ep_size_" + std::to_string(u.Ep())));
  }
  return out;
}

ValuePtr TorchOptimizerState(const TargetUnit& u, ValuePtr state, std::vector<std::vector<int64_t>> positions) {
  auto base = Value::Make(Value::Kind::Dict);
  SetItem(*base, "state", std::move(state));
  if (positions.empty()) {
    positions.resize(u.U.groups.size());
    for (size_t g = 0; g < positions.size(); ++g) positions[g] = {static_cast<int64_t>(g)};
  }
  SetItem(*base, "param_groups", ParamGroups(u, positions));
  return base;
}

ValuePtr AdamState(UnitWeights& weights, int g, std::vector<Segment> segs, int64_t len) {
  auto gs = Value::Make(Value::Kind::Dict);
  SetItem(*gs, "step", weights.GroupStep(g));
  SetItem(*gs, "exp_avg", weights.FlatState(segs, len, 1));
  SetItem(*gs, "exp_avg_sq", weights.FlatState(std::move(segs), len, 2));
  return gs;
}

void PutLossScaling(const TargetUnit& u, Value& osd) {
  SetItem(osd, "loss_scaler", LossScalerFor(u.T.dtype, u.S.optimizer.root->Get("loss_scaler")));
  SetItem(osd, "dynamic_loss_scale", Value::Bool(u.T.dtype == "fp16"));
  SetItem(osd, "overflow", SourceOr(u, "overflow", Value::Bool(false)));
}

ValuePtr ConfiguredClipping(const TargetUnit& u) {
  auto cfg = DsConfig(u);
  auto clip = cfg && cfg->kind == Value::Kind::Dict ? cfg->Get("gradient_clipping") : nullptr;
  if (clip && (clip->kind == Value::Kind::Float || clip->kind == Value::Kind::Int)) return Float(clip->AsFloat());
  return Float(0.0);
}

ValuePtr ZeroStage(const TargetUnit& u) {
  auto stage = Value::MakeObject("deepspeed.runtime.zero.config", "ZeroStageEnum");
  stage->args->items.push_back(Value::Int(u.T.zero_stage));
  return stage;
}

void WriteOptimizerRoot(const TargetUnit& u, ShardFiles& files, int d, ValuePtr osd) {
  auto root = Value::Make(Value::Kind::Dict);
  SetItem(*root, "optimizer_state_dict", std::move(osd));
  SetItem(*root, "ds_config", DsConfig(u));
  SetItem(*root, "ds_version", DsVersion(u));
  files.Write(OptimStatesFileName(u.T.dtype == "bf16" ? "bf16_" : "", d, u.Mp()), *root);
}

}  // namespace ucp::deepspeed
