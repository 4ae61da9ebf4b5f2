// A whole file mapped into memory, copy-on-write: tensors read from a checkpoint are views into
// this mapping (no copy), and a stray write into such a view changes only this process's pages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>

#include "core/file_descriptor.h"

namespace ucp {

class MappedFile {
 public:
  // Throws ucp::Error naming the path on any failure (missing, unreadable, not a regular file).
  // `keep_read_fd`: ReadAt opens the path once and keeps the descriptor while the mapping lives,
  // for an owner that reads a file in many pieces and holds few such files at once (an open on a
  // cluster's parallel file system is a round trip to its metadata server); else it opens the path
  // for each read, so that thousands of mapped files hold no descriptor.
  static std::shared_ptr<MappedFile> Open(const std::string& path, bool keep_read_fd = false);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  uint8_t* mutable_data() const { return data_; }
  size_t size() const { return size_; }
  // Drops the pages read so far from this process (they stay in the page cache): what a reader
  // that moves on frees, so that its resident memory does not grow with the files it has read.
  // Only for mappings nobody wrote into.
  void ReleaseResidentPages() const;
  // Bytes [offset, offset + n) of the file into dst by pread(2), not through the mapping: a large
  // read from the page cache costs a fraction of faulting the mapping's pages in and copying
  // from them (8x on a virtual machine here). Checks that the path still names the mapped file (once,
  // with `keep_read_fd`). Safe from several threads.
  void ReadAt(uint64_t offset, size_t n, void* dst) const;

 private:
  MappedFile(std::string path, uint8_t* data, size_t size, uint64_t dev, uint64_t ino, bool keep_read_fd)
      : path_(std::move(path)), data_(data), size_(size), dev_(dev), ino_(ino), keep_read_fd_(keep_read_fd) {}
  Fd OpenForRead() const;  // the path, checked to name the mapped file
  int ReadFd() const;      // with keep_read_fd: ReadAt's descriptor, opened on first use
  std::string path_;
  uint8_t* data_;
  size_t size_;
  uint64_t dev_, ino_;
  bool keep_read_fd_;
  mutable std::mutex read_fd_mutex_;
  mutable Fd read_fd_;
};

}  // namespace ucp
