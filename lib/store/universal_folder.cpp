#include "store/universal_folder.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <regex>
#include <tuple>

#include "core/error.h"
#include "patterns/resolve.h"
#include "patterns/rules.h"
#include "plan/convert_plan.h"
#include "pt/torch_file.h"
#include "source/source_index.h"
#include "store/atomic_store.h"

namespace ucp::store {
namespace fs = std::filesystem;
using pt::Value;

namespace {

constexpr const char* kOptimizerState = "zero/optimizer_state.pt";

// DeepSpeed's model-states files beside the universal tensors: mp_rank_XX (ZeRO 0-2), or
// zero_pp_rank_D_mp_rank_XX (ZeRO-3), as its converter copied them from the source.
struct ModelFile {
  std::string name;
  int mp = 0, dp = 0;
  bool zero3 = false;
};

std::vector<ModelFile> ModelFilesOf(const std::string& dir) {
  static const std::regex name_re(R"(^(zero_pp_rank_(\d{1,6})_)?mp_rank_(\d{1,6})_model_states\.pt$)");
  std::vector<ModelFile> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    std::smatch m;
    if (e.is_regular_file(ec) && std::regex_match(n, m, name_re))
      out.push_back({n, std::stoi(m[3]), m[2].matched ? std::stoi(m[2]) : 0, m[1].matched});
  }
  std::sort(out.begin(), out.end(), [](const ModelFile& a, const ModelFile& b) { return std::tie(a.mp, a.dp) < std::tie(b.mp, b.dp); });
  return out;
}

// The value at a path of dict keys (or a Namespace's attributes), or nullptr.
const Value* At(const Value& root, std::initializer_list<const char*> keys) {
  const Value* v = &root;
  for (const char* k : keys) {
    if (v->kind != Value::Kind::Dict && v->kind != Value::Kind::Object) return nullptr;
    auto next = v->Get(k);
    if (!next) return nullptr;
    v = next.get();
  }
  return v;
}
int64_t IntAt(const Value& root, std::initializer_list<const char*> keys, int64_t otherwise) {
  const Value* v = At(root, keys);
  return v && v->kind == Value::Kind::Int ? v->AsInt() : otherwise;
}
bool TrueAt(const Value& root, std::initializer_list<const char*> keys) {
  const Value* v = At(root, keys);
  return v && v->kind == Value::Kind::Bool && v->AsBool();
}
std::string StrAt(const Value& root, std::initializer_list<const char*> keys) {
  const Value* v = At(root, keys);
  return v && v->kind == Value::Kind::Str ? v->AsStr() : "";
}

std::vector<int64_t> ShapeOf(const Value& v) {
  std::vector<int64_t> out;
  for (const auto& d : v.AsSequence()) out.push_back(d->AsInt());
  pt::CheckedNumel(out);
  return out;
}

// The tag of the checkpoint the folder was made from, as its files record it: DeepSpeed names a
// tag global_step<global_steps> (Megatron-DeepSpeed: <iteration>), which rank 0's model-states file
// keeps; a folder's name is the user's (a copy may be called anything). Only a file that records
// neither step leaves the folder's name without DeepSpeed's "_universal".
std::string TagOf(const std::string& dir, const Value& model_states) {
  const int64_t step = IntAt(model_states, {"global_steps"}, IntAt(model_states, {"iteration"}, -1));
  if (step >= 0) return "global_step" + std::to_string(step);
  fs::path p = fs::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  std::string tag = p.filename().string();
  const std::string suffix = "_universal";
  if (tag.size() > suffix.size() && tag.ends_with(suffix)) tag.resize(tag.size() - suffix.size());
  return tag;
}

// The model-states files, each read whole once with every zip record's CRC-32 checked: a reshard
// carries them.
class ModelStates {
 public:
  ModelStates(std::string dir, std::vector<ModelFile> files) : dir_(std::move(dir)), files_(std::move(files)) {
    if (files_.empty())
      throw Error(dir_ + ": no mp_rank_*_model_states.pt beside zero/: not a DeepSpeed universal checkpoint folder");
  }
  const std::vector<ModelFile>& files() const { return files_; }
  bool zero3() const { return files_.front().zero3; }
  const Value& RootOf(const ModelFile& f) {
    auto it = read_.find(f.name);
    if (it == read_.end())
      it = read_.emplace(f.name, pt::ReadTorchFile(dir_ + "/" + f.name, {.verify_pickle_crc = true, .verify_storage_crc = true}))
               .first;
    return *it->second.root;
  }

 private:
  std::string dir_;
  std::vector<ModelFile> files_;
  std::map<std::string, pt::TorchFile> read_;
};

// zero/: one folder per parameter, sorted by name.
std::vector<std::string> ParamFolders(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir + "/zero"))
    if (e.is_directory()) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  if (names.empty()) throw Error(dir + "/zero: no parameter folder");
  return names;
}

void RefuseMixtureOfExperts(const std::string& dir, const Value& root, const std::vector<std::string>& names) {
  if (root.Get("num_experts") || root.Get("ds_autoep_layers") ||
      std::any_of(names.begin(), names.end(), [](const std::string& n) { return n.find("deepspeed_experts.") != std::string::npos; }))
    throw Error(dir + ": a Mixture-of-Experts universal checkpoint: ucp reads DeepSpeed's universal folders of dense "
                "models only; convert the source checkpoint with ucp-convert");
}

// The layout, from rank 0's model-states file (`first` names it in errors): degrees, ZeRO stage,
// dtypes, optimizer, Megatron's model facts and the checkpoint's own rules.
source::SourceIndex LayoutOf(const std::string& dir, const std::string& first, const Value& root,
                             const std::vector<std::string>& names, bool zero3) {
  source::SourceIndex L;
  L.format = "deepspeed-universal";
  L.root = L.dir = dir;
  L.tag = TagOf(dir, root);
  const bool pipe = std::any_of(names.begin(), names.end(), [](const std::string& n) {
    return n.rfind("tied_modules.", 0) == 0 || (!n.empty() && std::isdigit(static_cast<unsigned char>(n[0])));
  });
  L.naming = pipe ? "pipe" : "plain";
  WithContext(first, [&] {
    const Value* args = At(root, {"args"});  // Megatron's argparse.Namespace
    L.framework = args ? "megatron-deepspeed" : "deepspeed";
    L.ds_version = StrAt(root, {"ds_version"});
    L.zero_stage = zero3 ? 3 : static_cast<int>(IntAt(root, {"ds_config", "zero_optimization", "stage"}, 0));
    const bool bf16 = TrueAt(root, {"ds_config", "bf16", "enabled"}), fp16 = TrueAt(root, {"ds_config", "fp16", "enabled"});
    L.dtype = bf16 ? "bf16" : fp16 ? "fp16" : "fp32";
    L.grad_accum_dtype = StrAt(root, {"ds_config", "data_types", "grad_accum_dtype"});
    L.optimizer = L.zero_stage == 3 ? "zero3"
                  : bf16 && (L.zero_stage == 0 || (L.zero_stage == 1 && L.grad_accum_dtype == "fp32")) ? "bf16_optimizer"
                                                                                                            : "zero";
    L.dp = static_cast<int>(IntAt(root, {"dp_world_size"}, 1));
    const int64_t mp = IntAt(root, {"mp_world_size"}, 1);
    const int64_t tp = args ? IntAt(*args, {"tensor_model_parallel_size"}, -1) : -1;
    L.tp = static_cast<int>(tp > 0 ? tp : pipe ? 1 : mp);
    if (L.dp < 1 || mp < 1 || mp % L.tp) throw Error("mp_world_size " + std::to_string(mp) + " is no multiple of tp=" + std::to_string(L.tp));
    L.pp = static_cast<int>(mp / L.tp);
    L.iteration = IntAt(root, {"iteration"}, IntAt(root, {"global_steps"}, 0));
    source::TakeMegatronArgs(args, L);  // model facts, and SP within dp
    if (auto info = root.Get("universal_checkpoint_info"); info && info->kind != Value::Kind::None)
      L.universal_checkpoint_info = info;
  });
  return L;
}

// Each parameter's optimizer group, order and stages from param_shapes: per stage (TP rank 0's
// model-states file; under ZeRO-3 DP rank 0's, whose shapes are the full ones) and group, added to
// L.params; returns the shape param_shapes lists for each. Each parameter has its folder and each
// folder its parameter.
std::map<std::string, std::vector<int64_t>> ReadParamShapes(const std::string& dir, ModelStates& models,
                                                            const std::vector<std::string>& names, source::SourceIndex& L) {
  std::map<std::string, size_t> index;
  std::map<std::string, std::vector<int64_t>> listed_shape;
  const bool zero3 = models.zero3();
  for (const ModelFile& f : models.files()) {
    if (zero3 ? f.dp != 0 : f.mp % L.tp != 0) continue;
    const int stage = zero3 ? 0 : f.mp / L.tp;
    const std::string path = dir + "/" + f.name;
    const Value* shapes = At(models.RootOf(f), {"param_shapes"});
    if (!shapes || (shapes->kind != Value::Kind::List && shapes->kind != Value::Kind::Tuple))
      throw Error(path + ": no param_shapes list: the parameters' optimizer groups are unknown");
    WithContext(path + ": param_shapes", [&] {
      const auto& groups = shapes->AsSequence();
      for (size_t g = 0; g < groups.size(); ++g)
        for (const auto& item : groups[g]->AsDict().items()) {
          const std::string& name = item.key->AsStr();
          auto [it, fresh] = index.emplace(name, L.params.size());
          if (fresh) {
            source::ParamRecord p;
            p.name = name, p.group = static_cast<int>(g);
            L.params.push_back(p);
            listed_shape[name] = ShapeOf(*item.value);
          }
          L.params[it->second].stages.insert(stage);
        }
    });
  }
  for (const auto& n : names)
    if (!index.count(n)) throw Error(dir + "/zero/" + n + ": a parameter no model-states file's param_shapes lists");
  for (const auto& p : L.params)
    if (!std::binary_search(names.begin(), names.end(), p.name))
      throw Error(dir + "/zero: no folder for parameter '" + p.name + "', which param_shapes lists");
  return listed_shape;
}

// The shape of `p` from its fp32.pt (its pickle only): the dict's 'param'; DeepSpeed's bare ZeRO-3
// form (a 1-D tensor, vocabulary padding kept) takes param_shapes' full shape, `listed`.
void TakeFp32Shape(const std::string& dir, const std::vector<int64_t>& listed, source::ParamRecord& p) {
  const std::string rel = StateRelPath(p.name, plan::State::Fp32);
  const pt::TorchFile f = pt::ReadTorchFile(dir + "/" + rel);
  WithContext(dir + "/" + rel, [&] {
    const bool bare = f.root->kind == Value::Kind::Tensor;
    auto v = bare ? f.root : f.root->Get("param");
    if (!v || v->kind != Value::Kind::Tensor) throw Error("no 'param' tensor");
    p.tp_shape[0] = bare ? listed : v->AsTensor().shape;
    if (bare && static_cast<int64_t>(v->AsTensor().numel()) < pt::Numel(p.tp_shape[0]))
      throw Error("a 1-D tensor of " + std::to_string(v->AsTensor().numel()) + " elements for a parameter of shape " +
                  pt::ShapeString(p.tp_shape[0]));
  });
}

// The manifest's file list: each file by its size, checked by its zip's CRC-32s.
class FileList {
 public:
  explicit FileList(std::string dir) : dir_(std::move(dir)) {}
  void Add(const std::string& rel) {
    std::error_code ec;
    const auto size = fs::file_size(dir_ + "/" + rel, ec);
    if (ec) throw Error(dir_ + "/" + rel + ": missing");
    FileRecord r;
    r.path = rel, r.bytes = size, r.zip_crc32 = true;
    files_[rel] = r;
  }
  const std::map<std::string, FileRecord>& files() const { return files_; }

 private:
  std::string dir_;
  std::map<std::string, FileRecord> files_;
};

// The model-states files as the index's carried shard files.
void AddModelFiles(const ModelStates& models, FileList& files, source::SourceIndex& L) {
  const bool zero3 = models.zero3();
  for (const ModelFile& f : models.files()) {
    files.Add(f.name);
    source::ShardFile sf;
    sf.name = f.name, sf.kind = zero3 ? "zero3_model_states" : "model_states", sf.carried = true;
    sf.pp = zero3 ? 0 : f.mp / L.tp, sf.tp = zero3 ? 0 : f.mp % L.tp, sf.dp = f.dp;
    L.files.push_back(sf);
  }
}

// The manifest's parameters, with their patterns as ucp-convert resolves them over the joined
// tensors (a TP=1 view: the shapes are whole).
nlohmann::json ParamsJson(const std::string& dir, const source::SourceIndex& L, const patterns::ModelPatterns& M,
                          const std::map<std::string, FileRecord>& files) {
  if (!M.problems.empty()) throw Error(dir + ": " + M.problems.front());
  nlohmann::json params = nlohmann::json::array();
  for (size_t k = 0; k < L.params.size(); ++k) {
    const auto& pat = M.params.at(k);
    plan::ParamPlan P;
    P.index = static_cast<int>(k), P.name = pat.name, P.full_shape = pat.full_shape, P.full_numel = pt::Numel(pat.full_shape);
    nlohmann::json entry = ParamMetaJson(L, pat, P);
    nlohmann::json stored;
    for (int s = 0; s < plan::kStates; ++s) {
      const auto state = static_cast<plan::State>(s);
      stored[std::string(plan::StateName(state))] = StateRelPath(pat.name, state);
    }
    if (files.count(StepRelPath(pat.name))) stored["step"] = StepRelPath(pat.name);
    else if (L.zero_stage == 3) entry["step_in_optimizer_state"] = true;  // its form: no step.pt, the group's step there
    entry["files"] = stored;
    params.push_back(entry);
  }
  return params;
}

}  // namespace

bool IsDeepSpeedUniversal(const std::string& dir) {
  std::error_code ec;
  return !fs::exists(dir + "/" + kManifestName, ec) && !IsUnfinishedConversion(dir) &&
         fs::is_regular_file(dir + "/" + kOptimizerState, ec) && !ModelFilesOf(dir).empty();
}

nlohmann::json DescribeDeepSpeedUniversal(const std::string& dir) {
  ModelStates models(dir, ModelFilesOf(dir));
  const ModelFile& first = models.files().front();
  const Value& root = models.RootOf(first);
  const std::vector<std::string> names = ParamFolders(dir);
  RefuseMixtureOfExperts(dir, root, names);
  source::SourceIndex L = LayoutOf(dir, dir + "/" + first.name, root, names, models.zero3());
  const auto listed_shape = ReadParamShapes(dir, models, names, L);
  FileList files(dir);
  for (auto& p : L.params) {
    TakeFp32Shape(dir, listed_shape.at(p.name), p);
    for (int s = 0; s < plan::kStates; ++s) files.Add(StateRelPath(p.name, static_cast<plan::State>(s)));
    if (fs::exists(dir + "/" + StepRelPath(p.name))) files.Add(StepRelPath(p.name));
  }
  files.Add(kOptimizerState);
  AddModelFiles(models, files, L);
  source::SourceIndex whole = L;
  whole.tp = 1;
  const patterns::ModelPatterns M = patterns::ResolvePatterns(whole, {.pattern_files = {}, .patterns_dir = patterns::DefaultPatternsDir()});
  const nlohmann::json params = ParamsJson(dir, L, M, files.files());
  nlohmann::json m = AssembleManifest("pt", SourceJson(L, M), FamilyJson(M), params, files.files());
  m["checksum"] = "zip-crc32";
  m["deepspeed_universal"] = true;
  return m;
}

nlohmann::json ReadAtomicManifest(const std::string& dir) {
  if (IsDeepSpeedUniversal(dir)) return DescribeDeepSpeedUniversal(dir);
  return ReadManifest(dir);
}

}  // namespace ucp::store
