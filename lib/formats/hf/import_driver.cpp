// The registry's source row for a Hugging Face model folder (config.json and safetensors): its index
// lists the atomic checkpoint's parameters (import_model.h), Megatron's args and
// universal_checkpoint_info from the synthesized model-states file (import_states.h), and keeps the
// opened safetensors files for reading each parameter whole.
#include <cstring>
#include <filesystem>
#include <map>
#include <regex>

#include "core/error.h"
#include "formats/driver.h"
#include "formats/hf/import_model.h"
#include "formats/hf/import_states.h"
#include "source/source_index.h"
#include "safetensors/read.h"
#include "layout/naming.h"

namespace ucp::formats {
namespace hf {
using safetensors::StModel;
using safetensors::StTensor;
using safetensors::OpenSafetensorsModel;
namespace {
namespace fs = std::filesystem;

struct ImportSource {
  HfConfig config;
  StModel model;
  ImportModel M;
  std::map<std::string, std::string> stored;  // a table tensor's name -> the name the files hold it under
};

// A training checkpoint's root holds config.json and model.safetensors too (Trainer's checkpoint-N): one
// with a DeepSpeed tag folder is DeepSpeed's, `latest` or not.
bool LooksLikeModel(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir + "/config.json", ec) && !fs::exists(dir + "/latest", ec) &&
         (fs::is_regular_file(dir + "/model.safetensors", ec) || fs::is_regular_file(dir + "/model.safetensors.index.json", ec)) &&
         source::TagFoldersWithoutLatest(dir).empty();
}

// A file tensor's name in the table; "" for one that is no parameter. GPT-2 as older transformers
// saved it (the hub's gpt2): GPT2Model's names without "transformer.", and the attention's causal
// mask buffers attn.bias and attn.masked_bias, which the model computes rather than loads.
std::string TableName(const HfConfig& c, const std::string& name) {
  if (!c.Gpt2()) return name;
  static const std::regex buffer(R"(^(transformer\.)?h\.\d+\.attn\.(bias|masked_bias)$)"), base(R"(^(wte|wpe|h\.\d+|ln_f)\..+$)");
  if (std::regex_match(name, buffer)) return "";
  return std::regex_match(name, base) ? "transformer." + name : name;
}

// Every tensor of the files has its place in the table, with the table's shape; a tied model's
// lm_head.weight, if saved, must equal the embedding (it is not imported).
void CheckTensors(ImportSource& s, std::vector<std::string>& notes) {
  std::map<std::string, const reshard::ExportTensor*> wanted;
  for (const auto& t : s.M.tensors) wanted[t.name] = &t;
  int buffers = 0;
  for (const auto& [name, at] : s.model.where) {
    const StTensor& st = s.model.Tensor(name);
    const std::string where = s.model.dir + "/" + s.model.files[at.first].name + ": tensor '" + name + "'";
    const std::string table = TableName(s.config, name);
    if (table.empty()) {
      if (!buffers++) notes.push_back(where + " (and the like): GPT-2's causal-mask buffers, not parameters: not imported");
      continue;
    }
    if (table != name && s.model.where.count(table)) throw Error(where + ": the model holds it twice, also as '" + table + "'");
    if (table != name) s.stored[table] = name;
    auto it = wanted.find(table);
    if (it == wanted.end()) {
      const std::string embed = s.config.EmbeddingName();
      if (name == "lm_head.weight" && s.config.Tied() && s.model.where.count(embed)) {
        const StTensor& e = s.model.Tensor(embed);
        const auto& fe = s.model.files[s.model.where.at(embed).first];
        const auto& fl = s.model.files[at.first];
        if (e.end - e.begin == st.end - st.begin && e.dtype == st.dtype &&
            std::memcmp(fe.map->bytes().data() + fe.header.data_start + e.begin, fl.map->bytes().data() + fl.header.data_start + st.begin,
                        st.end - st.begin) == 0) {
          notes.push_back(where + ": the tied output layer, equal to " + embed + ": not imported (tie_word_embeddings)");
          continue;
        }
        throw Error(where + ": tie_word_embeddings is true, but it differs from " + embed);
      }
      throw Error(where + ": no place for it in " + s.config.architecture + " of config.json's sizes");
    }
    if (st.shape != it->second->shape)
      throw Error(where + ": shape " + pt::ShapeString(st.shape) + ", but config.json's sizes give " + pt::ShapeString(it->second->shape));
    wanted.erase(it);
  }
  if (!wanted.empty()) throw Error(s.model.dir + ": no safetensors file holds tensor '" + wanted.begin()->first + "'");
}

// The model's dtype: config.json's, else the tensors' (the most common, said when they differ).
std::string DtypeOf(const ImportSource& s, std::vector<std::string>& notes) {
  std::map<pt::DType, int64_t> count;
  for (const auto& f : s.model.files)
    for (const auto& t : f.header.tensors) ++count[t.dtype];
  pt::DType most = pt::DType::F32;
  int64_t best = -1;
  for (const auto& [d, n] : count)
    if (n > best) most = d, best = n;
  if (count.size() > 1) notes.push_back(s.model.dir + ": the tensors mix dtypes; each is widened to fp32 exactly");
  if (!s.config.dtype.empty()) return s.config.dtype;
  const std::string name = UcpDtypeName(std::string(pt::DTypeName(most)));
  notes.push_back("config.json says no dtype: the tensors' " + name);
  return name;
}

void FillIndex(const ImportSource& s, const std::string& dir, source::SourceIndex& L) {
  L.format = "hf", L.root = dir, L.dir = dir, L.framework = "hf", L.optimizer = "none", L.naming = "plain";
  L.job.kind = "hf";
  L.moe = s.config.llama.experts > 0, L.ep = 1;
  for (const char* name : {"config.json", "generation_config.json"})
    if (std::error_code ec; fs::is_regular_file(dir + "/" + name, ec)) L.job.carried.push_back(name);
  for (const auto& f : s.model.files) {
    source::ShardFile sf;
    sf.name = f.name, sf.kind = "safetensors";
    L.files.push_back(sf);
  }
  for (const auto& a : s.M.atoms) {
    source::ParamRecord p;
    p.name = a.name, p.group = a.group, p.tp_shape[0] = a.shape, p.stages = {0};
    if (auto e = reshard::ExpertOf(a.name)) p.expert = static_cast<int>(e->id), p.ep_rank = 0;  // Mixtral's experts, all on the one EP rank
    L.params.push_back(p);
  }
  L.model_states = ImportModelStates(s.config, s.M, L.dtype);
  L.universal_checkpoint_info = L.model_states->Get("universal_checkpoint_info");
  L.args = L.model_states->Get("args");
  source::TakeMegatronArgs(L.args.get(), L);
  L.notes.push_back(dir + ": " + s.config.architecture + " (" + std::to_string(s.M.tensors.size()) + " tensors in " +
                    std::to_string(s.model.files.size()) + " safetensors file(s)) as " + std::to_string(L.params.size()) +
                    " Megatron-DeepSpeed parameters, weights only");
  L.notes.push_back("safetensors carries no checksum of its data: ucp checked each file's structure (header, dtypes, "
                    "offsets, the index) and records the XXH64 of every tensor it writes");
}

source::SourceIndex IndexModel(const std::string& dir, const source::IndexOptions&) {
  if (!LooksLikeModel(dir)) throw Error(dir + ": no Hugging Face model (config.json and model.safetensors or its index)");
  auto s = std::make_shared<ImportSource>();
  source::SourceIndex L;
  s->config = ReadHfConfig(dir);
  s->model = OpenSafetensorsModel(dir);
  s->M = ImportModelOf(s->config, dir);
  for (const auto& n : s->config.notes) L.notes.push_back(s->config.path + ": " + n);
  CheckTensors(*s, L.notes);
  L.dtype = DtypeOf(*s, L.notes);
  FillIndex(*s, dir, L);
  L.keep_alive = s;
  return L;
}

void ReadParam(const source::SourceIndex& L, int param, float* dst) {
  const auto& s = *std::static_pointer_cast<const ImportSource>(L.keep_alive);
  FillAtom(s.M, static_cast<size_t>(param), [&](const reshard::ExportTensor& t, float* buf) {
    const auto stored = s.stored.find(t.name);
    s.model.ReadFp32(stored == s.stored.end() ? t.name : stored->second, buf);
  }, dst);
}

}  // namespace
}  // namespace hf

const SourceDriver& HuggingFaceSource() {
  static constexpr SourceDriver driver = {"hf",
     "a Hugging Face model folder (save_pretrained: config.json and safetensors, one file or shards with their "
     "index): LlamaForCausalLM, GPT2LMHeadModel, MixtralForCausalLM, F32, BF16 or F16 weights, imported as Megatron-DeepSpeed's parameters, weights only",
     "config.json, model.safetensors or model.safetensors.index.json and its shards", hf::LooksLikeModel, hf::IndexModel,
     hf::ReadParam, nullptr};
  return driver;
}

}  // namespace ucp::formats
