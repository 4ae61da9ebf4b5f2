#include "formats/deepspeed/writer.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <tuple>

#include "core/atomic_file.h"
#include "core/error.h"
#include "formats/deepspeed/names.h"
#include "patterns/rules.h"
#include "pt/low_precision.h"
#include "pt/torch_file.h"
#include "target/naming.h"

namespace ucp::deepspeed {
namespace fs = std::filesystem;
using nlohmann::json;
using pt::IntList;
using pt::SetItem;
using pt::Value;
using pt::ValuePtr;
using namespace reshard;

namespace {

// --- values ---------------------------------------------------------------------------------

ValuePtr Copied(const Value& v) { return std::make_shared<Value>(v); }  // shallow: shares the children

void PutIfPresent(Value& dict, const std::string& key, ValuePtr v) {
  if (dict.dict.Get(key)) SetItem(dict, key, std::move(v));
}

ValuePtr OrderedDict() {
  auto d = Value::Make(Value::Kind::Dict);
  d->module = "collections", d->name = "OrderedDict";
  return d;
}
// A shape as the source's files pickle one: torch.Size (torch 1.x), or a plain tuple, which is how
// torch 2.x pickles a torch.Size (DeepSpeed 0.19 files).
ValuePtr TorchSize(const std::vector<int64_t>& shape, bool plain_tuple) {
  auto t = Value::Make(Value::Kind::Tuple);
  for (int64_t d : shape) t->items.push_back(Value::Int(d));
  if (!plain_tuple) t->module = "torch", t->name = "Size";
  return t;
}
// Whether the source's param_shapes hold plain tuples rather than torch.Size (see TorchSize).
bool PlainTupleShapes(const Value& model_states) {
  auto shapes = model_states.Get("param_shapes");
  if (!shapes || !shapes->IsSequence()) return false;
  for (const auto& g : shapes->AsSequence())
    if (g && g->kind == Value::Kind::Dict)
      for (const auto& item : g->dict.items()) return item.value->kind == Value::Kind::Tuple && item.value->name.empty();
  return false;
}
ValuePtr TorchDtype(const std::string& dtype) {
  auto g = Value::Make(Value::Kind::Global);
  g->module = "torch", g->name = dtype == "bf16" ? "bfloat16" : dtype == "fp16" ? "float16" : "float32";
  return g;
}
ValuePtr Float(double f) { return Value::Float(f); }

// DeepSpeed's loss scalers, as their __init__ leaves them.
ValuePtr LossScalerFor(const std::string& dtype, const ValuePtr& source) {
  const bool dynamic = dtype == "fp16";
  const char* cls = dynamic ? "DynamicLossScaler" : "LossScaler";
  if (source && source->kind == Value::Kind::Object && source->name == cls) return source;
  auto state = Value::Make(Value::Kind::Dict);
  if (dynamic) {
    SetItem(*state, "cur_scale", Float(65536.0));
    SetItem(*state, "cur_iter", Value::Int(0));
    SetItem(*state, "last_overflow_iter", Value::Int(-1));
    SetItem(*state, "scale_factor", Float(2.0));
    SetItem(*state, "scale_window", Value::Int(1000));
    SetItem(*state, "min_scale", Value::Int(1));
    SetItem(*state, "delayed_shift", Value::Int(1));
    SetItem(*state, "cur_hysteresis", Value::Int(1));
    SetItem(*state, "consecutive_hysteresis", Value::Bool(false));
    SetItem(*state, "raise_error_at_min_scale", Value::Bool(true));
    SetItem(*state, "dynamic", Value::Bool(true));
    SetItem(*state, "dtype", TorchDtype("fp16"));
  } else {
    SetItem(*state, "cur_scale", Float(1.0));
    SetItem(*state, "dynamic", Value::Bool(false));
  }
  auto obj = Value::MakeObject("deepspeed.runtime.fp16.loss_scaler", cls, nullptr, state);
  obj->via_new = true;
  return obj;
}

ValuePtr FragmentAddress(int64_t numel, int64_t start) {
  auto state = Value::Make(Value::Kind::Dict);
  SetItem(*state, "numel", Value::Int(numel));
  SetItem(*state, "start", Value::Int(start));
  auto obj = Value::MakeObject("deepspeed.utils.tensor_fragment", "fragment_address", nullptr, state);
  obj->via_new = true;
  return obj;
}

struct LowPrecision {
  pt::DType dtype;
  size_t size;
};
LowPrecision LpOf(const std::string& dtype) {
  if (dtype == "bf16") return {pt::DType::BF16, 2};
  if (dtype == "fp16") return {pt::DType::F16, 2};
  return {pt::DType::F32, 4};
}

// Where a key sits inside its Megatron module (registration order), for the order of a model's
// state_dict; keys it does not know come after, in the atomic checkpoint's order.
int LocalKeyRank(const std::string& local) {
  static const std::vector<std::string> order = {
      "word_embeddings.weight", "position_embeddings.weight", "input_layernorm.weight", "input_layernorm.bias",
      "self_attention.query_key_value.weight", "self_attention.query_key_value.bias", "self_attention.dense.weight",
      "self_attention.dense.bias", "post_attention_layernorm.weight", "post_attention_layernorm.bias",
      "mlp.dense_h_to_4h.weight", "mlp.dense_h_to_4h.bias", "mlp.dense_4h_to_h.weight", "mlp.dense_4h_to_h.bias",
      "weight", "bias"};
  auto it = std::find(order.begin(), order.end(), local);
  return it == order.end() ? static_cast<int>(order.size()) : static_cast<int>(it - order.begin());
}

// The model's order of parameters: layer spec, then the key's place in its module.
bool InModelOrder(const LayerPlace& a, const LayerPlace& b) {
  return std::make_pair(a.spec, LocalKeyRank(a.local)) < std::make_pair(b.spec, LocalKeyRank(b.local));
}

class UnitWriter {
 public:
  // `arena` holds the unit's training-dtype weights; kept by the caller from unit to unit, so that
  // its pages are faulted in (and zeroed by the kernel) once per run, not once per unit.
  UnitWriter(const Source& S, const TargetLayout& T, const Plan& P, const Unit& U, SliceSource& slices, std::string dir,
             ScratchBytes& arena)
      : S_(S), T_(T), P_(P), U_(U), slices_(slices), dir_(std::move(dir)), arena_(arena),
        expert_moment_ratio_(ExpertMomentRatio(S, T)) {}

  // The files of this unit: under ZeRO-3 its DP rank's model-states and optimizer files; else the
  // optimizer files of every DP rank, the layer files and the model-states file.
  void Write() {
    if (T_.zero_stage == 3) {
      WriteZero3OptimizerFile(U_.dp);
      WriteShardFile(Zero3ModelStatesFileName(U_.dp, Mp()),
                     *ModelStates(Zero3Module()));
      return;
    }
    const auto lp = LpOf(T_.dtype);
    auto size = [&](const UnitParam& up) { return (std::max<int64_t>(1, up.local_numel) * lp.size + 63) / 64 * 64; };
    int64_t total = 0;
    for (const auto& up : U_.params) total += size(up);
    uint8_t* at = arena_.Reserve(static_cast<size_t>(total));  // filled whole from the fp32 weights, so not cleared
    for (const auto& up : U_.params) {
      lp_.push_back(std::shared_ptr<uint8_t[]>(std::shared_ptr<void>(), at));  // not owning: the arena outlives the unit
      at += size(up);
    }
    if (TorchOptimizer()) {
      if (!DdpBf16Wrapper(S_, T_)) {  // no fp32 copy beside the model's weights: they are the master weights
        for (size_t k = 0; k < U_.params.size(); ++k)
          slices_.Read(k, 0, 0, U_.params[k].local_numel, reinterpret_cast<float*>(lp_[k].get()));
      } else {  // bf16: the masters, read once, go in fp32_groups; Fill makes the weights their copies
        for (size_t k = 0; k < U_.params.size(); ++k) {
          const int64_t n = U_.params[k].local_numel;
          masters_.emplace_back(new uint8_t[static_cast<size_t>(std::max<int64_t>(1, n)) * 4]);
          Fill(k, 0, 0, n, reinterpret_cast<float*>(masters_.back().get()));
        }
      }
      WriteTorchOptimizerFiles();
    } else {
      for (int d = 0; d < T_.SeqDp(); ++d) WriteOptimizerFile(d);  // fills lp_ from the fp32 weights
    }
    if (NamingOf(T_) == Naming::Plain) {
      if (S_.moe) WriteExpertFiles();
      WriteShardFile(ModelStatesFileName(Mp()), *ModelStates(PlainModule()));
      return;
    }
    WriteLayerFiles();
    WriteShardFile(ModelStatesFileName(Mp()), *ModelStates(Value::None()));
  }

  UnitFiles written() const { return written_; }

 private:
  // One file of the target, written without an fsync of its own (the run syncs the file system
  // once before `latest` names the folder) and without a digest (nothing records one).
  void WriteShardFile(const std::string& name, const Value& root) {
    const std::string path = dir_ + "/" + name;
    pt::WriteTorchFile(path, root, Durability::Batch, Digest::None);
    written_.bytes += static_cast<int64_t>(fs::file_size(path)), ++written_.files;
  }

  // Local elements [a, b) of unit param k, state s, into dst (float32), from the slice source; fp32
  // also to the layer files' weights.
  void Fill(size_t k, int s, int64_t a, int64_t b, float* dst) {
    slices_.Read(k, s, a, b, dst);
    if (s > 0 && S_.atoms[U_.params[k].atom].expert >= 0 && expert_moment_ratio_ != 1.0) {
      // The expert's gradient scale differs between the source's job and the target's
      // (ExpertMomentRatio): its Adam moments are rescaled by the ratio and its square (exactly,
      // for power-of-two ratios), so that the first steps of the new job continue the old ones.
      const double r = expert_moment_ratio_, f = s == 1 ? r : r * r;
      for (int64_t i = 0; i < b - a; ++i) dst[i] = static_cast<float>(dst[i] * f);
    }
    if (s == 0 && !lp_.empty()) {  // the training-dtype weights of the layer files, from the same fp32 values
      uint8_t* lp = lp_[k].get();
      const int64_t n = b - a;
      if (T_.dtype == "bf16") {
        for (int64_t i = 0; i < n; ++i) {
          const uint16_t h = pt::Fp32ToBf16(dst[i]);
          std::memcpy(lp + 2 * (a + i), &h, 2);
        }
      } else if (T_.dtype == "fp16") {
        for (int64_t i = 0; i < n; ++i) {
          const uint16_t h = pt::Fp32ToFp16(dst[i]);
          std::memcpy(lp + 2 * (a + i), &h, 2);
        }
      } else {
        std::memcpy(lp + 4 * a, dst, static_cast<size_t>(n) * 4);
      }
    }
  }

  // Elements [at, at + n) of a flat ZeRO tensor are unit parameter k's local elements [local, local + n).
  struct Segment {
    int k;
    int64_t local, at, n;
  };

  // A flat float32 ZeRO tensor of `len` elements, produced while its file is written: the segments'
  // elements of state `s`, zeros elsewhere (alignment padding). Nothing of it is held in memory.
  ValuePtr FlatState(std::vector<Segment> segs, int64_t len, int s) {
    return pt::ProducedTensor(pt::DType::F32, {len}, [this, segs = std::move(segs), s](uint64_t off, uint64_t size, uint8_t* dst) {
      const int64_t a = static_cast<int64_t>(off / 4), b = static_cast<int64_t>((off + size) / 4);
      float* out = reinterpret_cast<float*>(dst);
      int64_t filled = a;  // [a, filled) written; segments come in flat order, the gaps between them are zeros
      for (const auto& sg : segs) {
        const int64_t f0 = std::max(a, sg.at), f1 = std::min(b, sg.at + sg.n);
        if (f0 >= f1) continue;
        std::fill(out + (filled - a), out + (f0 - a), 0.0f);
        Fill(static_cast<size_t>(sg.k), s, sg.local + (f0 - sg.at), sg.local + (f1 - sg.at), out + (f0 - a));
        filled = f1;
      }
      std::fill(out + (filled - a), out + (b - a), 0.0f);
    });
  }

  int Mp() const { return MpRank(U_.pp, U_.tp, T_.tp); }

  // The source's ds_config (a Mixture-of-Experts model-states file has none: the atomic
  // checkpoint's optimizer state keeps its optimizer files' one), with the target's stage and dtype.
  ValuePtr DsConfig() const {
    auto cfg = S_.model_states.root->Get("ds_config");
    if (!cfg) cfg = S_.optimizer.root->Get("ds_config");
    if (!cfg || cfg->kind != Value::Kind::Dict) return cfg ? cfg : Value::None();
    auto out = Copied(*cfg);
    auto section = [&](const char* key, const char* field, ValuePtr v) {
      auto sec = out->Get(key);
      if (!sec || sec->kind != Value::Kind::Dict) return;
      auto copy = Copied(*sec);
      SetItem(*copy, field, std::move(v));
      SetItem(*out, key, copy);
    };
    section("zero_optimization", "stage", Value::Int(T_.zero_stage));
    section("bf16", "enabled", Value::Bool(T_.dtype == "bf16"));
    section("fp16", "enabled", Value::Bool(T_.dtype == "fp16"));
    // The gradient-accumulation dtype that chose the optimizer (TargetLayout::grad_accum_dtype):
    // said where the source said it, and added where DeepSpeed's default would choose another.
    if (out->Get("data_types")) section("data_types", "grad_accum_dtype", Value::Str(T_.grad_accum_dtype));
    else if (T_.bf16_optimizer() && T_.zero_stage == 1) {
      auto dt = Value::Make(Value::Kind::Dict);
      SetItem(*dt, "grad_accum_dtype", Value::Str("fp32"));
      SetItem(*out, "data_types", dt);
    }
    return out;
  }

  // A job without ZeRO that runs the model's own torch optimizer: Mixture of Experts in fp32, its
  // state per position in one expp_rank file per expert-parallel rank; bf16 inside DeepSpeed's DDP
  // bf16 wrapper (DdpBf16Wrapper), in the model-states files (and expp_rank files).
  bool TorchOptimizer() const { return TorchOptimizerTarget(S_, T_); }

  // Mixture of Experts: the expert-parallel degree, the target's expert-parallel groups, and whether
  // optimizer group g holds experts.
  int Ep() const { return std::max(1, T_.ep); }
  ExpertGroups Groups() const { return {T_.dp, T_.tp, Ep()}; }
  // Whether this unit's TP rank saves the expert files (and, without ZeRO, the expp_rank file) of
  // expert-parallel rank r: the TP rank of global rank r (ExpertGroups).
  bool SavesEpRank(int r) const { return Groups().SaverTp(r) == U_.tp; }
  bool ExpertGroup(size_t g) const { return S_.moe && g < S_.expert_group.size() && S_.expert_group[g]; }

  // The parameters of group g on a rank of expert-parallel rank `ep_rank`, in the group's flat order.
  // An expert group holds the experts of that expert-parallel rank only, layer by layer, expert by
  // expert (the order of the model's parameters on that rank).
  std::vector<int> GroupMembers(size_t g, int ep_rank) const {
    if (!ExpertGroup(g)) return U_.groups[g];
    std::vector<int> members;
    for (int k : U_.groups[g])
      if (EpRankOf(S_, S_.atoms[U_.params[k].atom], Ep()) == ep_rank) members.push_back(k);
    std::stable_sort(members.begin(), members.end(), [&](int x, int y) {
      const Atom &a = S_.atoms[U_.params[x].atom], &b = S_.atoms[U_.params[y].atom];
      return std::make_pair(a.spec(), a.expert) < std::make_pair(b.spec(), b.expert);
    });
    return members;
  }

  // Unit parameter k's name in an optimizer file: an expert by its id on its expert-parallel rank.
  std::string OptimizerName(int k) const {
    const Atom& a = S_.atoms[U_.params[k].atom];
    const std::string& name = P_.names[U_.params[k].atom];
    if (a.expert < 0) return name;
    return ExpertOf(name)->With(LocalExpertId(S_, a, Ep()));
  }

  void WriteOptimizerFile(int d) {
    const int groups = static_cast<int>(U_.groups.size());
    auto state = Value::Make(Value::Kind::Dict);
    auto single = Value::Make(Value::Kind::List), paddings = Value::Make(Value::Kind::List);
    auto mappings = Value::Make(Value::Kind::List);
    std::vector<int64_t> partition_count;
    for (int g = 0; g < groups; ++g) {
      // An expert group is partitioned over its expert-data-parallel group (ExpertGroups: dp x tp / ep
      // ranks), every other group over the DP ranks.
      const bool experts = ExpertGroup(g);
      const ExpertGroups eg = Groups();
      const int parts = experts ? eg.Partitions() : T_.SeqDp(), part = experts ? eg.Partition(d, U_.tp) : d;
      partition_count.push_back(parts);
      const std::vector<int> members = GroupMembers(g, eg.EpRank(d, U_.tp));
      const int64_t alignment = 2 * parts;  // DeepSpeed: nccl_start_alignment_factor (2) x the group's DP degree
      int64_t total = 0;
      for (int k : members) total += U_.params[k].local_numel;
      const int64_t padded = (total + alignment - 1) / alignment * alignment, ps = padded / parts;
      const int64_t lo = part * ps, hi = lo + ps;
      std::vector<Segment> segs;
      auto m = OrderedDict();
      int64_t at = 0;
      for (int k : members) {
        const int64_t n = U_.params[k].local_numel, f0 = std::max(at, lo), f1 = std::min(at + n, hi);
        if (f0 < f1) {
          segs.push_back({k, f0 - at, f0 - lo, f1 - f0});
          SetItem(*m, OptimizerName(k), FragmentAddress(f1 - f0, f0 - lo));
        }
        at += n;
      }
      // Padding: the BF16 optimizer counts it on the last rank; ZeRO-1/2 on every rank it reaches,
      // and stores that rank's fp32 partition without it.
      int64_t pad = T_.bf16_optimizer() ? (part == parts - 1 ? padded - total : 0)
                                        : (total <= lo ? ps : (total < hi ? hi - total : 0));
      paddings->items.push_back(Value::Int(pad));
      const int64_t fp32_len = T_.bf16_optimizer() ? ps : ps - pad;
      single->items.push_back(FlatState(segs, fp32_len, 0));
      state->dict.Set(Value::Int(g), AdamState(g, std::move(segs), ps));
      mappings->items.push_back(m);
    }
    auto osd = Value::Make(Value::Kind::Dict);
    if (!T_.bf16_optimizer()) PutLossScaling(*osd);
    SetItem(*osd, "clip_grad", SourceOr("clip_grad", ConfiguredClipping()));
    SetItem(*osd, "base_optimizer_state", TorchOptimizerState(state));
    SetItem(*osd, "single_partition_of_fp32_groups", single);
    if (!T_.bf16_optimizer()) SetItem(*osd, "zero_stage", ZeroStage());
    SetItem(*osd, "group_paddings", paddings);
    SetItem(*osd, "partition_count", IntList(partition_count));
    SetItem(*osd, "ds_version", DsVersion());
    SetItem(*osd, "param_slice_mappings", mappings);
    WriteOptimizerRoot(d, osd);
  }

  // Without ZeRO, expert-parallel rank r's expp_rank file holds {'optimizer': state_dict()} of the
  // model's torch optimizer: Adam's step and moments per position, the positions numbered group by
  // group in each group's order (GroupMembers: an expert group holds rank r's experts), each
  // parameter's moments in its own shape. In bf16, DeepSpeed's DDP bf16 wrapper (its unfused FP16
  // optimizer class) holds that state_dict, with the fp32 masters per group and position and its
  // static loss scale. The state of the unit's DP rank 0 (under Mixture of Experts, expert-parallel
  // rank tp) goes in the model-states file too (without experts, only there). Each expp_rank file is
  // written at the TP rank of the rank that saves it (ExpertGroups).
  void WriteTorchOptimizerFiles() {
    const bool wrapper = DdpBf16Wrapper(S_, T_);
    for (int r = 0; r < Ep(); ++r) {
      if (S_.moe && !SavesEpRank(r)) continue;
      auto state = Value::Make(Value::Kind::Dict);
      std::vector<std::vector<int64_t>> positions(U_.groups.size());
      auto masters = Value::Make(Value::Kind::List);  // fp32_groups
      int64_t pos = 0;
      for (size_t g = 0; g < U_.groups.size(); ++g) {
        auto group_masters = Value::Make(Value::Kind::List);
        for (int k : GroupMembers(g, r)) {
          const auto& shape = U_.params[k].copy.shape;
          if (wrapper) group_masters->items.push_back(pt::OwnedTensor(masters_[k], masters_[k].get(), pt::DType::F32, shape));
          auto st = Value::Make(Value::Kind::Dict);
          SetItem(*st, "step", OwnStep(GroupStep(static_cast<int>(g))));
          for (int s : {1, 2})
            SetItem(*st, s == 1 ? "exp_avg" : "exp_avg_sq",
                    pt::ProducedTensor(pt::DType::F32, shape, [this, k, s](uint64_t off, uint64_t size, uint8_t* dst) {
                      Fill(static_cast<size_t>(k), s, static_cast<int64_t>(off / 4), static_cast<int64_t>((off + size) / 4),
                           reinterpret_cast<float*>(dst));
                    }));
          state->dict.Set(Value::Int(pos), st);
          positions[g].push_back(pos++);
        }
        masters->items.push_back(group_masters);
      }
      auto osd = Value::Make(Value::Kind::Dict);
      SetItem(*osd, "state", state);
      SetItem(*osd, "param_groups", ParamGroups(positions));
      if (wrapper) {
        auto outer = Value::Make(Value::Kind::Dict);
        SetItem(*outer, "dynamic_loss_scale", Value::Bool(false));
        SetItem(*outer, "cur_scale", Float(1.0));
        SetItem(*outer, "cur_iter", Value::Int(S_.manifest["source"]["iteration"].get<int64_t>()));
        SetItem(*outer, "optimizer_state_dict", osd);
        SetItem(*outer, "fp32_groups", masters);
        osd = outer;
      }
      auto root = Value::Make(Value::Kind::Dict);
      SetItem(*root, "optimizer", osd);
      if (S_.moe) WriteShardFile(ExpertOptimFileName(r, Mp()), *root);
      if (!rank0_optimizer_) rank0_optimizer_ = osd;
    }
  }

  // A step of its own for each position, as torch keeps one tensor per parameter (and steps each in
  // place): a 0-dim tensor is copied, a number is kept.
  static ValuePtr OwnStep(const ValuePtr& step) {
    if (!step || step->kind != Value::Kind::Tensor) return step ? step : Value::None();
    const pt::TensorView& t = step->AsTensor();
    std::shared_ptr<uint8_t[]> bytes(new uint8_t[std::max<uint64_t>(1, t.nbytes())]);
    std::memcpy(bytes.get(), t.data(), t.nbytes());
    return pt::OwnedTensor(bytes, bytes.get(), t.dtype, t.shape);
  }

  // DeepSpeed's engine saves {optimizer_state_dict, ds_config, ds_version} per DP rank.
  void WriteOptimizerRoot(int d, ValuePtr osd) {
    auto root = Value::Make(Value::Kind::Dict);
    SetItem(*root, "optimizer_state_dict", std::move(osd));
    SetItem(*root, "ds_config", DsConfig());
    SetItem(*root, "ds_version", DsVersion());
    WriteShardFile(OptimStatesFileName(T_.dtype == "bf16" ? "bf16_" : "", d, Mp()), *root);
  }

  // Group g's Adam state over a flat tensor of `len` elements: the step and the two moments.
  ValuePtr AdamState(int g, std::vector<Segment> segs, int64_t len) {
    auto gs = Value::Make(Value::Kind::Dict);
    SetItem(*gs, "step", GroupStep(g));
    SetItem(*gs, "exp_avg", FlatState(segs, len, 1));
    SetItem(*gs, "exp_avg_sq", FlatState(std::move(segs), len, 2));
    return gs;
  }

  // torch's optimizer.state_dict(): the per-group state and the source's param_groups, each listing
  // its flat tensors' positions (one per group: [g]; ZeRO-3: its sub-groups').
  ValuePtr TorchOptimizerState(ValuePtr state, std::vector<std::vector<int64_t>> positions = {}) const {
    auto base = Value::Make(Value::Kind::Dict);
    SetItem(*base, "state", std::move(state));
    if (positions.empty()) {
      positions.resize(U_.groups.size());
      for (size_t g = 0; g < positions.size(); ++g) positions[g] = {static_cast<int64_t>(g)};
    }
    SetItem(*base, "param_groups", ParamGroups(positions));
    return base;
  }

  // ZeRO-3 cuts each param group into sub-groups of about sub_group_size partition elements, a flat
  // partition and an optimizer state each, numbered across the groups (stage3.py's
  // _create_fp16_sub_groups: parameters are added until the sum of their partitions reaches the
  // size; a group whose partitions sum to no more is one sub-group). The size is the ds_config's
  // zero_optimization.sub_group_size, DeepSpeed's default 1e9 where it sets none.
  struct SubGroup {
    int group;
    std::vector<int> members;  // unit param indices, in the group's order
  };
  std::vector<SubGroup> Zero3SubGroups() const {
    int64_t size = 1000000000;
    auto cfg = DsConfig();
    auto zero = cfg && cfg->kind == Value::Kind::Dict ? cfg->Get("zero_optimization") : nullptr;
    auto v = zero && zero->kind == Value::Kind::Dict ? zero->Get("sub_group_size") : nullptr;
    if (v && (v->kind == Value::Kind::Int || v->kind == Value::Kind::Float)) size = static_cast<int64_t>(v->AsFloat());
    std::vector<SubGroup> subs;
    for (size_t g = 0; g < U_.groups.size(); ++g) {
      const auto& members = U_.groups[g];
      int64_t total = 0;
      for (int k : members) total += Zero3Piece(U_.params[k].local_numel, T_.SeqDp());
      if (size >= total) {
        subs.push_back({static_cast<int>(g), members});
        continue;
      }
      SubGroup sub{static_cast<int>(g), {}};
      int64_t sum = 0;
      for (size_t i = 0; i < members.size(); ++i) {
        sub.members.push_back(members[i]);
        sum += Zero3Piece(U_.params[members[i]].local_numel, T_.SeqDp());
        if (sum >= size || i + 1 == members.size()) {
          subs.push_back(std::move(sub));
          sub = SubGroup{static_cast<int>(g), {}};
          sum = 0;
        }
      }
    }
    return subs;
  }

  // The source's param_groups, each listing `positions[g]` (a flat group's one tensor: [g]); under
  // Mixture of Experts each expert group named after the target's expert-parallel degree, as
  // DeepSpeed names it ('ep_size_<ep>').
  ValuePtr ParamGroups(const std::vector<std::vector<int64_t>>& positions) const {
    auto groups = S_.optimizer.root->Get("param_groups");
    if (!groups || groups->kind != Value::Kind::List) return groups;
    auto out = Copied(*groups);
    for (size_t k = 0; k < out->items.size(); ++k) {
      auto& g = out->items[k];
      if (g->kind != Value::Kind::Dict) continue;
      g = Copied(*g);
      if (g->Get("params") && k < positions.size()) SetItem(*g, "params", IntList(positions[k]));
      auto moe = g->Get("moe");
      if (S_.moe && moe && moe->kind == Value::Kind::Bool && moe->b && g->Get("name"))
        SetItem(*g, "name", Value::Str("ep_size_" + std::to_string(Ep())));
    }
    return out;
  }

  // Mixture of Experts: one file per expert of each MoE layer, its weights under its global id in
  // the training dtype (engine._save_moe_checkpoint), and per expert-parallel rank an
  // expp_rank file, which under ZeRO holds no optimizer state. DeepSpeed 0.19.3 and later write
  // none under ZeRO: the target has them when the source had them (the manifest's file kinds).
  void WriteExpertFiles() {
    const auto lp = LpOf(T_.dtype);
    std::map<std::pair<int, int>, ValuePtr> files;  // (MoE layer, global expert) -> its weights
    for (size_t k = 0; k < U_.params.size(); ++k) {
      const Atom& a = S_.atoms[U_.params[k].atom];
      if (a.expert < 0 || !SavesEpRank(EpRankOf(S_, a, Ep()))) continue;
      auto& f = files[{a.moe_layer, a.expert}];
      if (!f) f = Value::Make(Value::Kind::Dict);
      SetItem(*f, P_.names[U_.params[k].atom], pt::OwnedTensor(lp_[k], lp_[k].get(), lp.dtype, U_.params[k].copy.shape));
    }
    for (const auto& [key, dict] : files) WriteShardFile(ExpertStatesFileName(key.first, key.second, Mp()), *dict);
    for (int r = 0; !TorchOptimizer() && ExppUnderZero() && r < Ep(); ++r) {
      if (!SavesEpRank(r)) continue;
      auto root = Value::Make(Value::Kind::Dict);
      SetItem(*root, "optimizer", Value::None());
      WriteShardFile(ExpertOptimFileName(r, Mp()), *root);
    }
  }

  // Whether the target's DeepSpeed writes expp_rank files ({'optimizer': None}) under ZeRO too:
  // what a ZeRO source's files show, unless another release is asked for; else (a source without
  // ZeRO has them either way) by release: DeepSpeed 0.19.3 stopped.
  bool ExppUnderZero() const {
    const auto& src = S_.manifest["source"];
    if (T_.ds_version.empty() && src.value("zero_stage", 1) > 0) {
      const auto kinds = src.value("file_kinds", nlohmann::json::object());
      return !kinds.is_object() || kinds.empty() || kinds.value("expert_optimizer_states", 0) > 0;
    }
    return ReleaseBefore(TargetRelease(S_, T_), 0, 19, 3);
  }

  // The fp16 / ZeRO optimizers' loss scaling: the scaler the dtype needs, and the source's overflow flag.
  void PutLossScaling(Value& osd) const {
    SetItem(osd, "loss_scaler", LossScalerFor(T_.dtype, S_.optimizer.root->Get("loss_scaler")));
    SetItem(osd, "dynamic_loss_scale", Value::Bool(T_.dtype == "fp16"));
    SetItem(osd, "overflow", SourceOr("overflow", Value::Bool(false)));
  }

  // The gradient clipping the job's ds_config sets (DeepSpeed's ZeRO and BF16 optimizers keep it as
  // clip_grad, and restore it from their files), for a source whose optimizer kept none (without
  // ZeRO, the model's torch optimizer clips nothing itself); 0.0, DeepSpeed's default, if unset.
  ValuePtr ConfiguredClipping() const {
    auto cfg = DsConfig();
    auto clip = cfg && cfg->kind == Value::Kind::Dict ? cfg->Get("gradient_clipping") : nullptr;
    if (clip && (clip->kind == Value::Kind::Float || clip->kind == Value::Kind::Int)) return Float(clip->AsFloat());
    return Float(0.0);
  }

  ValuePtr SourceOr(const char* key, ValuePtr fallback) const {
    auto v = S_.optimizer.root->Get(key);
    return v ? v : fallback;
  }

  ValuePtr ZeroStage() const {
    auto stage = Value::MakeObject("deepspeed.runtime.zero.config", "ZeroStageEnum");
    stage->args->items.push_back(Value::Int(T_.zero_stage));
    return stage;
  }

  // ZeRO-3: DP rank d's flat group is the concatenation of its slices of the group's parameters
  // (each padded to its piece), in the group's parameter order.
  void WriteZero3OptimizerFile(int d) {
    auto state = Value::Make(Value::Kind::Dict), flat = Value::Make(Value::Kind::List);
    const std::vector<SubGroup> subs = Zero3SubGroups();
    std::vector<std::vector<int64_t>> positions(U_.groups.size());
    for (size_t sg = 0; sg < subs.size(); ++sg) {
      int64_t total = 0;
      std::vector<Segment> segs;
      for (int k : subs[sg].members) {
        const UnitParam& up = U_.params[k];
        if (up.begin < up.end) segs.push_back({k, up.begin, total, up.end - up.begin});
        total += Zero3Piece(up.local_numel, T_.SeqDp());
      }
      flat->items.push_back(FlatState(segs, total, 0));
      state->dict.Set(Value::Int(static_cast<int64_t>(sg)), AdamState(subs[sg].group, std::move(segs), total));
      positions[subs[sg].group].push_back(static_cast<int64_t>(sg));
    }
    auto osd = Value::Make(Value::Kind::Dict);
    SetItem(*osd, "zero_stage", ZeroStage());
    PutLossScaling(*osd);
    SetItem(*osd, "partition_count", Value::Int(T_.SeqDp()));
    SetItem(*osd, "optimizer_state_dict", TorchOptimizerState(state, positions));
    SetItem(*osd, "fp32_flat_groups", flat);
    WriteOptimizerRoot(d, osd);
  }

  // DeepSpeed saves module.state_dict() under ZeRO-3 too: GPTModel's flat names, every parameter
  // an empty placeholder of the training dtype (the weights are in the optimizer files).
  ValuePtr Zero3Module() const {
    static const auto placeholder_owner = std::make_shared<uint8_t>(0);
    const auto lp = LpOf(T_.dtype);
    auto module = OrderedDict();
    for (size_t k : ModelOrder())
      SetItem(*module, P_.names[U_.params[k].atom], pt::OwnedTensor(placeholder_owner, placeholder_owner.get(), lp.dtype, {0}));
    return WithModuleBuffers(module);
  }

  // The unit's parameters in the model's order: a module's own (Naming::Module), else layer spec,
  // then the key's place in its module: the order of a model's state_dict and of its layer files.
  std::vector<size_t> ModelOrder() const {
    std::vector<size_t> order(U_.params.size());
    for (size_t k = 0; k < order.size(); ++k) order[k] = k;
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
      const Atom &a = S_.atoms[U_.params[x].atom], &b = S_.atoms[U_.params[y].atom];
      if (S_.naming == Naming::Module) return a.module_order < b.module_order;
      return InModelOrder(a.place, b.place);
    });
    return order;
  }

  // A module that is no GPT (Naming::Module) keeps its buffers in its state_dict beside the
  // parameters (DeepSpeed's buffer_names), loaded with them: carried from the source's module, in
  // its order. Megatron's GPT modules save none.
  ValuePtr WithModuleBuffers(ValuePtr params) const {
    if (S_.naming != Naming::Module) return params;
    auto source = S_.model_states.root->Get("module");
    auto buffers = S_.model_states.root->Get("buffer_names");
    if (!source || source->kind != Value::Kind::Dict || !buffers || !buffers->IsSequence() || buffers->AsSequence().empty())
      return params;
    std::set<std::string> is_buffer;
    for (const auto& b : buffers->AsSequence())
      if (b->kind == Value::Kind::Str) is_buffer.insert(b->s);
    auto module = OrderedDict();
    for (const auto& item : source->dict.items()) {
      const std::string key = item.key->kind == Value::Kind::Str ? item.key->s : "";
      if (is_buffer.count(key)) module->dict.Set(item.key, item.value);
      else if (auto p = params->Get(key)) module->dict.Set(item.key, p);
    }
    return module;
  }

  ValuePtr DsVersion() const {
    if (!T_.ds_version.empty()) return Value::Str(T_.ds_version);
    auto v = S_.optimizer.root->Get("ds_version");
    if (!v) v = S_.model_states.root->Get("ds_version");
    return v ? v : Value::Str("0.14.5");
  }

  ValuePtr GroupStep(int g) {
    for (const auto& a : S_.atoms)
      if (a.group == g && a.has_step) {
        auto it = steps_.find(g);
        if (it == steps_.end()) it = steps_.emplace(g, S_.reader->ReadStep(a.name)).first;
        return it->second;
      }
    return Value::None();
  }

  // A model that is not a PipelineModule: its state_dict, this TP rank's weights in the training
  // dtype under GPTModel's names, in the model's order (embedding, layers, final norm).
  ValuePtr PlainModule() const {
    const auto lp = LpOf(T_.dtype);
    auto module = OrderedDict();
    for (size_t k : ModelOrder()) {
      if (S_.atoms[U_.params[k].atom].expert >= 0) continue;  // the experts have files of their own
      SetItem(*module, P_.names[U_.params[k].atom], pt::OwnedTensor(lp_[k], lp_[k].get(), lp.dtype, U_.params[k].copy.shape));
    }
    return WithModuleBuffers(module);
  }

  void WriteLayerFiles() {
    const auto lp = LpOf(T_.dtype);
    std::map<int, ValuePtr> files;  // spec -> OrderedDict
    for (size_t k : ModelOrder()) {
      const Atom& a = S_.atoms[U_.params[k].atom];
      if (a.tied() && U_.pp != P_.embedding_stage) continue;  // the tied head writes no layer file
      auto& f = files[a.spec()];
      if (!f) f = OrderedDict();
      auto owner = lp_[k];
      SetItem(*f, a.place.local, pt::OwnedTensor(owner, owner.get(), lp.dtype, U_.params[k].copy.shape));
    }
    for (const auto& [spec, dict] : files) {
      WriteShardFile(LayerStatesFileName(spec, U_.tp), *dict);
    }
  }

  // Megatron-DeepSpeed names the TP rules (replicated, averaged, row-parallel) in its info only at
  // TP > 1. A TP > 1 target of a source whose info lacks one of them gets it from the rules that
  // decided the parameters (the manifest's, the model family's where the checkpoint was silent), in
  // the model's order, placed before the sub-parameter keys as Megatron-DeepSpeed places them.
  ValuePtr WithTpRules(const Value& info) const {
    std::vector<std::pair<std::string, ValuePtr>> missing;
    std::vector<size_t> order(S_.atoms.size());
    for (size_t k = 0; k < order.size(); ++k) order[k] = k;
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return InModelOrder(S_.atoms[x].place, S_.atoms[y].place); });
    for (const char* key : {patterns::kAverageKey, patterns::kReplicateKey, patterns::kRowParallelKey}) {
      if (info.Get(key)) continue;
      auto list = Value::Make(Value::Kind::List);
      std::set<std::string> seen;
      for (size_t k : order) {
        const auto& rule = S_.atoms[k].meta.value("rule", json::object());
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

  ValuePtr ModelStates(ValuePtr module) const {
    auto root = Copied(*S_.model_states.root);
    SetItem(*root, "module", std::move(module));
    auto shapes = Value::Make(Value::Kind::List);
    const bool plain_tuples = PlainTupleShapes(*S_.model_states.root);
    // The parameters of each optimizer group on DP rank 0 (the rank that saves this file): under
    // Mixture of Experts (DeepSpeed 0.19.3+ records them), the experts of its expert-parallel rank,
    // by their local names.
    // Under ZeRO-3, one per sub-group (Zero3SubGroups), as its engine lists its flat partitions.
    if (T_.zero_stage == 3) {
      for (const SubGroup& sub : Zero3SubGroups()) {
        auto m = OrderedDict();
        for (int k : sub.members) SetItem(*m, OptimizerName(k), TorchSize(U_.params[k].copy.shape, plain_tuples));
        shapes->items.push_back(m);
      }
    } else {
      for (size_t g = 0; g < U_.groups.size(); ++g) {
        auto m = OrderedDict();
        for (int k : GroupMembers(g, Groups().EpRank(0, U_.tp))) SetItem(*m, OptimizerName(k), TorchSize(U_.params[k].copy.shape, plain_tuples));
        shapes->items.push_back(m);
      }
    }
    // A Mixture-of-Experts save (engine._save_moe_checkpoint) records no param_shapes or ds_config
    // before DeepSpeed 0.19.3. Without ZeRO DeepSpeed records no param_shapes or shared_params, and
    // the optimizer's state_dict instead; under ZeRO the optimizer state is in the ZeRO files.
    if (TorchOptimizer()) shapes = Value::None();
    if (S_.moe) PutIfPresent(*root, "param_shapes", shapes);
    else SetItem(*root, "param_shapes", shapes);
    PutIfPresent(*root, "optimizer", rank0_optimizer_ ? rank0_optimizer_ : Value::None());
    // shared_params likewise: None without ZeRO; under ZeRO the source's, or, from a source saved
    // without ZeRO (None), {}: the parameters the model ties are one parameter (a tied module, an
    // output layer reusing the embedding), which is what DeepSpeed's own ZeRO saves of these models.
    // zero_to_fp32.py reads its items().
    if (auto shared = root->Get("shared_params")) {
      if (TorchOptimizer()) SetItem(*root, "shared_params", Value::None());
      else if (shared->kind == Value::Kind::None && T_.zero_stage > 0)
        SetItem(*root, "shared_params", Value::Make(Value::Kind::Dict));
    }
    // DeepSpeed records frozen parameters (none here) when ZeRO partitions gradients (stage 2, 3).
    for (const char* key : {"frozen_param_shapes", "frozen_param_fragments"})
      PutIfPresent(*root, key, T_.zero_stage >= 2 ? OrderedDict() : Value::None());
    PutOwnRngState(*root);
    SetItem(*root, "dp_world_size", Value::Int(T_.SeqDp()));  // DeepSpeed's seq_dp_world_size
    SetItem(*root, "mp_world_size", Value::Int(T_.tp * T_.pp));
    // DeepSpeed >= 0.19.5 records the model-parallel degrees, which its checkpoint readers trust.
    if (auto dims = root->Get("checkpoint_parallel_dimensions"); dims && dims->kind == Value::Kind::Dict) {
      auto d = Copied(*dims);
      PutIfPresent(*d, "pp_degree", Value::Int(T_.pp));
      PutIfPresent(*d, "tp_degree", Value::Int(T_.tp));
      SetItem(*root, "checkpoint_parallel_dimensions", d);
    }
    if (S_.moe) PutIfPresent(*root, "ds_config", DsConfig());
    else SetItem(*root, "ds_config", DsConfig());
    if (auto args = root->Get("args"); args && args->kind == Value::Kind::Object && args->state) {
      auto a = Copied(*args);
      a->state = Copied(*args->state);
      Value& st = *a->state;
      PutIfPresent(st, "tensor_model_parallel_size", Value::Int(T_.tp));
      PutIfPresent(st, "pipeline_model_parallel_size", Value::Int(T_.pp));
      PutIfPresent(st, "data_parallel_size", Value::Int(T_.dp));
      PutIfPresent(st, "world_size", Value::Int(T_.SeqDp() * T_.tp * T_.pp));
      // Megatron-DeepSpeed's Ulysses degrees: said when the target runs SP, kept true where recorded.
      for (auto [key, value] : {std::pair{"ds_sequence_parallel_size", T_.Sp()}, std::pair{"sequence_data_parallel_size", T_.SeqDp()}}) {
        if (T_.Sp() > 1) SetItem(st, key, Value::Int(value));
        else PutIfPresent(st, key, Value::Int(value));
      }
      if (P_.padded_vocab > 0) PutIfPresent(st, "padded_vocab_size", Value::Int(P_.padded_vocab));
      PutIfPresent(st, "fp16", Value::Bool(T_.dtype == "fp16"));
      PutIfPresent(st, "bf16", Value::Bool(T_.dtype == "bf16"));
      PutIfPresent(st, "params_dtype", TorchDtype(T_.dtype));
      PutIfPresent(st, "zero_stage", Value::Int(T_.zero_stage));
      PutIfPresent(st, "no_pipeline_parallel", Value::Bool(NamingOf(T_) == Naming::Plain));
      SetItem(*root, "args", a);
    }
    if (auto info = root->Get("universal_checkpoint_info"); info && info->kind == Value::Kind::Dict) {
      auto i = T_.tp > 1 ? WithTpRules(*info) : Copied(*info);
      if (P_.padded_vocab > 0) PutIfPresent(*i, "padded_vocab_size", Value::Int(P_.padded_vocab));
      if (auto widths = info->Get("sub_param_shard_widths"); widths && widths->kind == Value::Kind::Dict) {
        auto w = Copied(*widths);
        w->dict = pt::Dict();
        for (const auto& item : widths->dict.items()) {
          auto per = Value::Make(Value::Kind::List);
          for (const auto& sub : item.value->AsSequence()) {
            int64_t size = 0;
            for (const auto& x : sub->AsSequence()) size += x->AsInt();
            per->items.push_back(IntList(std::vector<int64_t>(T_.tp, size / T_.tp)));
          }
          w->dict.Set(item.key, per);
        }
        SetItem(*i, "sub_param_shard_widths", w);
      }
      std::vector<std::pair<std::string, std::string>> names;
      for (size_t k = 0; k < S_.atoms.size(); ++k) names.emplace_back(S_.atoms[k].name, P_.names[k]);
      if (S_.naming != Naming::Module)  // (a module's names are kept: its rules stand)
        SetItem(*root, "universal_checkpoint_info", RenameRules(*i, names, S_.naming, NamingOf(T_), S_.layers, S_.untied));
      else
        SetItem(*root, "universal_checkpoint_info", i);
    }
    return root;
  }

  // Megatron's rng_state is a rank's own (its model-parallel RNG tracker is seeded per TP rank), the
  // rest of the carried client state is the job's. Where the target's model-parallel layout is the
  // source's (same TP and PP degrees), each rank gets its own source rank's rng_state from the
  // atomic checkpoint's carried model-states file of that rank; otherwise rank 0's, with the rest
  // (no source rank is the same rank then: DeepSpeed's universal load restores no RNG state at all).
  void PutOwnRngState(Value& root) const {
    if (!root.Get("rng_state") || T_.tp != S_.tp || T_.pp != S_.manifest["source"].value("pp", 1) || T_.zero_stage == 3 ||
        S_.manifest["source"].value("zero_stage", 0) == 3)
      return;
    const std::string rel = ModelStatesFileName(U_.pp * T_.tp + U_.tp);
    if (!S_.reader->Lists(rel)) return;
    own_model_states_ = S_.reader->ReadCheckedFile(rel, "the rng_state of (pp=" + std::to_string(U_.pp) + ", tp=" +
                                                            std::to_string(U_.tp) + ")");
    if (auto rng = own_model_states_.root->Get("rng_state")) SetItem(root, "rng_state", rng);
  }

  const Source& S_;
  const TargetLayout& T_;
  const Plan& P_;
  const Unit& U_;
  mutable pt::TorchFile own_model_states_;  // the source rank's model-states file its rng_state comes from
  SliceSource& slices_;
  std::string dir_;
  ScratchBytes& arena_;
  std::vector<std::shared_ptr<uint8_t[]>> lp_;
  std::map<int, ValuePtr> steps_;
  ValuePtr rank0_optimizer_;
  std::vector<std::shared_ptr<uint8_t[]>> masters_;  // the DDP bf16 wrapper's fp32 masters, per unit parameter  // without ZeRO: expp_rank 0's optimizer state, for the model-states file
  UnitFiles written_;
  const double expert_moment_ratio_;  // target's expert gradient scale / the source's (ExpertMomentRatio)
};

}  // namespace

UnitFiles WriteUnit(const Source& S, const TargetLayout& T, const Plan& P, const Unit& U, SliceSource& slices,
                    const std::string& dir, ScratchBytes& arena) {
  UnitWriter writer(S, T, P, U, slices, dir, arena);
  writer.Write();
  return writer.written();
}

}  // namespace ucp::deepspeed
