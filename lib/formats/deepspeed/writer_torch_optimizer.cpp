// Without ZeRO, expert-parallel rank r's expp_rank file holds {'optimizer': state_dict()} of the
// model's torch optimizer: Adam's step and moments per position, the positions numbered group by
// group in each group's order (GroupMembers: an expert group holds rank r's experts), each
// parameter's moments in its own shape. In bf16, DeepSpeed's DDP bf16 wrapper (its unfused FP16
// optimizer class) holds that state_dict, with the fp32 masters per group and position and its
// static loss scale. The state of the unit's DP rank 0 (under Mixture of Experts, expert-parallel
// rank tp) goes in the model-states file too (without experts, only there). Each expp_rank file is
// written at the TP rank of the rank that saves it (ExpertGroups).
#include "formats/deepspeed/writer_files.h"

#include <algorithm>
#include <cstring>

#include "formats/deepspeed/names.h"
#include "formats/deepspeed/writer_optimizer.h"
#include "formats/deepspeed/writer_values.h"

namespace ucp::deepspeed {
using pt::SetItem;
using pt::Value;
using pt::ValuePtr;

namespace {

// A step of its own for each position, as torch keeps one tensor per parameter (and steps each in
// place): a 0-dim tensor is copied, a number is kept.
ValuePtr OwnStep(const ValuePtr& step) {
  if (!step || step->kind != Value::Kind::Tensor) return step ? step : Value::None();
  const pt::TensorView& t = step->AsTensor();
  std::shared_ptr<uint8_t[]> bytes(new uint8_t[std::max<uint64_t>(1, t.nbytes())]);
  std::memcpy(bytes.get(), t.data(), t.nbytes());
  return pt::OwnedTensor(bytes, bytes.get(), t.dtype, t.shape);
}

// Unit param k's Adam moment s (1: exp_avg, 2: exp_avg_sq) in its own shape, produced while its
// file is written.
ValuePtr Moment(UnitWeights& weights, const std::vector<int64_t>& shape, int k, int s) {
  return pt::ProducedTensor(pt::DType::F32, shape, [&weights, k, s](uint64_t off, uint64_t size, uint8_t* dst) {
    weights.Fill(static_cast<size_t>(k), s, static_cast<int64_t>(off / 4), static_cast<int64_t>((off + size) / 4),
                 reinterpret_cast<float*>(dst));
  });
}

// Expert-parallel rank r's optimizer.state_dict(), inside the DDP bf16 wrapper's where `wrapper`.
ValuePtr StateDictOf(const TargetUnit& u, UnitWeights& weights, int r, bool wrapper) {
  auto state = Value::Make(Value::Kind::Dict);
  std::vector<std::vector<int64_t>> positions(u.U.groups.size());
  auto masters = Value::Make(Value::Kind::List);  // fp32_groups
  int64_t pos = 0;
  for (size_t g = 0; g < u.U.groups.size(); ++g) {
    auto group_masters = Value::Make(Value::Kind::List);
    for (int k : u.GroupMembers(g, r)) {
      const auto& shape = u.U.params[k].copy.shape;
      if (wrapper) group_masters->items.push_back(weights.MasterTensor(static_cast<size_t>(k)));
      auto st = Value::Make(Value::Kind::Dict);
      SetItem(*st, "step", OwnStep(weights.GroupStep(static_cast<int>(g))));
      for (int s : {1, 2}) SetItem(*st, s == 1 ? "exp_avg" : "exp_avg_sq", Moment(weights, shape, k, s));
      state->dict.Set(Value::Int(pos), st);
      positions[g].push_back(pos++);
    }
    masters->items.push_back(group_masters);
  }
  auto osd = Value::Make(Value::Kind::Dict);
  SetItem(*osd, "state", state);
  SetItem(*osd, "param_groups", ParamGroups(u, positions));
  if (!wrapper) return osd;
  auto outer = Value::Make(Value::Kind::Dict);
  SetItem(*outer, "dynamic_loss_scale", Value::Bool(false));
  SetItem(*outer, "cur_scale", Float(1.0));
  SetItem(*outer, "cur_iter", Value::Int(u.S.manifest["source"]["iteration"].get<int64_t>()));
  SetItem(*outer, "optimizer_state_dict", osd);
  SetItem(*outer, "fp32_groups", masters);
  return outer;
}

}  // namespace

ValuePtr WriteTorchOptimizerFiles(const TargetUnit& u, UnitWeights& weights, ShardFiles& files) {
  const bool wrapper = reshard::DdpBf16Wrapper(u.S, u.T);
  weights.ReadWhole(wrapper);
  ValuePtr rank0;
  for (int r = 0; r < u.Ep(); ++r) {
    if (u.S.moe && !u.SavesEpRank(r)) continue;
    ValuePtr osd = StateDictOf(u, weights, r, wrapper);
    auto root = Value::Make(Value::Kind::Dict);
    SetItem(*root, "optimizer", osd);
    if (u.S.moe) files.Write(ExpertOptimFileName(r, u.Mp()), *root);
    if (!rank0) rank0 = osd;
  }
  return rank0;
}

}  // namespace ucp::deepspeed
