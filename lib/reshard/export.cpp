#include "reshard/export.h"

#include <algorithm>
#include <filesystem>
#include <chrono>
#include <numeric>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/format.h"
#include "core/output_lock.h"
#include "core/progress.h"
#include "reshard/atomic_input.h"
#include "reshard/claim.h"
#include "reshard/rank_totals.h"
#include "shuffle/agree.h"
#include "store/atomic_store.h"
#include "store/universal_folder.h"
#include "layout/reshard_plan.h"
#include "layout/store_rows.h"
#include "reshard/tool_name.h"

namespace ucp::reshard {
using nlohmann::json;
using shuffle::AnyFailed;
using shuffle::Capture;

namespace {

// " (fp32 -> bf16)" where the export's dtype is not the source job's (--dtype, or a target of one precision).
std::string PrecisionChange(const Source& S, const ExportPlan& P) {
  const std::string from = P.job_dtype.empty() ? S.manifest["source"].value("dtype", "") : P.job_dtype;
  return from.empty() || from == P.dtype ? "" : " (" + from + " -> " + P.dtype + ")";
}

}  // namespace

std::vector<int> AssignFiles(const ExportPlan& P, int ranks) {
  std::vector<int> order(P.files.size()), owner(P.files.size(), 0);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return P.files[a].bytes > P.files[b].bytes; });
  std::vector<int64_t> load(static_cast<size_t>(ranks), 0);
  for (int f : order) {
    const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    owner[f] = r, load[r] += P.files[f].bytes;
  }
  return owner;
}

namespace {

// --plan-only: the files, their tensors, bytes and rank, the side files and the marker.
void PrintExportPlan(const ExportPlan& P, const std::vector<int>& owner, bool as_json, std::ostream& out) {
  if (as_json) {
    out << ExportPlanJson(P, owner).dump(1) << "\n";
    return;
  }
  for (size_t f = 0; f < P.files.size(); ++f)
    out << "  " << P.files[f].name << ": " << P.files[f].tensors.size() << " tensors, "
        << HumanBytes(double(P.files[f].bytes)) << ", written by ucp rank " << owner[f] << "\n";
  for (const auto& [name, text] : P.side_files) out << "  " << name << "\n";
  out << "  " << P.marker << " (written last)\n";
}

// Steps 2 and 3: this rank's files, tensor by tensor from the store, then one sync. Returns this
// rank's record for the report. Throws ucp::Error naming the file.
json WriteExportFiles(const ReshardOptions& o, const formats::TargetDriver& driver, const Source& S, const ExportPlan& P,
                      const std::vector<int>& owner, int rank) {
  int64_t mine = 0, done = 0, written = 0;
  for (size_t f = 0; f < P.files.size(); ++f) mine += owner[f] == rank ? P.files[f].bytes : 0;
  ProgressLine progress(kTool, rank == 0 && !o.quiet && o.progress, mine);
  StoreRows rows(S);
  for (size_t f = 0; f < P.files.size(); ++f) {
    if (owner[f] != rank) continue;
    WithContext(o.output + "/" + P.files[f].name, [&] { driver.write_file(P, f, rows, o.output + "/" + P.files[f].name); });
    written += P.files[f].bytes;
    progress.Update(done += P.files[f].bytes);
  }
  progress.Update(done, true);
  Seal(o.output);
  return {{"rank", rank}, {"bytes_written", written}, {"bytes_read", static_cast<int64_t>(S.reader->storage_bytes_read())},
          {"peak_rss_bytes", PeakRssBytes()}};
}

// Rank 0: the --report file and the summary line. False when the report cannot be written.
bool ReportExport(const ReshardOptions& o, const formats::TargetDriver& driver, const ExportPlan& P,
                  const std::vector<std::string>& per_rank, int ranks, std::chrono::steady_clock::time_point t0,
                  std::ostream& err) {
  const RankTotals t = SumRanks(per_rank);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!WriteReport(o.report_path, {{"atomic", o.atomic_dir}, {"format", driver.name}, {"model", P.model}, {"dtype", P.dtype},
                                       {"output", o.output}, {"ranks", ranks}, {"seconds", secs}, {"bytes_read", t.bytes_read},
                                       {"bytes_written", t.bytes_written}, {"files", P.files.size()}, {"per_rank", t.per_rank}}, err, kTool)) return false;
  if (!o.quiet) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s: wrote %s: %s in %zu file%s (read %s) in %.2fs, peak RSS %s per rank\n", kTool,
                  o.output.c_str(), HumanBytes(double(t.bytes_written)).c_str(), P.files.size(), P.files.size() == 1 ? "" : "s",
                  HumanBytes(double(t.bytes_read)).c_str(), secs, HumanBytes(double(t.peak_rss)).c_str());
    err << buf;
  }
  return true;
}

}  // namespace

int RunExport(const ReshardOptions& o, const formats::TargetDriver& driver, shuffle::Comm& comm, std::ostream& out,
              std::ostream& err) {
  const int rank = comm.rank(), ranks = comm.size();
  const bool talk = rank == 0 && !o.quiet;
  const auto t0 = std::chrono::steady_clock::now();
  Source S;
  ExportPlan P;
  std::vector<int> owner;
  std::string error = Capture([&] {
    if (!o.plan_only) RefuseOutputWithin(o.output, o.atomic_dir, "the atomic checkpoint");
    RefuseNonAtomicInput(o.atomic_dir);
    S = LoadAtomic(o.atomic_dir, !driver.weights_only);
    P = driver.plan_export(S, o.model);
    owner = AssignFiles(P, ranks);
  });
  if (AnyFailed(comm, error, err, kTool)) return 1;
  if (talk) {
    err << kTool << ": " << o.atomic_dir << " (" << S.atoms.size() << " parameters) to " << driver.name << " " << P.model
        << ", " << P.tensors.size() << " tensors in " << P.dtype << PrecisionChange(S, P) << ", "
        << HumanBytes(double(P.tensor_bytes())) << " in " << P.files.size() << (P.files.size() == 1 ? " file" : " files")
        << " on " << comm.name() << "\n";
    for (const std::string& n : P.notes) err << kTool << ": note: " << n << "\n";
  }
  if (o.plan_only) {
    if (rank == 0) PrintExportPlan(P, owner, o.json, out);
    return 0;
  }

  // Step 1: the folder claimed; its one marker is the driver's (the index), the commit point.
  std::unique_ptr<ClaimedOutput> claim;
  std::string lock_note;
  std::vector<std::string> contents;
  for (const ExportFile& f : P.files) contents.push_back(f.name);
  for (const auto& [name, text] : P.side_files) contents.push_back(name);
  error = rank == 0 ? Capture([&] { claim = ClaimOutput(o.output, o.atomic_dir, o.force, {P.marker}, contents, P.model, &lock_note); }) : "";
  if (AnyFailed(comm, error, err, kTool)) return 1;
  if (talk && !lock_note.empty()) err << kTool << ": note: " << lock_note << "\n";
  // Steps 2 and 3; from here a failure takes back what this run made.
  json stats;
  error = Capture([&] { stats = WriteExportFiles(o, driver, S, P, owner, rank); });
  if (AnyFailedAbandoning(comm, error, err, claim.get())) return 1;
  auto per_rank = comm.GatherToRoot(stats.dump());

  // Step 4: the side files, then the marker (each written and synced atomically).
  error = rank == 0 ? Capture([&] {
    for (const auto& [name, text] : P.side_files) WriteFileAtomically(o.output + "/" + name, text);
    claim->folder().Mark({P.marker_text});
  }) : "";
  if (AnyFailed(comm, error, err, kTool)) return 1;  // not taken back: the commit point may be written
  if (rank == 0 && !ReportExport(o, driver, P, per_rank, ranks, t0, err)) return 1;
  return 0;
}

}  // namespace ucp::reshard
