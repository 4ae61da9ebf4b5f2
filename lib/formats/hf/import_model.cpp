#include "formats/hf/import_model.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "formats/hf/gpt2.h"
#include "formats/hf/names.h"
#include "layout/reshard_plan.h"

namespace ucp::formats::hf {
using reshard::ExportTensor;

namespace {

// Adds a parameter in its module's order with Megatron's optimizer group (0: >= 2-D, with weight decay).
struct AtomList {
  std::vector<ImportAtom> atoms;
  void Add(std::string name, std::vector<int64_t> shape, std::vector<int64_t> sub = {}) {
    const int group = shape.size() >= 2 ? 0 : 1;
    atoms.push_back({std::move(name), std::move(shape), group, std::move(sub), {}});
  }
  // Megatron's optimizer lists group 0 (weight decay) before group 1, each in module order; DeepSpeed
  // puts the experts in groups of their own after them (split_params_into_different_moe_groups_for_optimizer).
  std::vector<ImportAtom> Ordered() {
    std::stable_partition(atoms.begin(), atoms.end(), [](const ImportAtom& a) { return a.group == 0; });
    std::stable_partition(atoms.begin(), atoms.end(), [](const ImportAtom& a) { return a.group < 2; });
    return std::move(atoms);
  }
};

const std::string kLayer = "language_model.encoder.layers.";
const std::string kExperts = "mlp.deepspeed_moe.experts.deepspeed_experts.";

// Megatron-DeepSpeed's GPTModel parameters of a LlamaForCausalLM (RMSNorm, rotary, SwiGLU, GQA), or
// of a MixtralForCausalLM (every MLP a DeepSpeed MoE layer: its gate, its experts under global ids).
std::vector<ImportAtom> LlamaAtoms(const LlamaFacts& m) {
  const int64_t q = m.heads * m.head_dim, kv = m.kv_heads * m.head_dim;
  AtomList l;
  l.Add("language_model.embedding.word_embeddings.weight", {m.vocab, m.hidden});
  for (int64_t i = 0; i < m.layers; ++i) {
    const std::string p = kLayer + std::to_string(i) + ".";
    l.Add(p + "input_layernorm.weight", {m.hidden});
    l.Add(p + "self_attention.query_key_value.weight", {q + 2 * kv, m.hidden}, {q, kv, kv});
    if (m.attention_bias) l.Add(p + "self_attention.query_key_value.bias", {q + 2 * kv}, {q, kv, kv});
    l.Add(p + "self_attention.dense.weight", {m.hidden, q});
    if (m.attention_bias) l.Add(p + "self_attention.dense.bias", {m.hidden});
    l.Add(p + "post_attention_layernorm.weight", {m.hidden});
    if (m.experts > 0) {
      l.Add(p + "mlp.deepspeed_moe.gate.wg.weight", {m.experts, m.hidden});
      for (int64_t e = 0; e < m.experts; ++e) {  // ParallelMLP's [gate; up] rows: the module's own layout, no sizes
        const std::string x = p + kExperts + std::to_string(e) + ".";
        l.Add(x + "dense_h_to_4h.weight", {2 * m.ffn, m.hidden}), l.atoms.back().group = 2;
        l.Add(x + "dense_4h_to_h.weight", {m.hidden, m.ffn}), l.atoms.back().group = 2;
      }
      continue;
    }
    l.Add(p + "mlp.dense_h_to_4h.weight", {2 * m.ffn, m.hidden}, {m.ffn, m.ffn});
    if (m.mlp_bias) l.Add(p + "mlp.dense_h_to_4h.bias", {2 * m.ffn}, {m.ffn, m.ffn});
    l.Add(p + "mlp.dense_4h_to_h.weight", {m.hidden, m.ffn});
    if (m.mlp_bias) l.Add(p + "mlp.dense_4h_to_h.bias", {m.hidden});
  }
  l.Add("language_model.encoder.final_layernorm.weight", {m.hidden});
  if (!m.tied) l.Add("language_model.output_layer.weight", {m.vocab, m.hidden});
  return l.Ordered();
}

// GPTModel's parameters of a GPT2LMHeadModel: LayerNorm with biases, learned positions, biases on
// every linear layer, the output tied. The fused QKV without sub-parameter sizes: ParallelAttention's
// multi-head rows, head by head [q_i; k_i; v_i], the layout a real Megatron-DeepSpeed MHA save has.
std::vector<ImportAtom> Gpt2Atoms(const Gpt2Facts& m) {
  const int64_t h = m.hidden;
  AtomList l;
  l.Add("language_model.embedding.word_embeddings.weight", {m.vocab, h});
  l.Add("language_model.embedding.position_embeddings.weight", {m.positions, h});
  for (int64_t i = 0; i < m.layers; ++i) {
    const std::string p = kLayer + std::to_string(i) + ".";
    l.Add(p + "input_layernorm.weight", {h}), l.Add(p + "input_layernorm.bias", {h});
    l.Add(p + "self_attention.query_key_value.weight", {3 * h, h}), l.Add(p + "self_attention.query_key_value.bias", {3 * h});
    l.Add(p + "self_attention.dense.weight", {h, h}), l.Add(p + "self_attention.dense.bias", {h});
    l.Add(p + "post_attention_layernorm.weight", {h}), l.Add(p + "post_attention_layernorm.bias", {h});
    l.Add(p + "mlp.dense_h_to_4h.weight", {m.ffn, h}), l.Add(p + "mlp.dense_h_to_4h.bias", {m.ffn});
    l.Add(p + "mlp.dense_4h_to_h.weight", {h, m.ffn}), l.Add(p + "mlp.dense_4h_to_h.bias", {h});
  }
  l.Add("language_model.encoder.final_layernorm.weight", {h}), l.Add("language_model.encoder.final_layernorm.bias", {h});
  return l.Ordered();
}

// The export's table over `atoms`: the source the export would read, built from names and shapes.
std::vector<ExportTensor> ExportTable(const HfConfig& c, const std::vector<ImportAtom>& atoms, const std::string& dir) {
  reshard::Source S;
  S.manifest = {{"dir", dir}};
  for (const auto& a : atoms) {
    reshard::Atom atom;
    atom.name = a.name;
    atom.shape = a.shape;
    atom.numel = pt::Numel(a.shape);
    atom.sub_param_sizes = a.sub_param_sizes;
    S.atoms.push_back(std::move(atom));
  }
  return c.Gpt2() ? Gpt2Tensors(S, c.gpt2) : LlamaTensors(S, c.llama);
}

int64_t RowsOf(const std::vector<int64_t>& shape) { return shape.empty() ? 1 : shape[0]; }
int64_t PerRow(const std::vector<int64_t>& shape) { return pt::Numel(shape) / std::max<int64_t>(RowsOf(shape), 1); }

// Each parameter's tensors, every row filled exactly once (checked on the table alone, before data).
void Invert(ImportModel& M, const std::string& dir) {
  std::vector<std::vector<int>> covered(M.atoms.size());
  for (size_t a = 0; a < M.atoms.size(); ++a) covered[a].assign(static_cast<size_t>(RowsOf(M.atoms[a].shape)), 0);
  for (size_t i = 0; i < M.tensors.size(); ++i) {
    const ExportTensor& t = M.tensors[i];
    if (t.atom < 0 || static_cast<size_t>(t.atom) >= M.atoms.size()) throw Error("internal: " + t.name + " names no parameter");
    ImportAtom& a = M.atoms[static_cast<size_t>(t.atom)];
    if (t.layer >= 0 || t.rotary_head_dim > 0)
      throw Error(dir + ": " + t.name + ": the import does not invert stacked layers or re-ordered rotary rows");
    // A transposed tensor (a Conv1D weight, [in, out]) holds the atomic rows as its columns.
    if ((t.transposed ? (t.shape.size() == 2 ? t.shape[0] : -1) : PerRow(t.shape)) != PerRow(a.shape))
      throw Error(dir + ": " + t.name + " " + pt::ShapeString(t.shape) + " does not fit the rows of parameter '" + a.name + "' " +
                  pt::ShapeString(a.shape));
    auto& rows = covered[static_cast<size_t>(t.atom)];
    reshard::ForEachAtomRun(t, 0, t.source_rows(), [&](int64_t first, int64_t n) {
      for (int64_t r = first; r < first + n; ++r) {
        if (r < 0 || r >= static_cast<int64_t>(rows.size()))
          throw Error(dir + ": " + t.name + " fills row " + std::to_string(r) + " of parameter '" + a.name + "', which has " +
                      std::to_string(rows.size()));
        if (rows[static_cast<size_t>(r)]++)
          throw Error(dir + ": row " + std::to_string(r) + " of parameter '" + a.name + "' is filled twice (again by " + t.name + ")");
      }
    });
    a.fills.push_back(static_cast<int>(i));
  }
  for (size_t a = 0; a < M.atoms.size(); ++a)
    for (size_t r = 0; r < covered[a].size(); ++r)
      if (!covered[a][r])
        throw Error(dir + ": row " + std::to_string(r) + " of parameter '" + M.atoms[a].name + "' comes from no tensor of the model");
}

}  // namespace

ImportModel ImportModelOf(const HfConfig& c, const std::string& dir) {
  ImportModel M;
  M.atoms = c.Gpt2() ? Gpt2Atoms(c.gpt2) : LlamaAtoms(c.llama);
  M.tensors = ExportTable(c, M.atoms, dir);
  Invert(M, dir);
  return M;
}

void FillAtom(const ImportModel& M, size_t a, const std::function<void(const ExportTensor&, float*)>& read, float* dst) {
  const ImportAtom& atom = M.atoms[a];
  const int64_t per_row = PerRow(atom.shape);
  std::vector<float> buf, rows;
  for (int i : atom.fills) {
    const ExportTensor& t = M.tensors[static_cast<size_t>(i)];
    if (!t.transposed) {  // rows that land as one run in dst are read straight there, not through buf
      int64_t runs = 0, first = 0, rows = 0;
      reshard::ForEachAtomRun(t, 0, t.source_rows(), [&](int64_t f, int64_t n) { first = runs++ == 0 ? f : first, rows = n; });
      if (runs == 1 && rows * per_row == t.numel()) {
        read(t, dst + first * per_row);
        continue;
      }
    }
    buf.resize(static_cast<size_t>(std::max<int64_t>(t.numel(), 1)));
    read(t, buf.data());
    if (t.transposed) {  // [per_row, selected rows] -> the selected rows, each whole
      const int64_t n = t.source_rows();
      rows.resize(buf.size());
      for (int64_t r = 0; r < n; ++r)
        for (int64_t c = 0; c < per_row; ++c) rows[static_cast<size_t>(r * per_row + c)] = buf[static_cast<size_t>(c * n + r)];
      buf.swap(rows);
    }
    int64_t at = 0;
    reshard::ForEachAtomRun(t, 0, t.source_rows(), [&](int64_t first, int64_t n) {
      std::memcpy(dst + first * per_row, buf.data() + at * per_row, static_cast<size_t>(n * per_row) * sizeof(float));
      at += n;
    });
  }
}

}  // namespace ucp::formats::hf
