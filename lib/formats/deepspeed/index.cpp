#include "formats/deepspeed/index.h"
#include "formats/deepspeed/redundancy.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/xxhash64.h"
#include "core/names.h"
#include "target/naming.h"

namespace ucp::deepspeed {
namespace fs = std::filesystem;
using pt::Value;
using source::Fragment;
using source::ParamRecord;
using source::ShardFile;
using source::SourceIndex;

namespace {

// The shard folder: dir/<contents of dir/latest> when `latest` exists, else `dir` itself.
std::string ResolveShardDir(const std::string& dir, std::string* tag) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw Error(dir + ": not a directory");
  fs::path latest = fs::path(dir) / "latest";
  if (!fs::exists(latest)) {
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.path().extension() == ".pt") {
        *tag = fs::path(dir).filename().string();
        return dir;
      }
    throw Error(dir + ": no .pt shard files and no 'latest' file: not a DeepSpeed checkpoint folder");
  }
  *tag = source::ReadLatestTag(dir);
  fs::path shard_dir = fs::path(dir) / *tag;
  if (!fs::is_directory(shard_dir)) throw Error(latest.string() + ": names '" + *tag + "', which is not a folder");
  return shard_dir.string();
}


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

// A parameter's shape, checked (pt::CheckedNumel).
std::vector<int64_t> Shape(const Value& v) {
  std::vector<int64_t> out;
  for (const auto& d : v.AsSequence()) out.push_back(d->AsInt());
  pt::CheckedNumel(out);
  return out;
}

// The index's word for each kind of file (what ucp-inspect prints), and back.
constexpr std::pair<FileKind, const char*> kKindNames[] = {{FileKind::ModelStates, "model_states"},
                                                           {FileKind::LayerStates, "layer_states"},
                                                           {FileKind::ZeroOptimizer, "optimizer_states"},
                                                           {FileKind::Zero3ModelStates, "zero3_model_states"},
                                                           {FileKind::ExpertStates, "expert_states"},
                                                           {FileKind::ExpertOptimizer, "expert_optimizer_states"}};
const char* KindName(FileKind k) {
  for (const auto& [kind, name] : kKindNames)
    if (kind == k) return name;
  return "?";
}
FileKind KindOf(const ShardFile& f) {
  for (const auto& [kind, name] : kKindNames)
    if (f.kind == name) return kind;
  throw Error("internal: file kind '" + f.kind + "'");
}

using reshard::ExpertOf;

// Parameter `name` has `shape` in file f (at its pp, tp): recorded, the first time with `group`;
// a different shape at the same tp is a problem ("... but <other shape> <elsewhere>").
ParamRecord& RecordShape(SourceIndex& L, std::map<std::string, size_t>& index, const std::string& name, int group,
                         const ShardFile& f, const std::vector<int64_t>& shape, const char* elsewhere) {
  auto [it, inserted] = index.emplace(name, L.params.size());
  if (inserted) L.params.push_back(ParamRecord{name, group, {}, {}});
  ParamRecord& p = L.params[it->second];
  p.stages.insert(f.pp);
  auto [s, fresh] = p.tp_shape.emplace(f.tp, shape);
  if (!fresh && s->second != shape)
    L.problems.push_back(f.name + ": parameter '" + name + "' has shape " + pt::ShapeString(shape) + " at tp=" +
                         std::to_string(f.tp) + " but " + pt::ShapeString(s->second) + " " + elsewhere);
  return p;
}

// What a Mixture-of-Experts checkpoint says of its parameters instead of param_shapes.
struct MoeShapes {
  std::map<std::string, std::set<int>> experts;  // expert prefix -> the global ids of its expert files
  std::map<std::string, int> layer_of;           // expert prefix -> its MoE layer's ordinal (file names)
  std::vector<int64_t> num_experts;              // per MoE layer ordinal, from the model-states file

  void Add(const std::string& name, const ShardFile& f, const std::vector<int64_t>& shape, SourceIndex& L,
           std::map<std::string, size_t>& index) {
    pt::CheckedNumel(shape);
    RecordShape(L, index, name, -1, f, shape, "in another file");
  }

  // How many experts the MoE layer of `prefix` has: the model-states file's num_experts, else its
  // expert files (0: none).
  int ExpertsOf(const std::string& prefix) const {
    auto it = experts.find(prefix);
    if (it == experts.end()) return 0;
    const int layer = layer_of.at(prefix);
    return layer < static_cast<int>(num_experts.size()) ? static_cast<int>(num_experts[layer])
                                                        : static_cast<int>(it->second.size());
  }

  // The global name of an expert parameter that expert-parallel rank `ep_rank` of `ep` names by
  // its local index. Throws ucp::Error saying what does not fit.
  std::string Global(const std::string& name, int ep_rank, int ep) const {
    const auto e = ExpertOf(name);
    if (!e) throw Error("parameter '" + name + "' is in an expert group but names no deepspeed_experts.<id>");
    const int total = ExpertsOf(e->prefix);
    if (total == 0) throw Error("parameter '" + name + "': no layer_*_expert_*_model_states.pt holds its layer's experts");
    if (total % ep != 0)
      throw Error("'" + e->prefix + "' has " + std::to_string(total) + " experts, not a multiple of the " +
                  std::to_string(ep) + " expert-parallel ranks");
    const int local = total / ep;
    if (e->id >= local)
      throw Error("parameter '" + name + "': local expert " + std::to_string(e->id) + " of " + std::to_string(local) +
                  " per expert-parallel rank");
    return e->prefix + std::to_string(ep_rank * local + e->id) + e->rest;
  }
};

// Whether optimizer param group g holds experts ('moe': True, DeepSpeed's
// split_params_into_different_moe_groups_for_optimizer).
bool IsExpertGroup(const Value& osd, size_t g) {
  auto base = osd.Get("base_optimizer_state");
  auto groups = base ? base->Get("param_groups") : nullptr;
  if (!groups) return false;
  const auto& list = groups->AsSequence();
  if (g >= list.size()) return false;
  auto m = list[g]->Get("moe");
  return m && m->kind == Value::Kind::Bool && m->b;
}

// Every parameter the optimizer files map (param_slice_mappings), with its shape from the weights at
// its (pp, tp): a pipeline's layer files (GPTModelPipe's "<spec>.<key>", the tied embedding
// "tied_modules.embed.<key>" in spec 1's file), else the model-states file's module.
void ShapesFromWeights(SourceIndex& L, std::map<std::string, size_t>& index,
                       const std::function<std::shared_ptr<pt::TorchFile>(const ShardFile&)>& parse) {
  std::map<std::tuple<int, int, std::string>, std::vector<int64_t>> layer_weights;  // (spec, tp, key) -> shape
  std::map<std::pair<int, int>, const ShardFile*> model_file;                       // (pp, tp) -> model states
  for (const auto& f : L.files) {
    if (KindOf(f) == FileKind::LayerStates)
      if (auto file = parse(f)) try {
          for (const auto& item : file->root->AsDict().items())
            layer_weights[{f.layer, f.tp, item.key->AsStr()}] = item.value->AsTensor().shape;
        } catch (const std::exception& e) {
          L.errors.push_back(L.dir + "/" + f.name + ": " + e.what());
        }
    if (KindOf(f) == FileKind::ModelStates) model_file[{f.pp, f.tp}] = &f;
  }
  auto shape_of = [&](const std::string& name, const ShardFile& model) -> std::optional<std::vector<int64_t>> {
    if (L.naming != "pipe") {
      auto file = parse(model);
      auto module = file ? file->root->Get("module") : nullptr;
      auto t = module && module->kind == Value::Kind::Dict ? module->Get(name) : nullptr;
      if (t && t->kind == Value::Kind::Tensor) return t->AsTensor().shape;
      return std::nullopt;
    }
    static const std::string tied = "tied_modules.embed.";
    int spec = 1;
    std::string key;
    if (name.rfind(tied, 0) == 0) {
      key = name.substr(tied.size());
    } else {
      const size_t dot = name.find('.');
      if (dot == std::string::npos || dot == 0 ||
          !std::all_of(name.begin(), name.begin() + static_cast<long>(dot), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
        return std::nullopt;
      spec = std::stoi(name.substr(0, dot));
      key = name.substr(dot + 1);
    }
    auto it = layer_weights.find({spec, model.tp, key});
    if (it == layer_weights.end()) return std::nullopt;
    return it->second;
  };
  for (const auto& f : L.files) {
    if (!f.data) continue;
    auto mf = model_file.find({f.pp, f.tp});
    if (mf == model_file.end()) continue;  // the file grid check names the missing model-states file
    auto file = parse(f);
    if (!file) continue;
    try {
      const auto& mappings = file->root->At("optimizer_state_dict").At("param_slice_mappings").AsSequence();
      for (size_t g = 0; g < mappings.size(); ++g)
        for (const auto& item : mappings[g]->AsDict().items()) {
          const std::string& name = item.key->AsStr();
          auto shape = shape_of(name, *mf->second);
          if (!shape) {
            L.problems.push_back(L.dir + "/" + f.name + ": parameter '" + name + "' has no weight in the " +
                                 (L.naming == "pipe" ? "layer files" : "module of " + mf->second->name) +
                                 " to take its shape from (param_shapes is None)");
            continue;
          }
          pt::CheckedNumel(*shape);
          RecordShape(L, index, name, static_cast<int>(g), *mf->second, *shape, "on another stage");
        }
    } catch (const std::exception& e) {
      L.errors.push_back(L.dir + "/" + f.name + ": " + e.what());
    }
  }
}

// A parameter's weights in a file, in the model's order (TorchState).
struct Weight {
  std::string name;
  int file = -1;
  pt::TensorView tensor;
};

// One torch optimizer state_dict, Adam's state per position, the positions listed by each param
// group in the order of the model's parameters. Positions carry no names: each group's positions are
// matched to the model's parameters of its kind (the module's; an expert group's, the experts') in
// model order by shape, every parameter to the one group whose next position fits it; where two
// would fit, which one holds it cannot be told and the checkpoint is refused. A position's slot in
// its data file holds its moments there, and its fp32 values: the masters the optimizer keeps
// (`fp32_groups`, per group and position, in the same file), or without them the weights themselves.
class TorchState {
 public:
  TorchState(SourceIndex& L, int file, const Value& state_dict, const Value* fp32_groups,
             const std::map<std::string, size_t>& index,
             const std::function<std::shared_ptr<pt::TorchFile>(const ShardFile&)>& parse)
      : L_(L), fi_(file), state_(state_dict.At("state").AsDict()), fp32_groups_(fp32_groups), index_(index), parse_(parse) {
    const auto& groups = state_dict.At("param_groups").AsSequence();
    gs_.resize(groups.size());
    for (size_t g = 0; g < groups.size(); ++g) {
      auto m = groups[g]->Get("moe");
      gs_[g].experts = m && m->kind == Value::Kind::Bool && m->b;
      for (const auto& p : groups[g]->At("params").AsSequence()) gs_[g].positions.push_back(p->AsInt());
    }
  }

  // Matches `params` (the module's, or with `experts` an expert-parallel rank's experts) to the
  // positions of their groups; with `record`, each becomes a fragment of the file.
  void Match(const std::vector<Weight>& params, bool experts, bool record) {
    ShardFile& f = L_.files[fi_];
    const uint8_t* base = parse_(f)->archive->file()->bytes().data();
    for (const Weight& w : params) {
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
      const int g = static_cast<int>(fits[0]);
      const size_t k = gs_[g].next++;
      const int64_t pos = gs_[g].positions[k];
      if (!record) continue;
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
  }

  // Every position taken; the file then holds data.
  void Finish() {
    for (size_t g = 0; g < gs_.size(); ++g)
      if (gs_[g].next != gs_[g].positions.size())
        throw Error("param group " + std::to_string(g) + " has " + std::to_string(gs_[g].positions.size()) +
                    " positions but " + std::to_string(gs_[g].next) + " parameters of the model fit them");
    L_.files[fi_].data = true;
  }

  // How many positions the expert groups list (this rank's local experts' tensors).
  size_t ExpertPositions() const {
    size_t n = 0;
    for (const auto& g : gs_) n += g.experts ? g.positions.size() : 0;
    return n;
  }

 private:
  pt::TensorView Moment(int64_t pos, const char* key) const {
    auto st = state_.Get(pos);
    if (!st) throw Error("optimizer state has no entry for position " + std::to_string(pos));
    pt::TensorView t = st->At(key).AsTensor();
    if (t.dtype != pt::DType::F32 || !t.contiguous())
      throw Error("position " + std::to_string(pos) + ": " + key + " is " + std::string(pt::DTypeName(t.dtype)) +
                  (t.contiguous() ? "" : ", not contiguous") + "; float32 expected");
    return t;
  }

  struct Group {
    std::vector<int64_t> positions;
    size_t next = 0;  // how far its matching got
    bool experts = false;
  };
  SourceIndex& L_;
  const int fi_;
  const pt::Dict& state_;
  const Value* fp32_groups_;
  const std::map<std::string, size_t>& index_;
  const std::function<std::shared_ptr<pt::TorchFile>(const ShardFile&)>& parse_;
  std::vector<Group> gs_;
};

// The weights of a model-states file's module (its buffers left out), or an expert file's, in order.
void WeightsOf(const SourceIndex& L, int fi, const Value& root, std::vector<Weight>& out) {
  std::set<std::string> buffers;
  if (auto b = root.Get("buffer_names"); b && b->IsSequence())
    for (const auto& n : b->AsSequence()) buffers.insert(n->AsStr());
  const Value& d = L.files[fi].expert >= 0 ? root : root.At("module");
  for (const auto& item : d.AsDict().items())
    if (!buffers.count(item.key->AsStr())) out.push_back({item.key->AsStr(), fi, item.value->AsTensor()});
}

// The torch state of a model-states or expp_rank file's 'optimizer': the state_dict itself (the
// model's own torch optimizer: fp32 training), or DeepSpeed 0.17.6+'s DDP bf16 wrapper around it,
// {optimizer_state_dict, fp32_groups: the masters per group and position, the loss scale}.
struct TorchOptimizer {
  const Value* state_dict = nullptr;
  const Value* fp32_groups = nullptr;  // null: the fp32 values are the weights themselves
};
TorchOptimizer TorchOptimizerOf(const Value& optimizer) {
  if (optimizer.kind == Value::Kind::None) throw Error("'optimizer' is None: the file holds no optimizer state");
  if (auto osd = optimizer.Get("optimizer_state_dict"))
    if (auto fp32 = optimizer.Get("fp32_groups")) return {osd.get(), fp32.get()};
  return {&optimizer, nullptr};
}

// A Mixture-of-Experts checkpoint without ZeRO (the model's own torch optimizer, or in bf16 the DDP
// wrapper around it: TorchOptimizerOf): expert-parallel rank R's expp_rank_R file (at TP rank
// R % tp, ExpertGroups) holds its state under 'optimizer' (TorchState), its non-expert groups its
// TP rank's module parameters (every rank at a TP rank the same: taken from the first), its expert
// groups the experts of rank R, MoE layer by MoE layer, local expert by local expert. The fp32 values are the wrapper's masters, or in fp32 the weights, in the
// module and expert files.
void IndexMoeWithoutZero(SourceIndex& L, const MoeShapes& moe, const std::map<std::string, size_t>& index,
                         const std::function<std::shared_ptr<pt::TorchFile>(const ShardFile&)>& parse) {
  std::map<int, std::vector<Weight>> module;  // TP rank -> its module's weights
  std::map<std::pair<int, int>, int> expert_file;  // (MoE layer, global expert) -> file
  std::set<int> moe_layers;
  std::map<int, int> expp;  // expert-parallel rank -> file
  for (size_t fi = 0; fi < L.files.size(); ++fi) {
    const ShardFile& f = L.files[fi];
    if (KindOf(f) == FileKind::ModelStates && f.pp == 0)
      if (auto file = parse(f)) WeightsOf(L, static_cast<int>(fi), *file->root, module[f.tp]);
    if (f.expert >= 0) expert_file[{f.layer, f.expert}] = static_cast<int>(fi), moe_layers.insert(f.layer);
    if (KindOf(f) == FileKind::ExpertOptimizer) expp[f.dp] = static_cast<int>(fi);
  }
  // The expert-parallel degree: all the expert tensors over those rank 0's expert groups hold (its
  // local experts), so that a missing expp_rank file is named rather than shrinking the degree.
  L.ep = expp.empty() ? 1 : expp.rbegin()->first + 1;
  if (expp.count(0))
    if (auto file = parse(L.files[expp.at(0)])) try {
        int64_t total = 0;
        for (const auto& [key, fi] : expert_file)
          if (auto ef = parse(L.files[fi])) total += static_cast<int64_t>(ef->root->AsDict().size());
        const TorchOptimizer opt = TorchOptimizerOf(file->root->At("optimizer"));
        const auto local = static_cast<int64_t>(TorchState(L, expp.at(0), *opt.state_dict, opt.fp32_groups, index, parse).ExpertPositions());
        if (local > 0 && total % local == 0) L.ep = static_cast<int>(total / local);
      } catch (const std::exception&) {
        // (read again below, where its errors are reported)
      }
  for (int r = 0; r < L.ep; ++r)
    if (!expp.count(r))
      L.problems.push_back("missing rank file " + ExpertOptimFileName(r, reshard::ExpertGroups{L.dp, L.tp, L.ep}.SaverTp(r)) +
                           " (expert-parallel rank " +
                           std::to_string(r) + " of " + std::to_string(L.ep) + ")");
  for (const auto& [r, fi] : expp) {
    const std::string where = L.dir + "/" + L.files[fi].name;
    try {
      auto file = parse(L.files[fi]);
      if (!file) continue;
      std::vector<Weight> experts;
      for (int layer : moe_layers) {
        const int total = layer < static_cast<int>(moe.num_experts.size()) ? static_cast<int>(moe.num_experts[layer])
                                                                            : 0;
        if (total <= 0 || total % L.ep != 0)
          throw Error("MoE layer " + std::to_string(layer) + " has " + std::to_string(total) +
                      " experts, not a multiple of the " + std::to_string(L.ep) + " expert-parallel ranks");
        for (int j = 0; j < total / L.ep; ++j) {
          auto it = expert_file.find({layer, r * (total / L.ep) + j});
          if (it == expert_file.end()) continue;  // FinishMoe names the missing expert file
          if (auto ef = parse(L.files[it->second])) WeightsOf(L, it->second, *ef->root, experts);
        }
      }
      const TorchOptimizer opt = TorchOptimizerOf(file->root->At("optimizer"));
      if (!opt.fp32_groups && L.dtype != "fp32")
        throw Error("trained in " + L.dtype + ", its optimizer state has no fp32_groups (the masters of DeepSpeed's "
                    "bf16 wrapper): this " + (L.dtype == "bf16" ? "BF16" : "FP16") + " optimizer is not supported yet");
      TorchState torch_state(L, fi, *opt.state_dict, opt.fp32_groups, index, parse);
      // The non-expert state of the file's TP rank: that of the first expert-parallel rank saved there
      // (ExpertGroups::SaverTp: rank t, as tp <= ep).
      const int t = L.files[fi].tp;
      torch_state.Match(module[t], false, r == t);
      torch_state.Match(experts, true, true);
      torch_state.Finish();
    } catch (const std::exception& e) {
      L.errors.push_back(where + ": " + e.what());
    }
  }
}

// DeepSpeed 0.17.6+ training bf16 without ZeRO in a model that is not a pipeline wraps the model's
// torch optimizer (its DDP bf16 wrapper) and saves its state in each model-states file under
// 'optimizer': {optimizer_state_dict: the torch state (TorchState), fp32_groups: the masters per
// group and position, the loss scale}; no optimizer file. Every DP rank holds the same state: the
// file of each (pp, tp) is the data file, its module the parameters and their TP-local shapes.
void IndexDdpWrapper(SourceIndex& L, std::map<std::string, size_t>& index,
                     const std::function<std::shared_ptr<pt::TorchFile>(const ShardFile&)>& parse) {
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

using GroupParams = std::map<std::tuple<int, int, int>, std::vector<std::pair<std::string, int64_t>>>;

// Where nothing lists each group's parameters in flat order (no param_shapes: Mixture of Experts,
// DeepSpeed 0.19's BF16 optimizer at ZeRO-0), the fragments say it, each placed at its flat position
// in its group's buffer: after every optimizer file, each fragment is made relative to its
// parameter's first element (the smallest flat position the parameter has in the buffers of its
// (pp, tp)), each parameter gets its group, and the groups' parameter lists for the coverage check
// follow the flat order.
void PlaceByFragments(SourceIndex& L, GroupParams& group_params) {
  // (param, pp, tp) -> its smallest flat position there, and that fragment
  std::map<std::tuple<int, int, int>, std::pair<int64_t, const Fragment*>> first;
  auto copy_of = [&](const Fragment& fr) { return std::make_tuple(fr.param, L.files[fr.file].pp, L.CopyTp(fr)); };
  for (const auto& fr : L.fragments) {
    auto [it, fresh] = first.emplace(copy_of(fr), std::make_pair(fr.dst_start, &fr));
    if (!fresh && fr.dst_start < it->second.first) it->second = {fr.dst_start, &fr};
  }
  std::vector<int64_t> shift(L.fragments.size());
  for (size_t k = 0; k < L.fragments.size(); ++k) shift[k] = first.at(copy_of(L.fragments[k])).first;
  for (size_t k = 0; k < L.fragments.size(); ++k) L.fragments[k].dst_start -= shift[k];
  std::map<std::tuple<int, int, int>, std::vector<std::tuple<int64_t, std::string, int64_t>>> lists;
  std::set<int> placed;
  for (const auto& [copy, where] : first) {
    const auto [param, pp, tp] = copy;
    const Fragment& fr = *where.second;
    ParamRecord& p = L.params[param];
    if (p.group < 0) p.group = fr.group;  // ZeRO: the file's slot is the param group
    placed.insert(param);
    if (const auto shape = p.tp_shape.find(tp); shape != p.tp_shape.end())
      lists[{pp, tp, p.group}].emplace_back(where.first, p.name, pt::Numel(shape->second));
  }
  for (size_t k = 0; k < L.params.size(); ++k)
    if (!placed.count(static_cast<int>(k)))
      L.problems.push_back("parameter '" + L.params[k].name + "' is in the model but in no optimizer group (missing fragment)");
  for (auto& [key, list] : lists) {
    std::sort(list.begin(), list.end());
    for (const auto& [at, name, numel] : list) group_params[key].push_back({name, numel});
  }
}

// DeepSpeed 0.19's AutoEP (module_inject/auto_ep*): each MoE layer keeps its local experts in fused
// tensors, <expert_key_prefix>.w1 / .w2 / .w3 of shape [local experts, ...], in the expert param
// groups, and the model-states file lists the layers in ds_autoep_layers. Its expert files (each
// global expert's slice of the fused tensors) are carried, not read: the ZeRO files hold the values.
struct AutoEpLayer {
  std::string prefix;  // expert_key_prefix: the fused tensors are <prefix>.<name>
  int64_t experts = 0, local = 0, ep = 1;
};

std::vector<AutoEpLayer> AutoEpLayersOf(const Value& root) {
  std::vector<AutoEpLayer> out;
  auto layers = root.Get("ds_autoep_layers");
  if (!layers || layers->kind == Value::Kind::None) return out;
  for (const auto& l : layers->AsSequence()) {
    AutoEpLayer a;
    a.prefix = l->At("expert_key_prefix").AsStr();
    a.experts = l->At("num_experts").AsInt(), a.local = l->At("num_local_experts").AsInt(), a.ep = l->At("ep_size").AsInt();
    const std::string format = l->At("checkpoint_format").AsStr();
    if (format != "per_expert_files")
      throw Error("ds_autoep_layers: checkpoint_format '" + format + "' (AutoEP under ZeRO-3) is not supported yet");
    if (a.local < 1 || a.ep < 1 || a.local * a.ep != a.experts)
      throw Error("ds_autoep_layers: '" + a.prefix + "': " + std::to_string(a.experts) + " experts are not " +
                  std::to_string(a.local) + " local experts on each of " + std::to_string(a.ep) + " expert-parallel ranks");
    out.push_back(std::move(a));
  }
  if (root.Get("folding"))
    throw Error("AutoEP folded with AutoTP (the 'folding' metadata of tp > 1) is not supported yet");
  return out;
}

// An AutoEP index, after every optimizer file: each parameter of an expert group is a fused tensor of
// its layer's experts, its shape and its numel in the group lists made those of all the experts.
void FinishAutoEp(SourceIndex& L, const std::vector<AutoEpLayer>& layers, const std::set<int>& expert_groups,
                  GroupParams& group_params) {
  for (auto& p : L.params) {
    if (!expert_groups.count(p.group)) continue;
    const AutoEpLayer* layer = nullptr;
    for (const auto& l : layers)
      if (p.name.size() > l.prefix.size() + 1 && p.name.compare(0, l.prefix.size() + 1, l.prefix + ".") == 0 &&
          p.name.find('.', l.prefix.size() + 1) == std::string::npos)
        layer = &l;
    auto shape = p.tp_shape.find(0);
    if (!layer || shape == p.tp_shape.end() || shape->second.empty()) {
      L.problems.push_back("parameter '" + p.name + "' is in an expert group but is no fused expert tensor of a layer "
                           "ds_autoep_layers lists");
      continue;
    }
    if (layer->ep != L.ep || shape->second[0] != layer->local) {
      L.problems.push_back("parameter '" + p.name + "' of shape " + pt::ShapeString(shape->second) + ": ds_autoep_layers says " +
                           std::to_string(layer->local) + " local experts at ep " + std::to_string(layer->ep) +
                           ", the optimizer files ep " + std::to_string(L.ep));
      continue;
    }
    p.fused_experts = layer->experts;
    shape->second[0] = layer->experts;
    for (auto& [key, list] : group_params)
      if (std::get<2>(key) == p.group)
        for (auto& [name, numel] : list)
          if (name == p.name) numel *= L.ep;
  }
  L.notes.push_back("DeepSpeed AutoEP, ep=" + std::to_string(L.ep) + ": each fused expert tensor whole in the atomic "
                    "checkpoint, [experts, ...] (the expert-parallel ranks' runs of experts joined on dim 0), as "
                    "DeepSpeed's universal conversion writes it");
}

// A Mixture-of-Experts index, after every optimizer file: the fragments placed (PlaceByFragments),
// each expert's expert-parallel rank, and what is not supported.
void FinishMoe(SourceIndex& L, const MoeShapes& moe, GroupParams& group_params, const Value& model_root) {
  if (L.zero_stage == 3)
    L.errors.push_back(L.dir + ": a Mixture-of-Experts checkpoint under ZeRO-3 is not supported yet");
  for (auto& p : L.params)
    if (auto e = ExpertOf(p.name); e && p.name.find(".deepspeed_moe.") != std::string::npos)
      if (const int total = moe.ExpertsOf(e->prefix); total > 0)
        p.expert = e->id, p.ep_rank = e->id / std::max(1, total / L.ep);
  PlaceByFragments(L, group_params);  // (after the experts are known: their copies span TP ranks)
  L.notes.push_back("Mixture of Experts, ep=" + std::to_string(L.ep) + ": the atomic checkpoint keeps each expert under its "
                    "global id; DeepSpeed's universal load looks an expert up by its local name on its expert-parallel "
                    "rank, so it restores experts right only in a job with ep_size 1; for another ep_size, load the native files "
                    "ucp-reshard --ep writes");
  // The model-states file's num_experts (one count per MoE layer) against the expert files, each at
  // the TP rank of the rank that saves it (ExpertGroups).
  if (auto n = model_root.Get("num_experts"); n && n->kind == Value::Kind::List) {
    const reshard::ExpertGroups eg{L.dp, L.tp, L.ep};
    const auto& counts = n->AsSequence();
    auto saver_tp = [&](int layer, int e) {
      const int64_t want = layer < static_cast<int>(counts.size()) ? counts[layer]->AsInt() : 0;
      return want > 0 && want % L.ep == 0 ? eg.SaverTp(static_cast<int>(e / (want / L.ep))) : 0;
    };
    std::map<int, std::set<int>> files;  // MoE layer ordinal -> global expert ids
    for (const auto& f : L.files) {
      if (f.expert < 0) continue;
      files[f.layer].insert(f.expert);
      if (const int want = saver_tp(f.layer, f.expert); f.tp != want)
        L.problems.push_back(f.name + ": expert " + std::to_string(f.expert) + " at tp=" + std::to_string(f.tp) +
                             ", where DeepSpeed's rank that saves it is at tp=" + std::to_string(want) +
                             " (expert-parallel groups of consecutive global ranks)");
    }
    for (size_t layer = 0; layer < counts.size(); ++layer) {
      const int64_t want = counts[layer]->AsInt();
      const auto& have = files[static_cast<int>(layer)];
      for (int64_t e = 0; e < want; ++e)
        if (!have.count(static_cast<int>(e)))
          L.problems.push_back("missing rank file " +
                               ExpertStatesFileName(static_cast<int>(layer), static_cast<int>(e),
                                                    saver_tp(static_cast<int>(layer), static_cast<int>(e))) +
                               " (MoE layer " + std::to_string(layer) + " has " + std::to_string(want) + " experts)");
    }
  }
}

// Two checks on the fragments. In each file's flat group buffer no two fragments may share an
// element (an overlap: a corrupt mapping or a foreign file). And every element of every
// parameter's TP-local tensor at every (pp, tp) that holds it must be in exactly one fragment (a
// gap is a missing fragment: the message names the rank file that should hold it).
void CheckCoverage(SourceIndex& L, GroupParams& group_params,
                   const std::map<std::tuple<int, int, int>, int64_t>& partitions) {
  auto file_of = [&](const Fragment* fr) { return L.files[fr->file].name + " " + Coord(L.files[fr->file]); };
  std::map<std::pair<int, int>, std::vector<const Fragment*>> by_file;  // (file, group)
  for (const auto& fr : L.fragments) by_file[{fr.file, fr.group}].push_back(&fr);
  for (auto& [key, list] : by_file) {
    std::sort(list.begin(), list.end(), [](auto* a, auto* b) { return a->src_start < b->src_start; });
    for (size_t k = 1; k < list.size(); ++k)
      if (list[k]->src_start < list[k - 1]->src_start + list[k - 1]->numel)
        L.problems.push_back(L.dir + "/" + file_of(list[k]) + ": group " + std::to_string(key.second) +
                             ": the fragments of parameters '" + L.params[list[k - 1]->param].name + "' and '" +
                             L.params[list[k]->param].name + "' overlap at flat elements [" +
                             std::to_string(list[k]->src_start) + ", " +
                             std::to_string(std::min(list[k]->src_start + list[k]->numel,
                                                     list[k - 1]->src_start + list[k - 1]->numel)) +
                             ") (overlapping fragments)");
  }
  std::map<std::string, int> index;
  for (size_t k = 0; k < L.params.size(); ++k) index[L.params[k].name] = static_cast<int>(k);
  // One fault, one error: a gap whose holder is a file already reported missing or unreadable follows
  // from that report; it is folded into it (the parameters counted) instead of repeated per parameter.
  std::map<std::pair<int, size_t>, std::vector<std::string>> folded;  // (0 errors / 1 problems, index) -> parameters
  auto missing_gap = [&](const std::string& holder_text, const std::string& name, const std::string& message) {
    const std::string file = holder_text.rfind("(", 0) == 0 ? "" : holder_text.substr(0, holder_text.find(' '));
    for (size_t i = 0; i < L.errors.size() && !file.empty(); ++i)
      if (L.errors[i].find("/" + file + ":") != std::string::npos) return folded[{0, i}].push_back(name);
    for (size_t i = 0; i < L.problems.size(); ++i)
      if (L.problems[i].rfind("missing rank file ", 0) == 0 && L.problems[i].find(holder_text) != std::string::npos)
        return folded[{1, i}].push_back(name);
    L.problems.push_back(message);
  };
  std::map<std::tuple<int, int, int>, std::vector<const Fragment*>> by_param;  // (param, pp, tp)
  for (const auto& fr : L.fragments) by_param[{fr.param, L.files[fr.file].pp, L.CopyTp(fr)}].push_back(&fr);
  for (const auto& [group_key, params] : group_params) {
    const auto key = group_key;  // named copies: lambdas below capture them (clang 14: no bindings)
    const int pp = std::get<0>(key), tp = std::get<1>(key);
    int64_t offset = 0;  // of the parameter in the group's flat buffer (ZeRO-1/2)
    for (const auto& [name, param_numel] : params) {
      const int64_t numel = param_numel;
      const int64_t param_offset = offset;
      offset += numel;
      // The optimizer file that should hold element `e` of this parameter.
      auto holder = [&](int64_t e) {
        int dp = 0;
        if (L.zero_stage == 3) {
          dp = static_cast<int>(e / std::max<int64_t>(1, (numel + L.dp - 1) / L.dp));
        } else if (auto it = partitions.find(key); it != partitions.end() && it->second > 0) {
          dp = static_cast<int>((param_offset + e) / it->second);
        }
        for (const auto& f : L.files)
          if (f.data && f.pp == pp && f.tp == tp && f.dp == dp) return f.name + " " + Coord(f);
        return "(pp=" + std::to_string(pp) + ", tp=" + std::to_string(tp) + ", dp=" + std::to_string(dp) + ")";
      };
      std::string what = "parameter '" + name + "' (pp=" + std::to_string(pp) + ", tp=" + std::to_string(tp) + ")";
      auto& list = by_param[{index.at(name), pp, tp}];
      std::sort(list.begin(), list.end(), [](auto* a, auto* b) { return a->dst_start < b->dst_start; });
      int64_t at = 0;
      const Fragment* prev = nullptr;
      for (const Fragment* fr : list) {
        if (fr->dst_start < 0 || fr->dst_start + fr->numel > numel) {
          L.problems.push_back(L.dir + "/" + file_of(fr) + ": " + what + ": its fragment covers elements [" +
                               std::to_string(fr->dst_start) + ", " + std::to_string(fr->dst_start + fr->numel) +
                               ") of a tensor of " + std::to_string(numel) + ": its param_slice_mappings do not fit "
                               "its rank's place in the group's flat buffer (a file of another rank, swapped or renamed?)");
          continue;
        }
        if (fr->dst_start > at)
          missing_gap(holder(at), name, what + ": elements [" + std::to_string(at) + ", " + std::to_string(fr->dst_start) +
                                            ") are in no optimizer file (missing fragment; expected in " + holder(at) + ")");
        else if (fr->dst_start < at && prev)
          L.problems.push_back(what + ": elements [" + std::to_string(fr->dst_start) + ", " +
                               std::to_string(std::min(at, fr->dst_start + fr->numel)) + ") are in both " +
                               file_of(prev) + " and " + file_of(fr) + " (overlapping fragments)");
        at = std::max(at, fr->dst_start + fr->numel);
        prev = fr;
      }
      if (at < numel)
        missing_gap(holder(at), name, what + ": elements [" + std::to_string(at) + ", " + std::to_string(numel) + ") of " +
                                          std::to_string(numel) + " are in no optimizer file (missing fragment; expected in " +
                                          holder(at) + ")");
    }
  }
  for (auto& [where, names] : folded) {
    std::string& m = where.first == 0 ? L.errors[where.second] : L.problems[where.second];
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
    m += "; so " + std::to_string(names.size()) + " parameter" + (names.size() == 1 ? " lacks" : "s lack") +
         " the elements only it held ('" + names.front() + "'" + (names.size() > 1 ? " and " + std::to_string(names.size() - 1) + " more" : "") + ")";
  }
}

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

namespace {

// The framework's files beside the tag (source/job_files.h: Hugging Face Trainer's checkpoint-N),
// checked against DeepSpeed's files and carried by the conversion.
void TakeJobFiles(SourceIndex& L) {
  // The tag folder itself given: its root is the folder around it when that one's `latest` names it
  // (a Trainer checkpoint-N's global_stepN), whose files belong to it just the same.
  std::string root = L.root;
  if (L.dir == L.root) {
    const fs::path parent = fs::path(L.dir).lexically_normal().parent_path();
    std::error_code ec;
    std::string named;
    try {
      if (fs::exists(parent / "latest", ec)) named = source::ReadLatestTag(parent.string());
    } catch (const Error&) {
    }
    if (named.empty() || named != fs::path(L.dir).lexically_normal().filename().string()) return;
    root = parent.string();
  }
  L.job = source::FindJobFiles(root, L.tag);
  if (L.job.empty()) return;
  if (root != L.root) L.job.root = root;
  // A Hugging Face job runs no Megatron: the notes on Megatron's args and Ulysses degree say nothing of it.
  std::erase_if(L.notes, [](const std::string& n) { return n.rfind("no Megatron args", 0) == 0 || n.rfind("DP x SP = ", 0) == 0; });
  const int world = L.dp * L.tp * L.pp;
  for (auto& p : source::JobFileProblems(L.job, root, L.tag, world, L.iteration)) L.problems.push_back(std::move(p));
  // The RNG files are of the processes DeepSpeed's files describe: a missing one stays missing (said
  // where a reshard would take it), others an in-place step added are not this tag's.
  if (L.job.rng_world > 0) L.job.rng_world = world;
  std::string weights;
  for (const auto& w : L.job.weights) weights += (weights.empty() ? "" : ", ") + w;
  L.notes.push_back(std::string(L.job.kind == "hf-trainer" ? "a Hugging Face Trainer checkpoint" : "a Hugging Face model's checkpoint") +
                    (root != L.root ? " (" + root + ", whose latest names this folder)" : "") + ": its " +
                    std::to_string(L.job.carried.size()) + " files beside " + L.tag + " are carried (job/)" +
                    (weights.empty() ? "" : "; " + weights + " not: a copy of the weights " + L.tag + " holds (--format hf writes it)"));
}

}  // namespace

bool LooksLikeCheckpoint(const std::string& dir) {
  try {
    std::string tag;
    ResolveShardDir(dir, &tag);
    return true;
  } catch (const Error&) {
    return false;
  }
}

SourceIndex IndexCheckpoint(const std::string& dir, const source::IndexOptions& options) {
  SourceIndex L;
  L.format = "deepspeed";
  L.root = dir;
  L.dir = ResolveShardDir(dir, &L.tag);

  // 1. Classify file names.
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(L.dir))
    if (e.is_regular_file()) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  bool any_bf16_prefix = false;
  std::vector<int> mps;  // per file: the model-parallel rank its name holds
  for (const auto& n : names) {
    const auto parsed = ParseFileName(n);
    if (!parsed) {
      if (n.size() > 3 && n.substr(n.size() - 3) == ".pt") L.notes.push_back(n + ": unrecognised file name, ignored");
      continue;
    }
    ShardFile f;
    f.name = n, f.kind = KindName(parsed->kind), f.dp = parsed->dp;
    f.data = parsed->kind == FileKind::ZeroOptimizer;
    // What DeepSpeed's universal load reads besides the atomic tensors: the model-states files, and
    // a Mixture-of-Experts model's expert files (its load_moe_state_dict).
    f.carried = parsed->kind == FileKind::ModelStates || parsed->kind == FileKind::Zero3ModelStates ||
                parsed->kind == FileKind::ExpertStates;
    f.per_dp = parsed->kind == FileKind::ZeroOptimizer || parsed->kind == FileKind::Zero3ModelStates ||
               parsed->kind == FileKind::ExpertOptimizer;
    if (parsed->kind == FileKind::LayerStates) f.layer = parsed->layer, f.tp = parsed->tp;
    if (parsed->kind == FileKind::ExpertStates) f.layer = parsed->layer, f.expert = parsed->expert;
    mps.push_back(parsed->mp);
    any_bf16_prefix |= parsed->prefix == "bf16_";
    L.files.push_back(f);
  }
  auto count = [&](FileKind k) {
    return std::count_if(L.files.begin(), L.files.end(), [&](const ShardFile& f) { return KindOf(f) == k; });
  };
  if (count(FileKind::ModelStates) == 0 && count(FileKind::Zero3ModelStates) == 0)
    throw Error(L.dir + ": no mp_rank_*_model_states.pt or zero_pp_rank_*_model_states.pt file: not a DeepSpeed "
                        "checkpoint folder");
  bool zero3_files = count(FileKind::Zero3ModelStates) > 0;
  // Mixture of Experts without ZeRO: the optimizer state in one expp_rank file per expert-parallel
  // rank (IndexMoeWithoutZero), no ZeRO optimizer file.
  const bool expp_optimizer = count(FileKind::ZeroOptimizer) == 0 && count(FileKind::ExpertOptimizer) > 0 &&
                              count(FileKind::ExpertStates) > 0;
  L.naming = count(FileKind::LayerStates) > 0 ? "pipe" : "plain";

  // 2. Read every model-states file (metadata only) and the first one's training state.
  std::map<std::string, std::shared_ptr<pt::TorchFile>> parsed;
  auto parse = [&](const ShardFile& f) -> std::shared_ptr<pt::TorchFile> {
    auto it = parsed.find(f.name);
    if (it != parsed.end()) return it->second;
    std::shared_ptr<pt::TorchFile> file;
    try {
      file = std::make_shared<pt::TorchFile>(
          pt::ReadTorchFile(L.dir + "/" + f.name, {.verify_pickle_crc = true, .verify_storage_crc = options.verify_storage_crc}));
    } catch (const std::exception& e) {
      L.errors.push_back(e.what());
    }
    parsed[f.name] = file;
    return file;
  };
  std::vector<ShardFile*> model_files;
  for (auto& f : L.files)
    if (KindOf(f) == (zero3_files ? FileKind::Zero3ModelStates : FileKind::ModelStates)) model_files.push_back(&f);
  std::shared_ptr<pt::TorchFile> first;
  for (auto* f : model_files) {
    first = parse(*f);
    if (first) break;
  }
  if (!first) return L;  // nothing readable: the errors say why
  L.keep_alive = first;
  const Value& root = *first->root;
  auto in_first = [&](const char* what, auto&& fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      L.errors.push_back(first->archive->path() + ": " + what + ": " + e.what());
    }
  };
  const pt::ValuePtr args = root.Get("args");  // Megatron's argparse.Namespace
  L.args = args;
  L.universal_checkpoint_info = root.Get("universal_checkpoint_info");
  if (L.universal_checkpoint_info && L.universal_checkpoint_info->kind == Value::Kind::None)
    L.universal_checkpoint_info = nullptr;
  L.framework = args ? "megatron-deepspeed" : "deepspeed";
  int mp_world = 1, dp_world = 1;
  int config_stage = -1;  // ds_config.zero_optimization.stage of the model-states file
  // A Mixture-of-Experts save (engine._save_moe_checkpoint) writes no ds_config, ds_version or
  // param_shapes into the model-states file; its ZeRO optimizer files have the first two.
  std::vector<AutoEpLayer> autoep;
  try {
    autoep = AutoEpLayersOf(root);
  } catch (const std::exception& e) {
    L.errors.push_back(first->archive->path() + ": " + e.what());
    return L;
  }
  if (!autoep.empty() && count(FileKind::ZeroOptimizer) == 0) {
    L.errors.push_back(first->archive->path() + ": DeepSpeed AutoEP without ZeRO (expp_rank files) is not supported yet");
    return L;
  }
  // (AutoEP's experts are fused tensors in its ZeRO files, read as any parameter is: FinishAutoEp)
  const bool moe = autoep.empty() && (count(FileKind::ExpertStates) > 0 || root.Get("num_experts"));
  pt::ValuePtr config = root.Get("ds_config"), version = root.Get("ds_version");
  if (moe && !config)
    for (const auto& f : L.files)
      if (f.data && f.dp == 0 && mps[&f - L.files.data()] == 0)
        if (auto file = parse(f)) {
          const Value& r = *file->root;
          config = r.Get("ds_config"), version = r.Get("ds_version");
          L.notes.push_back("Mixture of Experts: ds_config and ds_version read from " + f.name +
                            " (the MoE model-states file has neither)");
          break;
        }
  in_first("training state", [&] {
    if (version) L.ds_version = version->kind == Value::Kind::Str ? version->s : "";
    if (auto v = root.Get("iteration")) L.iteration = v->AsInt();
    else if (auto g = root.Get("global_steps")) L.iteration = g->AsInt();
    mp_world = static_cast<int>(root.At("mp_world_size").AsInt());
    dp_world = static_cast<int>(root.At("dp_world_size").AsInt());
    L.dtype = "fp32";
    if (const auto& cfg = config; cfg && cfg->kind == Value::Kind::Dict) {
      auto enabled = [&](const char* key) {
        auto sec = cfg->Get(key);
        auto en = sec ? sec->Get("enabled") : nullptr;
        return en && en->kind == Value::Kind::Bool && en->b;
      };
      if (enabled("bf16")) L.dtype = "bf16";
      else if (enabled("fp16")) L.dtype = "fp16";
      if (auto z = cfg->Get("zero_optimization"); z && z->kind == Value::Kind::Dict)
        if (auto st = z->Get("stage"); st && st->kind == Value::Kind::Int) config_stage = static_cast<int>(st->i);
      // data_types.grad_accum_dtype, under any of the names DeepSpeed's DtypeEnum accepts.
      if (auto dt = cfg->Get("data_types"); dt && dt->kind == Value::Kind::Dict)
        if (auto g = dt->Get("grad_accum_dtype"); g && g->kind == Value::Kind::Str) {
          static const std::map<std::string, std::string> names = {
              {"fp32", "fp32"}, {"float32", "fp32"}, {"float", "fp32"}, {"torch.float32", "fp32"},
              {"fp16", "fp16"}, {"float16", "fp16"}, {"half", "fp16"}, {"torch.float16", "fp16"},
              {"bf16", "bf16"}, {"bfloat16", "bf16"}, {"torch.bfloat16", "bf16"}};
          if (auto it = names.find(g->s); it != names.end()) L.grad_accum_dtype = it->second;
          else L.problems.push_back("ds_config data_types.grad_accum_dtype '" + g->s + "' is no dtype DeepSpeed knows");
        }
    } else if (args) {
      if (auto b = args->Get("bf16"); b && b->kind == Value::Kind::Bool && b->b) L.dtype = "bf16";
      else if (auto h = args->Get("fp16"); h && h->kind == Value::Kind::Bool && h->b) L.dtype = "fp16";
    }
  });
  if (!L.errors.empty()) return L;
  // DeepSpeed 0.17.6+'s DDP bf16 wrapper (IndexDdpWrapper): no param_shapes, no optimizer file, the
  // optimizer state inside every model-states file.
  bool ddp_wrapper = false;
  if (auto ps = root.Get("param_shapes"); !moe && (!ps || ps->kind == Value::Kind::None) &&
                                          count(FileKind::ZeroOptimizer) == 0 && !zero3_files)
    if (auto opt = root.Get("optimizer"); opt && opt->kind == Value::Kind::Dict)
      ddp_wrapper = TorchOptimizerOf(*opt).fp32_groups != nullptr;

  // 3. Degrees: from metadata (Megatron args, else DeepSpeed's world sizes and the layer files).
  std::set<int> layer_tps;
  for (const auto& f : L.files)
    if (KindOf(f) == FileKind::LayerStates) layer_tps.insert(f.tp);
  if (args && args->Get("tensor_model_parallel_size")) {
    in_first("args", [&] {
      L.tp = static_cast<int>(args->At("tensor_model_parallel_size").AsInt());
      L.pp = static_cast<int>(args->At("pipeline_model_parallel_size").AsInt());
    });
  } else {
    L.tp = layer_tps.empty() ? (zero3_files ? mp_world : mp_world) : static_cast<int>(layer_tps.size());
    L.pp = std::max(1, mp_world / std::max(1, L.tp));
    L.notes.push_back("no Megatron args: TP and PP derived from mp_world_size and the layer files");
  }
  L.dp = dp_world;
  if (L.tp < 1 || L.pp < 1 || L.dp < 1) {
    L.errors.push_back(first->archive->path() + ": absurd degrees tp=" + std::to_string(L.tp) + " pp=" +
                       std::to_string(L.pp) + " dp=" + std::to_string(L.dp));
    return L;
  }
  source::TakeMegatronArgs(args.get(), L);  // model facts, and SP within dp
  if (!zero3_files && mp_world != L.tp * L.pp)
    L.problems.push_back("mismatched degrees: mp_world_size " + std::to_string(mp_world) + " != tp " +
                         std::to_string(L.tp) + " x pp " + std::to_string(L.pp));
  for (size_t fi = 0; fi < L.files.size(); ++fi) {
    ShardFile& f = L.files[fi];
    if (KindOf(f) == FileKind::LayerStates) continue;
    if (zero3_files) {
      f.tp = mps[fi], f.pp = 0;  // ZeRO-3 names files by TP rank (no PP)
    } else {
      f.pp = mps[fi] / L.tp, f.tp = mps[fi] % L.tp;  // the inverse of MpRank
    }
  }

  // Mixture of Experts in a pipeline: DeepSpeed's MoE layers run in a model that is not a
  // PipelineModule (with TP, see ExpertGroups: an expert's file and partitions lie at TP ranks of
  // their own, read below).
  if (moe && L.pp > 1) {
    L.errors.push_back(L.dir + ": a Mixture-of-Experts checkpoint at pp=" + std::to_string(L.pp) +
                       " is not supported (DeepSpeed's MoE layers run in a model that is not a pipeline)");
    return L;
  }

  // 4. The file grid must be complete and hold nothing beyond the degrees.
  std::set<std::string> present;
  for (const auto& f : L.files) present.insert(f.name);
  std::string prefix = any_bf16_prefix ? "bf16_" : "";
  auto expect = [&](const std::string& name, const std::string& what) {
    if (!present.count(name)) L.problems.push_back("missing rank file " + name + " (" + what + ")");
  };
  for (int pp = 0; pp < L.pp; ++pp)
    for (int tp = 0; tp < L.tp; ++tp) {
      const int mp = zero3_files ? tp : MpRank(pp, tp, L.tp);
      std::string coords = "pp=" + std::to_string(pp) + ", tp=" + std::to_string(tp);
      if (!zero3_files) expect(ModelStatesFileName(mp), coords);
      for (int dp = 0; dp < L.dp; ++dp) {
        std::string c = coords + ", dp=" + std::to_string(dp);
        if (!expp_optimizer && !ddp_wrapper) expect(OptimStatesFileName(prefix, dp, mp), c);
        if (zero3_files) expect(Zero3ModelStatesFileName(dp, mp), c);
      }
    }
  for (const auto& f : L.files) {
    // (an expp_rank file's "dp" is its expert-parallel rank: below dp x tp, ExpertGroups)
    const int dps = KindOf(f) == FileKind::ExpertOptimizer ? L.dp * L.tp : L.dp;
    bool outside = KindOf(f) == FileKind::LayerStates ? f.tp >= L.tp : (f.tp >= L.tp || f.pp >= L.pp || f.dp >= dps);
    if (outside) L.problems.push_back(f.name + ": rank " + Coord(f) + " lies outside the layout's degrees");
  }
  if (L.naming == "pipe") {
    std::map<int, std::set<int>> layer_files;
    for (const auto& f : L.files)
      if (KindOf(f) == FileKind::LayerStates) layer_files[f.layer].insert(f.tp);
    for (const auto& [layer, tps] : layer_files)
      for (int tp = 0; tp < L.tp; ++tp)
        if (!tps.count(tp))
          L.problems.push_back("missing rank file " + LayerStatesFileName(layer, tp) + " (layer " + std::to_string(layer) +
                               ", tp=" + std::to_string(tp) + ")");
  }

  // 5. Parameters and their per-TP shapes, from each model file's param_shapes.
  std::map<std::string, size_t> index;
  GroupParams group_params;  // (pp,tp,g)
  // Mixture of Experts: no param_shapes. The shapes are the module's tensors (the model-states file
  // holds every parameter but the experts) and the expert files' (each expert under its global id);
  // the optimizer groups, their order and the flat offsets come from the ZeRO files' mappings (step 6).
  MoeShapes moe_shapes;
  if (moe) {
    if (auto n = root.Get("num_experts"); n && n->kind == Value::Kind::List)
      for (const auto& c : n->AsSequence()) moe_shapes.num_experts.push_back(c->AsInt());
    for (auto* f : model_files)
      if (auto file = parse(*f)) try {
          for (const auto& item : file->root->At("module").AsDict().items())
            moe_shapes.Add(item.key->AsStr(), *f, item.value->AsTensor().shape, L, index);
        } catch (const std::exception& e) {
          L.errors.push_back(L.dir + "/" + f->name + ": module: " + e.what());
        }
    for (auto& f : L.files)
      if (KindOf(f) == FileKind::ExpertStates)
        if (auto file = parse(f)) try {
            // An expert is not split over TP: one whole tensor, its shape recorded at tp 0 whichever
            // TP rank saved it (ExpertGroups; FinishMoe checks that rank).
            ShardFile whole = f;
            whole.tp = 0;
            for (const auto& item : file->root->AsDict().items()) {
              const std::string& name = item.key->AsStr();
              moe_shapes.Add(name, whole, item.value->AsTensor().shape, L, index);
              if (auto e = ExpertOf(name)) moe_shapes.experts[e->prefix].insert(e->id), moe_shapes.layer_of[e->prefix] = f.layer;
            }
          } catch (const std::exception& e) {
            L.errors.push_back(L.dir + "/" + f.name + ": " + e.what());
          }
  }
  // DeepSpeed 0.19 saves no param_shapes for its BF16 optimizer at ZeRO stage 0 (its engine counts
  // only ZeRO as ZeRO optimizer state). Its optimizer files still map every parameter by name
  // (param_slice_mappings): the shapes come from the weights (the layer files of a pipeline, else
  // the module), each parameter's place in its group's flat buffer from its fragments.
  bool shapes_from_weights = false;
  if (auto ps = root.Get("param_shapes"); !moe && !zero3_files && (!ps || ps->kind == Value::Kind::None) &&
                                          count(FileKind::ZeroOptimizer) > 0) {
    shapes_from_weights = true;
    ShapesFromWeights(L, index, parse);
    L.notes.push_back("no param_shapes (DeepSpeed 0.19's BF16 optimizer at ZeRO-0 saves none): each parameter's shape "
                      "read from the " + std::string(L.naming == "pipe" ? "layer files" : "module") +
                      ", its place in its group from the optimizer files' param_slice_mappings");
  }
  // DeepSpeed 0.17.6+'s DDP bf16 wrapper: the optimizer state inside every model-states file.
  if (ddp_wrapper) {
    L.optimizer = "torch";
    IndexDdpWrapper(L, index, parse);
    L.notes.push_back("no ZeRO: the optimizer state inside the model-states files (DeepSpeed 0.17.6+'s DDP bf16 "
                      "wrapper), each position named by shape against the module's order");
  }
  // DeepSpeed variants that record no param_shapes, said by name rather than as every parameter
  // the optimizer files map but no param_shapes lists.
  if (auto ps = root.Get("param_shapes"); !moe && !shapes_from_weights && !ddp_wrapper &&
                                          (!ps || ps->kind == Value::Kind::None)) {
    auto opt = root.Get("optimizer");
    if (count(FileKind::ZeroOptimizer) == 0 && opt && opt->kind != Value::Kind::None)
      L.errors.push_back(first->archive->path() + ": the optimizer state is inside the model-states file and no "
                         "*_optim_states.pt exists, in a form ucp does not know (DeepSpeed 0.17.6+'s DDP bf16 wrapper "
                         "keeps optimizer_state_dict and fp32_groups there; fp32/fp16 without ZeRO saves the bare "
                         "torch or FP16 optimizer state): this variant is not supported yet");
    else
      L.errors.push_back(first->archive->path() + ": param_shapes is " + (ps ? "None" : "missing") +
                         " and no *_optim_states.pt maps the parameters by name: ucp cannot tell the optimizer "
                         "groups' parameters");
    return L;
  }
  for (auto* f : model_files) {
    if (moe || shapes_from_weights || ddp_wrapper) break;
    if (zero3_files && f->dp != 0) continue;  // every ZeRO-3 rank repeats the same shapes
    auto file = parse(*f);
    if (!file) continue;
    try {
      const auto& groups = file->root->At("param_shapes").AsSequence();
      for (size_t g = 0; g < groups.size(); ++g) {
        for (const auto& item : groups[g]->AsDict().items()) {
          const std::string& name = item.key->AsStr();
          auto shape = Shape(*item.value);
          RecordShape(L, index, name, static_cast<int>(g), *f, shape, "on another stage");
          group_params[{f->pp, f->tp, static_cast<int>(g)}].push_back({name, pt::Numel(shape)});
        }
      }
    } catch (const std::exception& e) {
      L.errors.push_back(L.dir + "/" + f->name + ": param_shapes: " + e.what());
    }
  }

  // 6. Optimizer files: stage, partition counts, and every parameter's fragments.
  auto offsets_of = [&](int pp, int tp, int g) {  // name -> (offset in the group's flat buffer, numel)
    std::map<std::string, std::pair<int64_t, int64_t>> out;
    int64_t at = 0;
    for (const auto& [name, numel] : group_params[{pp, tp, g}]) out[name] = {at, numel}, at += numel;
    return out;
  };
  std::set<int> stages_seen, expert_groups;
  std::map<std::tuple<int, int, int>, int64_t> partitions;  // (pp, tp, group) -> flat partition size
  for (size_t fi = 0; fi < L.files.size(); ++fi) {
    ShardFile& f = L.files[fi];
    if (!f.data || KindOf(f) != FileKind::ZeroOptimizer) continue;  // (a torch optimizer's state: TorchState)
    auto file = parse(f);
    if (!file) continue;
    std::string where = source::FileWhere(L, static_cast<int>(fi));
    try {
      const Value& osd = file->root->At("optimizer_state_dict");
      auto stage_v = osd.Get("zero_stage");
      int stage = stage_v ? ZeroStageOf(*stage_v) : 1;
      stages_seen.insert(stage);
      if (!stage_v) L.optimizer = "bf16_optimizer";
      else L.optimizer = stage == 3 ? "zero3" : "zero";
      L.zero_stage = stage;
      const Value& pc = osd.At("partition_count");
      std::vector<int64_t> counts;
      if (pc.kind == Value::Kind::Int) counts.push_back(pc.i);
      else
        for (const auto& c : pc.AsSequence()) counts.push_back(c->AsInt());
      for (size_t g = 0; g < counts.size(); ++g) {
        int64_t expected = L.dp;
        const bool experts = (moe || !autoep.empty()) && IsExpertGroup(osd, g);
        if (experts) expert_groups.insert(static_cast<int>(g));
        if (experts) {
          // Expert groups are partitioned over the expert-data-parallel group, world / ep ranks.
          const int64_t world = static_cast<int64_t>(L.dp) * L.tp;
          if (L.ep == 1 && counts[g] > 0 && counts[g] < world && world % counts[g] == 0)
            L.ep = static_cast<int>(world / counts[g]);
          expected = world / L.ep;
        }
        if (counts[g] != expected)
          L.problems.push_back(where + ": partition_count " + std::to_string(counts[g]) + " of group " +
                               std::to_string(g) + " != " + std::to_string(expected) +
                               (experts ? " (dp x tp / ep)" : " (dp_world_size)"));
      }
      auto flat = FlatGroupsOf(*file->root, stage);
      const uint8_t* base = file->archive->file()->bytes().data();
      auto extent = [&](const pt::TensorView& t) {
        return source::Extent{static_cast<uint64_t>(t.data() - base), static_cast<int64_t>(t.numel())};
      };
      for (const auto& fg : flat) f.groups.push_back({extent(fg.fp32), extent(fg.exp_avg), extent(fg.exp_avg_sq)});
      for (size_t g = 0; g < flat.size(); ++g) {
        int gi = static_cast<int>(g);
        if (f.dp == 0) L.steps[{f.pp, f.tp, gi}] = flat[g].step;
        int64_t partition = static_cast<int64_t>(flat[g].exp_avg.numel());
        partitions[{f.pp, f.tp, gi}] = partition;
        int64_t have_fp32 = static_cast<int64_t>(flat[g].fp32.numel());
        if (flat[g].exp_avg_sq.numel() != flat[g].exp_avg.numel() || have_fp32 > partition)
          L.problems.push_back(where + ": group " + std::to_string(g) + ": fp32 / exp_avg / exp_avg_sq partitions hold " +
                               std::to_string(have_fp32) + " / " + std::to_string(partition) + " / " +
                               std::to_string(flat[g].exp_avg_sq.numel()) + " elements");
        auto add = [&](const std::string& name, int64_t src, int64_t numel, int64_t dst) {
          auto it = index.find(name);
          if (it == index.end()) {
            L.problems.push_back(where + ": parameter '" + name + "' has a fragment but is in no " +
                                 (moe ? "module or expert file" : "param_shapes"));
            return;
          }
          if (src < 0 || numel < 0 || src + numel > std::min(partition, have_fp32))
            L.problems.push_back(where + ": parameter '" + name + "': fragment [" + std::to_string(src) + ", " +
                                 std::to_string(src + numel) + ") exceeds the flat partition of group " +
                                 std::to_string(g) + " (" + std::to_string(std::min(partition, have_fp32)) +
                                 " elements)");
          else if (numel > 0)
            L.fragments.push_back({static_cast<int>(fi), gi, static_cast<int>(it->second), src, numel, dst});
        };
        if (stage == 3) {
          // Each parameter padded to a multiple of dp and split equally, in param_shapes order.
          int64_t at = 0;
          for (const auto& [name, numel] : group_params[{0, f.tp, gi}]) {
            int64_t piece = (numel + L.dp - 1) / L.dp, lo = f.dp * piece, n = std::min(piece, numel - lo);
            if (n > 0) add(name, at, n, lo);
            at += piece;
            if (f.dp == 0) L.zero_padding_elements += piece * L.dp - numel;
          }
          if (at != partition)
            L.problems.push_back(where + ": fp32_flat_groups[" + std::to_string(g) + "] holds " +
                                 std::to_string(partition) + " elements, param_shapes need " + std::to_string(at));
          continue;
        }
        L.zero_padding_elements += osd.At("group_paddings").AsSequence().at(g)->AsInt();
        const auto& mappings = osd.At("param_slice_mappings").AsSequence();
        if (g >= mappings.size()) throw Error("param_slice_mappings has no group " + std::to_string(g));
        // An expert group (Mixture of Experts, AutoEP) holds the experts of this rank's expert-parallel
        // rank, partitioned over its expert-data-parallel group (ExpertGroups); every other group over
        // the DP ranks.
        const bool experts = expert_groups.count(gi) > 0;
        const reshard::ExpertGroups eg{L.dp, L.tp, L.ep};
        const int ep_rank = experts ? eg.EpRank(f.dp, f.tp) : 0;
        const int64_t part = experts ? eg.Partition(f.dp, f.tp) : f.dp;
        if (moe || shapes_from_weights) {
          // Fragments at their flat position in the group's buffer (one per expert-parallel rank for
          // an expert group); made relative to each parameter's first element (PlaceByFragments).
          for (const auto& item : mappings[g]->AsDict().items()) {
            const std::string name = experts ? moe_shapes.Global(item.key->AsStr(), ep_rank, L.ep) : item.key->AsStr();
            const int64_t start = item.value->At("start").AsInt(), numel = item.value->At("numel").AsInt();
            add(name, start, numel, part * partition + start);
          }
          continue;
        }
        auto offsets = offsets_of(f.pp, f.tp, gi);
        // (AutoEP: an expert group holds the fused tensors of its expert-parallel rank's experts, the
        // run [ep_rank * local, ...) of each full tensor)
        for (const auto& item : mappings[g]->AsDict().items()) {
          const std::string& name = item.key->AsStr();
          int64_t start = item.value->At("start").AsInt(), numel = item.value->At("numel").AsInt();
          auto off = offsets.find(name);
          if (off == offsets.end()) {
            L.problems.push_back(where + ": parameter '" + name + "' is mapped in group " + std::to_string(g) +
                                 " but this rank's param_shapes do not list it there");
            continue;
          }
          add(name, start, numel, part * partition + start - off->second.first + int64_t{ep_rank} * off->second.second);
        }
      }
    } catch (const std::exception& e) {
      L.errors.push_back(where + ": " + e.what());
    }
  }
  if (moe && expp_optimizer) {
    L.optimizer = "torch";
    IndexMoeWithoutZero(L, moe_shapes, index, parse);
  }
  for (const auto& f : L.files)
    if (KindOf(f) == FileKind::LayerStates) parse(f);  // integrity: every layer file must read
  if (stages_seen.size() > 1) L.problems.push_back("optimizer files disagree on the ZeRO stage");
  // The BF16 optimizer writes no zero_stage (its files have the ZeRO-1 layout): the job's stage, 0 or
  // 1, is the one its ds_config names.
  if (L.optimizer == "bf16_optimizer" && (config_stage == 0 || config_stage == 1)) L.zero_stage = config_stage;
  if (L.optimizer.empty()) L.optimizer = zero3_files ? "zero3" : "zero";
  L.moe = moe;
  if (moe) FinishMoe(L, moe_shapes, group_params, root);
  if (shapes_from_weights || ddp_wrapper) PlaceByFragments(L, group_params);
  if (!autoep.empty()) FinishAutoEp(L, autoep, expert_groups, group_params);
  CheckCoverage(L, group_params, partitions);
  if (zero3_files != (L.zero_stage == 3))
    L.problems.push_back("ZeRO-3 model files present but optimizer files say stage " + std::to_string(L.zero_stage));
  for (const auto& f : L.files)  // a file the conversion carries over is read as well: checked as it is copied
    if (f.carried) parse(f);
  for (auto& f : L.files)  // the zip CRC-32 of every record a mapper may read, or a copy passes on
    if (auto it = parsed.find(f.name); it != parsed.end() && it->second)
      for (const auto& [name, e] : it->second->archive->entries())
        f.checksummed.push_back({name, e.data_offset, e.size, e.crc32});
  for (auto& f : L.files)
    std::sort(f.checksummed.begin(), f.checksummed.end(),
              [](const source::ChecksummedRange& a, const source::ChecksummedRange& b) { return a.offset < b.offset; });
  // A missing file first: most of what else is wrong follows from it (one fault, one error: the tools
  // that stop at the first problem name it).
  std::stable_partition(L.problems.begin(), L.problems.end(), [](const std::string& p) { return p.rfind("missing rank file", 0) == 0; });
  CheckFilesAgree(L, parse);  // what every file repeats: a file of another save or run differs
  RecordWeightCopies(L, parse);  // what the module keeps besides the masters, compared as it is read
  TakeJobFiles(L);
  return L;
}

}  // namespace ucp::deepspeed
