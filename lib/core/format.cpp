#include "core/format.h"

#include <cstdio>
#include <cstdlib>
#include <ctime>

namespace ucp {

std::string HumanBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) bytes /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", bytes, units[u]);
  return buf;
}

namespace {
std::string Iso8601(std::time_t t) {
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}
}  // namespace

std::string UtcTimestamp() { return Iso8601(std::time(nullptr)); }

std::string OutputTimestamp() {
  const char* epoch = std::getenv("SOURCE_DATE_EPOCH");
  char* end = nullptr;
  const long long t = epoch ? std::strtoll(epoch, &end, 10) : -1;
  if (epoch && *epoch && end && *end == 0 && t >= 0) return Iso8601(static_cast<std::time_t>(t));
  return UtcTimestamp();
}

}  // namespace ucp
