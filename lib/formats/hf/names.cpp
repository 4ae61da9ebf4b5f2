#include "formats/hf/names.h"

#include <algorithm>
#include <map>
#include <regex>

#include "core/error.h"

namespace ucp::formats::hf {
using reshard::ExportTensor;

namespace {

// A parameter's place in the model: the embedding, a layer's key, the final norm or the output layer.
struct Slot {
  enum Kind { Embedding, Layer, Stacked, Norm, Output } kind;  // Stacked: every layer's, on the leading axis
  int64_t layer = -1;
  std::string key;  // inside the layer: "self_attention.dense.weight"
};

std::optional<Slot> SlotOf(const std::string& name, int64_t layers) {
  static const std::regex plain_layer(R"(^language_model\.encoder\.layers\.(\d+)\.(.+)$)"),
      pipe(R"(^(\d+)\.(.+)$)"), titan_layer(R"(^layers\.(\d+)\.(.+)$)");
  std::smatch m;
  // Megatron-Core's (torch_dist): the layers stacked in one tensor per key.
  if (name == "embedding.word_embeddings.weight") return Slot{Slot::Embedding, -1, ""};
  if (name == "decoder.final_layernorm.weight") return Slot{Slot::Norm, -1, ""};
  if (name == "output_layer.weight") return Slot{Slot::Output, -1, ""};
  if (name.starts_with("decoder.layers.")) return Slot{Slot::Stacked, -1, name.substr(15)};
  // torchtitan's Llama (FSDP2 / DTensor checkpoints with its names).
  if (name == "tok_embeddings.weight") return Slot{Slot::Embedding, -1, ""};
  if (name == "norm.weight") return Slot{Slot::Norm, -1, ""};
  if (name == "output.weight") return Slot{Slot::Output, -1, ""};
  if (std::regex_match(name, m, titan_layer) && m[1].length() < 9) {
    const int64_t i = std::stoll(m[1]);
    if (i < layers) return Slot{Slot::Layer, i, m[2]};
    return std::nullopt;
  }
  if (name == "language_model.embedding.word_embeddings.weight" || name == "tied_modules.embed.word_embeddings.weight")
    return Slot{Slot::Embedding, -1, ""};
  if (name == "language_model.encoder.final_layernorm.weight") return Slot{Slot::Norm, -1, ""};
  if (name == "language_model.output_layer.weight") return Slot{Slot::Output, -1, ""};
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
};

std::optional<Cut> CutOf(const std::string& key, const LlamaFacts& m) {
  const int64_t q = m.heads * m.head_dim, kv = m.kv_heads * m.head_dim;
  static const std::map<std::string, std::string> whole = {
      {"input_layernorm.weight", "input_layernorm.weight"},
      {"post_attention_layernorm.weight", "post_attention_layernorm.weight"},
      {"self_attention.dense.weight", "self_attn.o_proj.weight"},
      {"self_attention.dense.bias", "self_attn.o_proj.bias"},
      {"mlp.dense_4h_to_h.weight", "mlp.down_proj.weight"},
      {"mlp.dense_4h_to_h.bias", "mlp.down_proj.bias"},
  };
  if (auto it = whole.find(key); it != whole.end()) return Cut{{it->second}, {}};
  // torchtitan's: q and k rotate interleaved pairs (its complex rotary), Hugging Face's halves.
  static const std::map<std::string, std::pair<std::string, bool>> titan = {
      {"attention_norm.weight", {"input_layernorm.weight", false}},
      {"ffn_norm.weight", {"post_attention_layernorm.weight", false}},
      {"attention.wq.weight", {"self_attn.q_proj.weight", true}},
      {"attention.wk.weight", {"self_attn.k_proj.weight", true}},
      {"attention.wv.weight", {"self_attn.v_proj.weight", false}},
      {"attention.wo.weight", {"self_attn.o_proj.weight", false}},
      {"feed_forward.w1.weight", {"mlp.gate_proj.weight", false}},
      {"feed_forward.w3.weight", {"mlp.up_proj.weight", false}},
      {"feed_forward.w2.weight", {"mlp.down_proj.weight", false}},
  };
  if (auto it = titan.find(key); it != titan.end()) return Cut{{it->second.first}, {}, it->second.second};
  // Megatron-Core's: the norms fused into the next linear layer's (TE's names) or apart.
  static const std::map<std::string, std::string> core = {
      {"self_attention.linear_qkv.layer_norm_weight", "input_layernorm.weight"},
      {"input_layernorm.weight", "input_layernorm.weight"},
      {"mlp.linear_fc1.layer_norm_weight", "post_attention_layernorm.weight"},
      {"pre_mlp_layernorm.weight", "post_attention_layernorm.weight"},
      {"self_attention.linear_proj.weight", "self_attn.o_proj.weight"},
      {"self_attention.linear_proj.bias", "self_attn.o_proj.bias"},
      {"mlp.linear_fc2.weight", "mlp.down_proj.weight"},
      {"mlp.linear_fc2.bias", "mlp.down_proj.bias"},
  };
  if (auto it = core.find(key); it != core.end()) return Cut{{it->second}, {}};
  for (const char* kind : {"weight", "bias"}) {
    const std::string k = kind;
    if (key == "self_attention.query_key_value." + k)
      return Cut{{"self_attn.q_proj." + k, "self_attn.k_proj." + k, "self_attn.v_proj." + k}, {q, kv, kv}};
    if (key == "mlp.dense_h_to_4h." + k) return Cut{{"mlp.gate_proj." + k, "mlp.up_proj." + k}, {m.ffn, m.ffn}};
    // Megatron-Core's linear_fc1 of a gated MLP is saved [gate; up] whole (its SwiGLU sharded factory
    // puts each TP rank's gate rows in the first half, its up rows in the second).
    if (key == "mlp.linear_fc1." + k) return Cut{{"mlp.gate_proj." + k, "mlp.up_proj." + k}, {m.ffn, m.ffn}};
    // Megatron-Core's linear_qkv: per query group, the group's query heads, then its key, then its
    // value (its attention splits each group's rows so): q, k and v each taken group by group.
    if (key == "self_attention.linear_qkv." + k) {
      const int64_t per_group = m.heads / m.kv_heads;
      return Cut{{"self_attn.q_proj." + k, "self_attn.k_proj." + k, "self_attn.v_proj." + k}, {q, kv, kv}, false,
                 {per_group * m.head_dim, m.head_dim, m.head_dim}, (per_group + 2) * m.head_dim};
    }
  }
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
  return {m.hidden};  // the norms, the biases of o_proj and down_proj
}

std::string Shape(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
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

}  // namespace

std::vector<ExportTensor> LlamaTensors(const reshard::Source& S, const LlamaFacts& m) {
  const std::string dir = S.reader->dir();
  std::map<std::string, ExportTensor> made;
  auto refuse = [&](const std::string& name, const std::string& why) {
    return Error(dir + ": parameter '" + name + "': " + why);
  };
  auto add = [&](const std::string& source, ExportTensor t) {
    if (made.count(t.name)) throw refuse(source, "a second parameter for " + t.name + " (also '" + made[t.name].source + "')");
    t.source = source;
    made.emplace(t.name, std::move(t));
  };
  // One layer's tensor(s) from parameter `name` (atomic tensor `atom`; of `stacked` layer of it, or -1):
  // whole, or cut by rows as the checkpoint fused them.
  auto PlaceLayer = [&](const std::string& name, int atom, int64_t layer, int64_t stacked, const std::string& key,
                        const std::vector<int64_t>& shape, const std::vector<int64_t>& sub_param_sizes) {
    auto expect = [&](std::vector<int64_t> want) {
      if (shape != want)
        throw refuse(name, "shape " + Shape(shape) + (stacked >= 0 ? " per layer" : "") + ", but the model's sizes (hidden " +
                               std::to_string(m.hidden) + ", " + std::to_string(m.heads) + " heads and " + std::to_string(m.kv_heads) +
                               " key-value heads of " + std::to_string(m.head_dim) + ", FFN " + std::to_string(m.ffn) + ") give " +
                               Shape(want) + ": check num_attention_heads, num_key_value_heads, kv_channels, ffn_hidden_size");
    };
    const auto cut = CutOf(key, m);
    if (!cut) throw refuse(name, "'" + key + "' is no part of a LlamaForCausalLM layer");
    const std::string prefix = "model.layers." + std::to_string(layer) + ".";
    const bool bias = shape.size() == 1;
    const int64_t cols = bias ? 1 : shape.at(1);
    auto tensor = [&](const std::string& n, int64_t begin, int64_t end, std::vector<int64_t> s) {
      ExportTensor t{prefix + n, atom, "", begin, end, std::move(s)};
      t.layer = stacked;
      return t;
    };
    if (cut->rows.empty()) {
      expect(WholeShape(cut->names[0], m));
      ExportTensor t = tensor(cut->names[0], 0, shape[0], shape);
      if (cut->rotary) t.rotary_head_dim = m.head_dim;
      add(name, std::move(t));
      return;
    }
    // A fused tensor: its rows as the checkpoint joined them.
    int64_t rows = 0;
    for (int64_t r : cut->rows) rows += r;
    expect(bias ? std::vector<int64_t>{rows} : std::vector<int64_t>{rows, m.hidden});
    if (stacked < 0 && sub_param_sizes != cut->rows)  // Megatron-DeepSpeed's: as its sub-parameter sizes say
      throw refuse(name, sub_param_sizes.empty()
                             ? "the checkpoint does not say how its rows are fused (no sub-parameter shape in its "
                               "universal_checkpoint_info): Megatron models interleave them in more than one way, "
                               "and ucp does not guess"
                             : "sub-parameter sizes " + Shape(sub_param_sizes) + ", the model's sizes give " + Shape(cut->rows));
    int64_t at = 0;
    for (size_t k = 0; k < cut->names.size(); ++k) {
      std::vector<int64_t> s = bias ? std::vector<int64_t>{cut->rows[k]} : std::vector<int64_t>{cut->rows[k], cols};
      if (cut->blocks.empty()) {
        add(name, tensor(cut->names[k], at, at + cut->rows[k], s));
        at += cut->rows[k];
        continue;
      }
      ExportTensor t = tensor(cut->names[k], at, rows, s);  // blocks[k] rows of each group, from the group's offset
      t.block = cut->blocks[k], t.stride = cut->group_rows;
      add(name, std::move(t));
      at += cut->blocks[k];
    }
  };
  for (size_t i = 0; i < S.atoms.size(); ++i) {
    const reshard::Atom& a = S.atoms[i];
    const auto slot = SlotOf(a.name, m.layers);
    if (!slot) throw refuse(a.name, "has no place in LlamaForCausalLM of " + std::to_string(m.layers) + " layers");
    const int atom = static_cast<int>(i);
    const std::vector<int64_t>& shape = a.shape;
    auto expect = [&](std::vector<int64_t> want) {
      if (shape != want)
        throw refuse(a.name, "shape " + Shape(shape) + ", but the model's sizes (hidden " + std::to_string(m.hidden) + ", " +
                                 std::to_string(m.heads) + " heads and " + std::to_string(m.kv_heads) + " key-value heads of " +
                                 std::to_string(m.head_dim) + ", FFN " + std::to_string(m.ffn) + ") give " + Shape(want) +
                                 ": check num_attention_heads, num_key_value_heads, kv_channels, ffn_hidden_size");
    };
    switch (slot->kind) {
      case Slot::Embedding:
      case Slot::Output: {
        if (shape.size() != 2 || shape[1] != m.hidden || shape[0] < m.vocab)
          throw refuse(a.name, "shape " + Shape(shape) + ", expected at least " + std::to_string(m.vocab) + " rows of " +
                                   std::to_string(m.hidden));
        const std::string name = slot->kind == Slot::Embedding ? "model.embed_tokens.weight" : "lm_head.weight";
        add(a.name, {name, atom, "", 0, m.vocab, {m.vocab, m.hidden}});  // padding rows past the vocabulary dropped
        break;
      }
      case Slot::Norm:
        expect({m.hidden});
        add(a.name, {"model.norm.weight", atom, "", 0, m.hidden, {m.hidden}});
        break;
      case Slot::Layer:
        PlaceLayer(a.name, atom, slot->layer, -1, slot->key, shape, a.sub_param_sizes);
        break;
      case Slot::Stacked: {  // layer i is index i of the leading axis
        if (shape.size() < 2 || shape[0] != m.layers)
          throw refuse(a.name, "shape " + Shape(shape) + ": a stacked layers' tensor of the model's " + std::to_string(m.layers) +
                                   " layers has them on its leading axis");
        const std::vector<int64_t> per_layer(shape.begin() + 1, shape.end());
        for (int64_t l = 0; l < m.layers; ++l) PlaceLayer(a.name, atom, l, l, slot->key, per_layer, a.sub_param_sizes);
        break;
      }
    }
  }
  // LlamaForCausalLM's order; a tensor it needs that no parameter filled is refused.
  std::vector<ExportTensor> out;
  auto take = [&](const std::string& name, bool needed) {
    auto it = made.find(name);
    if (it == made.end()) {
      if (needed) throw Error(dir + ": no parameter fills LlamaForCausalLM's " + name);
      return;
    }
    out.push_back(std::move(it->second));
    made.erase(it);
  };
  take("model.embed_tokens.weight", true);
  for (int64_t i = 0; i < m.layers; ++i)
    for (const std::string& key : LayerOrder()) {
      const bool is_bias = key.ends_with(".bias");
      const bool needed = !is_bias || (key.starts_with("self_attn") ? m.attention_bias : m.mlp_bias);
      take("model.layers." + std::to_string(i) + "." + key, needed);
    }
  take("model.norm.weight", true);
  take("lm_head.weight", !m.tied);
  if (!made.empty())
    throw refuse(made.begin()->second.source, "gives " + made.begin()->first + ", which this model has no place for");
  return out;
}

bool TranslatedNaming(const std::vector<std::string>& names) {
  return std::any_of(names.begin(), names.end(), [](const std::string& n) {
    const auto slot = SlotOf(n, int64_t{1} << 40);  // any layer count: only the embedding's and stacked names tell
    return slot && (slot->kind == Slot::Embedding || slot->kind == Slot::Stacked);
  });
}

}  // namespace ucp::formats::hf
