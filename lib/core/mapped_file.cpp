#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace ucp {

std::shared_ptr<MappedFile> MappedFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw Error(path + ": cannot stat: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(path + ": not a regular file");
  }
  size_t size = static_cast<size_t>(st.st_size);
  uint8_t* data = nullptr;
  if (size > 0) {
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      throw Error(path + ": cannot map " + std::to_string(size) + " bytes: " + std::strerror(err));
    }
    data = static_cast<uint8_t*>(p);
  }
  ::close(fd);
  return std::shared_ptr<MappedFile>(new MappedFile(path, data, size, st.st_dev, st.st_ino));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

void MappedFile::ReleaseResidentPages() const {
  if (size_ > 0) ::madvise(data_, size_, MADV_DONTNEED);
}

void MappedFile::ReadAt(uint64_t offset, size_t n, void* dst) const {
  if (offset > size_ || n > size_ - offset)
    throw Error(path_ + ": read of " + std::to_string(n) + " bytes at " + std::to_string(offset) + " past its end");
  int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path_ + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_dev != dev_ || st.st_ino != ino_) {
    ::close(fd);
    throw Error(path_ + ": replaced while being read");
  }
  auto* to = static_cast<uint8_t*>(dst);
  while (n > 0) {
    const ssize_t got = ::pread(fd, to, n, static_cast<off_t>(offset));
    if (got <= 0) {
      if (got < 0 && errno == EINTR) continue;
      const std::string why = got < 0 ? std::strerror(errno) : "unexpected end of file";
      ::close(fd);
      throw Error(path_ + ": read failed at byte " + std::to_string(offset) + ": " + why);
    }
    to += got, offset += static_cast<uint64_t>(got), n -= static_cast<size_t>(got);
  }
  ::close(fd);
}

}  // namespace ucp
