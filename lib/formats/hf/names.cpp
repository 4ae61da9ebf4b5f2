#include "formats/hf/names.h"

#include <algorithm>
#include <map>
#include <regex>

#include "core/error.h"

namespace ucp::formats::hf {
using reshard::ExportTensor;

namespace {

// Megatron-Core's stacked experts (SequentialMLP's torch_dist keys, after decoder.layers.): [gate; up] and down.
constexpr const char* kMcoreExpertsUp = "mlp.experts.experts.linear_fc1.weight";
constexpr const char* kMcoreExpertsDown = "mlp.experts.experts.linear_fc2.weight";

// A parameter's place in the model: the embedding, a layer's key, the final norm or the output layer.
struct Slot {
  enum Kind { Embedding, Layer, Stacked, Norm, Output } kind;  // Stacked: every layer's, on the leading axis
  int64_t layer = -1;
  std::string key;  // inside the layer: "self_attention.dense.weight"
};

// The parameters outside the layers, by each naming's name.
const std::map<std::string, Slot::Kind>& ModelSlots() {
  static const std::map<std::string, Slot::Kind> slots = {
      // Megatron-Core's (torch_dist)
      {"embedding.word_embeddings.weight", Slot::Embedding},
      {"decoder.final_layernorm.weight", Slot::Norm},
      {"output_layer.weight", Slot::Output},
      // torchtitan's Llama (FSDP2 / DTensor checkpoints with its names)
      {"tok_embeddings.weight", Slot::Embedding},
      {"norm.weight", Slot::Norm},
      {"output.weight", Slot::Output},
      // Megatron-DeepSpeed's GPTModel (the pipeline's tied embedding too)
      {"language_model.embedding.word_embeddings.weight", Slot::Embedding},
      {"tied_modules.embed.word_embeddings.weight", Slot::Embedding},
      {"language_model.encoder.final_layernorm.weight", Slot::Norm},
      {"language_model.output_layer.weight", Slot::Output},
  };
  return slots;
}

std::optional<Slot> SlotOf(const std::string& name, int64_t layers) {
  static const std::regex plain_layer(R"(^language_model\.encoder\.layers\.(\d+)\.(.+)$)"),
      pipe(R"(^(\d+)\.(.+)$)"), titan_layer(R"(^layers\.(\d+)\.(.+)$)");
  std::smatch m;
  if (auto it = ModelSlots().find(name); it != ModelSlots().end()) return Slot{it->second, -1, ""};
  // Megatron-Core's: the layers stacked in one tensor per key.
  if (name.starts_with("decoder.layers.")) return Slot{Slot::Stacked, -1, name.substr(15)};
  if (std::regex_match(name, m, titan_layer) && m[1].length() < 9) {
    const int64_t i = std::stoll(m[1]);
    if (i < layers) return Slot{Slot::Layer, i, m[2]};
    return std::nullopt;
  }
  if (std::regex_match(name, m, plain_layer)) {
    const int64_t i = std::stoll(m[1]);
    if (i < layers) return Slot{Slot::Layer, i, m[2]};
    return std::nullopt;
  }
  if (std::regex_match(name, m, pipe) && m[1].length() < 9) {  // GPTModelPipe: 1 the embedding, 2..L+1 the layers
    const int64_t spec = std::stoll(m[1]);
    if (spec == 1 && m[2] == "word_embeddings.weight") return Slot{Slot::Embedding, -1, ""};
    if (spec >= 2 && spec < layers + 2) return Slot{Slot::Layer, spec - 2, m[2]};
    if (spec == layers + 2 && m[2] == "weight") return Slot{Slot::Norm, -1, ""};
    if (spec == layers + 3 && m[2] == "lm_head.weight") return Slot{Slot::Output, -1, ""};
  }
  return std::nullopt;
}

// A layer's key that is one Hugging Face tensor (the name after model.layers.<i>.), and whether its
// heads' rotary pairs are interleaved (torchtitan's complex rotary; Hugging Face's rotates halves).
struct Renamed {
  std::string name;
  bool rotary = false;
};
// torchtitan's Llama layer keys, in its TransformerBlock's state-dict order, and their Hugging Face
// names: q and k rotate interleaved pairs. The one table both ways (RenamedKeys, TorchtitanName).
const std::vector<std::pair<std::string, Renamed>>& TitanKeys() {
  static const std::vector<std::pair<std::string, Renamed>> keys = {
      {"attention.wq.weight", {"self_attn.q_proj.weight", true}},
      {"attention.wk.weight", {"self_attn.k_proj.weight", true}},
      {"attention.wv.weight", {"self_attn.v_proj.weight"}},
      {"attention.wo.weight", {"self_attn.o_proj.weight"}},
      {"feed_forward.w1.weight", {"mlp.gate_proj.weight"}},
      {"feed_forward.w2.weight", {"mlp.down_proj.weight"}},
      {"feed_forward.w3.weight", {"mlp.up_proj.weight"}},
      {"attention_norm.weight", {"input_layernorm.weight"}},
      {"ffn_norm.weight", {"post_attention_layernorm.weight"}},
  };
  return keys;
}

const std::map<std::string, Renamed>& RenamedKeys() {
  static const std::map<std::string, Renamed> keys = [] {
    std::map<std::string, Renamed> k = {
        // Megatron-DeepSpeed's
        {"input_layernorm.weight", {"input_layernorm.weight"}},
        {"post_attention_layernorm.weight", {"post_attention_layernorm.weight"}},
        {"self_attention.dense.weight", {"self_attn.o_proj.weight"}},
        {"self_attention.dense.bias", {"self_attn.o_proj.bias"}},
        {"mlp.dense_4h_to_h.weight", {"mlp.down_proj.weight"}},
        {"mlp.dense_4h_to_h.bias", {"mlp.down_proj.bias"}},
        // DeepSpeed MoE's gate (Mixtral's router)
        {"mlp.deepspeed_moe.gate.wg.weight", {"block_sparse_moe.gate.weight"}},
        // Megatron-Core's: the norms fused into the next linear layer's (TE's names) or apart (its
        // input_layernorm.weight is Megatron-DeepSpeed's name, above)
        {"self_attention.linear_qkv.layer_norm_weight", {"input_layernorm.weight"}},
        {"mlp.linear_fc1.layer_norm_weight", {"post_attention_layernorm.weight"}},
        {"pre_mlp_layernorm.weight", {"post_attention_layernorm.weight"}},
        {"self_attention.linear_proj.weight", {"self_attn.o_proj.weight"}},
        {"self_attention.linear_proj.bias", {"self_attn.o_proj.bias"}},
        {"mlp.linear_fc2.weight", {"mlp.down_proj.weight"}},
        {"mlp.linear_fc2.bias", {"mlp.down_proj.bias"}},
        // Megatron-Core MoE's router (Mixtral's gate; its experts: PlaceExperts)
        {"mlp.router.weight", {"block_sparse_moe.gate.weight"}},
    };
    for (const auto& [key, renamed] : TitanKeys()) k.emplace(key, renamed);  // torchtitan's
    return k;
  }();
  return keys;
}

// How a fused tensor's rows are joined: [q; k; v], [gate; up], or per query group the group's query
// heads, then its key head, then its value head (Megatron-Core's attention splits each group's rows so).
enum class Joined { QueryKeyValue, GateUp, PerQueryGroup };

// A layer's fused tensor, by its key without .weight / .bias, and the tensors it is cut into.
struct Fused {
  const char* key;
  std::vector<const char*> names;
  Joined joined;
};
const std::vector<Fused>& FusedKeys() {
  static const std::vector<Fused> keys = {
      // Megatron-DeepSpeed's: as its sub-parameter sizes say
      {"self_attention.query_key_value", {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"}, Joined::QueryKeyValue},
      {"mlp.dense_h_to_4h", {"mlp.gate_proj", "mlp.up_proj"}, Joined::GateUp},
      // Megatron-Core's: linear_fc1 of a gated MLP is saved [gate; up] whole (its SwiGLU sharded factory
      // puts each TP rank's gate rows in the first half, its up rows in the second)
      {"mlp.linear_fc1", {"mlp.gate_proj", "mlp.up_proj"}, Joined::GateUp},
      {"self_attention.linear_qkv", {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"}, Joined::PerQueryGroup},
  };
  return keys;
}

// A layer's Megatron key -> its Hugging Face tensors: the name after model.layers.<i>. and the rows
// of the fused tensor each takes, as sizes of consecutive row runs (one run: the whole tensor).
struct Cut {
  std::vector<std::string> names;
  std::vector<int64_t> rows;  // empty: the whole tensor
  bool rotary = false;        // its heads' rotary pairs interleaved (torchtitan): re-ordered to rotate-half
  // Non-empty: the tensors' rows interleave in groups of `group_rows` (Megatron-Core's QKV), each
  // taking blocks[k] rows of every group, in order; else each takes its `rows` in turn.
  std::vector<int64_t> blocks = {};
  int64_t group_rows = 0;
  // The rows' layout is the module's own whatever the checkpoint records (a DeepSpeed MoE expert's
  // [gate; up]: ParallelMLP's SwiGLU halves, the expert never split by TP): sub-parameter sizes,
  // where the checkpoint has them, must agree.
  bool own_layout = false;
};

// A DeepSpeed MoE expert's tensors (mlp.deepspeed_moe.experts.deepspeed_experts.<E>.<key>) as
// Mixtral's (block_sparse_moe.experts.<E>.<names>): w1 the gate, w3 the up projection, w2 the down.
struct ExpertKey {
  const char* key;
  std::vector<const char*> names;
};
const std::vector<ExpertKey>& ExpertKeys() {
  static const std::vector<ExpertKey> keys = {
      {"dense_h_to_4h.weight", {"w1.weight", "w3.weight"}},
      {"dense_4h_to_h.weight", {"w2.weight"}},
  };
  return keys;
}

Cut FusedCut(const Fused& f, const std::string& kind, const LlamaFacts& m) {
  const int64_t q = m.heads * m.head_dim, kv = m.kv_heads * m.head_dim;
  Cut cut;
  for (const char* n : f.names) cut.names.push_back(n + ("." + kind));
  if (f.joined == Joined::GateUp) {
    cut.rows = {m.ffn, m.ffn};
    return cut;
  }
  cut.rows = {q, kv, kv};
  if (f.joined == Joined::PerQueryGroup) {  // q, k and v each taken group by group
    const int64_t per_group = m.heads / m.kv_heads;
    cut.blocks = {per_group * m.head_dim, m.head_dim, m.head_dim};
    cut.group_rows = (per_group + 2) * m.head_dim;
  }
  return cut;
}

std::optional<Cut> CutOf(const std::string& key, const LlamaFacts& m) {
  static const std::regex expert(R"(^mlp\.deepspeed_moe\.experts\.deepspeed_experts\.(\d+)\.(.+)$)");
  std::smatch e;
  if (std::regex_match(key, e, expert) && e[1].length() < 9 && std::stoll(e[1]) < m.experts) {
    for (const ExpertKey& k : ExpertKeys()) {
      if (e[2] != k.key) continue;
      Cut cut;
      for (const char* n : k.names) cut.names.push_back("block_sparse_moe.experts." + e[1].str() + "." + n);
      if (cut.names.size() == 2) cut.rows = {m.ffn, m.ffn}, cut.own_layout = true;
      return cut;
    }
    return std::nullopt;
  }
  if (auto it = RenamedKeys().find(key); it != RenamedKeys().end()) return Cut{{it->second.name}, {}, it->second.rotary};
  const size_t dot = key.rfind('.');
  const std::string kind = dot == std::string::npos ? "" : key.substr(dot + 1);
  if (kind != "weight" && kind != "bias") return std::nullopt;
  for (const Fused& f : FusedKeys())
    if (key.compare(0, dot, f.key) == 0) return FusedCut(f, kind, m);
  return std::nullopt;
}

// The shape of a layer's tensor that no fused tensor is cut into, by its Hugging Face name.
std::vector<int64_t> WholeShape(const std::string& name, const LlamaFacts& m) {
  const int64_t q = m.heads * m.head_dim, kv = m.kv_heads * m.head_dim;
  if (name == "self_attn.o_proj.weight") return {m.hidden, q};
  if (name == "mlp.down_proj.weight") return {m.hidden, m.ffn};
  if (name == "self_attn.q_proj.weight") return {q, m.hidden};
  if (name == "self_attn.k_proj.weight" || name == "self_attn.v_proj.weight") return {kv, m.hidden};
  if (name == "mlp.gate_proj.weight" || name == "mlp.up_proj.weight") return {m.ffn, m.hidden};
  if (name == "block_sparse_moe.gate.weight") return {m.experts, m.hidden};
  if (name.ends_with(".w2.weight")) return {m.hidden, m.ffn};  // an expert's down projection
  return {m.hidden};  // the norms, the biases of o_proj and down_proj
}

// Each layer's tensors in the order LlamaForCausalLM holds them.
const std::vector<std::string>& LayerOrder() {
  static const std::vector<std::string> order = {
      "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.weight",
      "self_attn.k_proj.bias", "self_attn.v_proj.weight", "self_attn.v_proj.bias", "self_attn.o_proj.weight",
      "self_attn.o_proj.bias", "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.gate_proj.bias",
      "mlp.up_proj.weight", "mlp.up_proj.bias", "mlp.down_proj.weight", "mlp.down_proj.bias"};
  return order;
}

// Where a layer's tensors come from: layer `stacked` of atom `atom` (or all of it, -1).
struct InLayer {
  std::string prefix;  // model.layers.<i>.
  int atom = 0;
  int64_t stacked = -1;
  ExportTensor Tensor(const std::string& name, int64_t begin, int64_t end, std::vector<int64_t> shape) const {
    ExportTensor t = reshard::RowsAsTensor(prefix + name, atom, begin, end, std::move(shape));
    t.layer = stacked;
    return t;
  }
};

// The model's tensors as the parameters are placed, by their Hugging Face name: a second parameter
// for one, a shape the model's sizes do not give, is refused naming the parameter.
class Placement {
 public:
  Placement(std::string dir, const LlamaFacts& m) : dir_(std::move(dir)), m_(m) {}

  // Atom `atom` of the source, `a`, as its slot says.
  void Place(const reshard::Atom& a, int atom);
  // LlamaForCausalLM's order; a tensor it needs that no parameter filled is refused.
  std::vector<ExportTensor> InModelOrder();

 private:
  Error Refuse(const std::string& name, const std::string& why) const {
    return Error(dir_ + ": parameter '" + name + "': " + why);
  }
  void Add(const std::string& source, ExportTensor t);
  void Expect(const std::string& name, const std::vector<int64_t>& shape, const std::vector<int64_t>& want, bool per_layer) const;
  void PlaceEnd(const reshard::Atom& a, int atom, Slot::Kind kind);
  // One layer's tensor(s) from `a` (of layer `stacked` of it, or -1): whole, or cut by rows as the
  // checkpoint fused them.
  void PlaceLayer(const reshard::Atom& a, int atom, int64_t layer, int64_t stacked, const std::string& key,
                  const std::vector<int64_t>& shape);
  void PlaceFused(const reshard::Atom& a, const Cut& cut, const std::vector<int64_t>& shape, int64_t cols, const InLayer& in);
  // Megatron-Core's experts of one layer, stacked after it ([experts, rows, cols] per layer): each
  // expert's linear_fc1 [gate; up] as Mixtral's w1 and w3, its linear_fc2 as w2.
  void PlaceExperts(const reshard::Atom& a, const std::string& key, const std::vector<int64_t>& shape, const InLayer& in);

  std::string dir_;
  const LlamaFacts& m_;
  std::map<std::string, ExportTensor> made_;
};

void Placement::Add(const std::string& source, ExportTensor t) {
  if (made_.count(t.name)) throw Refuse(source, "a second parameter for " + t.name + " (also '" + made_[t.name].source + "')");
  t.source = source;
  made_.emplace(t.name, std::move(t));
}

void Placement::Expect(const std::string& name, const std::vector<int64_t>& shape, const std::vector<int64_t>& want,
                       bool per_layer) const {
  if (shape != want)
    throw Refuse(name, "shape " + pt::ShapeString(shape) + (per_layer ? " per layer" : "") + ", but the model's sizes (hidden " +
                           std::to_string(m_.hidden) + ", " + std::to_string(m_.heads) + " heads and " + std::to_string(m_.kv_heads) +
                           " key-value heads of " + std::to_string(m_.head_dim) + ", FFN " + std::to_string(m_.ffn) + ") give " +
                           pt::ShapeString(want) + ": check num_attention_heads, num_key_value_heads, kv_channels, ffn_hidden_size");
}

void Placement::Place(const reshard::Atom& a, int atom) {
  const auto slot = SlotOf(a.name, m_.layers);
  if (!slot) throw Refuse(a.name, "has no place in LlamaForCausalLM of " + std::to_string(m_.layers) + " layers");
  const std::vector<int64_t>& shape = a.shape;
  switch (slot->kind) {
    case Slot::Embedding:
    case Slot::Output:
    case Slot::Norm: PlaceEnd(a, atom, slot->kind); break;
    case Slot::Layer: PlaceLayer(a, atom, slot->layer, -1, slot->key, shape); break;
    case Slot::Stacked: {  // layer i is index i of the leading axis
      if (shape.size() < 2 || shape[0] != m_.layers)
        throw Refuse(a.name, "shape " + pt::ShapeString(shape) + ": a stacked layers' tensor of the model's " + std::to_string(m_.layers) +
                                 " layers has them on its leading axis");
      const std::vector<int64_t> per_layer(shape.begin() + 1, shape.end());
      for (int64_t l = 0; l < m_.layers; ++l) PlaceLayer(a, atom, l, l, slot->key, per_layer);
      break;
    }
  }
}

// The embedding, the output layer (their padding rows past the vocabulary dropped) or the final norm.
void Placement::PlaceEnd(const reshard::Atom& a, int atom, Slot::Kind kind) {
  const std::vector<int64_t>& shape = a.shape;
  if (kind == Slot::Norm) {
    Expect(a.name, shape, {m_.hidden}, false);
    Add(a.name, reshard::RowsAsTensor("model.norm.weight", atom, 0, m_.hidden, {m_.hidden}));
    return;
  }
  if (shape.size() != 2 || shape[1] != m_.hidden || shape[0] < m_.vocab)
    throw Refuse(a.name, "shape " + pt::ShapeString(shape) + ", expected at least " + std::to_string(m_.vocab) + " rows of " +
                             std::to_string(m_.hidden));
  const std::string name = kind == Slot::Embedding ? "model.embed_tokens.weight" : "lm_head.weight";
  Add(a.name, reshard::RowsAsTensor(name, atom, 0, m_.vocab, {m_.vocab, m_.hidden}));
}

void Placement::PlaceLayer(const reshard::Atom& a, int atom, int64_t layer, int64_t stacked, const std::string& key,
                           const std::vector<int64_t>& shape) {
  if (stacked >= 0 && (key == kMcoreExpertsUp || key == kMcoreExpertsDown))
    return PlaceExperts(a, key, shape, InLayer{"model.layers." + std::to_string(layer) + ".", atom, stacked});
  const auto cut = CutOf(key, m_);
  if (!cut) throw Refuse(a.name, "'" + key + "' is no part of a LlamaForCausalLM layer");
  if (shape.empty()) throw Refuse(a.name, "shape [] (a scalar), but every tensor of a layer has rows");
  const InLayer in{"model.layers." + std::to_string(layer) + ".", atom, stacked};
  const int64_t cols = shape.size() == 1 ? 1 : shape[1];
  if (!cut->rows.empty()) return PlaceFused(a, *cut, shape, cols, in);
  Expect(a.name, shape, WholeShape(cut->names[0], m_), stacked >= 0);
  ExportTensor t = in.Tensor(cut->names[0], 0, shape[0], shape);
  if (cut->rotary) t.rotary_head_dim = m_.head_dim;
  Add(a.name, std::move(t));
}

// A fused tensor (`cols` columns; a bias: 1): its rows as the checkpoint joined them.
void Placement::PlaceFused(const reshard::Atom& a, const Cut& cut, const std::vector<int64_t>& shape, int64_t cols,
                           const InLayer& in) {
  const bool bias = shape.size() == 1;
  int64_t rows = 0;
  for (int64_t r : cut.rows) rows += r;
  Expect(a.name, shape, bias ? std::vector<int64_t>{rows} : std::vector<int64_t>{rows, m_.hidden}, in.stacked >= 0);
  if (in.stacked < 0 && a.sub_param_sizes != cut.rows && !(cut.own_layout && a.sub_param_sizes.empty()))  // Megatron-DeepSpeed's: as its sub-parameter sizes say
    throw Refuse(a.name, a.sub_param_sizes.empty()
                             ? "the checkpoint does not say how its rows are fused (no sub-parameter shape in its "
                               "universal_checkpoint_info): Megatron models interleave them in more than one way, "
                               "and ucp does not guess"
                             : "sub-parameter sizes " + pt::ShapeString(a.sub_param_sizes) + ", the model's sizes give " + pt::ShapeString(cut.rows));
  int64_t at = 0;
  for (size_t k = 0; k < cut.names.size(); ++k) {
    std::vector<int64_t> s = bias ? std::vector<int64_t>{cut.rows[k]} : std::vector<int64_t>{cut.rows[k], cols};
    if (cut.blocks.empty()) {
      Add(a.name, in.Tensor(cut.names[k], at, at + cut.rows[k], s));
      at += cut.rows[k];
      continue;
    }
    ExportTensor t = in.Tensor(cut.names[k], at, rows, s);  // blocks[k] rows of each group, from the group's offset
    t.block = cut.blocks[k], t.stride = cut.group_rows;
    Add(a.name, std::move(t));
    at += cut.blocks[k];
  }
}

void Placement::PlaceExperts(const reshard::Atom& a, const std::string& key, const std::vector<int64_t>& shape, const InLayer& in) {
  const bool up = key == kMcoreExpertsUp;
  const std::vector<int64_t> want = up ? std::vector<int64_t>{m_.experts, 2 * m_.ffn, m_.hidden} : std::vector<int64_t>{m_.experts, m_.hidden, m_.ffn};
  if (m_.experts <= 0 || shape != want)
    throw Refuse(a.name, "shape " + pt::ShapeString(shape) + " per layer, but " + std::to_string(m_.experts) + " experts of FFN " +
                             std::to_string(m_.ffn) + " and hidden " + std::to_string(m_.hidden) + " give " + pt::ShapeString(want));
  for (int64_t e = 0; e < m_.experts; ++e) {
    const std::string prefix = "block_sparse_moe.experts." + std::to_string(e) + ".";
    auto expert = [&](const char* w, int64_t begin, int64_t end, std::vector<int64_t> s) {
      ExportTensor t = in.Tensor(prefix + w, begin, end, std::move(s));
      t.expert = e;
      Add(a.name, std::move(t));
    };
    if (up) {
      expert("w1.weight", 0, m_.ffn, {m_.ffn, m_.hidden});
      expert("w3.weight", m_.ffn, 2 * m_.ffn, {m_.ffn, m_.hidden});
    } else {
      expert("w2.weight", 0, m_.hidden, {m_.hidden, m_.ffn});
    }
  }
}

std::vector<ExportTensor> Placement::InModelOrder() {
  std::vector<ExportTensor> out;
  auto take = [&](const std::string& name, bool needed) {
    auto it = made_.find(name);
    if (it == made_.end()) {
      if (needed) throw Error(dir_ + ": no parameter fills LlamaForCausalLM's " + name);
      return;
    }
    out.push_back(std::move(it->second));
    made_.erase(it);
  };
  take("model.embed_tokens.weight", true);
  std::vector<std::string> layer_order;  // a sparse MoE block in place of the MLP (Mixtral)
  for (const std::string& key : LayerOrder())
    if (m_.experts == 0 || !key.starts_with("mlp.")) layer_order.push_back(key);
  if (m_.experts > 0) layer_order.push_back("block_sparse_moe.gate.weight");
  for (int64_t e = 0; e < m_.experts; ++e)
    for (const char* w : {"w1", "w2", "w3"}) layer_order.push_back("block_sparse_moe.experts." + std::to_string(e) + "." + w + ".weight");
  for (int64_t i = 0; i < m_.layers; ++i)
    for (const std::string& key : layer_order) {
      const bool is_bias = key.ends_with(".bias");
      const bool needed = !is_bias || (key.starts_with("self_attn") ? m_.attention_bias : m_.mlp_bias);
      take("model.layers." + std::to_string(i) + "." + key, needed);
    }
  take("model.norm.weight", true);
  take("lm_head.weight", !m_.tied);
  if (!made_.empty())
    throw Refuse(made_.begin()->second.source, "gives " + made_.begin()->first + ", which this model has no place for");
  return out;
}

}  // namespace

std::vector<ExportTensor> LlamaTensors(const reshard::Source& S, const LlamaFacts& m) {
  // The import (import_model.h) builds the table from names and shapes alone: no store, its folder in the manifest.
  Placement placement(S.reader ? S.reader->dir() : S.manifest.value("dir", std::string()), m);
  for (size_t i = 0; i < S.atoms.size(); ++i) placement.Place(S.atoms[i], static_cast<int>(i));
  return placement.InModelOrder();
}

std::optional<TitanName> TorchtitanName(const std::string& hf_name) {
  const int64_t keys = static_cast<int64_t>(TitanKeys().size()), end = int64_t{1} << 40;
  if (hf_name == "model.embed_tokens.weight") return TitanName{"tok_embeddings.weight", false, -1};
  if (hf_name == "model.norm.weight") return TitanName{"norm.weight", false, end};
  if (hf_name == "lm_head.weight") return TitanName{"output.weight", false, end + 1};
  static const std::regex layer(R"(^model\.layers\.(\d{1,8})\.(.+)$)");
  std::smatch m;
  if (!std::regex_match(hf_name, m, layer)) return std::nullopt;
  for (int64_t k = 0; k < keys; ++k) {
    const auto& [key, renamed] = TitanKeys()[k];
    if (renamed.name == m[2].str()) return TitanName{"layers." + m[1].str() + "." + key, renamed.rotary, std::stoll(m[1]) * keys + k};
  }
  return std::nullopt;
}

bool TranslatedNaming(const std::vector<std::string>& names) {
  return std::any_of(names.begin(), names.end(), [](const std::string& n) {
    const auto slot = SlotOf(n, int64_t{1} << 40);  // any layer count: only the embedding's and stacked names tell
    return slot && (slot->kind == Slot::Embedding || slot->kind == Slot::Stacked);
  });
}

}  // namespace ucp::formats::hf
