// The Hugging Face format's row of the registry (formats/registry.h): a target, LlamaForCausalLM in
// safetensors (model.h which class and its config.json, names.h its tensors, safetensors.h its files).
#include <cstdio>

#include "core/error.h"
#include "formats/driver.h"
#include "formats/hf/model.h"
#include "formats/hf/names.h"
#include "formats/hf/safetensors.h"

namespace ucp::formats {
namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";

reshard::ExportPlan PlanHuggingFace(const reshard::Source& S, const reshard::ExportOptions& o) {
  reshard::ExportPlan P;
  P.dtype = o.dtype.empty() ? reshard::ResolvedDtype({}, S.manifest["source"]) : o.dtype;
  const hf::LlamaFacts m = hf::LlamaFactsOf(S, o, P.notes);
  P.model = "LlamaForCausalLM";
  P.tensors = hf::LlamaTensors(S, m);
  P.files = reshard::CutIntoFiles(P, o.max_file_bytes, [](int i, int n) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", i + 1, n);
    return std::string(name);
  });
  for (reshard::ExportFile& f : P.files) {
    f.bytes = static_cast<int64_t>(hf::SafetensorsHeader(P, f).size());
    for (int i : f.tensors) f.bytes += P.tensors[i].numel() * reshard::ElementBytes(P.dtype);
  }
  P.side_files.emplace_back("config.json", hf::LlamaConfigJson(m, P.dtype));
  P.marker = kIndexName;
  P.marker_text = hf::SafetensorsIndex(P);
  return P;
}

void CheckHuggingFaceSource(const source::SourceIndex& L, const reshard::ExportOptions& o) {
  hf::ModelView v;
  v.dir = L.root;
  v.args_file = L.dir + " (its model-states file)";
  v.arg = [&L](const char* key) -> const pt::Value* {
    auto a = L.args ? L.args->Get(key) : nullptr;
    return a ? a.get() : nullptr;
  };
  v.moe = L.moe;
  for (const auto& p : L.params)
    if (!p.tp_shape.empty()) v.params.emplace_back(p.name, p.tp_shape.begin()->second);
  std::vector<std::string> notes;
  hf::RefuseUnlessLlama(v, o, notes);
}

}  // namespace

const TargetDriver& HuggingFaceTarget() {
  static constexpr TargetDriver driver = {"hf",
     "Hugging Face transformers models (ucp-reshard --format hf): LlamaForCausalLM (RMSNorm, rotary, SwiGLU, "
     "grouped-query attention, optional biases, tied or untied output layer) in safetensors, fused QKV and SwiGLU "
     "tensors split as the checkpoint's sub-parameter shapes say, vocabulary padding removed; fp32 weights in the "
     "source's dtype unless --dtype; loaded by from_pretrained",
     "config.json, model-NNNNN-of-NNNNN.safetensors, model.safetensors.index.json (written last)",
     nullptr, PlanHuggingFace, hf::WriteSafetensors, CheckHuggingFaceSource};
  return driver;
}

}  // namespace ucp::formats
