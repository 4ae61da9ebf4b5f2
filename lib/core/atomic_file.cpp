#include "core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace ucp {
namespace {

std::string DirName(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::atomic<uint64_t> g_counter{0};
constexpr size_t kBufferLimit = 1 << 20;

}  // namespace

AtomicFile::AtomicFile(std::string path, Durability durability, Digest digest)
    : path_(std::move(path)), durability_(durability), digest_(digest) {
  temp_ = path_ + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(g_counter++);
  fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error(path_ + ": cannot create " + temp_ + ": " + std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(temp_.c_str());
  }
}

void AtomicFile::WriteAll(const char* p, size_t left) {
  while (left > 0) {
    ssize_t n = ::write(fd_, p, std::min<size_t>(left, 1 << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(path_ + ": write failed: " + std::strerror(errno));
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
}

void AtomicFile::FlushBuffer() {
  WriteAll(buffer_.data(), buffer_.size());
  buffer_.clear();
}

void AtomicFile::Write(const void* data, size_t size) {
  if (fd_ < 0) throw Error(path_ + ": write after commit");
  if (digest_ == Digest::Xxh64) hash_.Update(data, size);
  size_ += size;
  if (buffer_.size() + size > kBufferLimit) FlushBuffer();
  if (size <= kBufferLimit) {
    buffer_.append(static_cast<const char*>(data), size);
  } else {
    WriteAll(static_cast<const char*>(data), size);  // large payload: no staging copy
  }
}

FileDigest AtomicFile::Commit() {
  FlushBuffer();
  if (durability_ == Durability::Now && ::fsync(fd_) != 0) throw Error(path_ + ": fsync failed: " + std::strerror(errno));
  if (::close(fd_) != 0) {
    fd_ = -1;
    ::unlink(temp_.c_str());
    throw Error(path_ + ": close failed: " + std::strerror(errno));
  }
  fd_ = -1;
  if (::rename(temp_.c_str(), path_.c_str()) != 0) {
    int err = errno;
    ::unlink(temp_.c_str());
    throw Error(path_ + ": rename from " + temp_ + " failed: " + std::strerror(err));
  }
  if (durability_ == Durability::Now) {
    int dir = ::open(DirName(path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir >= 0) {
      ::fsync(dir);
      ::close(dir);
    }
  }
  return {size_, digest_ == Digest::Xxh64 ? hash_.Digest() : 0};
}

void SyncFileSystemOf(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path + ": cannot open to sync its file system: " + std::strerror(errno));
  const int rc = ::syncfs(fd), err = errno;
  ::close(fd);
  if (rc != 0) throw Error(path + ": syncing its file system failed: " + std::strerror(err));
}

FileDigest WriteFileAtomically(const std::string& path, const std::string& contents) {
  AtomicFile f(path);
  f.Write(contents.data(), contents.size());
  return f.Commit();
}

}  // namespace ucp
