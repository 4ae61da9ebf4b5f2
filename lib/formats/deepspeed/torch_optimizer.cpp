#include "formats/deepspeed/torch_optimizer.h"

#include <set>

#include "core/error.h"

namespace ucp::deepspeed {
using pt::Value;
using source::ShardFile;
using source::SourceIndex;

void WeightsOf(const SourceIndex& L, int fi, const Value& root, std::vector<Weight>& out) {
  std::set<std::string> buffers;
  if (auto b = root.Get("buffer_names"); b && b->IsSequence())
    for (const auto& n : b->AsSequence()) buffers.insert(n->AsStr());
  const Value& d = L.files[fi].expert >= 0 ? root : root.At("module");
  for (const auto& item : d.AsDict().items())
    if (!buffers.count(item.key->AsStr())) out.push_back({item.key->AsStr(), fi, item.value->AsTensor()});
}

TorchOptimizer TorchOptimizerOf(const Value& optimizer) {
  if (optimizer.kind == Value::Kind::None) throw Error("'optimizer' is None: the file holds no optimizer state");
  if (auto osd = optimizer.Get("optimizer_state_dict"))
    if (auto fp32 = optimizer.Get("fp32_groups")) return {osd.get(), fp32.get()};
  return {&optimizer, nullptr};
}

TorchState::TorchState(SourceIndex& L, int file, const Value& state_dict, const Value* fp32_groups,
                       const ParamIndex& index, const ParseFile& parse)
    : L_(L), fi_(file), state_(state_dict.At("state").AsDict()), fp32_groups_(fp32_groups), index_(index), parse_(parse) {
  const auto& groups = state_dict.At("param_groups").AsSequence();
  gs_.resize(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    auto m = groups[g]->Get("moe");
    gs_[g].experts = m && m->kind == Value::Kind::Bool && m->b;
    for (const auto& p : groups[g]->At("params").AsSequence()) gs_[g].positions.push_back(p->AsInt());
  }
}

void TorchState::Match(const std::vector<Weight>& params, bool experts, bool record) {
  for (const Weight& w : params) {
    const int g = GroupFitting(w, experts);
    const size_t k = gs_[g].next++;
    const int64_t pos = gs_[g].positions[k];
    if (record) Record(w, g, k, pos);
  }
}

int TorchState::GroupFitting(const Weight& w, bool experts) const {
  std::vector<size_t> fits;
  for (size_t g = 0; g < gs_.size(); ++g)
    if (gs_[g].experts == experts && gs_[g].next < gs_[g].positions.size() &&
        Moment(gs_[g].positions[gs_[g].next], "exp_avg").shape == w.tensor.shape)
      fits.push_back(g);
  if (fits.empty())
    throw Error("parameter '" + w.name + "' " + pt::ShapeString(w.tensor.shape) + " fits the next position of no " +
                (experts ? "expert" : "non-expert") + " param group (a frozen parameter, or another model)");
  if (fits.size() > 1)
    throw Error("parameter '" + w.name + "' " + pt::ShapeString(w.tensor.shape) + " fits the next position of groups " +
                std::to_string(fits[0]) + " and " + std::to_string(fits[1]) +
                ": which one holds it cannot be told from the file (its positions carry no names)");
  return static_cast<int>(fits[0]);
}

void TorchState::Record(const Weight& w, int g, size_t k, int64_t pos) {
  ShardFile& f = L_.files[fi_];
  const uint8_t* base = parse_(f)->archive->file()->bytes().data();
  auto it = index_.find(w.name);
  if (it == index_.end()) throw Error("parameter '" + w.name + "' is in no module or expert file");
  const pt::TensorView a = Moment(pos, "exp_avg"), b = Moment(pos, "exp_avg_sq");
  if (b.shape != a.shape) throw Error("position " + std::to_string(pos) + ": exp_avg_sq's shape differs from exp_avg's");
  const int64_t n = static_cast<int64_t>(a.numel());
  source::Extent fp32;
  if (fp32_groups_) {
    const pt::TensorView t = fp32_groups_->AsSequence().at(g)->AsSequence().at(k)->AsTensor();
    if (t.dtype != pt::DType::F32 || !t.contiguous() || t.shape != a.shape)
      throw Error("fp32_groups[" + std::to_string(g) + "][" + std::to_string(k) + "] is " +
                  std::string(pt::DTypeName(t.dtype)) + " " + pt::ShapeString(t.shape) + ", not the float32 " +
                  pt::ShapeString(a.shape) + " of position " + std::to_string(pos));
    fp32 = {static_cast<uint64_t>(t.data() - base), n};
  } else {
    if (w.tensor.dtype != pt::DType::F32 || !w.tensor.contiguous())
      throw Error("parameter '" + w.name + "': its weights in " + L_.files[w.file].name + " are not contiguous float32");
    fp32 = {static_cast<uint64_t>(w.tensor.data() - parse_(L_.files[w.file])->archive->file()->bytes().data()), n,
            w.file};
  }
  const int slot = static_cast<int>(f.groups.size());
  f.groups.push_back({fp32, source::Extent{static_cast<uint64_t>(a.data() - base), n},
                      source::Extent{static_cast<uint64_t>(b.data() - base), n}});
  L_.fragments.push_back({fi_, slot, static_cast<int>(it->second), 0, n, 0});
  L_.params[it->second].group = g;
  if (!L_.steps.count({f.pp, f.tp, g}))
    if (auto st = state_.Get(pos)) L_.steps[{f.pp, f.tp, g}] = st->Get("step");
}

void TorchState::Finish() {
  for (size_t g = 0; g < gs_.size(); ++g)
    if (gs_[g].next != gs_[g].positions.size())
      throw Error("param group " + std::to_string(g) + " has " + std::to_string(gs_[g].positions.size()) +
                  " positions but " + std::to_string(gs_[g].next) + " parameters of the model fit them");
  L_.files[fi_].data = true;
}

size_t TorchState::ExpertPositions() const {
  size_t n = 0;
  for (const auto& g : gs_) n += g.experts ? g.positions.size() : 0;
  return n;
}

pt::TensorView TorchState::Moment(int64_t pos, const char* key) const {
  auto st = state_.Get(pos);
  if (!st) throw Error("optimizer state has no entry for position " + std::to_string(pos));
  pt::TensorView t = st->At(key).AsTensor();
  if (t.dtype != pt::DType::F32 || !t.contiguous())
    throw Error("position " + std::to_string(pos) + ": " + key + " is " + std::string(pt::DTypeName(t.dtype)) +
                (t.contiguous() ? "" : ", not contiguous") + "; float32 expected");
  return t;
}

// Every DP rank holds the same state: the file of each (pp, tp) is the data file, its module the
// parameters and their TP-local shapes. The state: {optimizer_state_dict: the torch state,
// fp32_groups: the masters per group and position, the loss scale}; no optimizer file.
void IndexDdpWrapper(SourceIndex& L, ParamIndex& index, const ParseFile& parse) {
  for (size_t fi = 0; fi < L.files.size(); ++fi) {
    ShardFile& f = L.files[fi];
    if (KindOf(f) != FileKind::ModelStates) continue;
    const std::string where = L.dir + "/" + f.name;
    try {
      auto file = parse(f);
      if (!file) continue;
      std::vector<Weight> module;
      WeightsOf(L, static_cast<int>(fi), *file->root, module);
      for (const auto& w : module) RecordShape(L, index, w.name, -1, f, w.tensor.shape, "in another file");
      const TorchOptimizer opt = TorchOptimizerOf(file->root->At("optimizer"));
      if (!opt.fp32_groups) throw Error("'optimizer' holds no optimizer_state_dict and fp32_groups");
      TorchState torch_state(L, static_cast<int>(fi), *opt.state_dict, opt.fp32_groups, index, parse);
      torch_state.Match(module, false, true);
      torch_state.Finish();
    } catch (const std::exception& e) {
      L.errors.push_back(where + ": " + e.what());
    }
  }
}

}  // namespace ucp::deepspeed
