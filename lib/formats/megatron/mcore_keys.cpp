#include "formats/megatron/mcore_keys.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "pt/value.h"
#include "source/megatron_stacking.h"

namespace ucp::formats::megatron {
using reshard::ExportTensor;

namespace {

// The whole of tensor `t` as one run.
Segment Whole(const ExportTensor& t) { return Segment{t, 0, t.rows()}; }

}  // namespace

std::vector<McoreKey> KeysOfMcoreAtoms(const reshard::Source& S, bool gated, int64_t layers) {
  std::vector<McoreKey> out;
  for (size_t a = 0; a < S.atoms.size(); ++a) {
    const reshard::Atom& atom = S.atoms[a];
    McoreKey k;
    k.key = atom.name;
    k.name = DistNameOfKey(atom.name, gated);
    k.stacked = source::StackedDims(atom.name) >= 1;
    k.shape = atom.shape;
    if (k.stacked) {
      if (atom.shape.empty() || atom.shape[0] != layers)
        throw Error(S.reader->dir() + ": parameter '" + atom.name + "' of shape " + pt::ShapeString(atom.shape) + " does not stack the " +
                    std::to_string(layers) + " layers the args say");
      k.shape.erase(k.shape.begin());
    }
    if (k.name.experts) {  // [layers, experts, rows, ...]: one tensor per layer and expert
      if (k.shape.size() < 2 || k.shape[0] < 1)
        throw Error(S.reader->dir() + ": parameter '" + atom.name + "' of shape " + pt::ShapeString(atom.shape) +
                    " has no experts' axis after its layers");
      k.experts = k.shape[0];
      k.shape.erase(k.shape.begin());
    }
    for (int64_t l = 0; l < (k.stacked ? layers : 1); ++l) {
      std::vector<Segment> segments;
      for (int64_t e = 0; e < std::max<int64_t>(k.experts, 1); ++e) {
        ExportTensor t = reshard::RowsAsTensor(atom.name, static_cast<int>(a), 0, k.Rows(), k.shape);
        t.source = atom.name, t.layer = k.stacked ? l : -1, t.expert = k.experts > 0 ? e : -1;
        segments.push_back(Whole(t));
      }
      k.layers.push_back(std::move(segments));
    }
    out.push_back(std::move(k));
  }
  return out;
}

OtherFamilyModel ModelOfLlama(const std::vector<ExportTensor>& tensors, const hf::LlamaFacts& m, const std::string& dir) {
  if (m.experts > 0)
    throw Error(dir + ": a Mixture-of-Experts model (" + std::to_string(m.experts) + " experts per layer) under another family's "
                "names: --format mcore writes Megatron-Core's own MoE models, and dense GPT / Llama models from other families (not yet "
                "their experts)");
  if (m.attention_bias || m.mlp_bias)
    throw Error(dir + ": the model's linear layers have biases (" + std::string(m.attention_bias ? "attention" : "MLP") +
                "): --format mcore writes Llama models from other families' names without them (not yet biases)");
  std::map<std::string, const ExportTensor*> by_name;
  for (const ExportTensor& t : tensors) by_name[t.name] = &t;
  auto tensor = [&](const std::string& name) -> const ExportTensor& {
    auto it = by_name.find(name);
    if (it == by_name.end()) throw Error("internal: " + dir + ": no " + name + " among the model's tensors");
    return *it->second;
  };
  std::vector<McoreKey> out;
  // A key of one tensor per layer (or none), its rows as they are.
  auto one = [&](const std::string& key, bool stacked, const std::string& hf_suffix, std::vector<int64_t> shape) {
    McoreKey k;
    k.key = key, k.name = DistNameOfKey(key, true), k.stacked = stacked, k.shape = std::move(shape);
    for (int64_t l = 0; l < (stacked ? m.layers : 1); ++l)
      k.layers.push_back({Whole(tensor(stacked ? "model.layers." + std::to_string(l) + "." + hf_suffix : hf_suffix))});
    out.push_back(std::move(k));
  };
  const int64_t h = m.hidden, d = m.head_dim, q_rows = m.heads * d, per_group = m.heads / m.kv_heads;
  one("embedding.word_embeddings.weight", false, "model.embed_tokens.weight", {m.vocab, h});
  one("decoder.layers.self_attention.linear_qkv.layer_norm_weight", true, "input_layernorm.weight", {h});
  {  // per query group: its query heads, its key head, its value head
    McoreKey k;
    k.key = "decoder.layers.self_attention.linear_qkv.weight", k.name = DistNameOfKey(k.key, true), k.stacked = true;
    k.shape = {q_rows + 2 * m.kv_heads * d, h};
    for (int64_t l = 0; l < m.layers; ++l) {
      const std::string at = "model.layers." + std::to_string(l) + ".self_attn.";
      const ExportTensor &q = tensor(at + "q_proj.weight"), &kk = tensor(at + "k_proj.weight"), &v = tensor(at + "v_proj.weight");
      std::vector<Segment> rows;
      for (int64_t g = 0; g < m.kv_heads; ++g) {
        rows.push_back({q, g * per_group * d, per_group * d});
        rows.push_back({kk, g * d, d});
        rows.push_back({v, g * d, d});
      }
      k.layers.push_back(std::move(rows));
    }
    out.push_back(std::move(k));
  }
  one("decoder.layers.self_attention.linear_proj.weight", true, "self_attn.o_proj.weight", {h, q_rows});
  one("decoder.layers.mlp.linear_fc1.layer_norm_weight", true, "post_attention_layernorm.weight", {h});
  {  // [gate; up]
    McoreKey k;
    k.key = "decoder.layers.mlp.linear_fc1.weight", k.name = DistNameOfKey(k.key, true), k.stacked = true;
    k.shape = {2 * m.ffn, h};
    for (int64_t l = 0; l < m.layers; ++l) {
      const std::string at = "model.layers." + std::to_string(l) + ".mlp.";
      k.layers.push_back({Whole(tensor(at + "gate_proj.weight")), Whole(tensor(at + "up_proj.weight"))});
    }
    out.push_back(std::move(k));
  }
  one("decoder.layers.mlp.linear_fc2.weight", true, "mlp.down_proj.weight", {h, m.ffn});
  one("decoder.final_layernorm.weight", false, "model.norm.weight", {h});
  if (!m.tied) one("output_layer.weight", false, "lm_head.weight", {m.vocab, h});
  for (const McoreKey& k : out)
    for (const auto& layer : k.layers) {
      int64_t rows = 0;
      for (const Segment& s : layer) {
        const std::vector<int64_t>& shape = s.rows.shape;
        if (shape.size() != k.shape.size() || (shape.size() == 2 && shape[1] != k.shape[1]) || s.first + s.count > s.rows.rows())
          throw Error("internal: " + dir + ": " + s.rows.name + " of shape " + pt::ShapeString(shape) + " does not fit " + k.key + " " +
                      pt::ShapeString(k.shape));
        rows += s.count;
      }
      if (rows != k.Rows()) throw Error("internal: " + dir + ": " + k.key + ": " + std::to_string(rows) + " rows of " + std::to_string(k.Rows()));
    }
  OtherFamilyModel model;
  model.keys = std::move(out);
  ModelFacts& f = model.facts;
  f.layers = m.layers, f.hidden = m.hidden, f.heads = m.heads, f.groups = m.kv_heads, f.head_dim = m.head_dim, f.ffn = m.ffn;
  f.vocab = m.vocab, f.positions = m.max_positions, f.tied = m.tied, f.eps = m.norm_eps, f.rope_base = m.rope_theta;
  return model;
}

}  // namespace ucp::formats::megatron
