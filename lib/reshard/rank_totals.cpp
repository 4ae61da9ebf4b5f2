#include "reshard/rank_totals.h"

#include <sys/resource.h>

#include <algorithm>

namespace ucp::reshard {

int64_t PeakRssBytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;
}

RankTotals SumRanks(const std::vector<std::string>& gathered) {
  RankTotals t;
  for (const auto& s : gathered) {
    nlohmann::json j = nlohmann::json::parse(s);
    t.bytes_read += j["bytes_read"].get<int64_t>(), t.bytes_written += j["bytes_written"].get<int64_t>();
    t.peak_rss = std::max(t.peak_rss, j["peak_rss_bytes"].get<int64_t>());
    t.per_rank.push_back(std::move(j));
  }
  return t;
}

}  // namespace ucp::reshard
