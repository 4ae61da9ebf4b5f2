// Reading a whole file front to back in large blocks (checksums, copies), with errors that name it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace ucp {

// Calls fn(data, size) for consecutive blocks of the file; returns the bytes read. Throws
// ucp::Error naming the path when it cannot be opened or read.
uint64_t ReadFileBlocks(const std::string& path, const std::function<void(const void*, size_t)>& fn);
// The same over an open descriptor, read from its current position in blocks of `block` bytes;
// fn also gets the file offset of each block (`path` names the file in errors).
uint64_t ReadFdBlocks(int fd, const std::string& path, size_t block,
                      const std::function<void(const void*, size_t, uint64_t)>& fn);

}  // namespace ucp
