#include "formats/deepspeed/writer_unit.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "core/atomic_file.h"
#include "formats/deepspeed/names.h"
#include "formats/deepspeed/writer_values.h"
#include "pt/low_precision.h"
#include "pt/torch_file.h"

namespace ucp::deepspeed {
using pt::Value;
using pt::ValuePtr;
using namespace reshard;

namespace {

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

}  // namespace

bool InModelOrder(const LayerPlace& a, const LayerPlace& b) {
  return std::make_pair(a.spec, LocalKeyRank(a.local)) < std::make_pair(b.spec, LocalKeyRank(b.local));
}

// --- TargetUnit -----------------------------------------------------------------------------

int TargetUnit::Mp() const { return MpRank(U.pp, U.tp, T.tp); }

bool TargetUnit::TorchOptimizer() const { return TorchOptimizerTarget(S, T); }

int TargetUnit::Ep() const { return std::max(1, T.ep); }
ExpertGroups TargetUnit::Groups() const { return {T.dp, T.tp, Ep()}; }
bool TargetUnit::SavesEpRank(int r) const { return Groups().SaverTp(r) == U.tp; }
bool TargetUnit::ExpertGroup(size_t g) const { return S.moe && g < S.expert_group.size() && S.expert_group[g]; }

std::vector<int> TargetUnit::GroupMembers(size_t g, int ep_rank) const {
  if (!ExpertGroup(g)) return U.groups[g];
  std::vector<int> members;
  for (int k : U.groups[g])
    if (EpRankOf(S, S.atoms[U.params[k].atom], Ep()) == ep_rank) members.push_back(k);
  std::stable_sort(members.begin(), members.end(), [&](int x, int y) {
    const Atom &a = S.atoms[U.params[x].atom], &b = S.atoms[U.params[y].atom];
    return std::make_pair(a.spec(), a.expert) < std::make_pair(b.spec(), b.expert);
  });
  return members;
}

std::string TargetUnit::OptimizerName(int k) const {
  const Atom& a = S.atoms[U.params[k].atom];
  const std::string& name = P.names[U.params[k].atom];
  if (a.expert < 0) return name;
  return ExpertOf(name)->With(LocalExpertId(S, a, Ep()));
}

std::vector<size_t> TargetUnit::ModelOrder() const {
  std::vector<size_t> order(U.params.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    const Atom &a = S.atoms[U.params[x].atom], &b = S.atoms[U.params[y].atom];
    if (S.naming == Naming::Module) return a.module_order < b.module_order;
    return InModelOrder(a.place, b.place);
  });
  return order;
}

// --- UnitWeights ----------------------------------------------------------------------------

UnitWeights::UnitWeights(const TargetUnit& u, SliceSource& slices)
    : u_(u), slices_(slices), expert_moment_ratio_(ExpertMomentRatio(u.S, u.T)) {}

void UnitWeights::ReserveTrainingDtype(ScratchBytes& arena) {
  const auto lp = LpOf(u_.T.dtype);
  auto size = [&](const UnitParam& up) { return (std::max<int64_t>(1, up.local_numel) * lp.size + 63) / 64 * 64; };
  int64_t total = 0;
  for (const auto& up : u_.U.params) total += size(up);
  uint8_t* at = arena.Reserve(static_cast<size_t>(total));  // filled whole from the fp32 weights, so not cleared
  for (const auto& up : u_.U.params) {
    lp_.push_back(std::shared_ptr<uint8_t[]>(std::shared_ptr<void>(), at));  // not owning: the arena outlives the unit
    at += size(up);
  }
}

void UnitWeights::ReadWhole(bool fp32_masters) {
  const auto& params = u_.U.params;
  if (!fp32_masters) {  // no fp32 copy beside the model's weights: they are the master weights
    for (size_t k = 0; k < params.size(); ++k)
      slices_.Read(k, 0, 0, params[k].local_numel, reinterpret_cast<float*>(lp_[k].get()));
    return;
  }
  for (size_t k = 0; k < params.size(); ++k) {  // the masters, read once; Fill makes the weights their copies
    const int64_t n = params[k].local_numel;
    masters_.emplace_back(new uint8_t[static_cast<size_t>(std::max<int64_t>(1, n)) * 4]);
    Fill(k, 0, 0, n, reinterpret_cast<float*>(masters_.back().get()));
  }
}

void UnitWeights::Fill(size_t k, int s, int64_t a, int64_t b, float* dst) {
  slices_.Read(k, s, a, b, dst);
  if (s > 0 && u_.S.atoms[u_.U.params[k].atom].expert >= 0 && expert_moment_ratio_ != 1.0) {
    // The expert's gradient scale differs between the source's job and the target's
    // (ExpertMomentRatio): its Adam moments are rescaled by the ratio and its square (exactly,
    // for power-of-two ratios), so that the first steps of the new job continue the old ones.
    const double r = expert_moment_ratio_, f = s == 1 ? r : r * r;
    for (int64_t i = 0; i < b - a; ++i) dst[i] = static_cast<float>(dst[i] * f);
  }
  if (s == 0 && !lp_.empty()) {  // the training-dtype weights of the layer files, from the same fp32 values
    uint8_t* lp = lp_[k].get();
    const int64_t n = b - a;
    if (u_.T.dtype == "bf16") {
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = pt::Fp32ToBf16(dst[i]);
        std::memcpy(lp + 2 * (a + i), &h, 2);
      }
    } else if (u_.T.dtype == "fp16") {
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = pt::Fp32ToFp16(dst[i]);
        std::memcpy(lp + 2 * (a + i), &h, 2);
      }
    } else {
      std::memcpy(lp + 4 * a, dst, static_cast<size_t>(n) * 4);
    }
  }
}

void UnitWeights::FillTrainingDtype() {
  constexpr int64_t kRun = int64_t{1} << 20;  // floats read at a time
  std::vector<float> run;
  for (size_t k = 0; k < u_.U.params.size(); ++k)
    for (int64_t a = 0, n = u_.U.params[k].local_numel; a < n; a += kRun) {
      run.resize(static_cast<size_t>(std::min(kRun, n - a)));
      Fill(k, 0, a, a + static_cast<int64_t>(run.size()), run.data());
    }
}

ValuePtr UnitWeights::FlatState(std::vector<Segment> segs, int64_t len, int s) {
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

ValuePtr UnitWeights::GroupStep(int g) {
  if (u_.S.weights_only) {  // a fresh optimizer's step: torch's Adam keeps it as a 0-dim float32 tensor
    auto zero = std::make_shared<float>(0.0f);
    return pt::OwnedTensor(zero, zero.get(), pt::DType::F32, {});
  }
  for (const auto& a : u_.S.atoms)
    if (a.group == g && a.has_step) {
      auto it = steps_.find(g);
      if (it == steps_.end()) it = steps_.emplace(g, u_.S.reader->ReadStep(a.name)).first;
      return it->second;
    }
  return Value::None();
}

ValuePtr UnitWeights::TrainingDtypeTensor(size_t k) const {
  return pt::OwnedTensor(lp_[k], lp_[k].get(), LpOf(u_.T.dtype).dtype, u_.U.params[k].copy.shape);
}

ValuePtr UnitWeights::MasterTensor(size_t k) const {
  return pt::OwnedTensor(masters_[k], masters_[k].get(), pt::DType::F32, u_.U.params[k].copy.shape);
}

// --- ShardFiles -----------------------------------------------------------------------------

void ShardFiles::Write(const std::string& name, const Value& root) {
  const std::string path = dir_ + "/" + name;
  pt::WriteTorchFile(path, root, Durability::Batch, Digest::None);
  written_.bytes += static_cast<int64_t>(std::filesystem::file_size(path)), ++written_.files;
}

}  // namespace ucp::deepspeed
