#include "layout/export_plan.h"

#include <algorithm>

#include "core/error.h"

namespace ucp::reshard {

int64_t ExportTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : box_sizes.empty() ? shape : box_sizes) n *= d;
  return n;
}

ExportTensor RowsAsTensor(std::string name, int atom, int64_t begin, int64_t end, std::vector<int64_t> shape) {
  ExportTensor t;
  t.name = std::move(name), t.atom = atom, t.row_begin = begin, t.row_end = end, t.shape = std::move(shape);
  return t;
}

int64_t ExportPlan::tensor_bytes() const {
  const int e = ElementBytes(dtype);
  int64_t total = 0;
  for (const ExportTensor& t : tensors) total += t.numel() * e;
  return total;
}

void RowSource::ReadRows(const ExportTensor& t, int64_t a, int64_t b, int64_t per_row, float* dst, int64_t c0, int64_t c1) {
  ForEachAtomRun(t, a, b, [&](int64_t row, int64_t n) {
    Read(t.atom, t.layer, t.expert, t.state, row, row + n, c0, c1, dst);
    dst += n * per_row;
  });
}

int ElementBytes(const std::string& dtype) {
  if (dtype == "fp32") return 4;
  if (dtype == "bf16" || dtype == "fp16") return 2;
  throw Error("unknown dtype '" + dtype + "' (fp32, bf16 or fp16)");
}

std::vector<ExportFile> CutIntoFiles(const ExportPlan& P, int64_t max_bytes,
                                     const std::function<std::string(int, int)>& name) {
  const int e = ElementBytes(P.dtype);
  std::vector<ExportFile> files;
  int64_t held = 0;
  for (size_t i = 0; i < P.tensors.size(); ++i) {
    const int64_t bytes = P.tensors[i].numel() * e;
    if (files.empty() || (held > 0 && held + bytes > max_bytes)) files.emplace_back(), held = 0;
    files.back().tensors.push_back(static_cast<int>(i));
    held += bytes;
  }
  for (size_t i = 0; i < files.size(); ++i) files[i].name = name(static_cast<int>(i), static_cast<int>(files.size()));
  return files;
}

void ToTargetRowOrder(const ExportTensor& t, const float* in, float* out, int64_t n, int64_t per_row) {
  const int64_t d = t.rotary_head_dim;
  if (t.transposed) {  // selected row i, column j -> target row j, column i
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < per_row; ++j) out[j * n + i] = in[i * per_row + j];
    return;
  }
  if (d <= 0) {
    std::copy(in, in + n * per_row, out);
    return;
  }
  for (int64_t head = 0; head < n; head += d)
    for (int64_t i = 0; i < d / 2; ++i)
      for (int64_t j = 0; j < 2; ++j) {  // atomic row 2i + j of the head is the target's row j * d/2 + i (or back)
        const int64_t pair = head + 2 * i + j, half = head + j * (d / 2) + i;
        const int64_t from = t.rotary_to_pairs ? half : pair, to = t.rotary_to_pairs ? pair : half;
        std::copy(in + from * per_row, in + (from + 1) * per_row, out + to * per_row);
      }
}

nlohmann::json ExportPlanJson(const ExportPlan& P, const std::vector<int>& owner) {
  nlohmann::json files = nlohmann::json::array();
  for (size_t f = 0; f < P.files.size(); ++f) {
    nlohmann::json tensors = nlohmann::json::array();
    for (int i : P.files[f].tensors) {
      const ExportTensor& t = P.tensors[i];
      tensors.push_back({{"name", t.name}, {"shape", t.shape}, {"source", t.source}, {"rows", {t.row_begin, t.row_end}}});
      if (t.rotary_head_dim > 0) tensors.back()["rotary_head_dim"] = t.rotary_head_dim;
      if (t.layer >= 0) tensors.back()["layer"] = t.layer;
      if (t.block > 0) tensors.back()["rows_in_blocks"] = {{"block", t.block}, {"stride", t.stride}};
      if (t.part_rows > 0) tensors.back()["rows_in_parts"] = {{"rows", t.part_rows}, {"step", t.part_step}};
      if (t.transposed) tensors.back()["transposed"] = true;
      if (t.rotary_to_pairs) tensors.back()["rotary_to_pairs"] = true;
      if (t.state > 0) tensors.back()["state"] = t.state == 1 ? "exp_avg" : "exp_avg_sq";
      if (!t.box_sizes.empty()) tensors.back()["box"] = {{"offsets", t.box_offsets}, {"sizes", t.box_sizes}};
      if (t.atom < 0) tensors.back()["bytes"] = t.payload.size();
    }
    files.push_back({{"name", P.files[f].name}, {"bytes", P.files[f].bytes}, {"rank", owner.at(f)}, {"tensors", tensors}});
  }
  nlohmann::json side = nlohmann::json::array();
  for (const auto& [name, text] : P.side_files) side.push_back(name);
  return {{"model", P.model}, {"dtype", P.dtype}, {"tensor_bytes", P.tensor_bytes()}, {"files", files},
          {"side_files", side}, {"marker", P.marker}, {"notes", P.notes}};
}

}  // namespace ucp::reshard
