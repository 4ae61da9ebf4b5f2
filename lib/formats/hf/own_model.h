// A model whose parameters already carry Hugging Face's names (a Trainer or Accelerate job's DeepSpeed
// checkpoint): nothing is translated, whatever its model_type. The job's own config.json says what
// the model is: the atomic checkpoint carries it (job/config.json, hashed in the manifest), or
// --model-config names one. The tensors are the atomic parameters under their own names, in the
// model's order, shaped as the atomic checkpoint holds them; tied weights go as save_pretrained
// writes them; the dtype is the one the job trained in unless --dtype, and config.json says the
// dtype the files hold.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "layout/export_plan.h"
#include "layout/reshard_plan.h"

namespace ucp::formats::hf {

// Whether a JSON object is a Hugging Face config.json (it names model_type or architectures), not a
// file of facts by Megatron's names.
bool IsHuggingFaceConfig(const nlohmann::json& config);

// The job's config files, as bytes (never re-serialised: they are carried unchanged).
struct JobConfig {
  std::string config;             // config.json
  std::string generation_config;  // generation_config.json; empty: the job has none
  std::string from;               // where config.json came from, for messages
  std::string generation_from;
};

// The atomic checkpoint's job/config.json (and job/generation_config.json), else --model-config when
// it is a Hugging Face config.json (and the generation_config.json beside it); nullopt when neither.
// Both given and different: refused, naming both.
std::optional<JobConfig> JobConfigOf(const reshard::Source& S, const reshard::ExportOptions& options);

// The config.json an atomic checkpoint carries (job/config.json: a Hugging Face model imported, or a
// DeepSpeed layout made from one with its config.json beside `latest`), for a model ucp translates:
// used when it names `architecture` and its sizes agree with `from_facts` (the config.json the facts
// give), its bytes kept (token ids, dropout, transformers' own spelling), its dtype field(s) set to
// `dtype` where they say another; with the generation_config.json carried beside it. nullopt
// otherwise (the caller writes `from_facts`); a carried one of another model is said in `notes`.
std::optional<JobConfig> CarriedConfigFor(const reshard::Source& S, const std::string& architecture,
                                          const std::string& from_facts, const std::string& dtype,
                                          std::vector<std::string>& notes);

struct OwnModel {
  std::string architecture;  // architectures[0], else model_type: for messages
  std::string dtype;         // the export's: --dtype, else config.json's, else the job's as the manifest records it
  std::string job_dtype;     // what the job trained in
  std::string config;        // config.json to write: the job's, its dtype field rewritten where --dtype changes it
  std::string generation_config;
  std::vector<reshard::ExportTensor> tensors;  // in the model's order
  int64_t parameters = 0;    // the model's parameters (elements), as save_pretrained's index counts them
};

// The export of such a model; throws ucp::Error naming what it cannot write (a persistent buffer or a
// frozen parameter, which hold no optimizer state and so are not in the atomic checkpoint; a tie the
// config and the checkpoint disagree on). What it decided is said in `notes`.
OwnModel OwnModelOf(const reshard::Source& S, const reshard::ExportOptions& options, const JobConfig& job,
                    std::vector<std::string>& notes);

}  // namespace ucp::formats::hf
