#include "formats/hf/import_model.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "formats/hf/names.h"
#include "layout/reshard_plan.h"

namespace ucp::formats::hf {
using reshard::ExportTensor;

namespace {

// Megatron-DeepSpeed's GPTModel parameters of a LlamaForCausalLM (RMSNorm, rotary, SwiGLU, GQA), in
// its module's order, with the optimizer group Megatron gives each.
std::vector<ImportAtom> LlamaAtoms(const LlamaFacts& m) {
  const int64_t q = m.heads * m.head_dim, kv = m.kv_heads * m.head_dim;
  std::vector<ImportAtom> atoms;
  auto add = [&](std::string name, std::vector<int64_t> shape, std::vector<int64_t> sub = {}) {
    const int group = shape.size() >= 2 ? 0 : 1;
    atoms.push_back({std::move(name), std::move(shape), group, std::move(sub), {}});
  };
  add("language_model.embedding.word_embeddings.weight", {m.vocab, m.hidden});
  for (int64_t i = 0; i < m.layers; ++i) {
    const std::string p = "language_model.encoder.layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {m.hidden});
    add(p + "self_attention.query_key_value.weight", {q + 2 * kv, m.hidden}, {q, kv, kv});
    if (m.attention_bias) add(p + "self_attention.query_key_value.bias", {q + 2 * kv}, {q, kv, kv});
    add(p + "self_attention.dense.weight", {m.hidden, q});
    if (m.attention_bias) add(p + "self_attention.dense.bias", {m.hidden});
    add(p + "post_attention_layernorm.weight", {m.hidden});
    add(p + "mlp.dense_h_to_4h.weight", {2 * m.ffn, m.hidden}, {m.ffn, m.ffn});
    if (m.mlp_bias) add(p + "mlp.dense_h_to_4h.bias", {2 * m.ffn}, {m.ffn, m.ffn});
    add(p + "mlp.dense_4h_to_h.weight", {m.hidden, m.ffn});
    if (m.mlp_bias) add(p + "mlp.dense_4h_to_h.bias", {m.hidden});
  }
  add("language_model.encoder.final_layernorm.weight", {m.hidden});
  if (!m.tied) add("language_model.output_layer.weight", {m.vocab, m.hidden});
  // Megatron's optimizer lists group 0 (weight decay) before group 1, each in module order.
  std::stable_partition(atoms.begin(), atoms.end(), [](const ImportAtom& a) { return a.group == 0; });
  return atoms;
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
  return LlamaTensors(S, c.llama);
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
    if (PerRow(t.shape) != PerRow(a.shape))
      throw Error(dir + ": " + t.name + " " + pt::ShapeString(t.shape) + " does not fit the rows of parameter '" + a.name + "' " +
                  pt::ShapeString(a.shape));
    auto& rows = covered[static_cast<size_t>(t.atom)];
    reshard::ForEachAtomRun(t, 0, t.rows(), [&](int64_t first, int64_t n) {
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
  M.atoms = LlamaAtoms(c.llama);
  M.tensors = ExportTable(c, M.atoms, dir);
  Invert(M, dir);
  return M;
}

void FillAtom(const ImportModel& M, size_t a, const std::function<void(const ExportTensor&, float*)>& read, float* dst) {
  const ImportAtom& atom = M.atoms[a];
  const int64_t per_row = PerRow(atom.shape);
  std::vector<float> buf;
  for (int i : atom.fills) {
    const ExportTensor& t = M.tensors[static_cast<size_t>(i)];
    buf.resize(static_cast<size_t>(std::max<int64_t>(t.numel(), 1)));
    read(t, buf.data());
    int64_t at = 0;
    reshard::ForEachAtomRun(t, 0, t.rows(), [&](int64_t first, int64_t n) {
      std::memcpy(dst + first * per_row, buf.data() + at * per_row, static_cast<size_t>(n * per_row) * sizeof(float));
      at += n;
    });
  }
}

}  // namespace ucp::formats::hf
