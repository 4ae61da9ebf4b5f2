#include "formats/hf/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "pt/low_precision.h"

namespace ucp::formats::hf {

static_assert(std::endian::native == std::endian::little, "safetensors holds little-endian bytes");

namespace {

const char* DtypeName(const std::string& dtype) {
  return dtype == "bf16" ? "BF16" : dtype == "fp16" ? "F16" : "F32";
}

// Rows of a tensor read at once: about 16 MiB of fp32 values.
constexpr int64_t kChunkFloats = int64_t{4} << 20;

}  // namespace

std::string SafetensorsHeader(const reshard::ExportPlan& P, const reshard::ExportFile& f) {
  const int e = reshard::ElementBytes(P.dtype);
  nlohmann::ordered_json h;
  h["__metadata__"] = {{"format", "pt"}};
  int64_t at = 0;
  for (int i : f.tensors) {
    const reshard::ExportTensor& t = P.tensors[i];
    const int64_t bytes = t.numel() * e;
    h[t.name] = {{"dtype", DtypeName(P.dtype)}, {"shape", t.shape}, {"data_offsets", {at, at + bytes}}};
    at += bytes;
  }
  std::string json = h.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t n = json.size();
  std::memcpy(out.data(), &n, 8);
  return out + json;
}

void WriteSafetensors(const reshard::ExportPlan& P, size_t f, reshard::RowSource& rows, const std::string& path) {
  const reshard::ExportFile& file = P.files.at(f);
  AtomicFile out(path, Durability::Batch, Digest::None);
  const std::string header = SafetensorsHeader(P, file);
  out.Write(header.data(), header.size());
  const int e = reshard::ElementBytes(P.dtype);
  const bool bf16 = P.dtype == "bf16";
  std::vector<float> values, ordered;
  std::vector<uint16_t> half;
  for (int i : file.tensors) {
    const reshard::ExportTensor& t = P.tensors[i];
    const int64_t rows_total = t.source_rows();  // the atomic rows taken (a transposed tensor's columns)
    if (rows_total <= 0) continue;
    const int64_t per_row = t.numel() / rows_total;
    const int64_t block = std::max<int64_t>(1, t.rotary_head_dim);  // whole heads when they are re-ordered
    const int64_t step = t.transposed ? rows_total  // every row at once: one tensor's values, transposed
                                      : std::max<int64_t>(1, kChunkFloats / std::max<int64_t>(1, per_row) / block) * block;
    for (int64_t r = 0; r < rows_total; r += step) {
      const int64_t n = std::min(step, rows_total - r);
      values.resize(static_cast<size_t>(n * per_row));
      rows.ReadRows(t, r, r + n, per_row, values.data());
      if (t.rotary_head_dim > 0 || t.transposed) {
        ordered.resize(values.size());
        reshard::ToTargetRowOrder(t, values.data(), ordered.data(), n, per_row);
        values.swap(ordered);
      }
      if (e == 4) {
        out.Write(values.data(), values.size() * 4);
        continue;
      }
      half.resize(values.size());
      if (bf16)
        pt::Fp32ToBf16(values.data(), half.data(), values.size());
      else
        pt::Fp32ToFp16(values.data(), half.data(), values.size());
      out.Write(half.data(), half.size() * 2);
    }
  }
  out.Commit();
}

std::string SafetensorsIndex(const reshard::ExportPlan& P, int64_t total_parameters) {
  nlohmann::json map = nlohmann::json::object();
  for (const reshard::ExportFile& f : P.files)
    for (int i : f.tensors) map[P.tensors[i].name] = f.name;
  nlohmann::json index = {{"metadata", {{"total_size", P.tensor_bytes()}}}, {"weight_map", map}};
  if (total_parameters > 0) index["metadata"]["total_parameters"] = total_parameters;  // (keys sorted, as json.dumps(sort_keys=True))
  return index.dump(2) + "\n";
}

}  // namespace ucp::formats::hf
