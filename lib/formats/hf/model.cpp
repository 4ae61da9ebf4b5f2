#include "formats/hf/model.h"

#include <cmath>
#include <optional>
#include <regex>

#include "core/error.h"
#include "pt/value.h"

namespace ucp::formats::hf {
using nlohmann::json;
using pt::Value;

namespace {

// One model fact by its Megatron name: the checkpoint's args.<key>, or --model-config's; both given
// must agree. nullopt where neither says it.
class Facts {
 public:
  Facts(const reshard::Source& S, const reshard::ExportOptions& o) : S_(S), o_(o) {}

  std::optional<json> Get(const char* key) const {
    std::optional<json> from_args;
    if (const Value* v = reshard::ArgOf(S_, key)) {
      switch (v->kind) {
        case Value::Kind::Bool: from_args = v->b; break;
        case Value::Kind::Int: from_args = v->i; break;
        case Value::Kind::Float: from_args = v->f; break;
        case Value::Kind::Str: from_args = v->s; break;
        default: break;  // None: not said
      }
    }
    std::optional<json> from_file;
    if (o_.model_config.is_object() && o_.model_config.contains(key) && !o_.model_config[key].is_null())
      from_file = o_.model_config[key];
    if (from_args && from_file && !Same(*from_args, *from_file))
      throw Error(o_.model_config_path + ": " + key + " is " + from_file->dump() + " but the checkpoint's args say " +
                  from_args->dump() + " (" + S_.reader->dir() + "/" + S_.model_file + ")");
    return from_args ? from_args : from_file;
  }

  int64_t Int(const char* key, const char* what) const {
    auto v = Get(key);
    if (!v) throw Missing(key, what);
    if (!v->is_number_integer()) throw Error(Where(key) + ": " + key + " is " + v->dump() + ", not an integer");
    return v->get<int64_t>();
  }
  double Number(const char* key, double otherwise, std::vector<std::string>& notes, const char* why) const {
    auto v = Get(key);
    if (!v) {
      notes.push_back(std::string(key) + " is not in the checkpoint's args: " + why);
      return otherwise;
    }
    if (!v->is_number()) throw Error(Where(key) + ": " + key + " is " + v->dump() + ", not a number");
    return v->get<double>();
  }
  bool Flag(const char* key, bool otherwise) const {
    auto v = Get(key);
    return v && v->is_boolean() ? v->get<bool>() : otherwise;
  }
  std::string Str(const char* key) const {
    auto v = Get(key);
    return v && v->is_string() ? v->get<std::string>() : "";
  }

  Error Missing(const char* key, const char* what) const {
    return Error(S_.reader->dir() + ": the checkpoint does not say the model's " + what + " (Megatron's args." + key +
                 "; a plain DeepSpeed engine saves no args): give it in --model-config FILE, a JSON object such as "
                 "{\"" + key + "\": ...} with Megatron's argument names");
  }

 private:
  static bool Same(const json& a, const json& b) {
    if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
    return a == b;
  }
  std::string Where(const char* key) const {
    return reshard::ArgOf(S_, key) ? S_.reader->dir() + "/" + S_.model_file + ": args" : o_.model_config_path;
  }
  const reshard::Source& S_;
  const reshard::ExportOptions& o_;
};

bool HasParam(const reshard::Source& S, const std::regex& re) {
  for (const auto& a : S.atoms)
    if (std::regex_match(a.name, re)) return true;
  return false;
}

}  // namespace

LlamaFacts LlamaFactsOf(const reshard::Source& S, const reshard::ExportOptions& o, std::vector<std::string>& notes) {
  const Facts f(S, o);
  const std::string dir = S.reader->dir();
  if (S.manifest["source"].value("moe", false))
    throw Error(dir + ": a Mixture-of-Experts model (DeepSpeed MoE experts): ucp-reshard --format hf writes dense "
                "LlamaForCausalLM models; the Mixtral layout is not written yet");
  // What LlamaForCausalLM computes, each checked against what the checkpoint says; every difference
  // is listed, for a model that is not one.
  std::vector<std::string> differs;
  const std::string norm = f.Str("normalization");
  if (norm.empty()) throw f.Missing("normalization", "normalization (layernorm or rmsnorm)");
  if (norm != "rmsnorm") differs.push_back("normalization '" + norm + "' (LlamaForCausalLM: RMSNorm)");
  if (!f.Get("swiglu")) throw f.Missing("swiglu", "MLP activation (swiglu true or false)");
  if (!f.Flag("swiglu", false)) differs.push_back("a GeLU MLP, swiglu false (LlamaForCausalLM: SwiGLU)");
  static const std::regex positions(R"(.*position_embeddings\.weight)");
  const std::string pos = f.Str("position_embedding_type");
  const bool learned = HasParam(S, positions);
  if (learned || (!pos.empty() && pos != "rope")) {
    differs.push_back(learned ? "learned absolute position embeddings (LlamaForCausalLM: rotary)"
                              : "position_embedding_type '" + pos + "' (LlamaForCausalLM: rope)");
  } else if (pos.empty() && !f.Flag("use_rotary_position_embeddings", false)) {
    throw f.Missing("position_embedding_type", "position embeddings (no position_embeddings parameter, and neither "
                    "position_embedding_type nor use_rotary_position_embeddings says rope)");
  }
  if (auto p = f.Get("rotary_percent"); p && p->is_number() && p->get<double>() != 1.0)
    differs.push_back("rotary_percent " + p->dump() + " (LlamaForCausalLM rotates every dimension)");
  for (const auto& a : S.atoms)
    if (a.name.find("layernorm.bias") != std::string::npos) {
      differs.push_back("a bias on its norms, '" + a.name + "' (RMSNorm has none)");
      break;
    }
  if (!differs.empty()) {
    // GPT-2's shape (LayerNorm, learned positions, GeLU, one key-value head per query head) is said as such.
    auto kv = f.Get("num_key_value_heads"), q = f.Get("num_attention_heads");
    if (norm == "layernorm" && learned && !f.Flag("swiglu", false) && (!kv || !q || *kv == *q))
      throw Error(dir + ": a GPT-2-shaped model (LayerNorm, learned positions, GeLU): ucp-reshard --format hf does not "
                  "write GPT2LMHeadModel yet (its fused QKV layout and transposed Conv1D weights have no real checkpoint "
                  "to be checked against here); it writes LlamaForCausalLM");
    std::string all;
    for (const auto& d : differs) all += (all.empty() ? "" : "; ") + d;
    throw Error(dir + ": not a model transformers has a class for: " + all + ". ucp-reshard --format hf writes "
                "LlamaForCausalLM (RMSNorm, rotary, SwiGLU); it does not guess another architecture");
  }

  LlamaFacts m;
  m.hidden = f.Int("hidden_size", "hidden size");
  m.layers = f.Int("num_layers", "layer count");
  m.heads = f.Int("num_attention_heads", "attention head count");
  m.kv_heads = m.heads;
  if (auto kv = f.Get("num_key_value_heads"); kv && kv->is_number_integer()) m.kv_heads = kv->get<int64_t>();
  else if (f.Flag("group_query_attention", false)) m.kv_heads = f.Int("num_query_groups", "key-value head count");
  m.head_dim = m.heads > 0 ? m.hidden / m.heads : 0;
  if (auto kv = f.Get("kv_channels"); kv && kv->is_number_integer()) m.head_dim = kv->get<int64_t>();
  m.ffn = f.Int("ffn_hidden_size", "FFN width");
  if (auto mp = f.Get("max_position_embeddings"); mp && mp->is_number_integer()) m.max_positions = mp->get<int64_t>();
  else m.max_positions = f.Int("seq_length", "maximum sequence length (max_position_embeddings)");
  if (m.hidden <= 0 || m.layers <= 0 || m.heads <= 0 || m.kv_heads <= 0 || m.head_dim <= 0 || m.ffn <= 0 ||
      m.max_positions <= 0 || m.heads % m.kv_heads != 0)
    throw Error(dir + ": the model's sizes do not describe a model: hidden " + std::to_string(m.hidden) + ", " +
                std::to_string(m.layers) + " layers, " + std::to_string(m.heads) + " heads, " + std::to_string(m.kv_heads) +
                " key-value heads of " + std::to_string(m.head_dim) + ", FFN " + std::to_string(m.ffn));
  m.norm_eps = f.Number("layernorm_epsilon", 1e-5, notes, "Megatron's default 1e-5");
  m.rope_theta = f.Number("rope_theta", 10000.0, notes, "Megatron's 10000");
  m.vocab = S.vocab;
  // Tied or not, biases or not: what the parameters are (names.h places each; a layer without one
  // its class expects is refused there).
  static const std::regex output(R"(^(language_model\.output_layer|\d+\.lm_head)\.weight$)"),
      qkv_bias(R"(.*query_key_value\.bias$)"), dense_bias(R"(.*self_attention\.dense\.bias$)"),
      up_bias(R"(.*dense_h_to_4h\.bias$)"), down_bias(R"(.*dense_4h_to_h\.bias$)");
  m.tied = !HasParam(S, output);
  if (auto untie = f.Get("untie_embeddings_and_output_weights"); untie && untie->is_boolean() && untie->get<bool>() == m.tied)
    throw Error(dir + ": untie_embeddings_and_output_weights is " + untie->dump() + " but the checkpoint " +
                (m.tied ? "has no output layer of its own" : "has an output layer apart from the word embedding"));
  m.attention_bias = HasParam(S, qkv_bias);
  m.mlp_bias = HasParam(S, up_bias);
  if (m.attention_bias != HasParam(S, dense_bias) || m.mlp_bias != HasParam(S, down_bias))
    throw Error(dir + ": biases on some of a block's linear layers only (query_key_value " + (m.attention_bias ? "has" : "has not") +
                ", dense " + (HasParam(S, dense_bias) ? "has" : "has not") + "; dense_h_to_4h " + (m.mlp_bias ? "has" : "has not") +
                ", dense_4h_to_h " + (HasParam(S, down_bias) ? "has" : "has not") + "): LlamaForCausalLM's attention_bias and "
                "mlp_bias each cover both");
  return m;
}

std::string LlamaConfigJson(const LlamaFacts& m, const std::string& dtype) {
  const char* torch_dtype = dtype == "bf16" ? "bfloat16" : dtype == "fp16" ? "float16" : "float32";
  nlohmann::ordered_json c = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"hidden_size", m.hidden},
      {"intermediate_size", m.ffn},
      {"num_hidden_layers", m.layers},
      {"num_attention_heads", m.heads},
      {"num_key_value_heads", m.kv_heads},
      {"head_dim", m.head_dim},
      {"hidden_act", "silu"},
      {"max_position_embeddings", m.max_positions},
      {"rms_norm_eps", m.norm_eps},
      {"rope_theta", m.rope_theta},
      {"rope_scaling", nullptr},
      {"attention_bias", m.attention_bias},
      {"mlp_bias", m.mlp_bias},
      {"attention_dropout", 0.0},
      {"tie_word_embeddings", m.tied},
      {"vocab_size", m.vocab},
      {"torch_dtype", torch_dtype},
  };
  return c.dump(2) + "\n";
}

}  // namespace ucp::formats::hf
