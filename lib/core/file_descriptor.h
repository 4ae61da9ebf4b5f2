// Fd, the one owner of an open file descriptor: every file ucp opens by open(2) is held by one, so
// that it is closed exactly once on every path, a thrown error's included.
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>

namespace ucp {

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) noexcept : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { Reset(); }

  // open(2) of `path` with O_CLOEXEC added; not open(), with errno set, when it fails: the caller
  // says why in its own words.
  static Fd Open(const std::string& path, int flags, mode_t mode = 0644);
  // The same, or throws ucp::Error("<path>: cannot open: <why>").
  static Fd OpenOrThrow(const std::string& path, int flags, mode_t mode = 0644);

  int get() const { return fd_; }
  bool open() const { return fd_ >= 0; }
  // Hands the descriptor over to a new owner; this one holds none after.
  int Release() noexcept { return std::exchange(fd_, -1); }
  // Closes now and returns close(2)'s result (errno set when -1): where a write's error may first
  // show. Holds none after, either way.
  int Close() noexcept;
  // Closes, if open, ignoring the result: for a file only read, or one given up.
  void Reset() noexcept;

 private:
  int fd_ = -1;
};

}  // namespace ucp
