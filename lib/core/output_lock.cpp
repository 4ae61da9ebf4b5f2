#include "core/output_lock.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/fault_point.h"
#include "core/file_descriptor.h"
#include "core/format.h"
#include "core/process.h"

namespace ucp {
namespace {

namespace fs = std::filesystem;

// What a lock file holds; "" when it cannot be read (then never judged stale, nor taken as ours).
std::string ReadAll(const std::string& path) { return ReadWholeFile(path).value_or(""); }

// A lock's field, of the type ucp writes it in; `fallback` where it is absent or of another type (a
// lock file edited or written by something else is judged, never a crash).
std::string Field(const nlohmann::json& holder, const char* key, const std::string& fallback) {
  const auto it = holder.find(key);
  return it != holder.end() && it->is_string() ? it->get<std::string>() : fallback;
}
long PidOf(const nlohmann::json& holder) {
  const auto it = holder.find("pid");
  return it != holder.end() && it->is_number_integer() ? it->get<long>() : 0L;
}

// Whether the holder a lock names is known to be gone: on this host, and its process gone (see
// ProcessGone). A lock of another host, or one that cannot be read, is never stale.
bool Stale(const nlohmann::json& holder) {
  if (!holder.is_object() || Field(holder, "host", "") != HostName()) return false;
  return ProcessGone(PidOf(holder), Field(holder, "start_ticks", ""));
}

std::string Describe(const nlohmann::json& holder) {
  if (!holder.is_object()) return "a lock that cannot be read";
  std::string s = Field(holder, "tool", "a ucp tool") + ", pid " + std::to_string(PidOf(holder)) + " on host " +
                  Field(holder, "host", "?") + ", since " + Field(holder, "started", "?");
  if (Field(holder, "host", "") != HostName()) s += " (another host: whether it still runs cannot be checked from here)";
  return s;
}

// The private names (.ucp-lock.*) of runs killed while taking a lock, removed by the run that holds
// it (a run still taking one loses anyway).
void RemoveLeftovers(const std::string& dir) {
  std::error_code ec;
  std::vector<fs::path> left;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().rfind(std::string(OutputLock::kFileName) + ".", 0) == 0) left.push_back(e.path());
  for (const auto& p : left) fs::remove(p, ec);
}

}  // namespace

OutputLock::OutputLock(const std::string& dir, const std::string& tool, std::string* note) {
  if (note) note->clear();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(dir + ": cannot create the output folder: " + ec.message());
  path_ = dir + "/" + kFileName;
  const long pid = static_cast<long>(::getpid());
  content_ = nlohmann::json{{"tool", tool}, {"host", HostName()}, {"pid", pid}, {"start_ticks", StartTicks(pid)},
                            {"started", UtcTimestamp()}}.dump() + "\n";
  // The lock appears whole or not at all: written under a private name, then linked to its own
  // (link(2) fails if the name exists: the exclusive step).
  const std::string mine = TemporaryName(path_);
  {
    Fd fd = Fd::Open(mine, O_WRONLY | O_CREAT | O_TRUNC);
    if (!fd.open()) throw Error(dir + ": cannot write its lock " + mine + ": " + std::strerror(errno));
    const bool ok = ::write(fd.get(), content_.data(), content_.size()) == static_cast<ssize_t>(content_.size());
    fd.Reset();
    if (!ok) {
      ::unlink(mine.c_str());
      throw Error(dir + ": cannot write its lock " + mine);
    }
  }
  for (int attempt = 0; attempt < 5; ++attempt) {
    if (::link(mine.c_str(), path_.c_str()) == 0) {
      RemoveLeftovers(dir);
      FaultPoint("lock-taken", path_);
      return;
    }
    if (errno == EPERM || errno == ENOTSUP || errno == ENOSYS) {  // a file system without hard links
      if (Fd fd = Fd::Open(path_, O_WRONLY | O_CREAT | O_EXCL); fd.open()) {
        const bool ok = ::write(fd.get(), content_.data(), content_.size()) == static_cast<ssize_t>(content_.size());
        fd.Reset();
        if (!ok) {
          ::unlink(mine.c_str());
          throw Error(dir + ": cannot write its lock " + path_);
        }
        RemoveLeftovers(dir);
        FaultPoint("lock-taken", path_);
        return;
      }
    }
    if (errno != EEXIST) {
      const int err = errno;
      ::unlink(mine.c_str());
      throw Error(dir + ": cannot take its lock " + path_ + ": " + std::strerror(err));
    }
    const std::string seen = ReadAll(path_);
    const nlohmann::json holder = nlohmann::json::parse(seen, nullptr, false);
    if (!Stale(holder)) {
      ::unlink(mine.c_str());
      throw Error(dir + ": another run is writing this folder: " + Describe(holder) + " (" + path_ +
                  "); wait for it to end, or remove that file if it no longer runs");
    }
    // Take the stale lock away under a private name, and check that what was moved is the lock
    // judged stale (not a live one another run created meanwhile: then it goes back).
    const std::string moved = path_ + ".stale-" + std::to_string(pid);
    if (::rename(path_.c_str(), moved.c_str()) != 0) continue;  // gone already: try again
    if (ReadAll(moved) == seen) {
      ::unlink(moved.c_str());
      if (note) *note = "took over the lock of a run that is gone: " + Describe(holder);
    } else {
      ::link(moved.c_str(), path_.c_str());
      ::unlink(moved.c_str());
    }
  }
  ::unlink(mine.c_str());
  throw Error(dir + ": could not take its lock " + path_ + " (other runs keep taking it)");
}

OutputLock::~OutputLock() {
  if (ReadAll(path_) == content_) ::unlink(path_.c_str());  // only our own
}

void RefuseOutputWithin(const std::string& output, const std::string& input, const std::string& what, const std::string& fix) {
  std::error_code ec;
  const fs::path out = fs::weakly_canonical(output, ec), in = fs::weakly_canonical(input, ec);
  if (out.empty() || in.empty()) return;
  auto o = out.begin(), i = in.begin();
  for (; i != in.end() && !i->empty(); ++i, ++o)  // a trailing "" component (a path ending in /) matches anything
    if (o == out.end() || *o != *i) return;
  fs::path plain = fs::absolute(output, ec).lexically_normal();
  if (!plain.has_filename()) plain = plain.parent_path();
  const bool linked = out != plain;
  throw Error(output + ": the output folder " + (out == in ? "is " : "is inside ") + what + " " + input +
              (linked ? " (through a symbolic link: it resolves to " + out.string() + ")" : "") + (fix.empty() ? "" : ": " + fix));
}

std::string OutputLock::RemoveStale(const std::string& dir, const std::string& tool) {
  if (!fs::exists(dir + "/" + kFileName)) return "";
  std::string note;
  OutputLock taken(dir, tool, &note);  // released at once: the lock file goes with it
  return note;
}

bool OutputLock::HoldsOnlyLock(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))  // the lock, and what a run killed while taking one leaves
    if (e.path().filename().string().rfind(kFileName, 0) != 0) return false;
  return true;
}

}  // namespace ucp
