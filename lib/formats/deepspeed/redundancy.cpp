#include "formats/deepspeed/redundancy.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/format.h"
#include "formats/deepspeed/index.h"
#include "safetensors/read.h"

namespace ucp::deepspeed {
namespace {

using pt::Value;
using source::ShardFile;
using source::SourceIndex;

bool IsModelStates(const ShardFile& f) { return f.kind == "model_states" || f.kind == "zero3_model_states"; }

// One value every file of a kind repeats, as each file has it: text -> the files holding it.
struct Repeated {
  std::string what;  // "ds_version", "global_steps", "step of optimizer group 0", ...
  std::map<std::string, std::vector<std::string>> files_by_value;
};

std::string Words(const Value& v) {
  if (v.kind == Value::Kind::Str) return v.s;
  if (v.kind == Value::Kind::Int) return std::to_string(v.i);
  char number[32];
  std::snprintf(number, sizeof number, "%.17g", pt::StepValue(v));
  return number;
}

// The odd files of a value that is not the same everywhere: those of the value the fewest hold
// (ties: the value a later file holds), named with the value the others hold.
std::string Disagreement(const std::string& dir, const Repeated& r) {
  auto odd = r.files_by_value.begin(), common = r.files_by_value.begin();
  for (auto it = r.files_by_value.begin(); it != r.files_by_value.end(); ++it) {
    if (it->second.size() < odd->second.size() || (it->second.size() == odd->second.size() && it->second.back() > odd->second.back()))
      odd = it;
    if (it->second.size() > common->second.size()) common = it;
  }
  if (common == odd)
    for (auto it = r.files_by_value.begin(); it != r.files_by_value.end(); ++it)
      if (it != odd) common = it;
  const std::string names = JoinNames(odd->second);
  return dir + ": " + names + (odd->second.size() == 1 ? " records " : " record ") + r.what + " = " + odd->first + " where " +
         std::to_string(common->second.size()) + " other file(s) (" + common->second.front() + (common->second.size() > 1 ? ", ..." : "") +
         ") record " + common->first + ": a file of another save, step or run is mixed into this tag (every file of one "
         "save repeats it); convert a tag whose files were written together";
}

// A weight file that holds some of the weights the optimizer's parameters name for it must hold
// all of them: one that lacks some is of another model or run (one problem naming it).
void RequireEveryWeight(SourceIndex& L, const ShardFile& f, const std::set<int>& held) {
  const bool layer = f.kind == "layer_states";
  std::vector<std::string> missing;
  for (size_t p = 0; p < L.params.size(); ++p) {
    const source::ParamRecord& param = L.params[p];
    if (param.WholeOverTp() || held.count(static_cast<int>(p)) || !param.tp_shape.count(f.tp)) continue;
    const std::string prefix = std::to_string(f.layer) + ".";
    const bool expected = layer ? param.name.rfind(prefix, 0) == 0 : param.stages.count(f.pp) > 0;
    if (expected) missing.push_back(param.name);
  }
  if (!missing.empty())
    L.problems.push_back(L.dir + "/" + f.name + ": holds no weight of " + std::to_string(missing.size()) +
                         " parameter(s) the optimizer files hold for it (e.g. '" + missing.front() +
                         "'): a file of another model or run?");
}

}  // namespace

void CheckFilesAgree(SourceIndex& L, const ParseFile& parse) {
  std::map<std::string, Repeated> values;  // what -> the files holding each value
  std::vector<std::string> empty_version;  // files whose ds_version is ''
  auto note = [&](const std::string& what, const Value* v, const ShardFile& f) {
    if (!v || v->kind == Value::Kind::None) return;
    try {
      values[what].what = what;
      values[what].files_by_value[Words(*v)].push_back(f.name);
    } catch (const std::exception&) {  // a value of a form no file of this kind has: the index's own reading says so
    }
  };
  for (const auto& f : L.files) {
    if (!IsModelStates(f) && f.kind != "optimizer_states") continue;
    const auto file = parse(f);
    if (!file) continue;  // the index has its error
    const Value& root = *file->root;
    if (root.kind != Value::Kind::Dict) continue;
    note("ds_version", root.Get("ds_version").get(), f);
    if (const auto v = root.Get("ds_version"); v && v->kind == Value::Kind::Str && v->s.empty())
      empty_version.push_back(f.name);
    if (IsModelStates(f))
      for (const char* key : {"global_steps", "global_samples", "iteration", "dp_world_size", "mp_world_size"})
        note(key, root.Get(key).get(), f);
    if (f.kind == "optimizer_states" && !L.moe) try {
        const auto groups = FlatGroupsOf(root, L.zero_stage);
        for (size_t g = 0; g < groups.size(); ++g)
          note("the step of optimizer group " + std::to_string(g), groups[g].step.get(), f);
      } catch (const std::exception&) {  // the index's reading of the file says what is wrong with it
      }
  }
  if (!empty_version.empty() && values["ds_version"].files_by_value.size() == 1)
    L.problems.push_back(L.dir + ": " + JoinNames(empty_version) + (empty_version.size() == 1 ? " records" : " record") +
                         " an empty ds_version, which DeepSpeed's load_checkpoint refuses (\"Empty ds_version in checkpoint\"): "
                         "written by a tool, not by DeepSpeed? ucp-reshard --ds-version RELEASE writes the release the job runs");
  for (const auto& [what, r] : values)
    if (r.files_by_value.size() > 1) {
      L.problems.insert(L.problems.begin(), Disagreement(L.dir, r));  // first: what follows may be its consequence
      return;  // one fault, one error: the first value that differs names the odd files
    }
}

void RecordWeightCopies(SourceIndex& L, const ParseFile& parse) {
  if (L.moe || (L.optimizer != "zero" && L.optimizer != "bf16_optimizer") || L.zero_stage > 2) return;
  std::map<std::string, int> param_of;
  for (size_t p = 0; p < L.params.size(); ++p)
    if (!L.params[p].WholeOverTp()) param_of[L.params[p].name] = static_cast<int>(p);
  static const std::string kTied = "tied_modules.embed.";
  for (size_t fi = 0; fi < L.files.size(); ++fi) {
    const ShardFile& f = L.files[fi];
    const bool layer = f.kind == "layer_states";
    if (!(layer ? L.naming == "pipe" : f.kind == "model_states" && L.naming != "pipe")) continue;
    const auto file = parse(f);
    if (!file || file->root->kind != Value::Kind::Dict) continue;
    const auto module = layer ? file->root : file->root->Get("module");
    if (!module || module->kind != Value::Kind::Dict) continue;
    const uint8_t* base = file->archive->file()->bytes().data();
    std::set<int> held;  // the parameters this file holds a weight of
    for (const auto& item : module->AsDict().items()) {
      if (item.key->kind != Value::Kind::Str || item.value->kind != Value::Kind::Tensor) continue;
      const std::string& key = item.key->s;
      std::string name = layer ? std::to_string(f.layer) + "." + key : key;
      if (layer && f.layer == 1 && !param_of.count(name)) name = kTied + key;
      const auto p = param_of.find(name);
      if (p == param_of.end()) continue;  // a buffer, or a weight the optimizer does not hold
      held.insert(p->second);
      const source::ParamRecord& param = L.params[static_cast<size_t>(p->second)];
      const pt::TensorView& t = item.value->AsTensor();
      const auto shape = param.tp_shape.find(f.tp);
      if (shape == param.tp_shape.end() || param.stages.empty()) continue;
      if (shape->second != t.shape) {
        L.problems.push_back(L.dir + "/" + f.name + ": the weight of '" + name + "' has shape " + pt::ShapeString(t.shape) +
                             " where the optimizer's parameter has " + pt::ShapeString(shape->second) +
                             " at tp=" + std::to_string(f.tp) + ": a file of another model, layout or run?");
        continue;
      }
      if (!t.contiguous() || (t.dtype != pt::DType::F32 && t.dtype != pt::DType::BF16 && t.dtype != pt::DType::F16)) continue;
      // A pipeline's weight belongs to the first stage holding it (the tied embedding's other copy,
      // on the last stage, is no layer file's: DeepSpeed saves a tied module once).
      const int pp = layer ? *param.stages.begin() : f.pp;
      L.weight_copies.push_back({p->second, pp, f.tp, static_cast<int>(fi), static_cast<uint64_t>(t.data() - base),
                                 static_cast<int64_t>(t.numel()), t.dtype});
    }
    if (!held.empty()) RequireEveryWeight(L, f, held);
  }
}

void RecordGatheredWeights(SourceIndex& L) {
  if (L.zero_stage != 3 || L.moe) return;
  const std::string root = L.job.root.empty() ? L.root : L.job.root;
  const auto& w = L.job.weights;
  const bool gathered = L.tp == 1 && L.pp == 1 && (std::find(w.begin(), w.end(), "model.safetensors") != w.end() ||
                                                   std::find(w.begin(), w.end(), "model.safetensors.index.json") != w.end());
  if (!gathered) {
    L.notes.push_back("ZeRO-3: each optimizer file's DP rank is taken from its name; its module keeps no weights (empty "
                      "placeholders), nothing in it names its rank, and no second copy of the weights is beside it (Trainer "
                      "writes model.safetensors with stage3_gather_16bit_weights_on_model_save), so files swapped between DP "
                      "ranks cannot be told (what every file repeats, the version and the step, is compared)");
    return;
  }
  safetensors::StModel model;
  try {
    model = safetensors::OpenSafetensorsModel(root);
  } catch (const Error& e) {
    L.problems.push_back(std::string(e.what()) + " (the copy of the weights beside " + L.tag + ", compared with its fp32 masters)");
    return;
  }
  const int first = static_cast<int>(L.files.size() + L.copy_files.size());
  for (const auto& f : model.files) L.copy_files.push_back(root + "/" + f.name);
  int64_t compared = 0;
  for (size_t p = 0; p < L.params.size(); ++p) {
    const source::ParamRecord& param = L.params[p];
    const auto at = model.where.find(param.name);
    const auto shape = param.tp_shape.find(0);
    if (at == model.where.end() || shape == param.tp_shape.end()) continue;  // a tied weight save_pretrained leaves out
    const auto& file = model.files[static_cast<size_t>(at->second.first)];
    const safetensors::StTensor& t = file.header.tensors[static_cast<size_t>(at->second.second)];
    if (t.shape != shape->second) {
      L.problems.push_back(root + "/" + file.name + ": tensor '" + param.name + "' has shape " + pt::ShapeString(t.shape) +
                           " where the optimizer's parameter has " + pt::ShapeString(shape->second) +
                           ": the weights of another model or run beside " + L.tag + "?");
      continue;
    }
    L.weight_copies.push_back({static_cast<int>(p), 0, 0, first + at->second.first, file.header.data_start + t.begin,
                               pt::Numel(t.shape), t.dtype});
    ++compared;
  }
  if (compared == 0) {
    L.problems.push_back(root + "/" + JoinNames(w) + ": holds none of the " + std::to_string(L.params.size()) +
                         " parameters the optimizer files of " + L.tag + " hold: the weights of another model?");
    return;
  }
  L.notes.push_back("ZeRO-3: the fp32 masters of " + std::to_string(compared) + " parameter(s) are compared with " + root + "/" +
                    (model.sharded ? "model.safetensors.index.json's shards" : "model.safetensors") +
                    ", the copy of every weight gathered at the save (optimizer files swapped between DP ranks, or of "
                    "another save, disagree with it)");
}

}  // namespace ucp::deepspeed
