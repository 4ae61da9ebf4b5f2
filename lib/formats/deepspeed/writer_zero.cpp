#include "formats/deepspeed/writer_files.h"

#include <algorithm>

#include "formats/deepspeed/writer_optimizer.h"
#include "formats/deepspeed/writer_values.h"

namespace ucp::deepspeed {
using pt::IntList;
using pt::SetItem;
using pt::Value;
using pt::ValuePtr;
using reshard::ExpertGroups;

namespace {

// Group g's flat partition on DP rank d: the pieces of its parameters it holds, their fragment
// addresses, and DeepSpeed's padding.
struct FlatPartition {
  int parts;                  // the ranks the group is partitioned over
  std::vector<Segment> segs;  // in the partition's flat order
  ValuePtr mapping;           // param_slice_mappings' entry: each piece's fragment_address
  int64_t size, pad;          // the partition's elements; the padding DeepSpeed counts on this rank
};

FlatPartition PartitionOf(const TargetUnit& u, int g, int d) {
  // An expert group is partitioned over its expert-data-parallel group (ExpertGroups: dp x tp / ep
  // ranks), every other group over the DP ranks.
  const bool experts = u.ExpertGroup(g);
  const ExpertGroups eg = u.Groups();
  const int parts = experts ? eg.Partitions() : u.T.SeqDp(), part = experts ? eg.Partition(d, u.U.tp) : d;
  const std::vector<int> members = u.GroupMembers(g, eg.EpRank(d, u.U.tp));
  const int64_t alignment = 2 * parts;  // DeepSpeed: nccl_start_alignment_factor (2) x the group's DP degree
  int64_t total = 0;
  for (int k : members) total += u.U.params[k].local_numel;
  const int64_t padded = (total + alignment - 1) / alignment * alignment, ps = padded / parts;
  const int64_t lo = part * ps, hi = lo + ps;
  FlatPartition p{parts, {}, OrderedDict(), ps, 0};
  int64_t at = 0;
  for (int k : members) {
    const int64_t n = u.U.params[k].local_numel, f0 = std::max(at, lo), f1 = std::min(at + n, hi);
    if (f0 < f1) {
      p.segs.push_back({k, f0 - at, f0 - lo, f1 - f0});
      SetItem(*p.mapping, u.OptimizerName(k), FragmentAddress(f1 - f0, f0 - lo));
    }
    at += n;
  }
  // Padding: the BF16 optimizer counts it on the last rank; ZeRO-1/2 on every rank it reaches,
  // and stores that rank's fp32 partition without it.
  p.pad = u.T.bf16_optimizer() ? (part == parts - 1 ? padded - total : 0)
                               : (total <= lo ? ps : (total < hi ? hi - total : 0));
  return p;
}

}  // namespace

void WriteZeroOptimizerFile(const TargetUnit& u, UnitWeights& weights, ShardFiles& files, int d) {
  const int groups = static_cast<int>(u.U.groups.size());
  auto state = Value::Make(Value::Kind::Dict);
  auto single = Value::Make(Value::Kind::List), paddings = Value::Make(Value::Kind::List);
  auto mappings = Value::Make(Value::Kind::List);
  std::vector<int64_t> partition_count;
  for (int g = 0; g < groups; ++g) {
    FlatPartition p = PartitionOf(u, g, d);
    partition_count.push_back(p.parts);
    paddings->items.push_back(Value::Int(p.pad));
    const int64_t fp32_len = u.T.bf16_optimizer() ? p.size : p.size - p.pad;
    single->items.push_back(weights.FlatState(p.segs, fp32_len, 0));
    state->dict.Set(Value::Int(g), AdamState(weights, g, std::move(p.segs), p.size));
    mappings->items.push_back(p.mapping);
  }
  auto osd = Value::Make(Value::Kind::Dict);
  if (!u.T.bf16_optimizer()) PutLossScaling(u, *osd);
  SetItem(*osd, "clip_grad", SourceOr(u, "clip_grad", ConfiguredClipping(u)));
  SetItem(*osd, "base_optimizer_state", TorchOptimizerState(u, state));
  SetItem(*osd, "single_partition_of_fp32_groups", single);
  if (!u.T.bf16_optimizer()) SetItem(*osd, "zero_stage", ZeroStage(u));
  SetItem(*osd, "group_paddings", paddings);
  SetItem(*osd, "partition_count", IntList(partition_count));
  SetItem(*osd, "ds_version", DsVersion(u));
  SetItem(*osd, "param_slice_mappings", mappings);
  WriteOptimizerRoot(u, files, d, osd);
}

}  // namespace ucp::deepspeed
