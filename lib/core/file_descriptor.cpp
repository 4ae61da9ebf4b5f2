#include "core/file_descriptor.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace ucp {

Fd Fd::Open(const std::string& path, int flags, mode_t mode) { return Fd(::open(path.c_str(), flags | O_CLOEXEC, mode)); }

Fd Fd::OpenOrThrow(const std::string& path, int flags, mode_t mode) {
  Fd fd = Open(path, flags, mode);
  if (!fd.open()) throw Error(path + ": cannot open: " + std::strerror(errno));
  return fd;
}

int Fd::Close() noexcept { return fd_ < 0 ? 0 : ::close(std::exchange(fd_, -1)); }

void Fd::Reset() noexcept {
  if (fd_ < 0) return;
  const int saved = errno;  // a message about to be built from errno keeps its cause
  ::close(std::exchange(fd_, -1));
  errno = saved;
}

}  // namespace ucp
