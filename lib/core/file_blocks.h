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

}  // namespace ucp
