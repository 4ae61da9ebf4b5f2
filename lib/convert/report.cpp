// Step 5 of a conversion, the report: each rank's counts and seconds gathered on rank 0, --report's
// JSON, the notes of what the union saw, and the summary line.
#include <algorithm>
#include <cstdio>

#include "convert/steps.h"
#include "core/atomic_file.h"
#include "core/format.h"
#include "core/process.h"
#include "shuffle/agree.h"

namespace ucp::convert {

namespace {

// Every rank's stats, their notes apart, and the sums the summary says.
struct Totals {
  nlohmann::json per = nlohmann::json::array(), notes = nlohmann::json::array();
  int64_t read = 0, written = 0, peak = 0;
};

Totals Sum(const std::vector<std::string>& stats) {
  Totals t;
  for (const auto& s : stats) {
    auto j = nlohmann::json::parse(s);
    for (const auto& n : j["notes"]) t.notes.push_back(n);
    j.erase("notes");
    t.read += j["bytes_read"].get<int64_t>(), t.written += j["bytes_written"].get<int64_t>();
    t.peak = std::max(t.peak, j["peak_rss_bytes"].get<int64_t>());
    t.per.push_back(j);
  }
  return t;
}

// The records the weight-copy check verified as it read the masters (the mappers read them once, for their
// bytes, not again for their CRC-32): how many, and their bytes.
nlohmann::json VerifiedBytes(const Planned& x) {
  int64_t records = 0, bytes = 0;
  for (size_t f = 0; f < x.verified.size() && f < x.L.files.size(); ++f)
    for (size_t k = 0; k < x.verified[f].size(); ++k)
      if (x.verified[f][k]) ++records, bytes += static_cast<int64_t>(x.L.files[f].checksummed[k].size);
  return {{"records", records}, {"bytes", bytes}};
}

}  // namespace

nlohmann::json RankStats(int rank, const RankOutput& out) {
  const Counters& c = out.c;
  return {{"rank", rank}, {"bytes_read", c.bytes_read}, {"bytes_sent", c.bytes_sent},
          {"bytes_received", c.bytes_received}, {"bytes_read_in_place", c.bytes_in_place}, {"bytes_crc_checked", c.crc_bytes}, {"max_round_bytes", c.max_round_bytes}, {"bytes_written", c.bytes_written},
          {"files_written", c.files_written}, {"seconds", c.SecondsJson()}, {"peak_rss_bytes", PeakRssBytes()}, {"threads", out.threads},
          {"notes", out.divergences}};
}

int Report(const ConvertOptions& o, const Planned& x, int ranks, const Phases& phases, const std::vector<std::string>& stats,
           const OutputClaim& claim, std::ostream& err) {
  const Totals t = Sum(stats);
  if (!o.report_path.empty()) {
    const auto& plan = x.plan;
    nlohmann::json report = {{"source", o.source}, {"output", o.output}, {"ranks", ranks}, {"phases_seconds", phases.seconds()},
                             {"bytes_read", t.read}, {"bytes_written", t.written}, {"per_rank", t.per},
                             {"resumed_items", std::count(claim.done.begin(), claim.done.end(), 1)}, {"notes", t.notes},
                             {"records_verified_by_weight_copy_check", VerifiedBytes(x)},
                             {"plan", {{"rounds", plan.rounds}, {"chunk_bytes", 4 * plan.chunk_elems},
                                       {"imbalance", plan.Imbalance()}}}};
    const std::string error = shuffle::Capture([&] { WriteFileAtomically(o.report_path, report.dump(1) + "\n"); });
    if (!error.empty()) {
      err << "ucp-convert: error: " << error << std::endl;
      return 1;
    }
  }
  if (!o.quiet) {
    for (const auto& n : t.notes) err << "ucp-convert: note: " << n.get<std::string>() << "\n";
    char buf[256];
    std::snprintf(buf, sizeof buf, "ucp-convert: wrote %s: %zu parameters, %s read, %s written in %.2fs (peak RSS %s per rank)\n",
                  o.output.c_str(), x.plan.params.size(), HumanBytes(double(t.read)).c_str(), HumanBytes(double(t.written)).c_str(),
                  phases.seconds().at("total").get<double>(), HumanBytes(double(t.peak)).c_str());
    err << buf;
  }
  return 0;
}

}  // namespace ucp::convert
