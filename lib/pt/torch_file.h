// torch.save files: read into a Value tree whose tensors are views over the memory-mapped archive,
// and write Value trees (dicts of str -> tensor / scalar / list / object) that Python's torch.load
// reads. The writer streams each tensor's bytes from its own memory to disk: no second copy.
#pragma once

#include <memory>
#include <string>

#include "core/atomic_file.h"
#include "pt/value.h"
#include "pt/zip_archive.h"

namespace ucp::pt {

struct ReadOptions {
  bool verify_pickle_crc = true;    // data.pkl is small; a flipped byte is caught here
  bool verify_storage_crc = false;  // reads every tensor byte once, and checks every other record too
};
// Storages of at most this many bytes are checked as they are read even without verify_storage_crc:
// such a tensor (an optimizer's step, a scalar) is used as a value, never through a checked range.
inline constexpr uint64_t kAlwaysCheckedStorageBytes = 4096;

struct TorchFile {
  std::shared_ptr<ZipArchive> archive;
  std::string prefix;  // "archive/" or whatever name the writer gave the archive
  ValuePtr root;
};

// Throws ucp::Error whose message starts with the file's path.
TorchFile ReadTorchFile(const std::string& path, const ReadOptions& options = {});

// The same for an archive already opened (ReadTorchFile's work after opening the file); errors name
// the archive's path.
TorchFile ReadTorchArchive(std::shared_ptr<ZipArchive> archive, const ReadOptions& options = {});

// Writes `root` as a torch.save zip archive (pickle protocol 2) at `path`, atomically: the bytes go
// to a temporary name in the same directory, are fsynced (Durability::Now; Batch: see
// core/atomic_file.h), and are renamed over `path`. The XXH64 of the file's bytes is computed as
// they go unless Digest::None.
FileDigest WriteTorchFile(const std::string& path, const Value& root, Durability durability = Durability::Now,
                          Digest digest = Digest::Xxh64);

// A torch.save file of `root`, whose one tensor several writers put in place: the bytes before the
// tensor's data (`head`, whose size does not depend on `crc`) and after them (`tail`), `crc` being
// the CRC-32 of its data_size bytes. head + the tensor's bytes + tail is the file WriteTorchFile
// writes of the same value, byte for byte.
struct TorchFileFrame {
  std::string head, tail;
  uint64_t data_size = 0;
};
TorchFileFrame FrameTorchFile(const Value& root, uint32_t crc);

// The torch.save file of `root` as bytes in memory (small values: a DCP bytes item, a step).
std::string TorchFileBytes(const Value& root);

// A pickle (protocol 2) of a tree without tensors: data for pickle.load (DCP's .metadata).
std::string PickleData(const Value& root);

// The pickle alone (tensors become persistent ids 0, 1, ... in order of appearance), for tests.
std::string PickleForTesting(const Value& root);

}  // namespace ucp::pt
