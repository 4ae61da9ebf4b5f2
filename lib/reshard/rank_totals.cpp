#include "reshard/rank_totals.h"

#include <algorithm>

#include "core/atomic_file.h"
#include "shuffle/agree.h"

namespace ucp::reshard {

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

bool WriteReport(const std::string& path, const nlohmann::json& report, std::ostream& err, const char* tool) {
  if (path.empty()) return true;
  const std::string error = shuffle::Capture([&] { WriteFileAtomically(path, report.dump(1) + "\n"); });
  if (error.empty()) return true;
  err << tool << ": error: " << error << std::endl;
  return false;
}

}  // namespace ucp::reshard
