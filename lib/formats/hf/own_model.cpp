#include "formats/hf/own_model.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <regex>

#include "core/atomic_file.h"
#include "core/error.h"
#include "formats/hf/model.h"
#include "pt/value.h"

namespace ucp::formats::hf {
using nlohmann::json;
using pt::Value;

namespace {

// config.json's dtype name (transformers 5 writes "dtype", 4 wrote "torch_dtype").
std::string ConfigDtype(const json& config) {
  for (const char* key : {"dtype", "torch_dtype"})
    if (config.contains(key) && config[key].is_string()) return config[key].get<std::string>();
  return "";
}

// The dtype fields of config.json set to `torch_name`, every other byte as the job wrote them (a
// re-serialisation would change its number formatting and key order). Nested configs (a
// multimodal model's text_config) say the same weights' dtype and change with it.
std::string WithDtype(const std::string& text, const std::string& torch_name, bool& rewritten_whole) {
  static const std::regex field(R"re(("(?:torch_)?dtype"\s*:\s*)"[^"]*")re");
  if (std::regex_search(text, field)) return std::regex_replace(text, field, "$1\"" + torch_name + "\"");
  rewritten_whole = true;  // no field to set in place: the file is written again, with one
  nlohmann::ordered_json c = nlohmann::ordered_json::parse(text);
  c["dtype"] = torch_name;
  return c.dump(2) + "\n";
}

// A list of the model-states file's names: a dict's keys, a list of dicts' keys (param_shapes and
// frozen_param_shapes per group), or a list of strings (buffer_names).
std::vector<std::string> NamesIn(const pt::ValuePtr& v) {
  std::vector<std::string> names;
  if (!v) return names;
  auto keys = [&](const Value& d) {
    for (const auto& item : d.dict.items())
      if (item.key && item.key->kind == Value::Kind::Str) names.push_back(item.key->s);
  };
  if (v->kind == Value::Kind::Dict) keys(*v);
  if (v->IsSequence())
    for (const auto& e : v->items) {
      if (e && e->kind == Value::Kind::Dict) keys(*e);
      if (e && e->kind == Value::Kind::Str) names.push_back(e->s);
    }
  return names;
}

std::string FirstFew(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < 3; ++i) out += (out.empty() ? "'" : ", '") + names[i] + "'";
  return out + (names.size() > 3 ? " and " + std::to_string(names.size() - 3) + " more" : "");
}

json ConfigOf(const JobConfig& job) {
  json config;
  try {
    config = json::parse(job.config);
  } catch (const std::exception& e) {
    throw Error(job.from + ": not a JSON config.json: " + e.what());
  }
  if (!IsHuggingFaceConfig(config))
    throw Error(job.from + ": not a Hugging Face config.json (it names no model_type and no architectures)");
  return config;
}

// architectures[0], else model_type, else "".
std::string ArchitectureOf(const json& config) {
  if (config.contains("architectures") && config["architectures"].is_array() && !config["architectures"].empty() &&
      config["architectures"][0].is_string())
    return config["architectures"][0].get<std::string>();
  if (config.contains("model_type") && config["model_type"].is_string()) return config["model_type"].get<std::string>();
  return "";
}

pt::ValuePtr ModelStatesEntry(const reshard::Source& S, const char* key) {
  return S.model_states.root ? S.model_states.root->Get(key) : nullptr;
}

// What the model-states file says beside the parameters: tensors of the model's state_dict the
// optimizer does not hold are not in the atomic checkpoint, so they cannot be written.
void RefuseWhatTheStoreLacks(const reshard::Source& S) {
  const std::string dir = S.reader->dir();
  if (const auto buffers = NamesIn(ModelStatesEntry(S, "buffer_names")); !buffers.empty())
    throw Error(dir + "/" + S.model_file + ": the model has persistent buffers (" + FirstFew(buffers) + "), which the "
                "atomic checkpoint does not hold (it keeps what the optimizer updates): --format hf does not write "
                "such a model yet (transformers would load it with those keys missing)");
  if (const auto frozen = NamesIn(ModelStatesEntry(S, "frozen_param_shapes")); !frozen.empty())
    throw Error(dir + "/" + S.model_file + ": the model has frozen parameters (" + FirstFew(frozen) + "), which hold "
                "no optimizer state and so are not in the atomic checkpoint: --format hf does not write such a model yet");
}

// The dtype: --dtype, else what the job trained in. config.json's own field says it for a
// Trainer job (the dtype DeepSpeed gave the module); the manifest's is the DeepSpeed config's.
void ChooseDtype(const reshard::Source& S, const reshard::ExportOptions& o, const JobConfig& job, const json& config,
                 OwnModel& m, std::vector<std::string>& notes) {
  const std::string said = ConfigDtype(config), from_config = UcpDtypeName(said);
  const std::string from_manifest = S.manifest["source"].value("dtype", "");
  m.job_dtype = !from_config.empty() ? from_config : from_manifest;
  if (m.job_dtype.empty())
    throw Error(job.from + ": neither config.json's dtype nor the atomic checkpoint says the dtype the job trained in: give "
                "--dtype fp32, bf16 or fp16");
  if (!from_config.empty() && !from_manifest.empty() && from_config != from_manifest)
    notes.push_back("config.json says dtype " + said + ", the DeepSpeed job trained in " + from_manifest + ": " +
                    from_config + " by default, as the model's own config says");
  m.dtype = o.dtype.empty() ? m.job_dtype : o.dtype;
  m.config = job.config;
  if (!o.dtype.empty() && m.dtype != from_config) {  // config.json must say what the files hold
    bool whole = false;
    m.config = WithDtype(job.config, TorchDtypeName(m.dtype), whole);
    notes.push_back("config.json's dtype " + (said.empty() ? std::string("(not said)") : said) + " -> " + TorchDtypeName(m.dtype) +
                    " (--dtype " + o.dtype + ")" +
                    (whole ? ": the file written again with a dtype field" : "; every other byte as the job wrote it"));
  }
}

// The atomic parameters under their own names, and the names tied to them. Ties (DeepSpeed's
// shared_params: a name that is another parameter, saved once, under the name named_parameters
// gives first): save_pretrained drops the tied name where the config ties the embeddings, and
// from_pretrained ties it back; where it does not, the name is written with the values of the one
// it shares, as zero_to_fp32 writes it, so that the model loads whole.
void TensorsOf(const reshard::Source& S, const json& config, OwnModel& m, std::vector<std::string>& notes) {
  const std::string dir = S.reader->dir();
  const bool ties = config.contains("tie_word_embeddings") && config["tie_word_embeddings"].is_boolean() &&
                    config["tie_word_embeddings"].get<bool>();
  std::vector<std::pair<std::string, std::string>> shared;  // (tied name, the parameter it is)
  if (const auto sp = ModelStatesEntry(S, "shared_params"); sp && sp->kind == Value::Kind::Dict)
    for (const auto& item : sp->dict.items())
      if (item.key && item.key->kind == Value::Kind::Str && item.value && item.value->kind == Value::Kind::Str)
        shared.emplace_back(item.key->s, item.value->s);

  std::map<std::string, int> atom_of;
  for (size_t i = 0; i < S.atoms.size(); ++i) atom_of[S.atoms[i].name] = static_cast<int>(i);
  auto tensor = [&](const std::string& name, int atom) {
    const reshard::Atom& a = S.atoms[atom];
    reshard::ExportTensor t;
    t.name = name, t.atom = atom, t.source = a.name, t.shape = a.shape;
    t.row_begin = 0, t.row_end = a.shape.empty() ? 1 : a.shape[0];
    return t;
  };
  for (const reshard::Atom& a : S.atoms) {
    m.tensors.push_back(tensor(a.name, atom_of[a.name]));
    m.parameters += m.tensors.back().numel();
  }
  for (const auto& [tied, stored] : shared) {
    auto it = atom_of.find(stored);
    if (it == atom_of.end()) throw Error(dir + "/" + S.model_file + ": shared_params says '" + tied + "' is '" + stored +
                                         "', which is not a parameter of the atomic checkpoint");
    if (atom_of.count(tied)) continue;  // saved as a parameter of its own: written as such
    if (ties) {
      notes.push_back("'" + tied + "' is '" + stored + "' (tie_word_embeddings true): not written, as save_pretrained drops "
                      "it; from_pretrained ties it back");
    } else {
      m.tensors.push_back(tensor(tied, it->second));
      notes.push_back("'" + tied + "' is '" + stored + "' in the job (DeepSpeed's shared_params) while config.json does not "
                      "say tie_word_embeddings true: written with its values, as zero_to_fp32 writes it, so that "
                      "from_pretrained finds it");
    }
  }
}

// The model's order: its state_dict's, as the model-states file's module lists it (the optimizer's
// groups put the norms after every matrix). Names it does not list keep the atomic checkpoint's order.
void SortInModelOrder(const reshard::Source& S, std::vector<reshard::ExportTensor>& tensors) {
  std::map<std::string, size_t> place;
  if (const auto module = ModelStatesEntry(S, "module"); module && module->kind == Value::Kind::Dict)
    for (const auto& item : module->dict.items())
      if (item.key && item.key->kind == Value::Kind::Str) place.emplace(item.key->s, place.size());
  std::stable_sort(tensors.begin(), tensors.end(), [&](const reshard::ExportTensor& x, const reshard::ExportTensor& y) {
    auto px = place.find(x.name), py = place.find(y.name);
    return (px == place.end() ? place.size() : px->second) < (py == place.end() ? place.size() : py->second);
  });
}

}  // namespace

bool IsHuggingFaceConfig(const json& config) {
  return config.is_object() && (config.contains("model_type") || config.contains("architectures"));
}

std::optional<JobConfig> JobConfigOf(const reshard::Source& S, const reshard::ExportOptions& o) {
  const std::string dir = S.reader->dir();
  std::optional<JobConfig> carried, given;
  if (S.reader->Lists("job/config.json")) {
    // Carried from the training run's folder; a scratch atomic checkpoint (a run from that folder) is
    // gone when the run ends, so the run names the folder's own file.
    const auto where = [&](const char* file) {
      if (!o.job_files_from.empty()) return (std::filesystem::path(o.job_files_from) / file).string();
      return dir + "/job/" + file;
    };
    JobConfig j;
    j.config = S.reader->ReadCheckedBytes("job/config.json", "the job's config.json");
    j.from = where("config.json");
    if (S.reader->Lists("job/generation_config.json")) {
      j.generation_config = S.reader->ReadCheckedBytes("job/generation_config.json", "the job's generation_config.json");
      j.generation_from = where("generation_config.json");
    }
    carried = std::move(j);
  }
  if (IsHuggingFaceConfig(o.model_config)) {
    JobConfig j;
    j.config = o.model_config_text;
    j.from = o.model_config_path;
    // Trainer and save_pretrained write generation_config.json beside config.json.
    const std::string beside = (std::filesystem::path(o.model_config_path).parent_path() / "generation_config.json").string();
    if (auto text = std::filesystem::is_regular_file(beside) ? ReadWholeFile(beside) : std::nullopt) {
      j.generation_config = *text;
      j.generation_from = beside;
    }
    given = std::move(j);
  }
  // A --model-config that is no config.json, for a model whose names are Hugging Face's own, says
  // nothing this export uses: refused, not ignored.
  if (!o.model_config_path.empty() && !given)
    throw Error(o.model_config_path + ": --model-config for a model whose parameters carry Hugging Face's names takes "
                "its config.json (with model_type or architectures); this file has neither" +
                (carried ? " (the atomic checkpoint carries the job's own config.json: export without --model-config)" : ""));
  if (carried && given && carried->config != given->config)
    throw Error(o.model_config_path + ": --model-config gives a config.json other than the one the atomic checkpoint "
                "carries from its job (" + carried->from + "): export without --model-config to write the job's own");
  return carried ? carried : given;
}

namespace {

// What a config.json's value means where transformers reads null as a default: GPT-2's n_inner
// (4 x n_embd), Llama's num_key_value_heads (num_attention_heads).
json Meant(const json& config, const std::string& key) {
  const json& v = config[key];
  if (!v.is_null()) return v;
  if (key == "n_inner" && config.value("n_embd", json()).is_number_integer()) return 4 * config["n_embd"].get<int64_t>();
  if (key == "num_key_value_heads" && config.value("num_attention_heads", json()).is_number_integer()) return config["num_attention_heads"];
  return v;
}

}  // namespace

std::optional<JobConfig> CarriedConfigFor(const reshard::Source& S, const std::string& architecture,
                                          const std::string& from_facts, const std::string& dtype,
                                          std::vector<std::string>& notes) {
  std::optional<JobConfig> job = JobConfigOf(S, {});
  if (!job) return std::nullopt;
  const json carried = ConfigOf(*job), facts = json::parse(from_facts);
  if (ArchitectureOf(carried) != architecture) {
    notes.push_back(job->from + " is a " + ArchitectureOf(carried) + "'s config.json: config.json written from the facts");
    return std::nullopt;
  }
  for (const char* key : {"hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                          "intermediate_size", "vocab_size", "num_local_experts", "n_embd", "n_layer", "n_head",
                          "n_inner", "n_positions", "tie_word_embeddings"})
    if (carried.contains(key) && facts.contains(key) && Meant(carried, key) != facts[key]) {
      notes.push_back(job->from + " says " + key + " " + carried[key].dump() + ", the checkpoint's model " +
                      facts[key].dump() + ": config.json written from the facts");
      return std::nullopt;
    }
  const std::string torch_name = TorchDtypeName(dtype);
  if (ConfigDtype(carried) != torch_name) {
    bool whole = false;
    job->config = WithDtype(job->config, torch_name, whole);
    notes.push_back("the carried config.json's dtype set to " + torch_name);
  }
  notes.push_back("config.json" + std::string(job->generation_config.empty() ? "" : " and generation_config.json") +
                  " as the model carried them (" + job->from + ")");
  return job;
}

OwnModel OwnModelOf(const reshard::Source& S, const reshard::ExportOptions& o, const JobConfig& job, std::vector<std::string>& notes) {
  const json config = ConfigOf(job);
  OwnModel m;
  m.architecture = ArchitectureOf(config);
  RefuseWhatTheStoreLacks(S);
  ChooseDtype(S, o, job, config, m, notes);
  m.generation_config = job.generation_config;
  TensorsOf(S, config, m, notes);
  SortInModelOrder(S, m.tensors);
  return m;
}

}  // namespace ucp::formats::hf
