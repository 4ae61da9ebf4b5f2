// A DCP file's bytes (target.h): the plan's items in turn, each a complete torch.save file.
#include <algorithm>

#include "core/atomic_file.h"
#include "core/error.h"
#include "pt/zip_archive.h"
#include "formats/dcp/target.h"
#include "pt/low_precision.h"
#include "pt/torch_file.h"

namespace ucp::formats::dcp {
using reshard::ExportTensor;

namespace {

// The box's values: its rows' columns read as they are; where rows are re-ordered, the whole heads
// its rows span, re-ordered, then its rows and columns cut from them.
std::vector<float> BoxValues(const ExportTensor& t, reshard::RowSource& rows) {
  const bool matrix = t.shape.size() == 2;
  const int64_t r0 = t.box_offsets.at(0), n = t.box_sizes.at(0);
  const int64_t per_row = matrix ? t.shape[1] : 1;
  const int64_t c0 = matrix ? t.box_offsets[1] : 0, cols = matrix ? t.box_sizes[1] : 1;
  std::vector<float> box(static_cast<size_t>(n * cols));
  if (n == 0 || cols == 0) return box;
  if (t.rotary_head_dim <= 0) {
    rows.ReadRows(t, r0, r0 + n, cols, box.data(), c0, matrix ? c0 + cols : -1);
    return box;
  }
  const int64_t d = std::max<int64_t>(1, t.rotary_head_dim);
  const int64_t a = r0 / d * d, b = (r0 + n + d - 1) / d * d;  // whole heads
  std::vector<float> in(static_cast<size_t>((b - a) * per_row)), out;
  rows.ReadRows(t, a, b, per_row, in.data());
  if (t.rotary_head_dim > 0) {
    out.resize(in.size());
    reshard::ToTargetRowOrder(t, in.data(), out.data(), b - a, per_row);
    in.swap(out);
  }
  for (int64_t r = 0; r < n; ++r) {
    const float* from = in.data() + (r0 - a + r) * per_row + c0;
    std::copy(from, from + cols, box.data() + r * cols);
  }
  return box;
}

}  // namespace

void WriteDcpFile(const reshard::ExportPlan& P, size_t f, reshard::RowSource& rows, const std::string& path) {
  const reshard::ExportFile& file = P.files.at(f);
  AtomicFile out(path, Durability::Batch, Digest::None);
  int64_t written = 0;
  for (int i : file.tensors) {
    const ExportTensor& t = P.tensors[i];
    if (t.atom < 0) {
      out.Write(t.payload.data(), t.payload.size());
      written += static_cast<int64_t>(t.payload.size());
      continue;
    }
    if (t.shape.empty() || t.shape.size() > 2) throw Error("internal: " + t.name + ": a DCP chunk of a " + std::to_string(t.shape.size()) + "-d tensor");
    std::vector<float> box = BoxValues(t, rows);
    std::vector<int64_t> sizes = t.box_sizes;
    if (t.layer_axis) sizes.insert(sizes.begin(), 1);  // a stacked tensor's chunk keeps its layer axis
    if (t.layer_axis && t.expert >= 0) sizes.insert(sizes.begin() + 1, 1);  // and an expert's its experts' axis
    std::vector<uint16_t> half;  // the values in a 16-bit dtype, where the item is saved in one
    pt::DType dtype = pt::DType::F32;
    const void* data = box.data();
    size_t bytes = box.size() * sizeof(float);
    if (!t.dtype.empty() && t.dtype != "fp32") {
      half.resize(box.size());
      if (t.dtype == "bf16") pt::Fp32ToBf16(box.data(), half.data(), box.size()), dtype = pt::DType::BF16;
      else pt::Fp32ToFp16(box.data(), half.data(), box.size()), dtype = pt::DType::F16;
      data = half.data(), bytes = half.size() * sizeof(uint16_t);
    }
    const uint32_t crc = pt::Crc32(0, {reinterpret_cast<const uint8_t*>(data), bytes});
    auto tensor = pt::OwnedTensor(nullptr, data, dtype, sizes);
    const pt::TorchFileFrame frame = pt::FrameTorchFile(*tensor, crc);
    out.Write(frame.head.data(), frame.head.size());
    out.Write(data, bytes);
    out.Write(frame.tail.data(), frame.tail.size());
    written += static_cast<int64_t>(frame.head.size() + bytes + frame.tail.size());
  }
  if (written != file.bytes)
    throw Error("internal: " + file.name + ": wrote " + std::to_string(written) + " bytes, planned " + std::to_string(file.bytes));
  out.Commit();
}

}  // namespace ucp::formats::dcp
