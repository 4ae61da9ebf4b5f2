// A PyTorch Distributed Checkpoint's `.metadata`: the pickle of torch.distributed.checkpoint's
// Metadata, read with ucp's data-only unpickler and then accepted only if every class it names is
// one DCP writes (kMetadataClasses): what each flattened key holds (a tensor's dtype, global size
// and chunks as boxes, or a bytes item), where each chunk's bytes lie (file, offset, length), and
// the original nesting of each key (planner_data).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "pt/value.h"

namespace ucp::formats::dcp {

// A box of the global tensor: elements offsets[d] <= i[d] < offsets[d] + sizes[d].
struct Chunk {
  std::vector<int64_t> offsets, sizes;
};

// The runs of box `c` in the row-major order of a tensor of `size`: fn(src_start, dst_start, numel),
// src counting in the box's own row-major order.
template <typename Fn>
void ForEachRun(const std::vector<int64_t>& size, const Chunk& c, Fn&& fn) {
  const int n = static_cast<int>(size.size());
  if (pt::Numel(c.sizes) == 0) return;
  int k = n - 1;  // the outermost dimension of the contiguous run
  while (k > 0 && c.sizes[k] == size[k]) --k;
  std::vector<int64_t> stride = pt::ContiguousStrides(size);
  const int64_t run = n == 0 ? 1 : c.sizes[k] * stride[k];
  int64_t runs = 1;
  for (int d = 0; d < k; ++d) runs *= c.sizes[d];
  std::vector<int64_t> at(std::max(k, 0), 0);
  for (int64_t r = 0; r < runs; ++r) {
    int64_t dst = n == 0 ? 0 : c.offsets[k] * stride[k];
    for (int d = 0; d < k; ++d) dst += (c.offsets[d] + at[d]) * stride[d];
    fn(r * run, dst, run);
    for (int d = k - 1; d >= 0 && ++at[d] == c.sizes[d]; --d) at[d] = 0;
  }
}

// Where an item's bytes lie: [offset, offset + length) of relative_path, a whole torch.save archive.
struct Storage {
  std::string relative_path;
  uint64_t offset = 0, length = 0;
};

// One element of a key's original nesting (planner_data): a dict key or a list index.
struct PathPart {
  std::string key;
  int64_t index = -1;  // >= 0: a list index, key empty
};

struct Item {
  std::string fqn;
  bool tensor = false;  // TensorStorageMetadata; else BytesStorageMetadata
  std::string dtype;    // torch's name: "float32", "bfloat16", ...
  std::vector<int64_t> size;
  std::vector<Chunk> chunks;
  std::vector<Storage> storage;  // per chunk (a bytes item: one)
  std::vector<PathPart> path;    // from planner_data; empty when the metadata has none
};

struct Metadata {
  std::vector<Item> items;                      // in the order state_dict_metadata lists them
  std::map<std::string, size_t> by_fqn;         // index into items
  std::vector<std::string> fields;              // Metadata's fields present, in order: the torch release's form
  std::optional<std::string> version;           // Metadata.version (torch 2.7+), as saved
  std::vector<std::string> transform_fields;    // _StorageInfo fields beyond the three torch 2.6 has
  std::vector<std::string> classes;             // every class the pickle names, once each, sorted
};

// The classes a DCP .metadata may name; any other is refused by name.
extern const char* const kMetadataClasses[];

// Reads and checks `path`. Throws ucp::Error naming the file and the key on anything malformed: a
// class not in kMetadataClasses, a chunk outside its tensor, a chunk without storage, a storage path
// that leaves the folder.
Metadata ReadMetadata(const std::string& path);

}  // namespace ucp::formats::dcp
