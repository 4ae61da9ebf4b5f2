#include "formats/deepspeed/model_states.h"

#include <algorithm>
#include <map>
#include <set>

#include "formats/deepspeed/torch_optimizer.h"

namespace ucp::deepspeed {
using pt::Value;
using source::ShardFile;
using source::SourceIndex;

SaveVariant VariantOfFiles(SourceIndex& L) {
  SaveVariant save;
  save.zero3_files = CountOf(L, FileKind::Zero3ModelStates) > 0;
  // Mixture of Experts without ZeRO: the optimizer state in one expp_rank file per expert-parallel
  // rank (IndexMoeWithoutZero), no ZeRO optimizer file.
  save.expp_optimizer = CountOf(L, FileKind::ZeroOptimizer) == 0 && CountOf(L, FileKind::ExpertOptimizer) > 0 &&
                        CountOf(L, FileKind::ExpertStates) > 0;
  L.naming = CountOf(L, FileKind::LayerStates) > 0 ? "pipe" : "plain";
  return save;
}

std::vector<ShardFile*> ModelStatesFiles(SourceIndex& L, bool zero3_files) {
  std::vector<ShardFile*> out;
  for (auto& f : L.files)
    if (KindOf(f) == (zero3_files ? FileKind::Zero3ModelStates : FileKind::ModelStates)) out.push_back(&f);
  return out;
}

FirstModelStates FirstReadable(const std::vector<ShardFile*>& model_files, const ParseFile& parse) {
  FirstModelStates first;
  for (auto* f : model_files) {
    first.file = parse(*f);
    if (first.file) break;
  }
  return first;
}

namespace {

// AutoEP's layers (save.autoep); false for an AutoEP save ucp does not read.
bool ReadAutoEp(SourceIndex& L, const FirstModelStates& first, SaveVariant& save) {
  try {
    save.autoep = AutoEpLayersOf(first.root());
  } catch (const std::exception& e) {
    L.errors.push_back(first.path() + ": " + e.what());
    return false;
  }
  if (!save.autoep.empty() && CountOf(L, FileKind::ZeroOptimizer) == 0) {
    L.errors.push_back(first.path() + ": DeepSpeed AutoEP without ZeRO (expp_rank files) is not supported yet");
    return false;
  }
  return true;
}

// The job's ds_config and ds_version.
struct DsConfig {
  pt::ValuePtr config, version;
};

// A Mixture-of-Experts save (engine._save_moe_checkpoint) writes no ds_config, ds_version or
// param_shapes into the model-states file; its ZeRO optimizer files have the first two.
DsConfig DsConfigOf(SourceIndex& L, const Value& root, const FileNames& names, const ParseFile& parse, bool moe) {
  DsConfig out{root.Get("ds_config"), root.Get("ds_version")};
  if (moe && !out.config)
    for (const auto& f : L.files)
      if (f.data && f.dp == 0 && names.mps[&f - L.files.data()] == 0)
        if (auto file = parse(f)) {
          const Value& r = *file->root;
          out.config = r.Get("ds_config"), out.version = r.Get("ds_version");
          L.notes.push_back("Mixture of Experts: ds_config and ds_version read from " + f.name +
                            " (the MoE model-states file has neither)");
          break;
        }
  return out;
}

// data_types.grad_accum_dtype, under any of the names DeepSpeed's DtypeEnum accepts.
void ReadGradAccumDtype(SourceIndex& L, const Value& cfg) {
  if (auto dt = cfg.Get("data_types"); dt && dt->kind == Value::Kind::Dict)
    if (auto g = dt->Get("grad_accum_dtype"); g && g->kind == Value::Kind::Str) {
      static const std::map<std::string, std::string> names = {
          {"fp32", "fp32"}, {"float32", "fp32"}, {"float", "fp32"}, {"torch.float32", "fp32"},
          {"fp16", "fp16"}, {"float16", "fp16"}, {"half", "fp16"}, {"torch.float16", "fp16"},
          {"bf16", "bf16"}, {"bfloat16", "bf16"}, {"torch.bfloat16", "bf16"}};
      if (auto it = names.find(g->s); it != names.end()) L.grad_accum_dtype = it->second;
      else L.problems.push_back("ds_config data_types.grad_accum_dtype '" + g->s + "' is no dtype DeepSpeed knows");
    }
}

// The dtype and ZeRO stage a ds_config names.
void ReadDsConfig(SourceIndex& L, const Value& cfg, int* config_stage) {
  auto enabled = [&](const char* key) {
    auto sec = cfg.Get(key);
    auto en = sec ? sec->Get("enabled") : nullptr;
    return en && en->kind == Value::Kind::Bool && en->b;
  };
  if (enabled("bf16")) L.dtype = "bf16";
  else if (enabled("fp16")) L.dtype = "fp16";
  if (auto z = cfg.Get("zero_optimization"); z && z->kind == Value::Kind::Dict)
    if (auto st = z->Get("stage"); st && st->kind == Value::Kind::Int) *config_stage = static_cast<int>(st->i);
  ReadGradAccumDtype(L, cfg);
}

// The writer's version, the iteration, the world sizes and the dtype. Throws what it cannot read.
void ReadTrainingState(SourceIndex& L, FirstModelStates& first, const DsConfig& ds) {
  const Value& root = first.root();
  if (ds.version) L.ds_version = ds.version->kind == Value::Kind::Str ? ds.version->s : "";
  if (auto v = root.Get("iteration")) L.iteration = v->AsInt();
  else if (auto g = root.Get("global_steps")) L.iteration = g->AsInt();
  first.mp_world = static_cast<int>(root.At("mp_world_size").AsInt());
  first.dp_world = static_cast<int>(root.At("dp_world_size").AsInt());
  L.dtype = "fp32";
  if (ds.config && ds.config->kind == Value::Kind::Dict) {
    ReadDsConfig(L, *ds.config, &first.config_stage);
  } else if (const auto& args = first.args) {
    if (auto b = args->Get("bf16"); b && b->kind == Value::Kind::Bool && b->b) L.dtype = "bf16";
    else if (auto h = args->Get("fp16"); h && h->kind == Value::Kind::Bool && h->b) L.dtype = "fp16";
  }
}

// DeepSpeed 0.17.6+'s DDP bf16 wrapper (IndexDdpWrapper): no param_shapes, no optimizer file, the
// optimizer state inside every model-states file.
bool IsDdpWrapper(const SourceIndex& L, const Value& root, const SaveVariant& save) {
  if (!save.moe && !HasParamShapes(root) && CountOf(L, FileKind::ZeroOptimizer) == 0 && !save.zero3_files)
    if (auto opt = root.Get("optimizer"); opt && opt->kind == Value::Kind::Dict)
      return TorchOptimizerOf(*opt).fp32_groups != nullptr;
  return false;
}

}  // namespace

bool ReadSaveMetadata(SourceIndex& L, FirstModelStates& first, const FileNames& names, const ParseFile& parse,
                      SaveVariant& save) {
  const Value& root = first.root();
  first.args = root.Get("args");
  L.args = first.args;
  L.universal_checkpoint_info = root.Get("universal_checkpoint_info");
  if (L.universal_checkpoint_info && L.universal_checkpoint_info->kind == Value::Kind::None)
    L.universal_checkpoint_info = nullptr;
  L.framework = first.args ? "megatron-deepspeed" : "deepspeed";
  if (!ReadAutoEp(L, first, save)) return false;
  // (AutoEP's experts are fused tensors in its ZeRO files, read as any parameter is: FinishAutoEp)
  save.moe = save.autoep.empty() && (CountOf(L, FileKind::ExpertStates) > 0 || root.Get("num_experts"));
  const DsConfig ds = DsConfigOf(L, root, names, parse, save.moe);
  first.Try(L, "training state", [&] { ReadTrainingState(L, first, ds); });
  if (!L.errors.empty()) return false;
  save.ddp_wrapper = IsDdpWrapper(L, root, save);
  return true;
}

bool SetDegrees(SourceIndex& L, const FirstModelStates& first, const FileNames& names, const SaveVariant& save) {
  std::set<int> layer_tps;
  for (const auto& f : L.files)
    if (KindOf(f) == FileKind::LayerStates) layer_tps.insert(f.tp);
  const pt::ValuePtr& args = first.args;
  if (args && args->Get("tensor_model_parallel_size")) {
    first.Try(L, "args", [&] {
      L.tp = static_cast<int>(args->At("tensor_model_parallel_size").AsInt());
      L.pp = static_cast<int>(args->At("pipeline_model_parallel_size").AsInt());
    });
  } else {
    L.tp = layer_tps.empty() ? first.mp_world : static_cast<int>(layer_tps.size());
    L.pp = std::max(1, first.mp_world / std::max(1, L.tp));
    L.notes.push_back("no Megatron args: TP and PP derived from mp_world_size and the layer files");
  }
  L.dp = first.dp_world;
  if (L.tp < 1 || L.pp < 1 || L.dp < 1) {
    L.errors.push_back(first.path() + ": absurd degrees tp=" + std::to_string(L.tp) + " pp=" +
                       std::to_string(L.pp) + " dp=" + std::to_string(L.dp));
    return false;
  }
  source::TakeMegatronArgs(args.get(), L);  // model facts, and SP within dp
  if (!save.zero3_files && first.mp_world != L.tp * L.pp)
    L.problems.push_back("mismatched degrees: mp_world_size " + std::to_string(first.mp_world) + " != tp " +
                         std::to_string(L.tp) + " x pp " + std::to_string(L.pp));
  PlaceOnGrid(L, names, save.zero3_files);
  // Mixture of Experts in a pipeline: DeepSpeed's MoE layers run in a model that is not a
  // PipelineModule (with TP, see ExpertGroups: an expert's file and partitions lie at TP ranks of
  // their own).
  if (save.moe && L.pp > 1) {
    L.errors.push_back(L.dir + ": a Mixture-of-Experts checkpoint at pp=" + std::to_string(L.pp) +
                       " is not supported (DeepSpeed's MoE layers run in a model that is not a pipeline)");
    return false;
  }
  return true;
}

}  // namespace ucp::deepspeed
