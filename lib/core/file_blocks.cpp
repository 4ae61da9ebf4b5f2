#include "core/file_blocks.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace ucp {

uint64_t ReadFileBlocks(const std::string& path, const std::function<void(const void*, size_t)>& fn) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  std::vector<unsigned char> block(8 << 20);
  uint64_t total = 0;
  for (;;) {
    ssize_t n = ::read(fd, block.data(), block.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      throw Error(path + ": read failed: " + std::strerror(err));
    }
    if (n == 0) break;
    try {
      fn(block.data(), static_cast<size_t>(n));
    } catch (...) {
      ::close(fd);
      throw;
    }
    total += static_cast<uint64_t>(n);
  }
  ::close(fd);
  return total;
}

}  // namespace ucp
