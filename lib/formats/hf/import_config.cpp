#include "formats/hf/import_config.h"

#include <optional>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"

namespace ucp::formats::hf {
using nlohmann::json;

namespace {

// config.json's keys, each read with its type checked; a missing key takes the class's default
// (said in the notes) or, without one, is refused.
class ConfigKeys {
 public:
  ConfigKeys(const json& j, std::string path, std::vector<std::string>& notes) : j_(j), path_(std::move(path)), notes_(notes) {}
  int64_t Int(const char* key, std::optional<int64_t> otherwise = std::nullopt) const {
    if (const json* v = Get(key)) {
      if (!v->is_number_integer() || v->get<int64_t>() < 0) throw Bad(key, *v, "a non-negative integer");
      return v->get<int64_t>();
    }
    return Default(key, otherwise);
  }
  double Number(const char* key, std::optional<double> otherwise = std::nullopt) const {
    if (const json* v = Get(key)) {
      if (!v->is_number()) throw Bad(key, *v, "a number");
      return v->get<double>();
    }
    return Default(key, otherwise);
  }
  bool Flag(const char* key, bool otherwise) const {
    if (const json* v = Get(key)) {
      if (!v->is_boolean()) throw Bad(key, *v, "true or false");
      return v->get<bool>();
    }
    return otherwise;
  }
  std::string Str(const char* key, const std::string& otherwise = "") const {
    if (const json* v = Get(key)) {
      if (!v->is_string()) throw Bad(key, *v, "a string");
      return v->get<std::string>();
    }
    return otherwise;
  }
  const json* Get(const char* key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  Error Bad(const std::string& key, const json& v, const char* want) const {
    return Error(path_ + ": " + key + " is " + v.dump() + ", not " + want);
  }
  const std::string& path() const { return path_; }

 private:
  template <class T>
  T Default(const char* key, std::optional<T> otherwise) const {
    if (!otherwise) throw Error(path_ + ": no " + std::string(key) + ": the model's size cannot be known without it");
    notes_.push_back(std::string(key) + " is not in config.json: the class's default " + json(*otherwise).dump());
    return *otherwise;
  }
  const json& j_;
  std::string path_;
  std::vector<std::string>& notes_;
};

// The rotary base: transformers 5's rope_parameters, else rope_theta; any scaling refused.
double RopeTheta(const ConfigKeys& k) {
  for (const char* key : {"rope_scaling", "rope_parameters"})
    if (const json* v = k.Get(key)) {
      if (!v->is_object()) throw k.Bad(key, *v, "an object");
      std::string type = "default";
      for (const char* name : {"type", "rope_type"})
        if (auto it = v->find(name); it != v->end() && !it->is_null()) {
          if (!it->is_string()) throw k.Bad(std::string(key) + "." + name, *it, "a string");
          type = it->get<std::string>();
        }
      if (type != "default")
        throw Error(k.path() + ": " + key + " " + v->dump() + ": rotary scaling ('" + type +
                    "') is not computed by Megatron-DeepSpeed's model; ucp imports unscaled rotary embeddings only");
      if (v->contains("rope_theta")) {
        if (!v->at("rope_theta").is_number()) throw k.Bad(std::string(key) + ".rope_theta", v->at("rope_theta"), "a number");
        return v->at("rope_theta").get<double>();
      }
    }
  return k.Number("rope_theta", 10000.0);
}

LlamaFacts LlamaOf(const ConfigKeys& k) {
  LlamaFacts m;
  m.hidden = k.Int("hidden_size");
  m.layers = k.Int("num_hidden_layers");
  m.heads = k.Int("num_attention_heads");
  m.kv_heads = k.Int("num_key_value_heads", m.heads);
  m.head_dim = k.Int("head_dim", m.heads > 0 ? m.hidden / m.heads : 0);
  m.ffn = k.Int("intermediate_size");
  m.vocab = k.Int("vocab_size");
  m.max_positions = k.Int("max_position_embeddings", 2048);
  m.norm_eps = k.Number("rms_norm_eps", 1e-6);
  m.rope_theta = RopeTheta(k);
  m.tied = k.Flag("tie_word_embeddings", false);
  m.attention_bias = k.Flag("attention_bias", false);
  m.mlp_bias = k.Flag("mlp_bias", false);
  if (const std::string act = k.Str("hidden_act", "silu"); act != "silu")
    throw Error(k.path() + ": hidden_act '" + act + "': Megatron's SwiGLU computes SiLU only");
  if (k.Int("pretraining_tp", 1) != 1)
    throw Error(k.path() + ": pretraining_tp " + std::to_string(k.Int("pretraining_tp")) + ": only 1 computes as Megatron's layers do");
  if (m.hidden <= 0 || m.layers <= 0 || m.heads <= 0 || m.kv_heads <= 0 || m.head_dim <= 0 || m.ffn <= 0 || m.vocab <= 0 ||
      m.heads % m.kv_heads != 0)
    throw Error(k.path() + ": the sizes describe no model: hidden " + std::to_string(m.hidden) + ", " + std::to_string(m.layers) +
                " layers, " + std::to_string(m.heads) + " heads, " + std::to_string(m.kv_heads) + " key-value heads of " +
                std::to_string(m.head_dim) + ", FFN " + std::to_string(m.ffn) + ", vocabulary " + std::to_string(m.vocab));
  return m;
}

// MixtralForCausalLM: Llama's facts and the sparse MoE blocks, whose router DeepSpeed's top-2 gate
// computes only with two experts per token and no jitter; no sliding window in Megatron's attention.
void MixtralOf(const ConfigKeys& k, LlamaFacts& m) {
  m.experts = k.Int("num_local_experts");
  m.experts_per_token = k.Int("num_experts_per_tok", 2);
  if (m.experts_per_token != 2)
    throw Error(k.path() + ": num_experts_per_tok " + std::to_string(m.experts_per_token) +
                ": DeepSpeed's MoE gate computes Mixtral's router for top-2 only");
  if (m.experts < 2) throw Error(k.path() + ": num_local_experts " + std::to_string(m.experts) + ": top-2 routing needs two experts or more");
  if (const double jitter = k.Number("router_jitter_noise", 0.0); jitter != 0.0)
    throw Error(k.path() + ": router_jitter_noise " + json(jitter).dump() + ": DeepSpeed's gate adds no jitter; ucp imports 0 only");
  if (const json* w = k.Get("sliding_window"))
    throw Error(k.path() + ": sliding_window " + w->dump() + ": Megatron-DeepSpeed's attention has no sliding window; ucp imports null only");
}

// GPT2LMHeadModel: Megatron's GPT with LayerNorm, learned positions, a GeLU MLP and tied embeddings.
Gpt2Facts Gpt2Of(const ConfigKeys& k) {
  Gpt2Facts m;
  m.hidden = k.Int("n_embd");
  m.layers = k.Int("n_layer");
  m.heads = k.Int("n_head");
  m.ffn = k.Int("n_inner", 4 * m.hidden);  // None: 4 x n_embd
  m.positions = k.Int("n_positions");
  m.vocab = k.Int("vocab_size");
  m.norm_eps = k.Number("layer_norm_epsilon", 1e-5);
  m.activation = k.Str("activation_function", "gelu_new");
  if (m.activation != "gelu" && m.activation != "gelu_new")
    throw Error(k.path() + ": activation_function '" + m.activation + "': Megatron computes F.gelu (\"gelu\") or its tanh "
                "approximation (openai_gelu, \"gelu_new\") only");
  if (!k.Flag("tie_word_embeddings", true))
    throw Error(k.path() + ": tie_word_embeddings false: GPT2LMHeadModel as Megatron's GPT-2 ties the output layer to the word embedding");
  if (!k.Flag("scale_attn_weights", true))
    throw Error(k.path() + ": scale_attn_weights false: Megatron's attention always scales by 1/sqrt(head_dim)");
  for (const char* key : {"scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"})
    if (k.Flag(key, false)) throw Error(k.path() + ": " + key + " true: Megatron's attention does not compute it");
  if (k.Flag("add_cross_attention", false)) throw Error(k.path() + ": add_cross_attention true: a decoder-only GPT has none");
  if (m.hidden <= 0 || m.layers <= 0 || m.heads <= 0 || m.hidden % m.heads != 0 || m.ffn <= 0 || m.positions <= 0 || m.vocab <= 0)
    throw Error(k.path() + ": the sizes describe no GPT-2 model: n_embd " + std::to_string(m.hidden) + ", n_layer " +
                std::to_string(m.layers) + ", n_head " + std::to_string(m.heads) + ", n_inner " + std::to_string(m.ffn) +
                ", n_positions " + std::to_string(m.positions) + ", vocab_size " + std::to_string(m.vocab));
  return m;
}

// The class: architectures[0], else model_type's class. One table for every class ucp imports.
std::string ArchitectureOf(const ConfigKeys& k) {
  static const std::pair<const char*, const char*> kByModelType[] = {
      {"llama", "LlamaForCausalLM"}, {"mixtral", "MixtralForCausalLM"}, {"gpt2", "GPT2LMHeadModel"}};
  if (const json* a = k.Get("architectures")) {
    if (!a->is_array() || a->size() != 1 || !(*a)[0].is_string()) throw k.Bad("architectures", *a, "a list of one class name");
    return (*a)[0].get<std::string>();
  }
  const std::string type = k.Str("model_type");
  for (const auto& [t, cls] : kByModelType)
    if (type == t) return cls;
  throw Error(k.path() + ": no architectures, and model_type '" + type + "' is no class ucp imports");
}

}  // namespace

HfConfig ReadHfConfig(const std::string& dir) {
  const std::string path = dir + "/config.json";
  const auto text = ReadWholeFile(path);
  if (!text) throw Error(path + ": cannot read it");
  return ParseHfConfig(*text, path);
}

HfConfig ParseHfConfig(const std::string& text, const std::string& path) {
  HfConfig c;
  c.path = path;
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw Error(c.path + ": no JSON object");
  const ConfigKeys k(j, c.path, c.notes);
  c.architecture = ArchitectureOf(k);
  if (c.architecture == "GPT2LMHeadModel") {
    c.gpt2 = Gpt2Of(k);
  } else if (c.architecture == "LlamaForCausalLM" || c.architecture == "MixtralForCausalLM") {
    c.llama = LlamaOf(k);
    if (c.architecture == "MixtralForCausalLM") MixtralOf(k, c.llama);
  } else {
    throw Error(c.path + ": architectures ['" + c.architecture + "']: ucp imports LlamaForCausalLM, MixtralForCausalLM and GPT2LMHeadModel");
  }
  const std::string torch_dtype = k.Str("dtype", k.Str("torch_dtype"));
  c.dtype = UcpDtypeName(torch_dtype);
  if (!torch_dtype.empty() && c.dtype.empty())
    throw Error(c.path + ": dtype '" + torch_dtype + "': ucp imports float32, bfloat16 and float16 models");
  return c;
}

}  // namespace ucp::formats::hf
