#include "formats/deepspeed/zero_partitions.h"

#include <algorithm>

#include "core/error.h"
#include "formats/deepspeed/index.h"
#include "layout/naming.h"

namespace ucp::deepspeed {
using pt::Value;
using source::ShardFile;
using source::SourceIndex;

namespace {

// DeepSpeed's ZeroStageEnum, pickled as ZeroStageEnum(2) or, by Python >= 3.11, getattr(ZeroStageEnum, 'gradients').
int ZeroStageOf(const Value& v) {
  if (v.kind == Value::Kind::Object && v.QualifiedName() == "builtins.getattr" && v.args && v.args->items.size() == 2 &&
      v.args->items[1]->kind == Value::Kind::Str) {
    static const std::map<std::string, int> names = {
        {"disabled", 0}, {"optimizer_states", 1}, {"gradients", 2}, {"weights", 3}, {"max_stage", 3}};
    auto it = names.find(v.args->items[1]->s);
    if (it == names.end()) throw Error("unknown ZeroStageEnum member '" + v.args->items[1]->s + "'");
    return it->second;
  }
  return static_cast<int>(v.AsInt());
}

// The fragments one flat group of one optimizer file holds, each checked against the group's
// partition before it is recorded.
struct GroupFragments {
  SourceIndex& L;
  const ParamIndex& index;
  const std::string& where;
  bool moe;
  int file, group;
  int64_t partition, have_fp32;

  void Add(const std::string& name, int64_t src, int64_t numel, int64_t dst) const {
    auto it = index.find(name);
    if (it == index.end()) {
      L.problems.push_back(where + ": parameter '" + name + "' has a fragment but is in no " +
                           (moe ? "module or expert file" : "param_shapes"));
      return;
    }
    if (src < 0 || numel < 0 || src + numel > std::min(partition, have_fp32))
      L.problems.push_back(where + ": parameter '" + name + "': fragment [" + std::to_string(src) + ", " +
                           std::to_string(src + numel) + ") exceeds the flat partition of group " +
                           std::to_string(group) + " (" + std::to_string(std::min(partition, have_fp32)) +
                           " elements)");
    else if (numel > 0)
      L.fragments.push_back({file, group, static_cast<int>(it->second), src, numel, dst});
  }
};

// Indexes the ZeRO and BF16 optimizer files one by one into L and `out`.
class ZeroFileIndexer {
 public:
  ZeroFileIndexer(SourceIndex& L, const SaveVariant& save, const ParamIndex& index, GroupParams& group_params,
                  const MoeShapes& moe_shapes, ZeroPartitions& out)
      : L_(L), save_(save), index_(index), group_params_(group_params), moe_shapes_(moe_shapes), out_(out) {}

  void File(int fi, const pt::TorchFile& file, const std::string& where) {
    ShardFile& f = L_.files[fi];
    const Value& osd = file.root->At("optimizer_state_dict");
    const int stage = Stage(osd);
    CheckPartitionCounts(osd, where);
    auto flat = FlatGroupsOf(*file.root, stage);
    const uint8_t* base = file.archive->file()->bytes().data();
    auto extent = [&](const pt::TensorView& t) {
      return source::Extent{static_cast<uint64_t>(t.data() - base), static_cast<int64_t>(t.numel())};
    };
    for (const auto& fg : flat) f.groups.push_back({extent(fg.fp32), extent(fg.exp_avg), extent(fg.exp_avg_sq)});
    for (size_t g = 0; g < flat.size(); ++g) Group(fi, osd, flat[g], g, stage, where);
  }

 private:
  // The file's ZeRO stage, and the optimizer it says (the BF16 optimizer writes no zero_stage).
  int Stage(const Value& osd) {
    auto stage_v = osd.Get("zero_stage");
    int stage = stage_v ? ZeroStageOf(*stage_v) : 1;
    out_.stages_seen.insert(stage);
    if (!stage_v) L_.optimizer = "bf16_optimizer";
    else L_.optimizer = stage == 3 ? "zero3" : "zero";
    L_.zero_stage = stage;
    return stage;
  }

  // Each group partitioned over the DP ranks; an expert group over the expert-data-parallel group,
  // world / ep ranks (from which, the first time, the expert-parallel degree).
  void CheckPartitionCounts(const Value& osd, const std::string& where) {
    const Value& pc = osd.At("partition_count");
    std::vector<int64_t> counts;
    if (pc.kind == Value::Kind::Int) counts.push_back(pc.i);
    else
      for (const auto& c : pc.AsSequence()) counts.push_back(c->AsInt());
    for (size_t g = 0; g < counts.size(); ++g) {
      int64_t expected = L_.dp;
      const bool experts = (save_.moe || !save_.autoep.empty()) && IsExpertGroup(osd, g);
      if (experts) out_.expert_groups.insert(static_cast<int>(g));
      if (experts) {
        const int64_t world = static_cast<int64_t>(L_.dp) * L_.tp;
        if (L_.ep == 1 && counts[g] > 0 && counts[g] < world && world % counts[g] == 0)
          L_.ep = static_cast<int>(world / counts[g]);
        expected = world / L_.ep;
      }
      if (counts[g] != expected)
        L_.problems.push_back(where + ": partition_count " + std::to_string(counts[g]) + " of group " +
                              std::to_string(g) + " != " + std::to_string(expected) +
                              (experts ? " (dp x tp / ep)" : " (dp_world_size)"));
    }
  }

  // Flat group g of file fi: its step, its partition size, its fragments.
  void Group(int fi, const Value& osd, const FlatGroup& flat, size_t g, int stage, const std::string& where) {
    const ShardFile& f = L_.files[fi];
    const int gi = static_cast<int>(g);
    if (f.dp == 0) L_.steps[{f.pp, f.tp, gi}] = flat.step;
    const int64_t partition = static_cast<int64_t>(flat.exp_avg.numel());
    out_.partitions[{f.pp, f.tp, gi}] = partition;
    const int64_t have_fp32 = static_cast<int64_t>(flat.fp32.numel());
    if (flat.exp_avg_sq.numel() != flat.exp_avg.numel() || have_fp32 > partition)
      L_.problems.push_back(where + ": group " + std::to_string(g) + ": fp32 / exp_avg / exp_avg_sq partitions hold " +
                            std::to_string(have_fp32) + " / " + std::to_string(partition) + " / " +
                            std::to_string(flat.exp_avg_sq.numel()) + " elements");
    const GroupFragments add{L_, index_, where, save_.moe, fi, gi, partition, have_fp32};
    if (stage == 3) return Zero3Fragments(f, add, where);
    L_.zero_padding_elements += osd.At("group_paddings").AsSequence().at(g)->AsInt();
    const auto& mappings = osd.At("param_slice_mappings").AsSequence();
    if (g >= mappings.size()) throw Error("param_slice_mappings has no group " + std::to_string(g));
    // An expert group (Mixture of Experts, AutoEP) holds the experts of this rank's expert-parallel
    // rank, partitioned over its expert-data-parallel group (ExpertGroups); every other group over
    // the DP ranks.
    const bool experts = out_.expert_groups.count(gi) > 0;
    const reshard::ExpertGroups eg{L_.dp, L_.tp, L_.ep};
    const int ep_rank = experts ? eg.EpRank(f.dp, f.tp) : 0;
    const int64_t part = experts ? eg.Partition(f.dp, f.tp) : f.dp;
    if (save_.moe || save_.shapes_from_weights)
      FlatPositionFragments(*mappings[g], add, experts, ep_rank, part);
    else
      ParamShapesFragments(f, *mappings[g], add, ep_rank, part);
  }

  // ZeRO-3: each parameter padded to a multiple of dp and split equally, in param_shapes order.
  void Zero3Fragments(const ShardFile& f, const GroupFragments& add, const std::string& where) {
    int64_t at = 0;
    for (const auto& [name, numel] : group_params_[{0, f.tp, add.group}]) {
      int64_t piece = (numel + L_.dp - 1) / L_.dp, lo = f.dp * piece, n = std::min(piece, numel - lo);
      if (n > 0) add.Add(name, at, n, lo);
      at += piece;
      if (f.dp == 0) L_.zero_padding_elements += piece * L_.dp - numel;
    }
    if (at != add.partition)
      L_.problems.push_back(where + ": fp32_flat_groups[" + std::to_string(add.group) + "] holds " +
                            std::to_string(add.partition) + " elements, param_shapes need " + std::to_string(at));
  }

  // Fragments at their flat position in the group's buffer (one per expert-parallel rank for an
  // expert group); made relative to each parameter's first element (PlaceByFragments).
  void FlatPositionFragments(const Value& mapping, const GroupFragments& add, bool experts, int ep_rank, int64_t part) {
    for (const auto& item : mapping.AsDict().items()) {
      const std::string name = experts ? moe_shapes_.Global(item.key->AsStr(), ep_rank, L_.ep) : item.key->AsStr();
      const int64_t start = item.value->At("start").AsInt(), numel = item.value->At("numel").AsInt();
      add.Add(name, start, numel, part * add.partition + start);
    }
  }

  // Fragments at their place in their parameter, from its offset in the group's param_shapes list.
  // (AutoEP: an expert group holds the fused tensors of its expert-parallel rank's experts, the
  // run [ep_rank * local, ...) of each full tensor)
  void ParamShapesFragments(const ShardFile& f, const Value& mapping, const GroupFragments& add, int ep_rank,
                            int64_t part) {
    std::map<std::string, std::pair<int64_t, int64_t>> offsets;  // name -> (offset in the flat buffer, numel)
    int64_t at = 0;
    for (const auto& [name, numel] : group_params_[{f.pp, f.tp, add.group}]) offsets[name] = {at, numel}, at += numel;
    for (const auto& item : mapping.AsDict().items()) {
      const std::string& name = item.key->AsStr();
      int64_t start = item.value->At("start").AsInt(), numel = item.value->At("numel").AsInt();
      auto off = offsets.find(name);
      if (off == offsets.end()) {
        L_.problems.push_back(add.where + ": parameter '" + name + "' is mapped in group " + std::to_string(add.group) +
                              " but this rank's param_shapes do not list it there");
        continue;
      }
      add.Add(name, start, numel, part * add.partition + start - off->second.first + int64_t{ep_rank} * off->second.second);
    }
  }

  SourceIndex& L_;
  const SaveVariant& save_;
  const ParamIndex& index_;
  GroupParams& group_params_;
  const MoeShapes& moe_shapes_;
  ZeroPartitions& out_;
};

}  // namespace

std::vector<FlatGroup> FlatGroupsOf(const Value& root, int zero_stage) {
  const Value& osd = root.At("optimizer_state_dict");
  const bool z3 = zero_stage == 3;
  const auto& fp32 = osd.At(z3 ? "fp32_flat_groups" : "single_partition_of_fp32_groups").AsSequence();
  const auto& state = osd.At(z3 ? "optimizer_state_dict" : "base_optimizer_state").At("state").AsDict();
  std::vector<FlatGroup> out;
  for (size_t g = 0; g < fp32.size(); ++g) {
    auto s = state.Get(static_cast<int64_t>(g));
    if (!s) throw Error(std::string(z3 ? "optimizer_state_dict" : "base_optimizer_state") + " has no state for group " +
                        std::to_string(g));
    FlatGroup fg{fp32[g]->AsTensor(), s->At("exp_avg").AsTensor(), s->At("exp_avg_sq").AsTensor(), s->Get("step")};
    for (const auto* t : {&fg.fp32, &fg.exp_avg, &fg.exp_avg_sq})
      if (t->dtype != pt::DType::F32 || !t->contiguous() || t->shape.size() != 1)
        throw Error("group " + std::to_string(g) + ": flat optimizer partitions must be contiguous 1-d float32, found " +
                    std::string(pt::DTypeName(t->dtype)) + " " + pt::ShapeString(t->shape));
    out.push_back(std::move(fg));
  }
  return out;
}

ZeroPartitions IndexZeroFiles(SourceIndex& L, const SaveVariant& save, const ParamIndex& index,
                              GroupParams& group_params, const MoeShapes& moe_shapes, const ParseFile& parse) {
  ZeroPartitions out;
  ZeroFileIndexer indexer(L, save, index, group_params, moe_shapes, out);
  for (size_t fi = 0; fi < L.files.size(); ++fi) {
    ShardFile& f = L.files[fi];
    if (!f.data || KindOf(f) != FileKind::ZeroOptimizer) continue;  // (a torch optimizer's state: TorchState)
    auto file = parse(f);
    if (!file) continue;
    std::string where = source::FileWhere(L, static_cast<int>(fi));
    try {
      indexer.File(static_cast<int>(fi), *file, where);
    } catch (const std::exception& e) {
      L.errors.push_back(where + ": " + e.what());
    }
  }
  return out;
}

void SettleZeroStage(SourceIndex& L, const ZeroPartitions& zero, int config_stage, bool zero3_files) {
  if (zero.stages_seen.size() > 1) L.problems.push_back("optimizer files disagree on the ZeRO stage");
  // The BF16 optimizer writes no zero_stage (its files have the ZeRO-1 layout): the job's stage, 0 or
  // 1, is the one its ds_config names.
  if (L.optimizer == "bf16_optimizer" && (config_stage == 0 || config_stage == 1)) L.zero_stage = config_stage;
  if (L.optimizer.empty()) L.optimizer = zero3_files ? "zero3" : "zero";
}

}  // namespace ucp::deepspeed
