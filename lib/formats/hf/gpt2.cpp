#include "formats/hf/gpt2.h"

#include <map>
#include <optional>
#include <regex>

#include "core/error.h"
#include "core/format.h"
#include "formats/hf/facts.h"
#include "layout/naming.h"

namespace ucp::formats::hf {
using reshard::ExportTensor;

namespace {

// A block's Megatron key, its GPT-2 name (after transformer.h.<i>.) and how it is held there: in
// GPT2Block's order. A Conv1D weight is the transpose of Megatron's Linear weight.
struct Gpt2Key {
  const char* megatron;
  const char* hf;
  bool transposed = false;
  bool qkv = false;  // the fused query-key-value rows
  const char* mcore = nullptr;  // Megatron-Core's key (after decoder.layers.; the layers stacked on a leading axis)
  const char* mcore_local = nullptr;  // its local spec's module name, where TE's fused name differs
};
const std::vector<Gpt2Key>& BlockKeys() {
  static const std::vector<Gpt2Key> keys = {
      {"input_layernorm.weight", "ln_1.weight", false, false, "self_attention.linear_qkv.layer_norm_weight", "input_layernorm.weight"},
      {"input_layernorm.bias", "ln_1.bias", false, false, "self_attention.linear_qkv.layer_norm_bias", "input_layernorm.bias"},
      {"self_attention.query_key_value.weight", "attn.c_attn.weight", true, true, "self_attention.linear_qkv.weight"},
      {"self_attention.query_key_value.bias", "attn.c_attn.bias", false, true, "self_attention.linear_qkv.bias"},
      {"self_attention.dense.weight", "attn.c_proj.weight", true, false, "self_attention.linear_proj.weight"},
      {"self_attention.dense.bias", "attn.c_proj.bias", false, false, "self_attention.linear_proj.bias"},
      {"post_attention_layernorm.weight", "ln_2.weight", false, false, "mlp.linear_fc1.layer_norm_weight", "pre_mlp_layernorm.weight"},
      {"post_attention_layernorm.bias", "ln_2.bias", false, false, "mlp.linear_fc1.layer_norm_bias", "pre_mlp_layernorm.bias"},
      {"mlp.dense_h_to_4h.weight", "mlp.c_fc.weight", true, false, "mlp.linear_fc1.weight"},
      {"mlp.dense_h_to_4h.bias", "mlp.c_fc.bias", false, false, "mlp.linear_fc1.bias"},
      {"mlp.dense_4h_to_h.weight", "mlp.c_proj.weight", true, false, "mlp.linear_fc2.weight"},
      {"mlp.dense_4h_to_h.bias", "mlp.c_proj.bias", false, false, "mlp.linear_fc2.bias"},
  };
  return keys;
}

// The parameters outside the blocks, by GPTModel's and GPTModelPipe's names (the final norm of the
// pipe is spec <layers + 2>, matched apart).
const std::map<std::string, std::string>& ModelKeys() {
  static const std::map<std::string, std::string> keys = {
      {"language_model.embedding.word_embeddings.weight", "transformer.wte.weight"},
      {"tied_modules.embed.word_embeddings.weight", "transformer.wte.weight"},
      {"1.word_embeddings.weight", "transformer.wte.weight"},
      {"language_model.embedding.position_embeddings.weight", "transformer.wpe.weight"},
      {"tied_modules.embed.position_embeddings.weight", "transformer.wpe.weight"},
      {"1.position_embeddings.weight", "transformer.wpe.weight"},
      {"language_model.encoder.final_layernorm.weight", "transformer.ln_f.weight"},
      {"language_model.encoder.final_layernorm.bias", "transformer.ln_f.bias"},
      // Megatron-Core's
      {"embedding.word_embeddings.weight", "transformer.wte.weight"},
      {"embedding.position_embeddings.weight", "transformer.wpe.weight"},
      {"decoder.final_layernorm.weight", "transformer.ln_f.weight"},
      {"decoder.final_layernorm.bias", "transformer.ln_f.bias"},
  };
  return keys;
}

const std::pair<std::string, std::vector<int64_t>>* FirstOf(const ModelView& v, const char* pattern) {
  const std::regex re(pattern);
  for (const auto& p : v.params)
    if (std::regex_match(p.first, re)) return &p;
  return nullptr;
}

bool ArgSet(const ModelView& v, const char* key) {
  const pt::Value* a = v.arg ? v.arg(key) : nullptr;
  return a && a->kind != pt::Value::Kind::None && !(a->kind == pt::Value::Kind::Bool && !a->b) &&
         !(a->kind == pt::Value::Kind::Int && a->i == 0);
}

// The output layer apart from the word embedding, where the model has one (GPTModel's, Megatron-DeepSpeed's or
// Megatron-Core's): GPT2LMHeadModel computes it as lm_head with tie_word_embeddings false.
const std::pair<std::string, std::vector<int64_t>>* UntiedOutput(const ModelView& v) {
  return FirstOf(v, R"(^(language_model\.)?output_layer\.weight$)");
}

// What the weights and args show that GPT2LMHeadModel does not compute, each said.
std::vector<std::string> Differences(const ModelView& v, const Facts& f) {
  std::vector<std::string> differs;
  // Megatron-DeepSpeed's names, or Megatron-Core's (linear_qkv, linear_proj, linear_fc1, linear_fc2): what is
  // said of the model is true of either, whichever the target writes.
  const auto *qkv = FirstOf(v, R"(.*self_attention\.(query_key_value|linear_qkv)\.weight)"),
             *dense = FirstOf(v, R"(.*self_attention\.(dense|linear_proj)\.weight)"),
             *up = FirstOf(v, R"(.*mlp\.(dense_h_to_4h|linear_fc1)\.weight)"), *down = FirstOf(v, R"(.*mlp\.(dense_4h_to_h|linear_fc2)\.weight)");
  const auto kv = f.Int("num_key_value_heads"), q = f.Int("num_attention_heads");
  if (kv && q && *kv != *q)
    differs.push_back("grouped-query attention, " + std::to_string(*kv) + " key-value heads for " + std::to_string(*q) +
                      " query heads (GPT2LMHeadModel: one per query head)");
  else if (qkv && dense && qkv->second.size() == 2 && dense->second.size() == 2 && qkv->second[0] != 3 * dense->second[1])
    differs.push_back("grouped-query attention: '" + qkv->first + "' has " + std::to_string(qkv->second[0]) + " rows, not 3 x " +
                      std::to_string(dense->second[1]) + " (GPT2LMHeadModel: one key-value head per query head)");
  const bool swiglu_rows = up && down && up->second.size() == 2 && down->second.size() == 2 && up->second[0] == 2 * down->second[1];
  if (f.Flag("swiglu").value_or(false) || swiglu_rows) differs.push_back("a SwiGLU MLP (GPT2LMHeadModel: GeLU)");
  std::string norm = f.Str("normalization");
  std::transform(norm.begin(), norm.end(), norm.begin(), [](unsigned char c) { return std::tolower(c); });
  if ((!norm.empty() && norm != "layernorm") || !FirstOf(v, R"(.*((layernorm|^\d+)\.bias|layer_norm_bias))"))
    differs.push_back("normalization '" + (norm.empty() ? std::string("without biases") : norm) + "' (GPT2LMHeadModel: LayerNorm with biases)");
  if (f.Str("position_embedding_type") == "rope" || f.Flag("use_rotary_position_embeddings").value_or(false))
    differs.push_back("rotary position embeddings (GPT2LMHeadModel: learned absolute positions only)");
  if (FirstOf(v, R"(^\d+\.lm_head\.weight$)"))
    differs.push_back("an output layer apart from the word embedding in GPTModelPipe's files (written untied from GPTModel's "
                      "output_layer only)");
  else if (f.Flag("untie_embeddings_and_output_weights").value_or(false) && !UntiedOutput(v))
    differs.push_back("untie_embeddings_and_output_weights set in the args, but no output layer among the parameters");
  if (!FirstOf(v, R"(.*self_attention\.(query_key_value|linear_qkv)\.bias)") || !FirstOf(v, R"(.*mlp\.(dense_4h_to_h|linear_fc2)\.bias)"))
    differs.push_back("linear layers without biases, add_bias_linear false (GPT2LMHeadModel: biases on every one)");
  if (v.moe || ArgSet(v, "num_moe_experts")) differs.push_back("Mixture-of-Experts layers (DeepSpeed MoE experts; GPT2LMHeadModel is dense)");
  for (const char* key : {"apply_residual_connection_post_layernorm", "apply_layernorm_1p", "qk_layernorm"})
    if (ArgSet(v, key)) differs.push_back(std::string(key) + " set in the checkpoint's args");
  return differs;
}

}  // namespace

bool Gpt2Shaped(const ModelView& view) { return FirstOf(view, R"(.*position_embeddings\.weight)") != nullptr; }

void RefuseUnlessGpt2(const ModelView& v, const reshard::ExportOptions& o, std::vector<std::string>&) {
  const Facts f(v, o);
  const auto differs = Differences(v, f);
  if (differs.empty()) return;
  throw Error(v.dir + ": a GPT-shaped model (learned position embeddings) that GPT2LMHeadModel does not compute: " +
              JoinNames(differs, "; ") + ". ucp-reshard --format hf writes GPT2LMHeadModel for LayerNorm, learned "
              "positions, GeLU and multi-head attention, LlamaForCausalLM for RMSNorm, rotary and SwiGLU; it does not "
              "guess another architecture. ucp-convert's atomic checkpoint holds its fp32 weights, one file per "
              "parameter (zero/<name>/fp32.pt).");
}

Gpt2Facts Gpt2FactsOf(const reshard::Source& S, const reshard::ExportOptions& o, std::vector<std::string>& notes) {
  const ModelView v = ViewOf(S);
  RefuseUnlessGpt2(v, o, notes);
  const Facts f(v, o);
  Gpt2Facts m;
  std::vector<std::string> missing;
  const auto *wte = FirstOf(v, R"(.*word_embeddings\.weight)"), *wpe = FirstOf(v, R"(.*position_embeddings\.weight)"),
             *down = FirstOf(v, R"(.*mlp\.(dense_4h_to_h|linear_fc2)\.weight)");
  m.hidden = f.Int("hidden_size").value_or(wte && wte->second.size() == 2 ? wte->second[1] : 0);
  std::vector<std::string> names;
  for (const auto& p : v.params) names.push_back(p.first);
  const auto naming = S.manifest["source"].value("naming", "") == "plain" ? reshard::Naming::Plain : reshard::Naming::Pipe;
  m.layers = f.Int("num_layers").value_or(reshard::LayerCountOf(names, naming));
  if (auto h = f.Int("num_attention_heads")) m.heads = *h;
  else missing.push_back("num_attention_heads");
  m.ffn = f.Int("ffn_hidden_size").value_or(down && down->second.size() >= 2 ? down->second.back() : 0);  // stacked: [layers, h, ffn]
  m.tied = !UntiedOutput(v);
  m.positions = wpe && wpe->second.size() == 2 ? wpe->second[0] : 0;
  if (auto p = f.Int("max_position_embeddings"); p && *p != m.positions)
    throw Error(v.dir + ": max_position_embeddings is " + std::to_string(*p) + " but '" + wpe->first + "' has " +
                std::to_string(m.positions) + " rows");
  const bool openai = f.Flag("openai_gelu").value_or(false);
  const auto fused = f.Flag("bias_gelu_fusion");
  if (!openai && !fused) missing.push_back("bias_gelu_fusion");
  m.activation = openai || fused.value_or(false) ? "gelu_new" : "gelu";
  if (m.activation == "gelu_new")
    notes.push_back(std::string(openai ? "openai_gelu" : "bias_gelu_fusion") + " in the checkpoint's args: Megatron computed GeLU's tanh "
                    "approximation, GPT2Config's \"gelu_new\" (Megatron's fused kernel rounds sqrt(2/pi) to 0.79788456: "
                    "logits agree to rounding, not bit for bit)");
  RefuseUnsaid(v.dir, missing);
  m.norm_eps = f.Number("layernorm_epsilon", 1e-5, notes, "Megatron's default 1e-5");
  m.vocab = S.vocab > 0 ? S.vocab : (wte && wte->second.size() == 2 ? wte->second[0] : 0);
  if (m.hidden <= 0 || m.layers <= 0 || m.heads <= 0 || m.hidden % m.heads != 0 || m.ffn <= 0 || m.positions <= 0 || m.vocab <= 0)
    throw Error(v.dir + ": the model's sizes do not describe a GPT-2 model: hidden " + std::to_string(m.hidden) + ", " +
                std::to_string(m.layers) + " layers, " + std::to_string(m.heads) + " heads, FFN " + std::to_string(m.ffn) +
                ", " + std::to_string(m.positions) + " positions, vocabulary " + std::to_string(m.vocab));
  return m;
}

namespace {

// One parameter as its GPT-2 tensor: the shape Megatron holds it in (checked), the rows, a transpose.
class Gpt2Placement {
 public:
  Gpt2Placement(std::string dir, const Gpt2Facts& m) : dir_(std::move(dir)), m_(m) {}
  void Place(const reshard::Atom& a, int atom);
  std::vector<ExportTensor> InModelOrder();

 private:
  Error Refuse(const std::string& name, const std::string& why) const { return Error(dir_ + ": parameter '" + name + "': " + why); }
  void Add(const reshard::Atom& a, ExportTensor t, const std::vector<int64_t>& want);
  void PlaceBlock(const reshard::Atom& a, int atom, int64_t layer, const std::string& key);
  void PlaceStacked(const reshard::Atom& a, int atom, const std::string& key);
  ExportTensor BlockTensor(const reshard::Atom& a, int atom, int64_t layer, const Gpt2Key& key) const;
  std::vector<int64_t> MegatronShape(const std::string& key) const;

  std::string dir_;
  const Gpt2Facts& m_;
  std::map<std::string, ExportTensor> made_;
};

// A block key's shape in Megatron's model (weights [out, in]).
std::vector<int64_t> Gpt2Placement::MegatronShape(const std::string& key) const {
  const int64_t h = m_.hidden;
  if (key == "self_attention.query_key_value.weight") return {3 * h, h};
  if (key == "self_attention.query_key_value.bias") return {3 * h};
  if (key == "self_attention.dense.weight") return {h, h};
  if (key == "mlp.dense_h_to_4h.weight") return {m_.ffn, h};
  if (key == "mlp.dense_h_to_4h.bias") return {m_.ffn};
  if (key == "mlp.dense_4h_to_h.weight") return {h, m_.ffn};
  return {h};  // the norms, the biases of dense and dense_4h_to_h
}

void Gpt2Placement::Add(const reshard::Atom& a, ExportTensor t, const std::vector<int64_t>& want) {
  if (a.shape != want)
    throw Refuse(a.name, "shape " + pt::ShapeString(a.shape) + ", but the model's sizes (hidden " + std::to_string(m_.hidden) + ", " +
                             std::to_string(m_.heads) + " heads, FFN " + std::to_string(m_.ffn) + ") give " + pt::ShapeString(want));
  if (made_.count(t.name)) throw Refuse(a.name, "a second parameter for " + t.name + " (also '" + made_[t.name].source + "')");
  t.source = a.name;
  made_.emplace(t.name, std::move(t));
}

void Gpt2Placement::Place(const reshard::Atom& a, int atom) {
  static const std::regex plain(R"(^language_model\.encoder\.layers\.(\d+)\.(.+)$)"), pipe(R"(^(\d+)\.(.+)$)");
  std::smatch mm;
  const int64_t h = m_.hidden;
  std::string name = a.name;
  if (name.starts_with("decoder.layers.")) return PlaceStacked(a, atom, name.substr(15));
  if (!m_.tied && (name == "output_layer.weight" || name == "language_model.output_layer.weight")) {  // untied: lm_head
    if (a.shape.size() != 2 || a.shape[0] < m_.vocab || a.shape[1] != h)
      throw Refuse(a.name, "shape " + pt::ShapeString(a.shape) + ", expected at least " + std::to_string(m_.vocab) + " rows of " + std::to_string(h));
    return Add(a, {"lm_head.weight", atom, "", 0, m_.vocab, {m_.vocab, h}}, a.shape);
  }
  if (std::regex_match(a.name, mm, pipe) && mm[1].length() < 9 && std::stoll(mm[1]) == m_.layers + 2)
    name = "language_model.encoder.final_layernorm." + std::string(mm[2]);  // GPTModelPipe's final norm
  if (auto it = ModelKeys().find(name); it != ModelKeys().end()) {
    const bool wte = it->second == "transformer.wte.weight", wpe = it->second == "transformer.wpe.weight";
    if (wte && (a.shape.size() != 2 || a.shape[0] < m_.vocab || a.shape[1] != h))
      throw Refuse(a.name, "shape " + pt::ShapeString(a.shape) + ", expected at least " + std::to_string(m_.vocab) + " rows of " + std::to_string(h));
    const int64_t rows = wte ? m_.vocab : wpe ? m_.positions : h;  // the vocabulary padding rows dropped
    const std::vector<int64_t> shape = wte || wpe ? std::vector<int64_t>{rows, h} : std::vector<int64_t>{h};
    return Add(a, {it->second, atom, "", 0, rows, shape}, wte ? a.shape : shape);
  }
  if (std::regex_match(a.name, mm, plain) && std::stoll(mm[1]) < m_.layers) return PlaceBlock(a, atom, std::stoll(mm[1]), mm[2]);
  if (std::regex_match(a.name, mm, pipe) && mm[1].length() < 9 && std::stoll(mm[1]) >= 2 && std::stoll(mm[1]) < m_.layers + 2)
    return PlaceBlock(a, atom, std::stoll(mm[1]) - 2, mm[2]);
  throw Refuse(a.name, "has no place in GPT2LMHeadModel of " + std::to_string(m_.layers) + " layers");
}

// Megatron-Core's stacked tensor: each layer's block tensor, the rows those of its layer.
void Gpt2Placement::PlaceStacked(const reshard::Atom& a, int atom, const std::string& key) {
  const auto it = std::find_if(BlockKeys().begin(), BlockKeys().end(), [&](const Gpt2Key& k) {
    return key == k.mcore || (k.mcore_local && key == k.mcore_local);
  });
  if (it == BlockKeys().end()) throw Refuse(a.name, "'" + key + "' is no part of a GPT2LMHeadModel block");
  std::vector<int64_t> want = MegatronShape(it->megatron);
  want.insert(want.begin(), m_.layers);
  if (a.shape != want)
    throw Refuse(a.name, "shape " + pt::ShapeString(a.shape) + ", but the model's sizes (" + std::to_string(m_.layers) + " layers, hidden " +
                             std::to_string(m_.hidden) + ", " + std::to_string(m_.heads) + " heads, FFN " + std::to_string(m_.ffn) + ") give " +
                             pt::ShapeString(want));
  for (int64_t layer = 0; layer < m_.layers; ++layer) {
    reshard::Atom one = a;  // the layer's tensor, as a block's
    one.shape.erase(one.shape.begin());
    one.name = a.name + " layer " + std::to_string(layer);
    ExportTensor t = BlockTensor(one, atom, layer, *it);
    t.layer = layer;
    Add(one, std::move(t), one.shape);
  }
}

// A block key's tensor in GPT2LMHeadModel's layer `layer`: its shape and rows (the fused QKV's in
// Megatron's head-by-head order unless the sub-parameter sizes say [q; k; v]), transposed for Conv1D.
ExportTensor Gpt2Placement::BlockTensor(const reshard::Atom& a, int atom, int64_t layer, const Gpt2Key& key) const {
  const std::vector<int64_t> want = MegatronShape(key.megatron);
  ExportTensor t{"transformer.h." + std::to_string(layer) + "." + key.hf, atom, "", 0, want[0], want};
  if (key.transposed) t.transposed = true, t.shape = {want[1], want[0]};
  if (key.qkv) {  // [q; k; v] as the sub-parameter sizes say, else Megatron's head-by-head [q_i; k_i; v_i]
    const int64_t h = m_.hidden, hd = m_.hidden / m_.heads;
    if (a.sub_param_sizes.empty()) t.part_rows = h, t.part_step = hd, t.block = hd, t.stride = 3 * hd;
    else if (a.sub_param_sizes != std::vector<int64_t>{h, h, h})
      throw Refuse(a.name, "sub-parameter sizes " + pt::ShapeString(a.sub_param_sizes) + ", but GPT-2's attention has q, k and v of " +
                               std::to_string(h) + " rows each");
  }
  return t;
}

void Gpt2Placement::PlaceBlock(const reshard::Atom& a, int atom, int64_t layer, const std::string& key) {
  const auto it = std::find_if(BlockKeys().begin(), BlockKeys().end(), [&](const Gpt2Key& k) { return key == k.megatron; });
  if (it == BlockKeys().end()) throw Refuse(a.name, "'" + key + "' is no part of a GPT2LMHeadModel block");
  Add(a, BlockTensor(a, atom, layer, *it), MegatronShape(key));
}

std::vector<ExportTensor> Gpt2Placement::InModelOrder() {
  std::vector<std::string> order = {"transformer.wte.weight", "transformer.wpe.weight"};
  for (int64_t i = 0; i < m_.layers; ++i)
    for (const Gpt2Key& k : BlockKeys()) order.push_back("transformer.h." + std::to_string(i) + "." + k.hf);
  order.insert(order.end(), {"transformer.ln_f.weight", "transformer.ln_f.bias"});
  if (!m_.tied) order.push_back("lm_head.weight");
  std::vector<ExportTensor> out;
  for (const std::string& name : order) {
    auto it = made_.find(name);
    if (it == made_.end()) throw Error(dir_ + ": no parameter fills GPT2LMHeadModel's " + name);
    out.push_back(std::move(it->second));
    made_.erase(it);
  }
  return out;  // (every parameter placed has a name of `order`: Place refuses any other)
}

}  // namespace

std::vector<ExportTensor> Gpt2Tensors(const reshard::Source& S, const Gpt2Facts& m) {
  // The import (import_model.h) builds the table from names and shapes alone: no store, its folder in the manifest.
  Gpt2Placement placement(S.reader ? S.reader->dir() : S.manifest.value("dir", std::string()), m);
  for (size_t i = 0; i < S.atoms.size(); ++i) placement.Place(S.atoms[i], static_cast<int>(i));
  return placement.InModelOrder();
}

std::string Gpt2ConfigJson(const Gpt2Facts& m, const std::string& dtype) {
  nlohmann::ordered_json c = {
      {"architectures", {"GPT2LMHeadModel"}},
      {"model_type", "gpt2"},
      {"vocab_size", m.vocab},
      {"n_positions", m.positions},
      {"n_embd", m.hidden},
      {"n_layer", m.layers},
      {"n_head", m.heads},
      {"n_inner", m.ffn},
      {"activation_function", m.activation},
      {"layer_norm_epsilon", m.norm_eps},
      {"scale_attn_weights", true},
      {"scale_attn_by_inverse_layer_idx", false},
      {"reorder_and_upcast_attn", false},
      {"tie_word_embeddings", m.tied},
      {"torch_dtype", TorchDtypeName(dtype)},
  };
  return c.dump(2) + "\n";
}

}  // namespace ucp::formats::hf
