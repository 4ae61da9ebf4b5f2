#include "core/atomic_file.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/fault_point.h"
#include "core/process.h"

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
constexpr const char* kTempMark = ".tmp-";

}  // namespace

AtomicFile::AtomicFile(std::string path, Durability durability, Digest digest)
    : path_(std::move(path)), durability_(durability), digest_(digest) {
  temp_ = TemporaryName(path_);
  fd_ = Fd::Open(temp_, O_WRONLY | O_CREAT | O_TRUNC);
  if (!fd_.open()) throw Error(path_ + ": cannot create " + temp_ + ": " + std::strerror(errno));
  FaultPoint("file-open", path_);
}

AtomicFile::~AtomicFile() {
  if (fd_.open()) {
    fd_.Reset();
    ::unlink(temp_.c_str());
  }
}

void AtomicFile::WriteAll(const char* p, size_t left) {
  while (left > 0) {
    ssize_t n = ::write(fd_.get(), p, std::min<size_t>(left, 1 << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(path_ + ": write failed: " + std::strerror(errno));
    }
    p += n;
    left -= static_cast<size_t>(n);
    FaultPoint("file-write", path_);
  }
}

void AtomicFile::FlushBuffer() {
  WriteAll(buffer_.data(), buffer_.size());
  buffer_.clear();
}

void AtomicFile::Write(const void* data, size_t size) {
  if (!fd_.open()) throw Error(path_ + ": write after commit");
  if (digest_ == Digest::Xxh64) hash_.Update(data, size);
  size_ += size;
  if (buffer_.size() + size > kBufferLimit) FlushBuffer();
  if (size <= kBufferLimit) {
    buffer_.append(static_cast<const char*>(data), size);
  } else {
    WriteAll(static_cast<const char*>(data), size);  // large payload: no staging copy
  }
}

bool AtomicFile::Clone(int from_fd) {
  if (!fd_.open() || size_ != 0 || !buffer_.empty()) throw Error(path_ + ": internal: a clone into a file already written");
  if (::ioctl(fd_.get(), FICLONE, from_fd) != 0) return false;
  struct stat st {};
  if (::fstat(fd_.get(), &st) != 0) throw Error(path_ + ": cannot stat the clone: " + std::strerror(errno));
  size_ = static_cast<uint64_t>(st.st_size);
  FaultPoint("file-write", path_);
  return true;
}

FileDigest AtomicFile::Commit() {
  FlushBuffer();
  FaultPoint("file-written", path_);
  if (durability_ == Durability::Now) {
    if (::fsync(fd_.get()) != 0) throw Error(path_ + ": fsync failed: " + std::strerror(errno));
    FaultPoint("file-synced", path_);
  } else {
    // Batch: the file is made durable later, with the others (one sync). Its writeback starts now,
    // on a thread of its own, so that the disk works while the run goes on and that sync finds
    // little left to write.
    if (int dup = ::fcntl(fd_.get(), F_DUPFD_CLOEXEC, 0); dup >= 0) StartWriteback(dup);
  }
  if (fd_.Close() != 0) {
    ::unlink(temp_.c_str());
    throw Error(path_ + ": close failed: " + std::strerror(errno));
  }
  if (::rename(temp_.c_str(), path_.c_str()) != 0) {
    int err = errno;
    ::unlink(temp_.c_str());
    throw Error(path_ + ": rename from " + temp_ + " failed: " + std::strerror(err));
  }
  FaultPoint("file-renamed", path_);
  if (durability_ == Durability::Now) {
    if (const Fd dir = Fd::Open(DirName(path_), O_RDONLY | O_DIRECTORY); dir.open()) ::fsync(dir.get());
  }
  return {size_, digest_ == Digest::Xxh64 ? hash_.Digest() : 0};
}

namespace {

// The writeback starter: one thread that asks the kernel to start writing each handed-over file
// or range of a file (sync_file_range, SYNC_FILE_RANGE_WRITE, which may block while the device's
// queue is full: better here than in a writer) and then closes its descriptor. Started with the
// first file; the process's exit ends it (queued files are closed by the exit, their bytes already
// in the page cache).
class WritebackStarter {
 public:
  static WritebackStarter& Get() {
    static auto* the = new WritebackStarter;  // never destroyed: no join at exit
    return *the;
  }
  void Add(int fd, uint64_t offset, uint64_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back({Fd(fd), offset, bytes});
      if (!thread_started_) {
        thread_started_ = true;
        std::thread([this] { Run(); }).detach();
      }
    }
    cv_.notify_one();
  }
  // Returns when every file handed over so far has had its writeback started.
  void Flush() {
    std::unique_lock<std::mutex> lock(mu_);
    idle_.wait(lock, [&] { return queue_.empty() && !busy_; });
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return !queue_.empty(); });
      Range r = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      lock.unlock();
      ::sync_file_range(r.fd.get(), static_cast<off_t>(r.offset), static_cast<off_t>(r.bytes), SYNC_FILE_RANGE_WRITE);
      r.fd.Reset();
      lock.lock();
      busy_ = false;
      if (queue_.empty()) idle_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_, idle_;
  struct Range {
    Fd fd;
    uint64_t offset, bytes;  // bytes 0: to the end of the file
  };
  std::deque<Range> queue_;
  bool busy_ = false, thread_started_ = false;
};

}  // namespace

void StartWriteback(int fd, uint64_t offset, uint64_t bytes) { WritebackStarter::Get().Add(fd, offset, bytes); }

void SyncFileSystemOf(const std::string& path) {
  WritebackStarter::Get().Flush();  // its files' descriptors closed, their writeback under way
  Fd fd = Fd::Open(path, O_RDONLY);
  if (!fd.open()) throw Error(path + ": cannot open to sync its file system: " + std::strerror(errno));
  const int rc = ::syncfs(fd.get()), err = errno;
  fd.Reset();
  if (rc != 0) throw Error(path + ": syncing its file system failed: " + std::strerror(err));
  FaultPoint("sync", path);
}

void CreateSpreadFolder(const std::string& dir) {
  std::filesystem::create_directories(dir);
  const Fd fd = Fd::Open(dir, O_RDONLY | O_DIRECTORY);
  if (!fd.open()) throw Error(dir + ": cannot open the folder just created: " + std::strerror(errno));
  int flags = 0;  // a hint: a file system that has no such flags, or refuses them, writes as it would anyway
  if (::ioctl(fd.get(), FS_IOC_GETFLAGS, &flags) == 0 && !(flags & FS_TOPDIR_FL)) {
    flags |= FS_TOPDIR_FL;
    (void)::ioctl(fd.get(), FS_IOC_SETFLAGS, &flags);
  }
}

FileDigest WriteFileAtomically(const std::string& path, const std::string& contents) {
  AtomicFile f(path);
  f.Write(contents.data(), contents.size());
  return f.Commit();
}

std::optional<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string TemporaryName(const std::string& path, long pid, uint64_t n) {
  return path + kTempMark + std::to_string(pid) + "-" + std::to_string(n);
}

std::string TemporaryName(const std::string& path) { return TemporaryName(path, ::getpid(), NextTemporarySerial()); }

uint64_t NextTemporarySerial() { return g_counter++; }

std::string SharedTemporaryName(const std::string& path) { return path + kTempMark + "split"; }

bool IsTemporaryName(const std::string& file_name) { return file_name.find(kTempMark) != std::string::npos; }

void RemoveTemporaries(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<fs::path> found;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
    if (!it->is_directory() && IsTemporaryName(it->path().filename().string())) found.push_back(it->path());
  for (const auto& p : found) fs::remove(p, ec);
}

void RemoveDeadTemporariesOf(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  const std::string prefix = p.filename().string() + kTempMark;
  std::error_code ec;
  std::vector<fs::path> dead;
  for (const auto& e : fs::directory_iterator(p.has_parent_path() ? p.parent_path() : fs::path("."), ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const long pid = std::atol(name.c_str() + prefix.size());  // "<pid>-<n>"
    if (pid > 0 && ProcessGone(pid)) dead.push_back(e.path());
  }
  for (const auto& d : dead) fs::remove(d, ec);
}

}  // namespace ucp
