// The Hugging Face format's row of the registry (formats/registry.h): a target, LlamaForCausalLM or
// MixtralForCausalLM in safetensors (model.h which class and its config.json, names.h its tensors,
// mixtral.h the MoE gate), GPT2LMHeadModel (gpt2.h), safetensors.h the files,
// or a model whose parameters already carry Hugging Face's names, as it is (own_model.h).
#include <cstdio>

#include "core/error.h"
#include "formats/driver.h"
#include "formats/hf/gpt2.h"
#include "formats/hf/model.h"
#include "formats/hf/names.h"
#include "formats/hf/own_model.h"
#include "formats/hf/safetensors.h"

namespace ucp::formats {
namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";

// The files' sizes: each header from the plan, then its tensors.
void SizeFiles(reshard::ExportPlan& P) {
  for (reshard::ExportFile& f : P.files) {
    f.bytes = static_cast<int64_t>(hf::SafetensorsHeader(P, f).size());
    for (int i : f.tensors) f.bytes += P.tensors[i].numel() * reshard::ElementBytes(P.dtype);
  }
}

std::string ShardName(int i, int n) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", i + 1, n);
  return name;
}

// The files as save_pretrained writes them: one model.safetensors (no index) up to --max-shard-size,
// its config.json the commit point (from_pretrained reads it first); else model-0000i-of-0000N.safetensors
// and the index with total_parameters and total_size, the commit point.
void FinishSavePretrained(reshard::ExportPlan& P, const reshard::ExportOptions& o, const hf::JobConfig& job, int64_t parameters) {
  P.files = reshard::CutIntoFiles(P, o.max_file_bytes, [](int i, int n) { return n == 1 ? std::string("model.safetensors") : ShardName(i, n); });
  SizeFiles(P);
  if (!job.generation_config.empty()) P.side_files.emplace_back("generation_config.json", job.generation_config);
  if (P.files.size() == 1) {
    P.marker = "config.json", P.marker_text = job.config;
  } else {
    P.side_files.emplace_back("config.json", job.config);
    P.marker = kIndexName, P.marker_text = hf::SafetensorsIndex(P, parameters);
  }
}

// The files of a translated model once its tensors are placed: with the model's own config.json where
// the atomic checkpoint carries it (hf::CarriedConfigFor), as save_pretrained writes them; else cut by
// --max-shard-size into model-0000i-of-0000N.safetensors, config.json from the facts, the index last.
void FinishTranslated(const reshard::Source& S, reshard::ExportPlan& P, const reshard::ExportOptions& o, std::string config) {
  if (auto carried = hf::CarriedConfigFor(S, P.model, config, P.dtype, P.notes)) {
    int64_t parameters = 0;
    for (const auto& t : P.tensors) parameters += t.numel();
    FinishSavePretrained(P, o, *carried, parameters);
    return;
  }
  P.files = reshard::CutIntoFiles(P, o.max_file_bytes, ShardName);
  SizeFiles(P);
  P.side_files.emplace_back("config.json", std::move(config));
  P.marker = kIndexName;
  P.marker_text = hf::SafetensorsIndex(P);
}

std::string TranslatedDtype(const reshard::Source& S, const reshard::ExportOptions& o) {
  return o.dtype.empty() ? reshard::ResolvedDtype({}, S.manifest["source"]) : o.dtype;
}

// A model ucp translates (Megatron's, torchtitan's, Megatron-Core's names): LlamaForCausalLM (or
// MixtralForCausalLM with DeepSpeed MoE experts), its config.json written from the facts.
reshard::ExportPlan PlanLlama(const reshard::Source& S, const reshard::ExportOptions& o) {
  reshard::ExportPlan P;
  P.dtype = TranslatedDtype(S, o);
  const hf::LlamaFacts m = hf::LlamaFactsOf(S, o, P.notes);
  P.model = m.experts > 0 ? "MixtralForCausalLM" : "LlamaForCausalLM";
  P.tensors = hf::LlamaTensors(S, m);
  FinishTranslated(S, P, o, hf::LlamaConfigJson(m, P.dtype));
  return P;
}

// A GPT-shaped model (learned positions): GPT2LMHeadModel, its config.json written from the facts.
reshard::ExportPlan PlanGpt2(const reshard::Source& S, const reshard::ExportOptions& o) {
  reshard::ExportPlan P;
  P.dtype = TranslatedDtype(S, o);
  const hf::Gpt2Facts m = hf::Gpt2FactsOf(S, o, P.notes);
  P.model = "GPT2LMHeadModel";
  P.tensors = hf::Gpt2Tensors(S, m);
  FinishTranslated(S, P, o, hf::Gpt2ConfigJson(m, P.dtype));
  return P;
}

// A model with Hugging Face's own names, written as save_pretrained writes it: one model.safetensors
// (no index) up to --max-shard-size, else model-0000i-of-0000N.safetensors and the index with
// total_parameters and total_size. The job's config.json is the commit point of a single file
// (from_pretrained reads it first), the index that of shards.
reshard::ExportPlan PlanOwnModel(const reshard::Source& S, const reshard::ExportOptions& o, const hf::JobConfig& job) {
  reshard::ExportPlan P;
  P.notes.push_back("the parameters carry Hugging Face's own names: written as they are, with the job's config.json (" +
                    job.from + ")" + (job.generation_config.empty() ? "" : " and generation_config.json"));
  hf::OwnModel m = hf::OwnModelOf(S, o, job, P.notes);
  P.dtype = m.dtype;
  P.job_dtype = m.job_dtype;
  P.model = m.architecture;
  P.tensors = std::move(m.tensors);
  FinishSavePretrained(P, o, {m.config, m.generation_config, job.from, job.generation_from}, m.parameters);
  return P;
}

reshard::ExportPlan PlanHuggingFace(const reshard::Source& S, const reshard::ExportOptions& o) {
  std::vector<std::string> names;
  for (const auto& a : S.atoms) names.push_back(a.name);
  const bool translated = hf::TranslatedNaming(names);
  if (translated) {
    if (hf::IsHuggingFaceConfig(o.model_config))
      throw Error(o.model_config_path + ": a Hugging Face config.json, but the parameters carry " + (names.empty() ? "no" : "Megatron's or torchtitan's names ('" + names.front() + "')") +
                  ", which ucp-reshard --format hf translates into LlamaForCausalLM's and writes the config.json of: give "
                  "--model-config the facts the checkpoint lacks by Megatron's argument names instead (see --help)");
    return hf::Gpt2Shaped(hf::ViewOf(S)) ? PlanGpt2(S, o) : PlanLlama(S, o);
  }
  if (auto job = hf::JobConfigOf(S, o)) return PlanOwnModel(S, o, *job);
  throw Error(S.reader->dir() + ": the parameters ('" + (names.empty() ? std::string("none") : names.front()) + "', ...) are named "
              "neither as Megatron-DeepSpeed, torchtitan nor Megatron-Core name them (ucp-reshard --format hf translates "
              "those into LlamaForCausalLM's): taken as Hugging Face's own names (a Trainer job's), they need the model's "
              "config.json, and the atomic checkpoint carries none (job/config.json): give --model-config "
              "path/to/config.json (the one Trainer wrote beside global_stepN)");
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
  std::vector<std::string> names;
  for (const auto& p : L.params) {
    names.push_back(p.name);
    if (!p.tp_shape.empty()) v.params.emplace_back(p.name, p.tp_shape.begin()->second);
  }
  if (!hf::TranslatedNaming(names)) return;  // Hugging Face's own names: the model's config.json decides, after the conversion
  std::vector<std::string> notes;
  if (hf::Gpt2Shaped(v)) hf::RefuseUnlessGpt2(v, o, notes);
  else hf::RefuseUnlessLlama(v, o, notes);
}

}  // namespace

const TargetDriver& HuggingFaceTarget() {
  static constexpr TargetDriver driver = {"hf",
     "Hugging Face transformers models (ucp-reshard --format hf): LlamaForCausalLM (RMSNorm, rotary, SwiGLU, "
     "grouped-query attention, optional biases, tied or untied output layer), MixtralForCausalLM (the same, every MLP "
     "a DeepSpeed or Megatron-Core MoE layer) or GPT2LMHeadModel (LayerNorm, learned positions, GeLU, Conv1D weights transposed) "
     "in safetensors, fused QKV and SwiGLU tensors split as the checkpoint's sub-parameter shapes say, vocabulary "
     "padding removed; or any model whose "
     "parameters carry Hugging Face's own names (a Trainer job's), as save_pretrained writes it, with the job's config.json; "
     "fp32 weights in the source's dtype unless --dtype; loaded by from_pretrained",
     "config.json, generation_config.json (a Trainer job's), model.safetensors or model-NNNNN-of-NNNNN.safetensors, "
     "model.safetensors.index.json (written last)",
     nullptr, PlanHuggingFace, hf::WriteSafetensors, CheckHuggingFaceSource, /*weights_only=*/ true};
  return driver;
}

}  // namespace ucp::formats
