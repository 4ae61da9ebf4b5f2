// What each rank of a ucp-reshard run reports (bytes read and written, peak RSS), gathered on rank 0
// and summed there, for the summary line and --report, whatever the target; and the --report file.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/process.h"  // PeakRssBytes, each rank's

namespace ucp::reshard {

struct RankTotals {
  int64_t bytes_read = 0, bytes_written = 0, peak_rss = 0;  // sums; the largest peak
  nlohmann::json per_rank = nlohmann::json::array();        // each rank's object, in rank order
};

// The gathered per-rank JSON objects (each with bytes_read, bytes_written, peak_rss_bytes) summed.
RankTotals SumRanks(const std::vector<std::string>& gathered);

// --report: `report` written atomically to `path` (nothing when empty). False after printing the
// error as `tool` does.
bool WriteReport(const std::string& path, const nlohmann::json& report, std::ostream& err, const char* tool);

}  // namespace ucp::reshard
