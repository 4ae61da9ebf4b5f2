#include "formats/dcp/dcp_files.h"

#include <cstdio>

#include "core/xxhash64.h"
#include "pt/torch_file.h"

namespace ucp::formats::dcp {
using reshard::ExportTensor;

namespace {

// A tensor item's torch.save file: its size (the frame's does not depend on the CRC).
int64_t FramedLength(const ExportTensor& t, const std::vector<int64_t>& sizes) {
  pt::DType dtype = pt::DType::F32;
  if (!t.dtype.empty() && t.dtype != "fp32") dtype = t.dtype == "bf16" ? pt::DType::BF16 : pt::DType::F16;
  auto tensor = pt::ProducedTensor(dtype, sizes, [](uint64_t, uint64_t, uint8_t*) {});
  const pt::TorchFileFrame frame = pt::FrameTorchFile(*tensor, 0);
  return static_cast<int64_t>(frame.head.size() + frame.data_size + frame.tail.size());
}

}  // namespace

void LayDcpFile(int rank, const std::string& folder, std::vector<PlannedItem> items, reshard::ExportPlan& P, SavedCheckpoint& c) {
  reshard::ExportFile file;
  const std::string name = "__" + std::to_string(rank) + "_0.distcp";
  file.name = folder + name;
  std::vector<SavedItem>& saved = c.items.emplace_back();
  std::vector<int>& order = c.file_order.emplace_back();
  for (PlannedItem& it : items) it.saved.file = name, saved.push_back(it.saved);
  for (int pass = 0; pass < 2; ++pass)  // bytes items first
    for (size_t k = 0; k < saved.size(); ++k)
      if (saved[k].bytes == (pass == 0)) order.push_back(static_cast<int>(k));
  int64_t at = 0;
  for (int k : order) {
    SavedItem& s = saved[k];
    ExportTensor& t = items[k].data;
    s.offset = at;
    s.length = t.payload.empty() ? FramedLength(t, s.sizes) : static_cast<int64_t>(t.payload.size());
    at += s.length;
    file.tensors.push_back(static_cast<int>(P.tensors.size()));
    P.tensors.push_back(std::move(t));
  }
  file.bytes = at;
  P.files.push_back(std::move(file));
}

std::string SaveIdOf(const reshard::Source& S, const std::string& layout) {
  const std::string what = S.manifest["files"].dump() + layout;
  const uint64_t a = XxHash64::Of(what.data(), what.size()), b = XxHash64::Of(what.data(), what.size(), a);
  char id[40];
  std::snprintf(id, sizeof id, "%08x-%04x-4%03x-%04x-%012llx", static_cast<unsigned>(a >> 32), static_cast<unsigned>((a >> 16) & 0xFFFF),
                static_cast<unsigned>(a & 0xFFF), static_cast<unsigned>(0x8000 | ((b >> 48) & 0x3FFF)),
                static_cast<unsigned long long>(b & 0xFFFFFFFFFFFFull));
  return id;
}

}  // namespace ucp::formats::dcp
