// Mixture of Experts: one file per expert of each MoE layer, its weights under its global id in
// the training dtype (engine._save_moe_checkpoint), and per expert-parallel rank an expp_rank file,
// which under ZeRO holds no optimizer state. DeepSpeed 0.19.3 and later write none under ZeRO: the
// target has them when the source had them (the manifest's file kinds).
#include "formats/deepspeed/writer_files.h"

#include <map>
#include <utility>

#include "formats/deepspeed/names.h"

namespace ucp::deepspeed {
using pt::SetItem;
using pt::Value;
using pt::ValuePtr;
using reshard::Atom;

namespace {

// Whether the target's DeepSpeed writes expp_rank files ({'optimizer': None}) under ZeRO too:
// what a ZeRO source's files show, unless another release is asked for; else (a source without
// ZeRO has them either way) by release: DeepSpeed 0.19.3 stopped.
bool ExppUnderZero(const TargetUnit& u) {
  const auto& src = u.S.manifest["source"];
  if (u.T.ds_version.empty() && src.value("zero_stage", 1) > 0) {
    const auto kinds = src.value("file_kinds", nlohmann::json::object());
    return !kinds.is_object() || kinds.empty() || kinds.value("expert_optimizer_states", 0) > 0;
  }
  return reshard::ReleaseBefore(reshard::TargetRelease(u.S, u.T), 0, 19, 3);
}

}  // namespace

void WriteExpertFiles(const TargetUnit& u, const UnitWeights& weights, ShardFiles& files) {
  std::map<std::pair<int, int>, ValuePtr> experts;  // (MoE layer, global expert) -> its weights
  for (size_t k = 0; k < u.U.params.size(); ++k) {
    const Atom& a = u.S.atoms[u.U.params[k].atom];
    if (a.expert < 0 || !u.SavesEpRank(reshard::EpRankOf(u.S, a, u.Ep()))) continue;
    auto& f = experts[{a.moe_layer, a.expert}];
    if (!f) f = Value::Make(Value::Kind::Dict);
    SetItem(*f, u.P.names[u.U.params[k].atom], weights.TrainingDtypeTensor(k));
  }
  for (const auto& [key, dict] : experts) files.Write(ExpertStatesFileName(key.first, key.second, u.Mp()), *dict);
  for (int r = 0; !u.TorchOptimizer() && ExppUnderZero(u) && r < u.Ep(); ++r) {
    if (!u.SavesEpRank(r)) continue;
    auto root = Value::Make(Value::Kind::Dict);
    SetItem(*root, "optimizer", Value::None());
    files.Write(ExpertOptimFileName(r, u.Mp()), *root);
  }
}

}  // namespace ucp::deepspeed
