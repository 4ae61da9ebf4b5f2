#include "formats/deepspeed/experts.h"

#include <algorithm>

#include "core/error.h"
#include "formats/deepspeed/coverage.h"
#include "formats/deepspeed/torch_optimizer.h"
#include "layout/naming.h"

namespace ucp::deepspeed {
using pt::Value;
using reshard::ExpertOf;
using source::ShardFile;
using source::SourceIndex;

void MoeShapes::Add(const std::string& name, const ShardFile& f, const std::vector<int64_t>& shape, SourceIndex& L,
                    ParamIndex& index) {
  pt::CheckedNumel(shape);
  RecordShape(L, index, name, -1, f, shape, "in another file");
}

int MoeShapes::ExpertsOf(const std::string& prefix) const {
  auto it = experts.find(prefix);
  if (it == experts.end()) return 0;
  const int layer = layer_of.at(prefix);
  return layer < static_cast<int>(num_experts.size()) ? static_cast<int>(num_experts[layer])
                                                      : static_cast<int>(it->second.size());
}

std::string MoeShapes::Global(const std::string& name, int ep_rank, int ep) const {
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

void ReadMoeShapes(SourceIndex& L, const Value& model_root, const std::vector<ShardFile*>& model_files,
                   const ParseFile& parse, ParamIndex& index, MoeShapes& moe) {
  if (auto n = model_root.Get("num_experts"); n && n->kind == Value::Kind::List)
    for (const auto& c : n->AsSequence()) moe.num_experts.push_back(c->AsInt());
  for (auto* f : model_files)
    if (auto file = parse(*f)) try {
        for (const auto& item : file->root->At("module").AsDict().items())
          moe.Add(item.key->AsStr(), *f, item.value->AsTensor().shape, L, index);
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
            moe.Add(name, whole, item.value->AsTensor().shape, L, index);
            if (auto e = ExpertOf(name)) moe.experts[e->prefix].insert(e->id), moe.layer_of[e->prefix] = f.layer;
          }
        } catch (const std::exception& e) {
          L.errors.push_back(L.dir + "/" + f.name + ": " + e.what());
        }
}

bool IsExpertGroup(const Value& osd, size_t g) {
  auto base = osd.Get("base_optimizer_state");
  auto groups = base ? base->Get("param_groups") : nullptr;
  if (!groups) return false;
  const auto& list = groups->AsSequence();
  if (g >= list.size()) return false;
  auto m = list[g]->Get("moe");
  return m && m->kind == Value::Kind::Bool && m->b;
}

namespace {

// The files of a Mixture-of-Experts save without ZeRO.
struct ExppFiles {
  std::map<int, std::vector<Weight>> module;       // TP rank -> its module's weights
  std::map<std::pair<int, int>, int> expert_file;  // (MoE layer, global expert) -> file
  std::set<int> moe_layers;
  std::map<int, int> expp;  // expert-parallel rank -> file
};

ExppFiles FindExppFiles(const SourceIndex& L, const ParseFile& parse) {
  ExppFiles out;
  for (size_t fi = 0; fi < L.files.size(); ++fi) {
    const ShardFile& f = L.files[fi];
    if (KindOf(f) == FileKind::ModelStates && f.pp == 0)
      if (auto file = parse(f)) WeightsOf(L, static_cast<int>(fi), *file->root, out.module[f.tp]);
    if (f.expert >= 0) out.expert_file[{f.layer, f.expert}] = static_cast<int>(fi), out.moe_layers.insert(f.layer);
    if (KindOf(f) == FileKind::ExpertOptimizer) out.expp[f.dp] = static_cast<int>(fi);
  }
  return out;
}

// The expert-parallel degree: all the expert tensors over those rank 0's expert groups hold (its
// local experts), so that a missing expp_rank file is named rather than shrinking the degree.
void SetExpertParallelDegree(SourceIndex& L, const ExppFiles& files, const ParamIndex& index, const ParseFile& parse) {
  L.ep = files.expp.empty() ? 1 : files.expp.rbegin()->first + 1;
  if (files.expp.count(0))
    if (auto file = parse(L.files[files.expp.at(0)])) try {
        int64_t total = 0;
        for (const auto& [key, fi] : files.expert_file)
          if (auto ef = parse(L.files[fi])) total += static_cast<int64_t>(ef->root->AsDict().size());
        const TorchOptimizer opt = TorchOptimizerOf(file->root->At("optimizer"));
        const auto local = static_cast<int64_t>(
            TorchState(L, files.expp.at(0), *opt.state_dict, opt.fp32_groups, index, parse).ExpertPositions());
        if (local > 0 && total % local == 0) L.ep = static_cast<int>(total / local);
      } catch (const std::exception&) {
        // (read again below, where its errors are reported)
      }
  for (int r = 0; r < L.ep; ++r)
    if (!files.expp.count(r))
      L.problems.push_back("missing rank file " + ExpertOptimFileName(r, reshard::ExpertGroups{L.dp, L.tp, L.ep}.SaverTp(r)) +
                           " (expert-parallel rank " +
                           std::to_string(r) + " of " + std::to_string(L.ep) + ")");
}

// The weights of expert-parallel rank r's experts, MoE layer by MoE layer, local expert by local expert.
std::vector<Weight> ExpertWeightsOf(const SourceIndex& L, const MoeShapes& moe, const ExppFiles& files, int r,
                                    const ParseFile& parse) {
  std::vector<Weight> experts;
  for (int layer : files.moe_layers) {
    const int total = layer < static_cast<int>(moe.num_experts.size()) ? static_cast<int>(moe.num_experts[layer])
                                                                        : 0;
    if (total <= 0 || total % L.ep != 0)
      throw Error("MoE layer " + std::to_string(layer) + " has " + std::to_string(total) +
                  " experts, not a multiple of the " + std::to_string(L.ep) + " expert-parallel ranks");
    for (int j = 0; j < total / L.ep; ++j) {
      auto it = files.expert_file.find({layer, r * (total / L.ep) + j});
      if (it == files.expert_file.end()) continue;  // FinishMoe names the missing expert file
      if (auto ef = parse(L.files[it->second])) WeightsOf(L, it->second, *ef->root, experts);
    }
  }
  return experts;
}

// Expert-parallel rank r's expp_rank file (file fi): its optimizer state matched to its TP rank's
// module and its experts.
void IndexExppFile(SourceIndex& L, const MoeShapes& moe, const ExppFiles& files, int r, int fi,
                   const ParamIndex& index, const ParseFile& parse) {
  auto file = parse(L.files[fi]);
  if (!file) return;
  std::vector<Weight> experts = ExpertWeightsOf(L, moe, files, r, parse);
  const TorchOptimizer opt = TorchOptimizerOf(file->root->At("optimizer"));
  if (!opt.fp32_groups && L.dtype != "fp32")
    throw Error("trained in " + L.dtype + ", its optimizer state has no fp32_groups (the masters of DeepSpeed's "
                "bf16 wrapper): this " + (L.dtype == "bf16" ? "BF16" : "FP16") + " optimizer is not supported yet");
  TorchState torch_state(L, fi, *opt.state_dict, opt.fp32_groups, index, parse);
  // The non-expert state of the file's TP rank: that of the first expert-parallel rank saved there
  // (ExpertGroups::SaverTp: rank t, as tp <= ep).
  const int t = L.files[fi].tp;
  static const std::vector<Weight> no_weights;
  auto module = files.module.find(t);
  torch_state.Match(module != files.module.end() ? module->second : no_weights, false, r == t);
  torch_state.Match(experts, true, true);
  torch_state.Finish();
}

}  // namespace

// Without ZeRO (the model's own torch optimizer, or in bf16 the DDP wrapper around it:
// TorchOptimizerOf), expert-parallel rank R's expp_rank_R file (at TP rank R % tp, ExpertGroups)
// holds its state under 'optimizer' (TorchState): its non-expert groups its TP rank's module
// parameters (every rank at a TP rank the same: taken from the first), its expert groups the experts
// of rank R, MoE layer by MoE layer, local expert by local expert. The fp32 values are the wrapper's
// masters, or in fp32 the weights, in the module and expert files.
void IndexMoeWithoutZero(SourceIndex& L, const MoeShapes& moe, const ParamIndex& index, const ParseFile& parse) {
  const ExppFiles files = FindExppFiles(L, parse);
  SetExpertParallelDegree(L, files, index, parse);
  for (const auto& [r, fi] : files.expp) {
    const std::string where = L.dir + "/" + L.files[fi].name;
    try {
      IndexExppFile(L, moe, files, r, fi, index, parse);
    } catch (const std::exception& e) {
      L.errors.push_back(where + ": " + e.what());
    }
  }
}

namespace {

// The model-states file's num_experts (one count per MoE layer) against the expert files, each at
// the TP rank of the rank that saves it (ExpertGroups).
void CheckExpertFiles(SourceIndex& L, const Value& counts_value) {
  const reshard::ExpertGroups eg{L.dp, L.tp, L.ep};
  const auto& counts = counts_value.AsSequence();
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

}  // namespace

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
  if (auto n = model_root.Get("num_experts"); n && n->kind == Value::Kind::List) CheckExpertFiles(L, *n);
}

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

namespace {

// The layer of `layers` whose fused tensor `name` is (<prefix>.<name>); nullptr: none.
const AutoEpLayer* FusedLayerOf(const std::string& name, const std::vector<AutoEpLayer>& layers) {
  const AutoEpLayer* layer = nullptr;
  for (const auto& l : layers)
    if (name.size() > l.prefix.size() + 1 && name.compare(0, l.prefix.size() + 1, l.prefix + ".") == 0 &&
        name.find('.', l.prefix.size() + 1) == std::string::npos)
      layer = &l;
  return layer;
}

}  // namespace

void FinishAutoEp(SourceIndex& L, const std::vector<AutoEpLayer>& layers, const std::set<int>& expert_groups,
                  GroupParams& group_params) {
  for (auto& p : L.params) {
    if (!expert_groups.count(p.group)) continue;
    const AutoEpLayer* layer = FusedLayerOf(p.name, layers);
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

}  // namespace ucp::deepspeed
