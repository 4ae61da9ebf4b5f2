// The steps of RunConvert (convert.cpp), in the order it takes them, each in the file of its idea:
// index and plan, the output folder and resume, the rounds of map / shuffle / union / write (the
// side files beside them, the split items' parts completed after them), the commit, the report.
// Internal to lib/convert.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "convert/convert.h"
#include "core/commit.h"
#include "core/task_pool.h"
#include "patterns/resolve.h"
#include "plan/convert_plan.h"
#include "source/source_index.h"
#include "store/atom_store.h"
#include "store/atomic_store.h"

namespace ucp::convert {

// The threads a rank writes (and checks weight copies) with: --threads, else its cores.
inline int ThreadsOf(const ConvertOptions& o) { return o.threads > 0 ? o.threads : AvailableCores(); }

using Clock = std::chrono::steady_clock;
inline double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

// Adds the seconds `fn` takes to `total`.
template <typename Fn>
auto Timed(double& total, Fn&& fn) {
  struct Lap {
    double& total;
    Clock::time_point start = Clock::now();
    ~Lap() { total += Seconds(start); }
  } lap{total};
  return fn();
}

// The seconds of each phase of the run, for the report: each phase ends where the next begins.
class Phases {
 public:
  void Done(const char* name) {
    seconds_[name] = Seconds(last_);
    last_ = Clock::now();
  }
  // Sets and returns the seconds since the run began.
  double Total() { return (seconds_["total"] = Seconds(start_)).get<double>(); }
  const nlohmann::json& seconds() const { return seconds_; }

 private:
  Clock::time_point start_ = Clock::now(), last_ = start_;
  nlohmann::json seconds_;
};

// 1. Index, patterns, plan (index_and_plan.cpp): every rank, from metadata only, to the same answer.
struct Planned {
  source::SourceIndex L;
  patterns::ModelPatterns M;
  plan::ConvertPlan plan;
  store::StoreKind kind = store::StoreKind::Pt;
  // Per file and checksummed record: verified by the weight-copy check as it read the masters
  // (map/weight_copies.h), so the mapper does not read it again.
  std::vector<std::vector<char>> verified;
};
// Throws saying the first fault of the source, its patterns or its plan.
Planned IndexAndPlan(const ConvertOptions& o, int ranks);
// The index and the patterns alone (no plan): what a model source (from_model.cpp) needs.
Planned IndexAndResolve(const ConvertOptions& o);
// Rank 0's lines on what was indexed, its notes and (--no-strict) its problems.
void SayPlanned(const ConvertOptions& o, const Planned& x, const std::string& comm_name, std::ostream& err);
// A --plan-only --json plan with the notes SayPlanned prints, as "notes" (the same lines, for a script).
nlohmann::json WithNotes(nlohmann::json plan, const Planned& x);
// What the checkpoint stores twice agrees; throws saying where it does not. Every rank, its share.
// Returns the records it verified on the way (Planned::verified).
std::vector<std::vector<char>> RequireWeightCopiesAgree(const ConvertOptions& o, const source::SourceIndex& L, shuffle::Comm& comm);
// The step a parameter's step.pt holds (its group's, as the source keeps it); nullptr: no step.pt.
pt::ValuePtr StepOf(const source::SourceIndex& L, const plan::ParamPlan& P);

// --force on a non-empty -o: refused unless ucp wrote what is there (its manifest or journal, or only
// leftovers of a killed run); a universal checkpoint DeepSpeed wrote is never cleared. Rank 0, claiming.
void RefuseForeignForce(const ConvertOptions& o, const OutputFolder& folder);

// Rank 0 claims the output folder (locked, emptied by --force's rule, its zero/ folder made), then every
// rank opens the store's writer of `specs` (collective): the start of a run that writes whole tensors
// (from_atomic.cpp; a model's import, from_model.cpp). False when a rank failed (said on `err`).
bool ClaimAndOpenWriter(const ConvertOptions& o, store::StoreKind kind, const std::vector<store::AtomSpec>& specs, shuffle::Comm& comm,
                        std::ostream& err, std::unique_ptr<OutputFolder>& folder, std::unique_ptr<store::AtomWriter>& writer);

// 2. The output folder and the resume decision (output_folder.cpp).
struct OutputClaim {
  std::unique_ptr<OutputFolder> folder;                // rank 0's, locked
  std::map<std::string, store::FileRecord> journaled;  // from the interrupted run
  std::vector<char> done;                              // [param * kStates + state]: verified done
};
// Claims the output folder (rank 0) and, resuming, drops from the plan what the journal shows done
// (every rank). Returns the exit status when the run ends here: a failure (said on `err`), or a
// folder complete already or after only its commit's end.
std::optional<int> ClaimOutput(const ConvertOptions& o, Planned& x, shuffle::Comm& comm, std::ostream& err, OutputClaim& claim);

// 3. Map, shuffle, union, write, in rounds of bounded size (rounds.cpp).
struct Counters {
  int64_t bytes_read = 0, bytes_sent = 0, bytes_received = 0, bytes_in_place = 0, bytes_written = 0, files_written = 0;
  int64_t crc_bytes = 0;  // bytes the mapper read to check records' CRC-32 (not those the weight-copy check verified)
  int64_t max_round_bytes = 0;  // the most bytes in flight in one round: sent plus received
  // Where a rank's time goes. read: from the files, into the shuffle buffers or into place;
  // exchange: the collectives, waiting for the slowest rank included; assemble: union of the
  // shuffled runs; wait: for room among the writers; drain: for the writers to finish, after the
  // last round; finish_parts: completing the files of split items whose first part is this rank's;
  // sync: the store's commit (one syncfs). write: the writers' own time, summed over
  // the writer threads (it overlaps the others), the side files' share of it apart.
  double read = 0, exchange = 0, assemble = 0, wait = 0, drain = 0, sync = 0, finish_parts = 0;
  std::atomic<int64_t> write_ns{0}, side_ns{0};
  nlohmann::json SecondsJson() const {
    return {{"read", read}, {"exchange", exchange}, {"assemble", assemble}, {"wait_for_writers", wait},
            {"drain", drain}, {"write_threads_sum", write_ns.load() * 1e-9}, {"side_files", side_ns.load() * 1e-9},
            {"finish_parts", finish_parts}, {"sync", sync}};
  }
};

// What a rank's rounds leave for the commit and the report; the writer threads add to it.
struct RankOutput {
  Counters c;
  std::mutex mu;  // guards records and the byte and file counts the writers add
  std::vector<store::FileRecord> records;
  std::vector<std::string> divergences;  // tied copies on later stages that differ (notes)
  int threads = 0;                       // writer threads
  std::unique_ptr<store::AtomWriter> writer;  // committed; kept to the end of the run
  store::StoreCommit committed;

  // Files written: counted, and listed for the manifest.
  void Record(const std::vector<store::FileRecord>& recs) {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& r : recs) c.bytes_written += static_cast<int64_t>(r.bytes), ++c.files_written, records.push_back(r);
  }
};
// Every round, then the store's commit. False when a rank failed (said on `err`).
bool MapShuffleWrite(const ConvertOptions& o, const Planned& x, shuffle::Comm& comm, std::ostream& err, RankOutput& out);

// ConvertOptions::reference (reference.cpp): whether every parameter reads as it is from its
// partitions; then the scratch of the partitions store, its side files and manifest. Collective.
bool ReadsAsIs(const Planned& x);
int RunReference(const ConvertOptions& o, Planned& x, shuffle::Comm& comm, std::ostream& err);

// The side files DeepSpeed's universal loader reads (side_files.cpp), handed to the writers.
void SubmitSideFiles(const ConvertOptions& o, const Planned& x, int rank, int ranks, TaskPool& writers, RankOutput& out);

// Parts this rank wrote of split items: (param, state, part) -> their CRC-32 and XXH64.
using PartsWritten = std::map<std::tuple<int, int, int>, store::AtomWriter::PartDigest>;
// The split items' files completed from their parts (split_parts.cpp). False when a rank failed.
bool FinishSplitParts(const plan::ConvertPlan& plan, const PartsWritten& parts_written, store::AtomWriter& writer,
                      store::Journal& journal, shuffle::Comm& comm, std::ostream& err, RankOutput& out);

// 4. The commit (manifest.cpp): rank 0 lists every rank's files and writes the manifest last.
// Every rank's records, gathered on rank 0 (one JSON list per rank).
std::vector<std::string> GatherRecords(shuffle::Comm& comm, const std::vector<store::FileRecord>& records);
// Adds the gathered records to `files`, by path.
void AddGathered(const std::vector<std::string>& gathered, std::map<std::string, store::FileRecord>& files);
struct Committed {
  bool points_latest = false;   // whether the commit pointed <parent>/latest_universal at the output
  std::string previous_latest;  // what it named before
};
// Each parameter's manifest entry: what the plan and the patterns say of it, with `storage`'s entry
// for it (the store's part: its files, or its runs in a partitions store's sources).
nlohmann::json ParamEntries(const Planned& x, const nlohmann::json& storage);
// Rank 0: the manifest of the records gathered, the commit point, then latest_universal.
Committed CommitManifest(const ConvertOptions& o, const Planned& x, OutputClaim& claim, const RankOutput& out,
                         const std::vector<std::string>& gathered);
// Rank 0 (talking): that latest_universal now names the output instead of what it named.
void SayLatestMoved(const std::string& output, const Committed& committed, std::ostream& err);

// 5. The report (report.cpp).
// This rank's counts and seconds, for the report.
nlohmann::json RankStats(int rank, const RankOutput& out);
// Rank 0: --report's JSON, then the notes and the summary line. Returns the exit status.
int Report(const ConvertOptions& o, const Planned& x, int ranks, const Phases& phases, const std::vector<std::string>& stats,
           const OutputClaim& claim, std::ostream& err);

}  // namespace ucp::convert
