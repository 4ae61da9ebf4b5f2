#include "core/fault_point.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <mutex>

namespace ucp {
namespace {

struct Faults {
  bool active = false;
  std::string kill_name;
  long kill_at = 0;
  int log_fd = -1;
  std::string rank = "0";
  std::mutex mu;
  std::map<std::string, long> passed;

  Faults() {
    for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
      if (const char* r = std::getenv(v)) {
        rank = r;
        break;
      }
    if (const char* at = std::getenv("UCP_TEST_KILL_AT")) {
      const std::string s = at;
      const size_t colon = s.rfind(':');
      const char* only = std::getenv("UCP_TEST_KILL_RANK");
      if (colon != std::string::npos && (!only || rank == only)) {
        kill_name = s.substr(0, colon);
        kill_at = std::atol(s.c_str() + colon + 1);
      }
    }
    if (const char* log = std::getenv("UCP_TEST_FAULT_LOG"))
      log_fd = ::open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    active = kill_at > 0 || log_fd >= 0;
  }
};

Faults& Get() {
  static Faults f;
  return f;
}

}  // namespace

void FaultPoint(const char* name, const std::string& path) {
  Faults& f = Get();
  if (!f.active) return;
  std::lock_guard<std::mutex> lock(f.mu);
  const long n = ++f.passed[name];
  if (f.log_fd >= 0) {
    const std::string line = f.rank + " " + name + " " + std::to_string(n) + " " + path + "\n";
    if (::write(f.log_fd, line.data(), line.size()) < 0) {
      // a test's log: nothing to do about a failed write but go on
    }
  }
  if (n == f.kill_at && f.kill_name == name) ::raise(SIGKILL);
}

}  // namespace ucp
