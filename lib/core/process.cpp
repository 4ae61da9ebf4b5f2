#include "core/process.h"

#include <sys/resource.h>

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <iterator>
#include <sstream>

namespace ucp {
namespace {

// The fields of /proc/PID/stat after the command name (which may hold spaces and parentheses):
// [0] is field 3, the state.
std::vector<std::string> StatFields(long pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  const std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');
  std::vector<std::string> fields;
  if (close == std::string::npos) return fields;
  std::istringstream s(stat.substr(close + 1));
  for (std::string f; fields.size() < 20 && s >> f;) fields.push_back(f);
  return fields;
}

}  // namespace

std::string HostName() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

std::string StartTicks(long pid) {
  auto fields = StatFields(pid);
  return fields.size() >= 20 ? fields[19] : "";
}

bool ProcessGone(long pid, const std::string& start_ticks) {
  if (pid <= 0) return false;
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return true;
  auto fields = StatFields(pid);
  if (fields.empty()) return false;  // no /proc: alive as far as can be told
  if (fields[0] == "Z" || fields[0] == "X") return true;
  return !start_ticks.empty() && fields.size() >= 20 && fields[19] != start_ticks;
}

int64_t PeakRssBytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;
}

}  // namespace ucp
