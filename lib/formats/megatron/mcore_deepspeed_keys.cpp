// A Megatron-DeepSpeed GPT as Megatron-Core's keys (mcore_keys.h): each parameter placed in its layer by
// the GPT namings of layout/naming.h, its facts from its weights, checked against its args.
#include <algorithm>
#include <cctype>
#include <map>
#include <set>

#include "core/error.h"
#include "core/format.h"
#include "formats/hf/facts.h"
#include "formats/megatron/mcore_keys.h"
#include "layout/naming.h"
#include "pt/value.h"

namespace ucp::formats::megatron {
using reshard::ExportTensor;

namespace {

// Megatron-DeepSpeed's key inside a layer -> Megatron-Core's (after decoder.layers.), in the order of
// Megatron-Core's layer (its state dict's).
const std::vector<std::pair<std::string, std::string>>& LayerKeys() {
  static const std::vector<std::pair<std::string, std::string>> keys = {
      {"input_layernorm.weight", "self_attention.linear_qkv.layer_norm_weight"},
      {"input_layernorm.bias", "self_attention.linear_qkv.layer_norm_bias"},
      {"self_attention.query_key_value.weight", "self_attention.linear_qkv.weight"},
      {"self_attention.query_key_value.bias", "self_attention.linear_qkv.bias"},
      {"self_attention.dense.weight", "self_attention.linear_proj.weight"},
      {"self_attention.dense.bias", "self_attention.linear_proj.bias"},
      {"post_attention_layernorm.weight", "mlp.linear_fc1.layer_norm_weight"},
      {"post_attention_layernorm.bias", "mlp.linear_fc1.layer_norm_bias"},
      {"mlp.dense_h_to_4h.weight", "mlp.linear_fc1.weight"},
      {"mlp.dense_h_to_4h.bias", "mlp.linear_fc1.bias"},
      {"mlp.dense_4h_to_h.weight", "mlp.linear_fc2.weight"},
      {"mlp.dense_4h_to_h.bias", "mlp.linear_fc2.bias"},
  };
  return keys;
}

bool LayerKey(const std::string& local) {
  return std::any_of(LayerKeys().begin(), LayerKeys().end(), [&](const auto& k) { return k.first == local; });
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

class Placed {
 public:
  Placed(const reshard::Source& S, std::string dir) : S_(S), dir_(std::move(dir)) {
    std::vector<std::string> names;
    for (const auto& a : S.atoms) names.push_back(a.name);
    naming_ = reshard::GptModelNames(names) ? reshard::Naming::Plain : reshard::Naming::Pipe;
    layers_ = reshard::LayerCountOf(names, naming_);
    if (layers_ < 1) throw Error(dir_ + ": no transformer layer among the parameters' names");
    in_layer_.resize(static_cast<size_t>(layers_));
    for (size_t i = 0; i < S.atoms.size(); ++i) {
      const reshard::Atom& a = S.atoms[i];
      reshard::LayerPlace p;
      try {
        p = reshard::PlaceOf(a.name, naming_, static_cast<int>(layers_));
      } catch (const Error& e) {
        throw Error(dir_ + ": " + e.what() + " (--format mcore translates Megatron-DeepSpeed's GPT names)");
      }
      std::map<std::string, int>& where = p.spec >= 2 && p.spec < layers_ + 2 ? in_layer_[static_cast<size_t>(p.spec - 2)] : ends_;
      const std::string key = p.spec == layers_ + 2 ? "final_layernorm." + p.local : p.local;
      if (p.spec >= 2 && p.spec < layers_ + 2 && !LayerKey(key))
        throw Error(dir_ + ": parameter '" + a.name + "': '" + key + "' is no tensor of the layers --format mcore writes (Megatron-Core's "
                    "GPT layer: norms, query_key_value, dense, dense_h_to_4h, dense_4h_to_h)");
      if (!where.emplace(key, static_cast<int>(i)).second) throw Error(dir_ + ": parameter '" + a.name + "' twice in its place");
    }
  }
  int64_t layers() const { return layers_; }
  // The atom at `key` of layer `l` (-1: outside the layers); nullptr where there is none.
  const reshard::Atom* At(int64_t l, const std::string& key) const {
    const auto& where = l < 0 ? ends_ : in_layer_[static_cast<size_t>(l)];
    auto it = where.find(key);
    return it == where.end() ? nullptr : &S_.atoms[static_cast<size_t>(it->second)];
  }
  int Index(const reshard::Atom* a) const { return static_cast<int>(a - S_.atoms.data()); }
  const std::map<std::string, int>& Ends() const { return ends_; }
  const std::map<std::string, int>& Layer(int64_t l) const { return in_layer_[static_cast<size_t>(l)]; }

 private:
  const reshard::Source& S_;
  std::string dir_;
  reshard::Naming naming_;
  int64_t layers_ = 0;
  std::map<std::string, int> ends_;  // word_embeddings.weight, position_embeddings.weight, final_layernorm.*, lm_head.weight
  std::vector<std::map<std::string, int>> in_layer_;
};

ExportTensor Rows(const reshard::Atom& a, int atom, std::vector<int64_t> shape) {
  const int64_t rows = a.shape.empty() ? 1 : a.shape[0];
  ExportTensor t = reshard::RowsAsTensor(a.name, atom, 0, rows, std::move(shape));
  t.source = a.name;
  return t;
}

}  // namespace

OtherFamilyModel ModelOfMegatronDeepSpeed(const reshard::Source& S, const reshard::ExportOptions& o, std::vector<std::string>& notes) {
  const std::string dir = S.reader->dir();
  const Placed at(S, dir);
  const hf::ModelView view = hf::ViewOf(S);
  const hf::Facts said(view, o);
  OtherFamilyModel model;
  ModelFacts& m = model.facts;
  m.layers = at.layers();
  auto need = [&](const reshard::Atom* a, const std::string& what, size_t dims) -> const reshard::Atom& {
    if (!a) throw Error(dir + ": no " + what + " among the parameters");
    if (a->shape.size() != dims)
      throw Error(dir + ": parameter '" + a->name + "' of shape " + pt::ShapeString(a->shape) + " is no " + what);
    return *a;
  };
  const reshard::Atom& embed = need(at.At(-1, "word_embeddings.weight"), "word embedding", 2);
  m.hidden = embed.shape[1];
  m.vocab = S.vocab > 0 ? S.vocab : embed.shape[0];
  if (m.vocab > embed.shape[0]) throw Error(dir + ": the vocabulary (" + std::to_string(m.vocab) + ") is larger than the embedding's rows");
  const auto heads = said.Int("num_attention_heads");
  if (!heads) hf::RefuseUnsaid(dir, {"num_attention_heads"});
  m.heads = *heads;
  auto kv = said.Int("num_key_value_heads");
  if (!kv && said.Flag("group_query_attention").value_or(false)) kv = said.Int("num_query_groups");
  m.head_dim = said.Int("kv_channels").value_or(m.heads > 0 ? m.hidden / m.heads : 0);
  const reshard::Atom& qkv = need(at.At(0, "self_attention.query_key_value.weight"), "query_key_value weight of layer 0", 2);
  // query_key_value's sub-parameter sizes ([q, k, v] rows) say the key-value heads where the head size is known
  const bool sized = qkv.sub_param_sizes.size() == 3 && m.head_dim > 0 && qkv.sub_param_sizes[1] % m.head_dim == 0;
  if (kv && sized && *kv != qkv.sub_param_sizes[1] / m.head_dim)
    throw Error(said.Where("num_key_value_heads") + ": " + std::to_string(*kv) + " key-value heads, but the weights of " + dir + " hold " +
                std::to_string(qkv.sub_param_sizes[1] / m.head_dim) + " (parameter '" + qkv.name + "': " +
                std::to_string(qkv.sub_param_sizes[1]) + " key rows of heads of " + std::to_string(m.head_dim) + ")");
  if (!kv && sized) kv = qkv.sub_param_sizes[1] / m.head_dim;
  m.groups = kv.value_or(m.heads);
  if (m.heads < 1 || m.groups < 1 || m.heads % m.groups != 0 || m.head_dim < 1)
    throw Error(dir + ": " + std::to_string(m.heads) + " attention heads, " + std::to_string(m.groups) + " key-value heads of " +
                std::to_string(m.head_dim) + ": no grouped-query attention (check num_attention_heads, num_key_value_heads, kv_channels)");
  const reshard::Atom& down = need(at.At(0, "mlp.dense_4h_to_h.weight"), "dense_4h_to_h weight of layer 0", 2);
  m.ffn = down.shape[1];
  const reshard::Atom& up = need(at.At(0, "mlp.dense_h_to_4h.weight"), "dense_h_to_4h weight of layer 0", 2);
  m.swiglu = up.shape[0] == 2 * m.ffn;
  if (!m.swiglu && up.shape[0] != m.ffn)
    throw Error(dir + ": parameter '" + up.name + "' has " + std::to_string(up.shape[0]) + " rows for an FFN of " + std::to_string(m.ffn));
  if (auto sw = said.Flag("swiglu"); sw && *sw != m.swiglu)
    throw Error(dir + ": the args say swiglu " + std::string(*sw ? "true" : "false") + ", the weights' dense_h_to_4h rows the other");
  m.rms_norm = !at.At(0, "input_layernorm.bias");
  if (const std::string n = Lower(said.Str("normalization")); !n.empty() && (n == "rmsnorm") != m.rms_norm)
    throw Error(dir + ": the args say normalization " + n + ", but the norms " + (m.rms_norm ? "have no" : "have") + " biases");
  m.learned_positions = at.At(-1, "position_embeddings.weight") != nullptr;
  m.positions = m.learned_positions ? at.At(-1, "position_embeddings.weight")->shape.at(0) : said.Int("max_position_embeddings").value_or(0);
  if (!m.learned_positions) {
    const std::string type = said.Str("position_embedding_type");
    if (type != "rope" && !said.Flag("use_rotary_position_embeddings").value_or(false))
      throw Error(dir + ": no position embeddings and the args do not say rope (position_embedding_type): give --model-config "
                  "with position_embedding_type \"rope\" for a rotary model");
    m.rope_base = said.Number("rope_theta", 10000, notes, "Megatron's rotary base 10000 written");
    m.rotary_percent = said.Number("rotary_percent", 1.0, notes, "rotary over the whole head (1.0) written");
    if (m.positions <= 0) hf::RefuseUnsaid(dir, {"max_position_embeddings"});
  }
  m.eps = said.Number("layernorm_epsilon", 1e-5, notes, "Megatron's default 1e-5 written");
  // What the weights decide, against what the args or --model-config say of it: a contradiction refused by name.
  std::vector<std::pair<const char*, int64_t>> decided = {{"hidden_size", m.hidden}, {"num_layers", m.layers}, {"ffn_hidden_size", m.ffn}};
  if (m.learned_positions) decided.emplace_back("max_position_embeddings", m.positions);
  std::set<std::string> checked;
  if (sized) checked.insert({"num_key_value_heads", "num_query_groups"});
  for (const auto& [key, value] : decided) {
    checked.insert(key);
    if (const auto v = said.Int(key); v && *v != value)
      throw Error(said.Where(key) + ": " + key + " is " + std::to_string(*v) + ", but the weights of " + dir + " hold " + std::to_string(value) +
                  " (" + (std::string(key) == "num_layers" ? "the layers' names" : std::string(key) == "hidden_size" ? "the word embedding's columns"
                          : std::string(key) == "ffn_hidden_size" ? "dense_4h_to_h's columns" : "the position embedding's rows") + ")");
  }
  if (const auto trusted = said.OnTrust(checked); !trusted.empty())
    notes.push_back("taken on trust from --model-config, as nothing in the checkpoint records them to check against (a wrong value, "
                    "a head count above all, still loads in Megatron-LM and computes other logits): " + JoinNames(trusted));
  m.bias_linear = at.At(0, "self_attention.dense.bias") != nullptr;
  m.bias_qkv = at.At(0, "self_attention.query_key_value.bias") != nullptr;
  m.tied = at.At(-1, "lm_head.weight") == nullptr;
  if (!m.swiglu) {
    m.openai_gelu = said.Flag("openai_gelu").value_or(false);
    const auto fusion = said.Flag("bias_gelu_fusion");
    if (!fusion && !m.openai_gelu && m.bias_linear)
      hf::RefuseUnsaid(dir, {"bias_gelu_fusion"});  // Megatron's default with biases: the tanh approximation; which one ran is not in the weights
    m.bias_gelu_fusion = fusion.value_or(false);
  }
  // Every layer holds the tensors layer 0 holds, no other.
  for (int64_t l = 1; l < m.layers; ++l)
    if (at.Layer(l).size() != at.Layer(0).size())
      throw Error(dir + ": layer " + std::to_string(l) + " holds " + std::to_string(at.Layer(l).size()) + " tensors, layer 0 " +
                  std::to_string(at.Layer(0).size()) + ": --format mcore writes layers of one kind");
  if (m.bias_linear != (at.At(0, "mlp.dense_h_to_4h.bias") != nullptr) || m.bias_linear != (at.At(0, "mlp.dense_4h_to_h.bias") != nullptr) ||
      (m.bias_linear && !m.bias_qkv))
    throw Error(dir + ": biases on some linear layers and not others: Megatron-Core's add_bias_linear puts them on every one "
                "(add_qkv_bias on linear_qkv alone)");

  const int64_t d = m.head_dim, q_rows = m.heads * d, kv_rows = m.groups * d, per = m.heads / m.groups;
  auto segments = [&](int64_t l, const std::string& local, const std::vector<int64_t>& shape) -> std::vector<Segment> {
    const reshard::Atom* a = at.At(l, local);
    if (!a) throw Error(dir + ": layer " + std::to_string(l) + " has no " + local);
    std::vector<int64_t> want = shape;
    if (a->shape != want)
      throw Error(dir + ": parameter '" + a->name + "' of shape " + pt::ShapeString(a->shape) + ", the model's sizes give " +
                  pt::ShapeString(want) + " (hidden " + std::to_string(m.hidden) + ", " + std::to_string(m.heads) + " heads, " +
                  std::to_string(m.groups) + " key-value heads of " + std::to_string(d) + ", FFN " + std::to_string(m.ffn) + ")");
    const ExportTensor t = Rows(*a, at.Index(a), shape);
    if (local.rfind("self_attention.query_key_value.", 0) != 0) return {Segment{t, 0, t.rows()}};
    if (a->sub_param_sizes.empty()) {  // ParallelAttention's own order, head by head: per query group at one head a group
      if (m.groups != m.heads)
        throw Error(dir + ": parameter '" + a->name + "': grouped-query attention without sub-parameter sizes: the order of its "
                    "query, key and value rows is not recorded");
      return {Segment{t, 0, t.rows()}};
    }
    if (a->sub_param_sizes != std::vector<int64_t>{q_rows, kv_rows, kv_rows})
      throw Error(dir + ": parameter '" + a->name + "': sub-parameter sizes " + pt::ShapeString(a->sub_param_sizes) + ", the model's [q; k; v] " +
                  pt::ShapeString({q_rows, kv_rows, kv_rows}));
    std::vector<Segment> rows;
    for (int64_t g = 0; g < m.groups; ++g) {
      rows.push_back({t, g * per * d, per * d});
      rows.push_back({t, q_rows + g * d, d});
      rows.push_back({t, q_rows + kv_rows + g * d, d});
    }
    return rows;
  };
  const std::vector<int64_t> h{m.hidden};
  const int64_t qkv_rows = q_rows + 2 * kv_rows, fc1_rows = m.swiglu ? 2 * m.ffn : m.ffn;
  const std::map<std::string, std::vector<int64_t>> layer_shapes = {
      {"input_layernorm.weight", h}, {"input_layernorm.bias", h},
      {"self_attention.query_key_value.weight", {qkv_rows, m.hidden}}, {"self_attention.query_key_value.bias", {qkv_rows}},
      {"self_attention.dense.weight", {m.hidden, q_rows}}, {"self_attention.dense.bias", h},
      {"post_attention_layernorm.weight", h}, {"post_attention_layernorm.bias", h},
      {"mlp.dense_h_to_4h.weight", {fc1_rows, m.hidden}}, {"mlp.dense_h_to_4h.bias", {fc1_rows}},
      {"mlp.dense_4h_to_h.weight", {m.hidden, m.ffn}}, {"mlp.dense_4h_to_h.bias", h}};
  auto end_key = [&](const std::string& local, const std::string& key, int64_t rows) {
    const reshard::Atom* a = at.At(-1, local);
    if (!a) return;
    McoreKey k;
    k.key = key, k.name = DistNameOfKey(key, m.swiglu), k.shape = a->shape;
    k.shape[0] = rows > 0 ? rows : k.shape[0];
    if (a->shape.size() == 2 && a->shape[1] != m.hidden)
      throw Error(dir + ": parameter '" + a->name + "' of shape " + pt::ShapeString(a->shape) + " for a hidden size of " + std::to_string(m.hidden));
    k.layers.push_back({Segment{Rows(*a, at.Index(a), a->shape), 0, k.shape[0]}});
    model.keys.push_back(std::move(k));
  };
  end_key("word_embeddings.weight", "embedding.word_embeddings.weight", m.vocab);
  end_key("position_embeddings.weight", "embedding.position_embeddings.weight", 0);
  for (const auto& [local, key] : LayerKeys()) {
    if (!at.At(0, local)) continue;
    McoreKey k;
    k.key = "decoder.layers." + key, k.name = DistNameOfKey(k.key, m.swiglu), k.stacked = true;
    k.shape = layer_shapes.at(local);
    for (int64_t l = 0; l < m.layers; ++l) k.layers.push_back(segments(l, local, k.shape));
    model.keys.push_back(std::move(k));
  }
  end_key("final_layernorm.weight", "decoder.final_layernorm.weight", 0);
  end_key("final_layernorm.bias", "decoder.final_layernorm.bias", 0);
  if (const reshard::Atom* head = at.At(-1, "lm_head.weight"); head && head->shape.at(0) < m.vocab)
    throw Error(dir + ": parameter '" + head->name + "' has fewer rows than the vocabulary");
  end_key("lm_head.weight", "output_layer.weight", m.vocab);
  for (const auto& [local, index] : at.Ends())
    if (local != "word_embeddings.weight" && local != "position_embeddings.weight" && local != "final_layernorm.weight" &&
        local != "final_layernorm.bias" && local != "lm_head.weight")
      throw Error(dir + ": parameter '" + S.atoms[static_cast<size_t>(index)].name + "' has no place in Megatron-Core's GPT");
  return model;
}

}  // namespace ucp::formats::megatron
