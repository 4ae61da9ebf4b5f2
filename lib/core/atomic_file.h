// Atomic file creation. The protocol, in order:
//   1. write everything to "<name>.tmp-<pid>-<n>" in the destination directory,
//   2. fsync the temporary file,
//   3. rename it over the destination (atomic within one file system),
//   4. fsync the directory so the rename itself is durable.
// A file that is destroyed before Commit() removes its temporary: a killed or failed write never
// leaves a file under the final name, and a crash leaves only a "*.tmp-*" name behind.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "core/file_descriptor.h"
#include "core/xxhash64.h"

namespace ucp {

// What a committed file holds: its size and the XXH64 of its bytes, computed as they were written.
struct FileDigest {
  uint64_t size = 0;
  uint64_t xxh64 = 0;
};

// Now: the protocol above, file by file. Batch: steps 1 and 3 only, the file's writeback started
// in the background (StartWriteback); the caller makes the whole batch durable at once with
// SyncFileSystemOf before it writes what marks the batch complete (a manifest, `latest`). A killed process still leaves no file under its final name that is not complete (the
// bytes are in the page cache before the rename); a crash of the machine before the sync can lose
// batch files, but then no marker names them.
enum class Durability { Now, Batch };

// Xxh64: Commit() reports the XXH64 of the bytes, computed as they are written (what a manifest
// records). None: a file nothing records a digest of; its FileDigest::xxh64 is 0.
enum class Digest { Xxh64, None };

// One syncfs(2) of the file system holding `path`: every file written there so far, renames
// included, is durable when it returns. Throws ucp::Error naming the path.
void SyncFileSystemOf(const std::string& path);

// Hands the open descriptor `fd` to a background thread that starts the kernel writing the dirty
// pages of bytes [offset, offset + bytes) of the file (bytes 0: to its end) to disk and then closes
// it: a batch file's bytes, or a part of a shared file, travel to the disk while the run goes on,
// and the batch's one sync waits for little. Durability still comes from the sync.
void StartWriteback(int fd, uint64_t offset = 0, uint64_t bytes = 0);

// Creates the folder `dir` (and its parents) for many subfolders of many files each, and asks the
// file system to spread those subfolders over its allocation groups (ext2/3/4's "top of a
// directory hierarchy" flag; a file system without it ignores the request). Kept in one group, as
// ext4 places the subfolders of an ordinary folder, every file created scans that group's inode
// table, past each recently freed inode when the file system has no journal: an output written
// again where the last one was removed cost ucp-convert a third of its CPU in that scan.
void CreateSpreadFolder(const std::string& dir);

class AtomicFile {
 public:
  explicit AtomicFile(std::string path, Durability durability = Durability::Now, Digest digest = Digest::Xxh64);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void Write(const void* data, size_t size);
  // Makes the (still empty) file share the whole content of the open file `from_fd` (a reflink:
  // FICLONE, on file systems whose files can share extents, e.g. XFS, Btrfs); no byte is copied.
  // False, with nothing changed, where the file system cannot: the caller then writes the bytes.
  bool Clone(int from_fd);
  FileDigest Commit();
  const std::string& path() const { return path_; }

 private:
  void FlushBuffer();
  void WriteAll(const char* data, size_t size);
  std::string path_, temp_;
  Durability durability_;
  Digest digest_;
  Fd fd_;
  std::string buffer_;
  XxHash64 hash_;
  uint64_t size_ = 0;  // coalesces small writes (headers); large payloads bypass it
};

// Writes a whole small file atomically.
FileDigest WriteFileAtomically(const std::string& path, const std::string& contents);
// Reads a whole small file back; nullopt when it cannot be opened.
std::optional<std::string> ReadWholeFile(const std::string& path);

// The one naming rule for temporaries: "<path>.tmp-<pid>-<n>", n counting in process `pid`.
std::string TemporaryName(const std::string& path, long pid, uint64_t n);
// The same for this process and its next n.
std::string TemporaryName(const std::string& path);
// This process's next n: for a temporary several processes must name alike (rank 0's, shared).
uint64_t NextTemporarySerial();
// A temporary several processes write into alike, by name (a split item's file): "<path>.tmp-split".
std::string SharedTemporaryName(const std::string& path);
// Whether a file name (no folder) is a temporary's: a killed run's leftover, never complete.
bool IsTemporaryName(const std::string& file_name);
// Removes every temporary under `dir`, recursively: for a run that holds the folder's lock.
void RemoveTemporaries(const std::string& dir);
// Removes the temporaries of `path` (in its folder) whose process is gone: for a file outside
// any locked folder (latest_universal beside the atomic checkpoint).
void RemoveDeadTemporariesOf(const std::string& path);

}  // namespace ucp
