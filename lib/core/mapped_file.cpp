#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "core/file_descriptor.h"

namespace ucp {

std::shared_ptr<MappedFile> MappedFile::Open(const std::string& path, bool keep_read_fd) {
  const Fd fd = Fd::OpenOrThrow(path, O_RDONLY);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw Error(path + ": cannot stat: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw Error(path + ": not a regular file");
  size_t size = static_cast<size_t>(st.st_size);
  uint8_t* data = nullptr;
  if (size > 0) {
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd.get(), 0);
    if (p == MAP_FAILED) throw Error(path + ": cannot map " + std::to_string(size) + " bytes: " + std::strerror(errno));
    data = static_cast<uint8_t*>(p);
  }
  return std::shared_ptr<MappedFile>(new MappedFile(path, data, size, st.st_dev, st.st_ino, keep_read_fd));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

void MappedFile::ReleaseResidentPages() const {
  if (size_ > 0) ::madvise(data_, size_, MADV_DONTNEED);
}

Fd MappedFile::OpenForRead() const {
  Fd fd = Fd::OpenOrThrow(path_, O_RDONLY);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || st.st_dev != dev_ || st.st_ino != ino_) throw Error(path_ + ": replaced while being read");
  return fd;
}

int MappedFile::ReadFd() const {
  const std::lock_guard<std::mutex> lock(read_fd_mutex_);
  if (!read_fd_.open()) read_fd_ = OpenForRead();
  return read_fd_.get();
}

void MappedFile::ReadAt(uint64_t offset, size_t n, void* dst) const {
  if (offset > size_ || n > size_ - offset)
    throw Error(path_ + ": read of " + std::to_string(n) + " bytes at " + std::to_string(offset) + " past its end");
  const Fd own = keep_read_fd_ ? Fd() : OpenForRead();
  const int fd = keep_read_fd_ ? ReadFd() : own.get();
  auto* to = static_cast<uint8_t*>(dst);
  while (n > 0) {
    const ssize_t got = ::pread(fd, to, n, static_cast<off_t>(offset));
    if (got <= 0) {
      if (got < 0 && errno == EINTR) continue;
      const std::string why = got < 0 ? std::strerror(errno) : "unexpected end of file";
      throw Error(path_ + ": read failed at byte " + std::to_string(offset) + ": " + why);
    }
    to += got, offset += static_cast<uint64_t>(got), n -= static_cast<size_t>(got);
  }
}

}  // namespace ucp
