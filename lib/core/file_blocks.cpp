#include "core/file_blocks.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/file_descriptor.h"

namespace ucp {

uint64_t ReadFdBlocks(int fd, const std::string& path, size_t block,
                      const std::function<void(const void*, size_t, uint64_t)>& fn) {
  std::vector<unsigned char> buffer(block);
  uint64_t total = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Error(path + ": read failed: " + std::strerror(errno));
    if (n == 0) break;
    fn(buffer.data(), static_cast<size_t>(n), total);
    total += static_cast<uint64_t>(n);
  }
  return total;
}

uint64_t ReadFileBlocks(const std::string& path, const std::function<void(const void*, size_t)>& fn) {
  const Fd fd = Fd::OpenOrThrow(path, O_RDONLY);
  ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
  return ReadFdBlocks(fd.get(), path, 8 << 20, [&](const void* p, size_t n, uint64_t) { fn(p, n); });
}

}  // namespace ucp
