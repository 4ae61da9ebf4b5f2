#include "formats/hf/model.h"
#include "formats/hf/facts.h"
#include "formats/hf/mixtral.h"
#include "formats/hf/mixtral_mcore.h"

#include <algorithm>
#include <map>
#include <optional>
#include <regex>

#include "core/error.h"
#include "core/format.h"
#include "pt/value.h"
#include "layout/naming.h"

namespace ucp::formats::hf {
using nlohmann::json;
using pt::Value;

namespace {


const reshard::Atom* FirstParam(const reshard::Source& S, const std::regex& re) {
  for (const auto& a : S.atoms)
    if (std::regex_match(a.name, re)) return &a;
  return nullptr;
}
const std::pair<std::string, std::vector<int64_t>>* FirstParam(const ModelView& v, const std::regex& re) {
  for (const auto& p : v.params)
    if (std::regex_match(p.first, re)) return &p;
  return nullptr;
}

// torchtitan's Llama names (tok_embeddings, layers.N.attention.wq, feed_forward.w1/w3/w2): its model
// is RMSNorm, rotary (interleaved pairs) and SwiGLU by construction.
bool TorchtitanNames(const ModelView& v) {
  static const std::regex titan(R"(^layers\.\d+\.(attention\.w[qkvo]|feed_forward\.w[123])\.weight$)");
  bool embedding = false, layer = false;
  for (const auto& p : v.params) embedding |= p.first == "tok_embeddings.weight", layer |= std::regex_match(p.first, titan);
  return embedding && layer;
}


// What LlamaFactsOf reads the facts from, and what it found unsaid (every fact neither said nor shown
// by the weights, asked for at once) or read off the weights (said in `notes`).
struct FactReading {
  const reshard::Source& S;
  const Facts& f;
  bool titan;  // torchtitan's names
  std::vector<std::string>& notes;
  std::vector<std::string> missing = {};

  void Need(const char* key) { missing.push_back(key); }
  int64_t Derived(const char* key, int64_t value, const std::string& how) {
    notes.push_back(std::string(key) + " is not in the checkpoint's args: " + std::to_string(value) + ", from " + how);
    return value;
  }
};

// The weights whose shapes say a size the args do not.
struct Weights {
  const reshard::Atom *up, *down, *qkv, *embed, *key;
};
Weights WeightsOf(const reshard::Source& S) {
  static const std::regex embedding(R"(.*word_embeddings\.weight|^tok_embeddings\.weight)"),
      up(R"(.*mlp\.(deepspeed_moe\.experts\.deepspeed_experts\.\d+\.)?dense_h_to_4h\.weight|^layers\.\d+\.feed_forward\.w1\.weight)"),
      down(R"(.*mlp\.(deepspeed_moe\.experts\.deepspeed_experts\.\d+\.)?dense_4h_to_h\.weight|^layers\.\d+\.feed_forward\.w2\.weight)"),
      qkv(R"(.*self_attention\.query_key_value\.weight)"), key(R"(^layers\.\d+\.attention\.wk\.weight)");
  return {FirstParam(S, up), FirstParam(S, down), FirstParam(S, qkv), FirstParam(S, embedding), FirstParam(S, key)};
}

// RMSNorm, rotary and SwiGLU: torchtitan's by construction (said in a note), else said or asked for.
void AskForTheKind(FactReading& r, const Weights& w) {
  const Facts& f = r.f;
  if (r.titan) {
    const std::string norm = f.Str("normalization");
    const bool rope_said = !f.Str("position_embedding_type").empty() || f.Flag("use_rotary_position_embeddings");
    if (norm.empty() || !rope_said)
      r.notes.push_back("torchtitan's Llama names: RMSNorm, rotary and SwiGLU, as its model is built; query and key rows "
                        "re-ordered from its interleaved rotary pairs to Hugging Face's rotate-half");
  } else {
    if (f.Str("normalization").empty()) r.Need("normalization");
    if (!f.Flag("swiglu") && !(w.up && w.down)) r.Need("swiglu");
  }
  const bool rope = r.titan || f.Str("position_embedding_type") == "rope" || f.Flag("use_rotary_position_embeddings").value_or(false);
  if (!rope) r.Need("position_embedding_type");
}

// The layer count the parameter names show.
int64_t LayerCountOfNames(const reshard::Source& S, bool titan) {
  std::vector<std::string> names;
  for (const auto& a : S.atoms) names.push_back(a.name);
  if (!titan) {
    const auto naming = S.manifest["source"].value("naming", "") == "plain" ? reshard::Naming::Plain : reshard::Naming::Pipe;
    return reshard::LayerCountOf(names, naming);
  }
  static const std::regex layer(R"(^layers\.(\d+)\..*)");
  int64_t top = -1;
  std::smatch mm;
  for (const auto& n : names)
    if (std::regex_match(n, mm, layer) && mm[1].length() < 9) top = std::max<int64_t>(top, std::stoll(mm[1]));
  return top + 1;
}

// The sizes: said, or read off the weights (and said so in a note).
LlamaFacts SizesOf(FactReading& r, const Weights& w) {
  const Facts& f = r.f;
  LlamaFacts m;
  if (auto v = f.Int("hidden_size")) m.hidden = *v;
  else if (w.embed && w.embed->shape.size() == 2) m.hidden = r.Derived("hidden_size", w.embed->shape[1], w.embed->name + "'s columns");
  else r.Need("hidden_size");
  if (auto v = f.Int("num_layers")) m.layers = *v;
  else m.layers = r.Derived("num_layers", LayerCountOfNames(r.S, r.titan), "the parameter names");
  if (auto v = f.Int("num_attention_heads")) m.heads = *v;
  else r.Need("num_attention_heads");
  if (auto v = f.Int("kv_channels")) m.head_dim = *v;
  else if (m.heads > 0) m.head_dim = m.hidden / m.heads;
  if (auto v = f.Int("num_key_value_heads")) m.kv_heads = *v;
  else if (f.Flag("group_query_attention").value_or(false)) m.kv_heads = f.Int("num_query_groups").value_or(0);
  else if (w.qkv && w.qkv->sub_param_sizes.size() == 3 && m.head_dim > 0)
    m.kv_heads = r.Derived("num_key_value_heads", w.qkv->sub_param_sizes[1] / m.head_dim, w.qkv->name + "'s sub-parameter sizes");
  else if (w.key && w.key->shape.size() == 2 && m.head_dim > 0 && w.key->shape[0] % m.head_dim == 0)
    m.kv_heads = r.Derived("num_key_value_heads", w.key->shape[0] / m.head_dim, w.key->name + "'s rows");
  else m.kv_heads = m.heads;
  if (auto v = f.Int("ffn_hidden_size")) m.ffn = *v;
  else if (w.down && w.down->shape.size() == 2) m.ffn = r.Derived("ffn_hidden_size", w.down->shape[1], w.down->name + "'s columns");
  else r.Need("ffn_hidden_size");
  if (auto v = f.Int("max_position_embeddings")) m.max_positions = *v;
  else if (auto s = f.Int("seq_length")) m.max_positions = *s;
  else r.Need("max_position_embeddings");
  return m;
}

// Tied or not, biases or not: what the parameters are (names.h places each; a layer without one
// its class expects is refused there).
void TiesAndBiases(const reshard::Source& S, const Facts& f, LlamaFacts& m) {
  const std::string dir = S.reader->dir();
  static const std::regex output(R"(^(language_model\.output_layer|\d+\.lm_head|output|output_layer)\.weight$)"),
      qkv_bias(R"(.*(query_key_value|linear_qkv)\.bias$)"), dense_bias(R"(.*self_attention\.(dense|linear_proj)\.bias$)"),
      up_bias(R"(.*(dense_h_to_4h|linear_fc1)\.bias$)"), down_bias(R"(.*(dense_4h_to_h|linear_fc2)\.bias$)");
  auto has = [&](const std::regex& re) { return FirstParam(S, re) != nullptr; };
  m.tied = !has(output);
  if (auto untie = f.Flag("untie_embeddings_and_output_weights"); untie && *untie == m.tied)
    throw Error(dir + ": untie_embeddings_and_output_weights is " + (*untie ? "true" : "false") + " but the checkpoint " +
                (m.tied ? "has no output layer of its own" : "has an output layer apart from the word embedding"));
  m.attention_bias = has(qkv_bias);
  m.mlp_bias = has(up_bias);
  if (m.attention_bias != has(dense_bias) || m.mlp_bias != has(down_bias))
    throw Error(dir + ": biases on some of a block's linear layers only (query_key_value " + (m.attention_bias ? "has" : "has not") +
                ", dense " + (has(dense_bias) ? "has" : "has not") + "; dense_h_to_4h " + (m.mlp_bias ? "has" : "has not") +
                ", dense_4h_to_h " + (has(down_bias) ? "has" : "has not") + "): LlamaForCausalLM's attention_bias and "
                "mlp_bias each cover both");
}

}  // namespace

ModelView ViewOf(const reshard::Source& S) {
  ModelView v;
  v.dir = S.reader->dir();
  v.args_file = S.reader->dir() + "/" + (S.model_states.root ? S.model_file : S.args_file_name);
  v.arg = [&S](const char* key) {  // Megatron-DeepSpeed's name, else Megatron-LM's for the same fact
    static const std::map<std::string, const char*> megatron_lm = {{"layernorm_epsilon", "norm_epsilon"}, {"rope_theta", "rotary_base"}};
    const Value* v = reshard::ArgOf(S, key);
    auto other = megatron_lm.find(key);
    return v || other == megatron_lm.end() ? v : reshard::ArgOf(S, other->second);
  };
  v.moe = S.manifest["source"].value("moe", false);
  for (const auto& a : S.atoms) v.params.emplace_back(a.name, a.shape);
  return v;
}

void RefuseUnlessLlama(const ModelView& v, const reshard::ExportOptions& o, std::vector<std::string>& notes) {
  const Facts f(v, o);
  const std::string& dir = v.dir;
  static const std::regex positions(R"(.*position_embeddings\.weight)"),
      norm_bias(R"(.*(layernorm|^\d+)\.bias|.*\.layer_norm_bias)"), up(R"(.*mlp\.(deepspeed_moe\.experts\.deepspeed_experts\.\d+\.)?dense_h_to_4h\.weight)"),
      down(R"(.*mlp\.(deepspeed_moe\.experts\.deepspeed_experts\.\d+\.)?dense_4h_to_h\.weight)");
  const auto* bias_on_norm = FirstParam(v, norm_bias);
  const bool learned = FirstParam(v, positions) != nullptr;
  const auto *up_w = FirstParam(v, up), *down_w = FirstParam(v, down);

  // What LlamaForCausalLM computes, each checked against what the checkpoint says or its weights
  // show; every difference is listed, for a model that is not one. (A fact neither says is asked
  // for by LlamaFactsOf, with the sizes.)
  std::string norm = f.Str("normalization");
  std::transform(norm.begin(), norm.end(), norm.begin(), [](unsigned char c) { return std::tolower(c); });  // Megatron-LM: RMSNorm
  if (norm.empty() && bias_on_norm) norm = "layernorm";  // RMSNorm has no bias
  std::optional<bool> swiglu = f.Flag("swiglu");
  if (TorchtitanNames(v) && !swiglu) swiglu = true;  // w1 / w3 / w2: gate, up, down
  if (!swiglu && up_w && down_w && up_w->second.size() == 2 && down_w->second.size() == 2) {
    swiglu = up_w->second[0] == 2 * down_w->second[1];  // [gate; up] rows: twice the FFN width dense_4h_to_h reads
    notes.push_back(std::string("swiglu is not in the checkpoint's args: ") + (*swiglu ? "true" : "false") + ", as " +
                    up_w->first + " has " + (*swiglu ? "twice" : "as many as") + " the rows of the FFN width");
  }
  const std::string pos = f.Str("position_embedding_type");
  std::vector<std::string> differs;
  if (!norm.empty() && norm != "rmsnorm") differs.push_back("normalization '" + norm + "' (LlamaForCausalLM: RMSNorm)");
  if (swiglu && !*swiglu) differs.push_back("a GeLU MLP, swiglu false (LlamaForCausalLM: SwiGLU)");
  if (learned) differs.push_back("learned absolute position embeddings (LlamaForCausalLM: rotary)");
  else if (!pos.empty() && pos != "rope") differs.push_back("position_embedding_type '" + pos + "' (LlamaForCausalLM: rope)");
  if (auto p = f.Get("rotary_percent"); p && p->is_number() && p->get<double>() != 1.0)
    differs.push_back("rotary_percent " + p->dump() + " (LlamaForCausalLM rotates every dimension)");
  if (bias_on_norm) differs.push_back("a bias on its norms, '" + bias_on_norm->first + "' (RMSNorm has none)");
  // Megatron's args that change what the model computes and that LlamaForCausalLM's config.json as
  // written here does not say: each one set is a difference, never dropped unsaid.
  static const std::pair<const char*, const char*> kChanges[] = {
      {"rotary_interleaved", "rotating interleaved pairs; LlamaForCausalLM rotates halves"},
      {"use_rope_scaling", "Llama 3.1's rotary frequency scaling, which this export does not write into rope_scaling"},
      {"rotary_seq_len_interpolation_factor", "rotary positions interpolated"},
      {"window_size", "sliding-window attention"},
      {"no_rope_freq", "layers without rotary embeddings"},
      {"apply_residual_connection_post_layernorm", "the residual taken after the norm"},
      {"apply_layernorm_1p", "norm weights stored as an offset from 1"},
      {"layernorm_zero_centered_gamma", "norm weights stored as an offset from 1"},
      {"qk_layernorm", "query and key norms"},
      {"multi_latent_attention", "multi-latent attention"},
      {"mtp_num_layers", "multi-token prediction layers"},
  };
  const bool mcore_moe = McoreMoe(v);  // Megatron-Core's MoE layers: MixtralForCausalLM, if the router computes Mixtral's
  if (mcore_moe) McoreMixtralDifferences(v, differs);
  else if (const Value* a = v.arg ? v.arg("num_moe_experts") : nullptr; a && a->kind == Value::Kind::Int && a->i > 0)
    differs.push_back("num_moe_experts set in the checkpoint's args (Mixture of Experts)");
  for (const auto& [key, meaning] : kChanges)
    if (const Value* a = v.arg ? v.arg(key) : nullptr;
        a && a->kind != Value::Kind::None && !(a->kind == Value::Kind::Bool && !a->b) && !(a->kind == Value::Kind::Int && a->i == 0))
      differs.push_back(std::string(key) + " set in the checkpoint's args (" + meaning + ")");
  if (const Value* n = v.arg ? v.arg("num_experts") : nullptr; !mcore_moe && n && n->kind == Value::Kind::Int && n->i > 1)  // Megatron-LM's
    differs.push_back("num_experts " + std::to_string(n->i) + " in the checkpoint's args (Mixture of Experts; the Mixtral "
                      "layout is written from Megatron-Core's stacked router and experts, which these parameters are not)");  // (Megatron-DeepSpeed's is a list per layer, [1] when dense)
  for (const auto& [key, plain] : {std::pair<const char*, const char*>{"rope_type", "rope"}, {"softmax_type", "vanilla"}})
    if (const Value* a = v.arg ? v.arg(key) : nullptr; a && a->kind == Value::Kind::Str && a->s != plain)
      differs.push_back(std::string(key) + " '" + a->s + "' in the checkpoint's args (LlamaForCausalLM: " + plain + ")");
  if (v.moe) {  // DeepSpeed MoE layers: MixtralForCausalLM's sparse blocks, if their gate computes Mixtral's router
    std::vector<std::string> unsaid;  // (asked for by LlamaFactsOf, with the sizes)
    MixtralDifferences(v, f, differs, unsaid);
  }
  if (differs.empty()) return;
  const std::string next = " ucp-convert's atomic checkpoint holds its fp32 weights, one file per parameter (zero/<name>/fp32.pt).";
  const std::string all = JoinNames(differs, "; ");
  throw Error(dir + ": not a model transformers has a class for: " + all + ". ucp-reshard --format hf writes "
              "LlamaForCausalLM (RMSNorm, rotary, SwiGLU; MixtralForCausalLM with every MLP a top-2 DeepSpeed MoE or a Megatron-Core MoE) and, for models with learned positions, GPT2LMHeadModel; it "
              "does not guess another architecture." + next);
}

LlamaFacts LlamaFactsOf(const reshard::Source& S, const reshard::ExportOptions& o, std::vector<std::string>& notes) {
  const ModelView view = ViewOf(S);
  RefuseUnlessLlama(view, o, notes);
  const Facts f(view, o);
  FactReading r{S, f, TorchtitanNames(view), notes};
  const std::string dir = S.reader->dir();
  const Weights w = WeightsOf(S);
  AskForTheKind(r, w);
  if (view.moe) {
    std::vector<std::string> differs;  // (none: RefuseUnlessLlama refused them)
    MixtralDifferences(view, f, differs, r.missing);
  }
  LlamaFacts m = SizesOf(r, w);
  if (view.moe) MoeSizesOf(view, f, m);
  else if (McoreMoe(view)) McoreMoeSizesOf(view, m);
  // Megatron-DeepSpeed's defaults stand where its args leave a value out (releases without the key);
  // a checkpoint without args at all could be any model: asked for.
  const bool has_args = reshard::ArgOf(S, "num_layers") != nullptr;
  for (const char* key : {"layernorm_epsilon", "rope_theta"})
    if (!has_args && !f.Get(key)) r.Need(key);
  RefuseUnsaid(dir, r.missing);
  if (m.hidden <= 0 || m.layers <= 0 || m.heads <= 0 || m.kv_heads <= 0 || m.head_dim <= 0 || m.ffn <= 0 ||
      m.max_positions <= 0 || m.heads % m.kv_heads != 0 || (r.titan && m.head_dim % 2 != 0))
    throw Error(dir + ": the model's sizes do not describe a model: hidden " + std::to_string(m.hidden) + ", " +
                std::to_string(m.layers) + " layers, " + std::to_string(m.heads) + " heads, " + std::to_string(m.kv_heads) +
                " key-value heads of " + std::to_string(m.head_dim) + ", FFN " + std::to_string(m.ffn));
  if (const auto trusted = f.OnTrust(); !trusted.empty()) {
    const std::string all = JoinNames(trusted);
    notes.push_back("taken on trust from --model-config, as nothing in the checkpoint records them to check against (a "
                    "wrong value, a head count above all, still loads in transformers and computes other logits): " + all);
  }
  m.norm_eps = f.Number("layernorm_epsilon", 1e-5, notes, "Megatron's default 1e-5");
  m.rope_theta = f.Number("rope_theta", 10000.0, notes, "Megatron's 10000");
  m.vocab = S.vocab;
  if (m.vocab <= 0 && w.embed && w.embed->shape.size() == 2) m.vocab = w.embed->shape[0];  // no vocabulary padding recorded
  TiesAndBiases(S, f, m);
  return m;
}

namespace {
// ucp's dtype names and torch's, which config.json says.
constexpr std::pair<const char*, const char*> kDtypeNames[] = {{"fp32", "float32"}, {"bf16", "bfloat16"}, {"fp16", "float16"}};
}  // namespace

const char* TorchDtypeName(const std::string& dtype) {
  for (const auto& [ucp, torch] : kDtypeNames)
    if (dtype == ucp) return torch;
  return "float32";
}

std::string UcpDtypeName(const std::string& torch_name) {
  for (const auto& [ucp, torch] : kDtypeNames)
    if (torch_name == torch) return ucp;
  return "";
}

std::string LlamaConfigJson(const LlamaFacts& m, const std::string& dtype) {
  const char* torch_dtype = TorchDtypeName(dtype);
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
  if (m.experts > 0) {  // MixtralForCausalLM: the same with sparse MoE blocks (and no biases)
    c["architectures"] = {"MixtralForCausalLM"}, c["model_type"] = "mixtral";
    c.erase("attention_bias"), c.erase("mlp_bias");
    c["num_local_experts"] = m.experts, c["num_experts_per_tok"] = m.experts_per_token;
    c["router_jitter_noise"] = 0.0, c["output_router_logits"] = false, c["sliding_window"] = nullptr;
  }
  return c.dump(2) + "\n";
}

}  // namespace ucp::formats::hf
