#include "pt/record_crc.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "pt/zip_archive.h"

namespace ucp::pt {

uint32_t Crc32Of(int fd, uint64_t offset, uint64_t size, const std::string& path, const std::string& record) {
  std::vector<uint8_t> block(static_cast<size_t>(std::min<uint64_t>(size, uint64_t{8} << 20)));
  uint32_t crc = 0;
  for (uint64_t at = 0; at < size;) {
    const ssize_t got = ::pread(fd, block.data(), static_cast<size_t>(std::min<uint64_t>(block.size(), size - at)),
                                static_cast<off_t>(offset + at));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw Error(path + ": record '" + record + "': read failed: " + std::strerror(errno));
    if (got == 0) throw Error(path + ": record '" + record + "': the file ends inside it (truncated?)");
    crc = Crc32(crc, {block.data(), static_cast<size_t>(got)});
    at += static_cast<uint64_t>(got);
  }
  return crc;
}

}  // namespace ucp::pt
