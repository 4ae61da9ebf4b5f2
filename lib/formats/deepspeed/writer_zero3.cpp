#include "formats/deepspeed/writer_files.h"

#include "formats/deepspeed/writer_optimizer.h"
#include "formats/deepspeed/writer_values.h"

namespace ucp::deepspeed {
using pt::SetItem;
using pt::Value;
using pt::ValuePtr;
using reshard::UnitParam;
using reshard::Zero3Piece;

namespace {

// The ds_config's zero_optimization.sub_group_size, DeepSpeed's default 1e9 where it sets none.
int64_t SubGroupSize(const TargetUnit& u) {
  int64_t size = 1000000000;
  auto cfg = DsConfig(u);
  auto zero = cfg && cfg->kind == Value::Kind::Dict ? cfg->Get("zero_optimization") : nullptr;
  auto v = zero && zero->kind == Value::Kind::Dict ? zero->Get("sub_group_size") : nullptr;
  if (v && (v->kind == Value::Kind::Int || v->kind == Value::Kind::Float)) size = static_cast<int64_t>(v->AsFloat());
  return size;
}

}  // namespace

std::vector<SubGroup> Zero3SubGroups(const TargetUnit& u) {
  const int64_t size = SubGroupSize(u);
  std::vector<SubGroup> subs;
  for (size_t g = 0; g < u.U.groups.size(); ++g) {
    const auto& members = u.U.groups[g];
    int64_t total = 0;
    for (int k : members) total += Zero3Piece(u.U.params[k].local_numel, u.T.SeqDp());
    if (size >= total) {
      subs.push_back({static_cast<int>(g), members});
      continue;
    }
    SubGroup sub{static_cast<int>(g), {}};
    int64_t sum = 0;
    for (size_t i = 0; i < members.size(); ++i) {
      sub.members.push_back(members[i]);
      sum += Zero3Piece(u.U.params[members[i]].local_numel, u.T.SeqDp());
      if (sum >= size || i + 1 == members.size()) {
        subs.push_back(std::move(sub));
        sub = SubGroup{static_cast<int>(g), {}};
        sum = 0;
      }
    }
  }
  return subs;
}

// DP rank d's flat group is the concatenation of its slices of the group's parameters (each padded
// to its piece), in the group's parameter order.
void WriteZero3OptimizerFile(const TargetUnit& u, UnitWeights& weights, ShardFiles& files) {
  auto state = Value::Make(Value::Kind::Dict), flat = Value::Make(Value::Kind::List);
  const std::vector<SubGroup> subs = Zero3SubGroups(u);
  std::vector<std::vector<int64_t>> positions(u.U.groups.size());
  for (size_t sg = 0; sg < subs.size(); ++sg) {
    int64_t total = 0;
    std::vector<Segment> segs;
    for (int k : subs[sg].members) {
      const UnitParam& up = u.U.params[k];
      if (up.begin < up.end) segs.push_back({k, up.begin, total, up.end - up.begin});
      total += Zero3Piece(up.local_numel, u.T.SeqDp());
    }
    flat->items.push_back(weights.FlatState(segs, total, 0));
    state->dict.Set(Value::Int(static_cast<int64_t>(sg)), AdamState(weights, subs[sg].group, std::move(segs), total));
    positions[subs[sg].group].push_back(static_cast<int64_t>(sg));
  }
  auto osd = Value::Make(Value::Kind::Dict);
  SetItem(*osd, "zero_stage", ZeroStage(u));
  PutLossScaling(u, *osd);
  SetItem(*osd, "partition_count", Value::Int(u.T.SeqDp()));
  SetItem(*osd, "optimizer_state_dict", TorchOptimizerState(u, state, positions));
  SetItem(*osd, "fp32_flat_groups", flat);
  WriteOptimizerRoot(u, files, u.U.dp, osd);
}

}  // namespace ucp::deepspeed
