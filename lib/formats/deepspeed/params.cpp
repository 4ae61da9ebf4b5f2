#include "formats/deepspeed/params.h"

#include <algorithm>
#include <cctype>
#include <optional>

#include "core/error.h"
#include "formats/deepspeed/experts.h"
#include "formats/deepspeed/model_states.h"
#include "formats/deepspeed/torch_optimizer.h"

namespace ucp::deepspeed {
using pt::Value;
using source::ParamRecord;
using source::ShardFile;
using source::SourceIndex;

std::vector<int64_t> Shape(const Value& v) {
  std::vector<int64_t> out;
  for (const auto& d : v.AsSequence()) out.push_back(d->AsInt());
  pt::CheckedNumel(out);
  return out;
}

bool HasParamShapes(const Value& root) {
  auto ps = root.Get("param_shapes");
  return ps && ps->kind != Value::Kind::None;
}

ParamRecord& RecordShape(SourceIndex& L, ParamIndex& index, const std::string& name, int group, const ShardFile& f,
                         const std::vector<int64_t>& shape, const char* elsewhere) {
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

namespace {

// Each model-states file's param_shapes: every parameter's shape at the file's (pp, tp), and each
// optimizer group's parameters in flat order.
void ShapesFromParamShapes(SourceIndex& L, const std::vector<ShardFile*>& model_files, bool zero3_files,
                           const ParseFile& parse, ParamIndex& index, GroupParams& group_params) {
  for (auto* f : model_files) {
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
}

// The shape of weight `name` at the (pp, tp) of model-states file `model`: a pipeline's layer files
// (GPTModelPipe's "<spec>.<key>", the tied embedding "tied_modules.embed.<key>" in spec 1's file),
// else the model-states file's module.
class WeightShapes {
 public:
  WeightShapes(const SourceIndex& L, const ParseFile& parse) : L_(L), parse_(parse) {}

  // A layer file's weights, by (spec, tp, key).
  void AddLayerFile(const ShardFile& f, const pt::TorchFile& file) {
    for (const auto& item : file.root->AsDict().items())
      layer_weights_[{f.layer, f.tp, item.key->AsStr()}] = item.value->AsTensor().shape;
  }

  std::optional<std::vector<int64_t>> Of(const std::string& name, const ShardFile& model) const {
    if (L_.naming != "pipe") {
      auto file = parse_(model);
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
    auto it = layer_weights_.find({spec, model.tp, key});
    if (it == layer_weights_.end()) return std::nullopt;
    return it->second;
  }

 private:
  const SourceIndex& L_;
  const ParseFile& parse_;
  std::map<std::tuple<int, int, std::string>, std::vector<int64_t>> layer_weights_;  // (spec, tp, key) -> shape
};

// Every parameter the optimizer files map (param_slice_mappings), with its shape from the weights at
// its (pp, tp) (WeightShapes).
void ShapesFromWeights(SourceIndex& L, ParamIndex& index, const ParseFile& parse) {
  WeightShapes weights(L, parse);
  std::map<std::pair<int, int>, const ShardFile*> model_file;  // (pp, tp) -> model states
  for (const auto& f : L.files) {
    if (KindOf(f) == FileKind::LayerStates)
      if (auto file = parse(f)) try {
          weights.AddLayerFile(f, *file);
        } catch (const std::exception& e) {
          L.errors.push_back(L.dir + "/" + f.name + ": " + e.what());
        }
    if (KindOf(f) == FileKind::ModelStates) model_file[{f.pp, f.tp}] = &f;
  }
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
          auto shape = weights.Of(name, *mf->second);
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

// DeepSpeed variants that record no param_shapes, said by name rather than as every parameter
// the optimizer files map but no param_shapes lists.
void RefuseUnlistedParameters(SourceIndex& L, const FirstModelStates& first) {
  auto ps = first.root().Get("param_shapes");
  auto opt = first.root().Get("optimizer");
  if (CountOf(L, FileKind::ZeroOptimizer) == 0 && opt && opt->kind != Value::Kind::None)
    L.errors.push_back(first.path() + ": the optimizer state is inside the model-states file and no "
                       "*_optim_states.pt exists, in a form ucp does not know (DeepSpeed 0.17.6+'s DDP bf16 wrapper "
                       "keeps optimizer_state_dict and fp32_groups there; fp32/fp16 without ZeRO saves the bare "
                       "torch or FP16 optimizer state): this variant is not supported yet");
  else
    L.errors.push_back(first.path() + ": param_shapes is " + (ps ? "None" : "missing") +
                       " and no *_optim_states.pt maps the parameters by name: ucp cannot tell the optimizer "
                       "groups' parameters");
}

}  // namespace

bool ReadParameters(SourceIndex& L, const FirstModelStates& first, const std::vector<ShardFile*>& model_files,
                    const ParseFile& parse, SaveVariant& save, ParamIndex& index, GroupParams& group_params,
                    MoeShapes& moe_shapes) {
  const Value& root = first.root();
  // Mixture of Experts: no param_shapes. The shapes are the module's tensors and the expert files';
  // the optimizer groups, their order and the flat offsets come from the ZeRO files' mappings.
  if (save.moe) ReadMoeShapes(L, root, model_files, parse, index, moe_shapes);
  // DeepSpeed 0.19 saves no param_shapes for its BF16 optimizer at ZeRO stage 0 (its engine counts
  // only ZeRO as ZeRO optimizer state). Its optimizer files still map every parameter by name
  // (param_slice_mappings): the shapes come from the weights (the layer files of a pipeline, else
  // the module), each parameter's place in its group's flat buffer from its fragments.
  if (!save.moe && !save.zero3_files && !HasParamShapes(root) && CountOf(L, FileKind::ZeroOptimizer) > 0) {
    save.shapes_from_weights = true;
    ShapesFromWeights(L, index, parse);
    L.notes.push_back("no param_shapes (DeepSpeed 0.19's BF16 optimizer at ZeRO-0 saves none): each parameter's shape "
                      "read from the " + std::string(L.naming == "pipe" ? "layer files" : "module") +
                      ", its place in its group from the optimizer files' param_slice_mappings");
  }
  // DeepSpeed 0.17.6+'s DDP bf16 wrapper: the optimizer state inside every model-states file.
  if (save.ddp_wrapper) {
    L.optimizer = "torch";
    IndexDdpWrapper(L, index, parse);
    L.notes.push_back("no ZeRO: the optimizer state inside the model-states files (DeepSpeed 0.17.6+'s DDP bf16 "
                      "wrapper), each position named by shape against the module's order");
  }
  if (save.moe || save.shapes_from_weights || save.ddp_wrapper) return true;
  if (!HasParamShapes(root)) {
    RefuseUnlistedParameters(L, first);
    return false;
  }
  ShapesFromParamShapes(L, model_files, save.zero3_files, parse, index, group_params);
  return true;
}

}  // namespace ucp::deepspeed
