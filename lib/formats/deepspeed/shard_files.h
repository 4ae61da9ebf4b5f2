// Finding a DeepSpeed checkpoint's shard files: the tag folder, each file's kind and ranks from its
// name, its (pp, tp) once the degrees are known, the grid the files must fill; and each file read
// once, for every step of the index that asks for it.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "formats/deepspeed/names.h"
#include "formats/deepspeed/redundancy.h"
#include "pt/torch_file.h"
#include "source/source_index.h"

namespace ucp::deepspeed {

// The shard folder: dir/<contents of dir/latest> when `latest` exists, else `dir` itself.
std::string ResolveShardDir(const std::string& dir, std::string* tag);

// The index's word for each kind of file (what ucp-inspect prints), and back.
const char* KindName(FileKind k);
FileKind KindOf(const source::ShardFile& f);
// How many of L's files are of kind k.
long CountOf(const source::SourceIndex& L, FileKind k);

// What the file names say that L.files does not keep.
struct FileNames {
  std::vector<int> mps;  // per file: the model-parallel rank its name holds
  bool any_bf16_prefix = false;
};
// L.files, from the names in L.dir in sorted order (an unrecognised .pt name noted). Throws
// ucp::Error when no model-states file is there: not a DeepSpeed checkpoint folder.
FileNames FindShardFiles(source::SourceIndex& L);

// Each file's (pp, tp) from the model-parallel rank its name holds (ZeRO-3 names files by TP rank).
void PlaceOnGrid(source::SourceIndex& L, const FileNames& names, bool zero3_files);

// The file grid must be complete and hold nothing beyond the degrees. `optimizer_files`: the
// save has a ZeRO or BF16 optimizer file per (pp, tp, dp). False when it should and has none at all
// (ucp-reshard --no-optimizer's tag: one error, and nothing further to index).
bool CheckFileGrid(source::SourceIndex& L, const FileNames& names, bool zero3_files, bool optimizer_files);

// Each shard file read once (its pickle's CRC-32 checked, and its storages' with
// verify_storage_crc): a file that does not read is one error of the index, and nullptr to every
// step that asks for it.
class ShardReader {
 public:
  ShardReader(source::SourceIndex& L, const source::IndexOptions& options) : L_(L), options_(options) {}
  std::shared_ptr<pt::TorchFile> operator()(const source::ShardFile& f);
  // The files asked for so far, by name (nullptr: did not read).
  const std::map<std::string, std::shared_ptr<pt::TorchFile>>& read() const { return read_; }

 private:
  source::SourceIndex& L_;
  const source::IndexOptions& options_;
  std::map<std::string, std::shared_ptr<pt::TorchFile>> read_;
};

}  // namespace ucp::deepspeed
