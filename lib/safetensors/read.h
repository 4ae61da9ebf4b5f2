// Reading a safetensors model (huggingface/safetensors, docs "format"): one model.safetensors, or
// shards named by model.safetensors.index.json's weight_map. Everything is checked before a byte of
// data is used: the 8-byte header length against the file and a cap, the JSON header, each tensor's
// dtype (F32, BF16, F16; any other refused by name), its shape times its element size against its
// data_offsets span, the spans tiling the data exactly (the format forbids holes and overlaps), and
// the index against the files (every tensor where it says, none missing, none extra, total_size).
// safetensors carries no checksum of the data: a flipped data byte passes these checks unseen.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/mapped_file.h"
#include "pt/value.h"

namespace ucp::safetensors {

inline constexpr uint64_t kMaxSafetensorsHeader = uint64_t{100} << 20;  // safetensors' own limit

struct StTensor {
  std::string name;
  pt::DType dtype = pt::DType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // data_offsets: bytes into the data after the header
};

struct StHeader {
  uint64_t data_start = 0;  // 8 + the header's length
  std::vector<StTensor> tensors;  // in offset order
  std::map<std::string, std::string> metadata;  // __metadata__
};

// The header of a safetensors file of `file_size` bytes whose first bytes are `prefix` (at least
// 8 + the header's length of them, where the file has that many). Throws ucp::Error naming `path`
// and the tensor.
StHeader ParseSafetensorsHeader(std::string_view prefix, uint64_t file_size, const std::string& path);

struct StIndex {
  std::map<std::string, std::string> weight_map;  // tensor -> file name (no folder)
  int64_t total_size = -1;                         // metadata.total_size; -1: not given
  std::vector<std::string> files;                  // the files it names, sorted
};

// model.safetensors.index.json's text. Throws ucp::Error naming `path`: no weight_map, a file name
// with a folder in it or not ending .safetensors, a total_size that is no non-negative integer.
StIndex ParseSafetensorsIndex(std::string_view text, const std::string& path);

// A model's safetensors files, opened (mapped) and checked against each other and the index.
struct StModel {
  struct File {
    std::string name;
    std::shared_ptr<MappedFile> map;
    StHeader header;
  };
  std::string dir;
  bool sharded = false;  // an index names the files
  std::vector<File> files;
  std::map<std::string, std::pair<int, int>> where;  // tensor -> (file, tensor in file)

  const StTensor& Tensor(const std::string& name) const;  // throws naming the tensor
  // The whole tensor widened to fp32 (bf16 and fp16 exactly) into dst (numel floats).
  void ReadFp32(const std::string& name, float* dst) const;
};

// Opens `dir`'s model.safetensors, or its index's shards. Throws ucp::Error naming the file.
StModel OpenSafetensorsModel(const std::string& dir);

// "F32" -> F32, "BF16" -> BF16, "F16" -> F16; false for any other name.
bool SafetensorsDType(std::string_view name, pt::DType* out);

}  // namespace ucp::safetensors
