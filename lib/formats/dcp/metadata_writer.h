// DCP's `.metadata` as torch 2.6's FileSystemWriter pickles it (`../shared/real-dcp/README.md`), so
// that torch.distributed.checkpoint.load reads ucp's files as its own: Metadata(state_dict_metadata,
// planner_data, storage_data, storage_meta); a tensor key's TensorStorageMetadata(properties, size,
// chunks) with TensorProperties' state the tuple (dtype, layout, requires_grad, memory_format,
// pin_memory), each chunk a ChunkStorageMetadata(offsets, sizes), in rank order; a bytes key's
// BytesStorageMetadata(); storage_data MetadataIndex(fqn, index, offset; a bytes item's index None
// and no offset) -> _StorageInfo(
// relative_path, offset, length), rank by rank in the order each file holds them. Dataclasses are
// built as pickle builds them (cls.__new__, then their fields); sizes and offsets are torch.Size.
// Written with pickle protocol 2 (torch writes 4; pickle.load reads either), and storage_meta's
// checkpoint_id as pathlib.PosixPath (Python 3.13 pickles pathlib._local.PosixPath, which older
// Pythons cannot load): the output folder's name (torch records the path its caller gave; the name
// keeps the bytes the same wherever the folder is).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "pt/value.h"

namespace ucp::formats::dcp {

// One write item of one rank: a tensor's chunk (a 0-d tensor: empty shape, offsets and sizes) or a
// bytes item, and where its torch.save file lies.
struct SavedItem {
  std::string key;
  bool bytes = false;
  std::vector<int64_t> shape, offsets, sizes;
  std::string file;
  int64_t offset = 0, length = 0;
  pt::DType dtype = pt::DType::F32;  // a tensor's, as TensorProperties records it
};

struct SavedCheckpoint {
  // Per rank: its items in its save plan's order (the state dict's), and their order in its file.
  std::vector<std::vector<SavedItem>> items;
  std::vector<std::vector<int>> file_order;
  // Every key's place in the nested state dict, in the state dict's order: ("model", fqn),
  // ("optim", "state", fqn, state), ("optim", "param_groups", group, option).
  std::vector<std::pair<std::string, pt::ValuePtr>> planner_data;
  std::string checkpoint_id, save_id;
};

// The pickle `.metadata` holds.
std::string MetadataPickle(const SavedCheckpoint& c);

}  // namespace ucp::formats::dcp
