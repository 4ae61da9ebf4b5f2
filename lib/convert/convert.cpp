#include "convert/convert.h"

#include <sys/resource.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <sstream>

#include "core/atomic_file.h"
#include "core/buffer_pool.h"
#include "core/error.h"
#include "core/format.h"
#include "core/commit.h"
#include "core/output_lock.h"
#include "core/progress.h"
#include "core/task_pool.h"
#include "formats/registry.h"
#include "map/mapper.h"
#include "map/weight_copies.h"
#include "patterns/resolve.h"
#include "plan/convert_plan.h"
#include "pt/torch_file.h"
#include "shuffle/agree.h"
#include "shuffle/round.h"
#include "source/source_index.h"
#include "store/atom_store.h"
#include "store/atomic_store.h"
#include "store/universal_folder.h"
#include "union/assembly.h"

namespace ucp::convert {
namespace fs = std::filesystem;
using plan::ConvertPlan;
using plan::Item;
using plan::State;
using shuffle::AnyFailed;
using shuffle::Capture;

namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }


std::string VersionString(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

int64_t PeakRss() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;
}

// Whether a problem is a file that is missing or not the rank's, save's or run's its name says:
// --no-strict converts no such checkpoint, so it is not offered.
bool FileFault(const std::string& problem) {
  for (const char* mark : {"missing rank file", "swapped or renamed", "mixed into this tag", "a file of another"})
    if (problem.find(mark) != std::string::npos) return true;
  return false;
}

// One fault, one error: the first of what the index found (a missing or odd file comes first, and
// most of what follows it are its consequences), one line, with the count of the rest.
std::string FirstFault(const std::vector<std::string>& lines, const std::string& head, const std::string& source) {
  std::string s = head + ": " + lines.front();
  if (lines.size() > 1)
    s += " (and " + std::to_string(lines.size() - 1) + " more found with it; `ucp-inspect " + source + "` lists every one)";
  return s;
}

// The runs of reducer r's round k, in one order every rank agrees on.
template <typename Fn>
void ForEachRoundRun(const ConvertPlan& plan, int r, int64_t k, Fn&& fn) {
  const auto& items = plan.work[r];
  const int64_t begin = k * plan.chunk_elems, end = std::min(begin + plan.chunk_elems, plan.work_numel[r]);
  if (begin >= end) return;
  size_t lo = 0, hi = items.size();  // first item ending after `begin`
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (items[mid].work_start + items[mid].numel <= begin) lo = mid + 1;
    else hi = mid;
  }
  for (size_t i = lo; i < items.size() && items[i].work_start < end; ++i) {
    const auto& it = items[i];
    int64_t a = std::max<int64_t>(0, begin - it.work_start), b = std::min(it.numel, end - it.work_start);
    plan::ForEachItemRun(plan.params[it.param], it, a, b, [&](const plan::Piece& pc, int64_t off, int64_t n, int64_t) { fn(i, pc, off, n); });
  }
}

struct Counters {
  int64_t bytes_read = 0, bytes_sent = 0, bytes_received = 0, bytes_in_place = 0, bytes_written = 0, files_written = 0;
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

// What a --resume finds: nothing to resume (start afresh), files of an interrupted run to verify
// and keep, or a run killed after its manifest, whose commit only needs finishing.
// Complete: a finished conversion of the same source, every file as its manifest says: nothing to do.
enum class Resume { No, Yes, OnlyCommitLeft, Complete };

// That `dir`, a committed atomic checkpoint, is this conversion finished: its manifest's source
// fingerprint is the source folder's as it is now, and every file it lists has its size and XXH64.
// Throws saying which is not so (a job script that always passes --resume must not take another
// source's, or a damaged, checkpoint for done).
void RequireFinishedConversionOf(const std::string& dir, const source::SourceIndex& L) {
  const nlohmann::json m = store::ReadManifest(dir);
  const std::string where = dir + "/" + store::kManifestName;
  if (m.at("source").value("fingerprint", "") != source::FolderFingerprint(L.dir))
    throw Error(where + ": a complete atomic checkpoint of another source (or of " + L.dir +
                " before its files changed): nothing to resume; --force converts again");
  for (const auto& f : m.at("files")) {
    std::string why;
    const auto rec = store::FileRecord::FromJson(f);
    if (!store::Verify(dir, rec, &why))
      throw Error(dir + "/" + rec.path + ": " + why + ": the complete atomic checkpoint is damaged; --force converts again");
  }
}

// Rank 0's checks and claim of the output folder (core/commit.h, step 1) before anything is
// written: its lock taken first (held until the run ends), then resumed or required empty.
void PrepareOutput(const ConvertOptions& o, const source::SourceIndex& L, const std::string& fingerprint,
                   Resume* resume, std::unique_ptr<OutputFolder>* folder, std::string* lock_note) {
  std::error_code ec;
  RefuseOutputWithin(o.output, L.dir, "the source checkpoint folder");
  if (fs::weakly_canonical(L.root, ec) == fs::weakly_canonical(o.output, ec))  // a folder inside the root is DeepSpeed's place for it
    throw Error(o.output + ": the output folder is the source checkpoint folder");
  *resume = Resume::No;
  *folder = std::make_unique<OutputFolder>(o.output, "ucp-convert", store::AtomicFolderMarkers(), lock_note);
  const bool journal = fs::exists(o.output + "/" + store::kJournalDir + "/run.json");
  if (o.resume && !o.force && !journal && !store::IsAtomicCheckpoint(o.output) && HoldsOnlyLeftovers(o.output)) {
    RemoveTemporaries(o.output);  // killed before it had written anything to keep: start afresh
  } else if (o.resume && !o.force && !(*folder)->Empty()) {
    if (store::IsAtomicCheckpoint(o.output) && !journal) {
      // A journal folder without its run.json: the run was killed while removing its journal,
      // after its manifest; only the end of its commit is left to do.
      if (fs::exists(o.output + "/" + store::kJournalDir)) {
        *resume = Resume::OnlyCommitLeft;
        return;
      }
      RequireFinishedConversionOf(o.output, L);
      *resume = Resume::Complete;
      return;
    }
    store::Journal::Load(o.output, fingerprint);  // throws unless the same conversion
    if (store::IsAtomicCheckpoint(o.output)) {
      *resume = Resume::OnlyCommitLeft;
      return;
    }
    *resume = Resume::Yes;
    RemoveTemporaries(o.output);  // files the killed run was writing: never renamed, never complete
  } else {
    // --force replaces only what ucp wrote: a universal checkpoint without ucp's manifest or
    // journal (DeepSpeed's ds_to_universal.py output) is never cleared.
    if (o.force && !(*folder)->Empty() && !journal && store::IsDeepSpeedUniversal(o.output))
      throw Error(o.output + ": holds a universal checkpoint ucp did not write (zero/ without " +
                  std::string(store::kManifestName) + ", as DeepSpeed's ds_to_universal.py writes it): --force "
                  "replaces only what ucp wrote; choose another -o");
    if (o.force && !(*folder)->Empty() && !fs::exists(o.output + "/" + store::kJournalDir) &&
        !store::IsAtomicCheckpoint(o.output) && !HoldsOnlyLeftovers(o.output))
      throw Error(o.output + ": not written by ucp (no " + std::string(store::kManifestName) + " or journal, and files "
                  "of its own): --force replaces only what ucp wrote; remove it yourself or choose another -o");
    (*folder)->RequireEmpty(o.force, store::AtomicFolderContents(),
                            "use --resume to finish an interrupted conversion or --force to overwrite it");
  }
  CreateSpreadFolder(o.output + "/zero");  // a folder per parameter
  if (*resume == Resume::No) store::Journal::Start(o.output, fingerprint);
}

// The last steps of a conversion's commit, after its manifest (a run killed there is finished so):
// latest_universal where DeepSpeed's universal load follows it (PointsLatestUniversal), then the journal goes.
void FinishCommit(const std::string& output) {
  const nlohmann::json manifest = store::ReadManifest(output);
  if (store::PointsLatestUniversal(output, manifest)) store::WriteLatestUniversal(output);
  store::Journal::Remove(output);
}

// zero/optimizer_state.pt, which DeepSpeed's universal loader reads besides the atomic tensors:
// from the optimizer file at pp=0, tp=0, dp=0.
store::FileRecord WriteOptimizerStateFile(const source::SourceIndex& L, const std::string& out, Durability durability) {
  if (L.optimizer_state) {
    auto d = pt::WriteTorchFile(out + "/zero/optimizer_state.pt", *L.optimizer_state, durability);
    return {"zero/optimizer_state.pt", d.size, d.xxh64};
  }
  const source::ShardFile* first_optim = nullptr;
  for (const auto& f : L.files)
    if (f.data && f.pp == 0 && f.tp == 0 && f.dp == 0) first_optim = &f;
  if (!first_optim) throw Error(L.dir + ": no optimizer file at (pp=0, tp=0, dp=0)");
  auto root = pt::ReadTorchFile(L.dir + "/" + first_optim->name);
  auto osv = WithContext(L.dir + "/" + first_optim->name, [&] { return store::OptimizerStateValue(*root.root, L.zero_stage); });
  // A Mixture-of-Experts model-states file has no ds_config; ucp-reshard writes the optimizer
  // files' from this copy (DeepSpeed's universal load reads only the keys it knows).
  if (auto config = root.root->Get("ds_config"); L.moe && config) pt::SetItem(*osv, "ds_config", config);
  // A torch optimizer's state (no ZeRO) records no ds_version, which DeepSpeed's ZeRO optimizers
  // require of the state a universal load restores: the checkpoint's own.
  if (L.optimizer == "torch" && !L.ds_version.empty()) pt::SetItem(*osv, "ds_version", pt::Value::Str(L.ds_version));
  auto d = pt::WriteTorchFile(out + "/zero/optimizer_state.pt", *osv, durability);
  return {"zero/optimizer_state.pt", d.size, d.xxh64};
}

}  // namespace

int RunConvert(const ConvertOptions& o, shuffle::Comm& comm, std::ostream& out, std::ostream& err) {
  const int rank = comm.rank(), ranks = comm.size();
  const bool talk = rank == 0 && !o.quiet;
  auto t0 = Clock::now();
  nlohmann::json phases;
  auto phase_done = [&, last = t0](const char* name) mutable {
    phases[name] = Seconds(last);
    last = Clock::now();
  };

  // 1. Index, patterns, plan: every rank, from metadata only, to the same answer.
  source::SourceIndex L;
  patterns::ModelPatterns M;
  ConvertPlan plan;
  store::StoreKind kind = store::StoreKind::Pt;
  std::string error = Capture([&] {
    kind = store::StoreFromName(o.format);
    if (kind == store::StoreKind::Hdf5 && o.resume)
      throw Error("--resume is not supported with --format hdf5: atoms.h5 is one file, written whole; rerun with --force");
    // An atomic checkpoint is converted already: said as such, not as a training checkpoint missing its rank files.
    if (store::IsAtomicCheckpoint(o.source) || store::IsDeepSpeedUniversal(o.source))
      throw Error(o.source + " is " + (store::IsAtomicCheckpoint(o.source) ? "an atomic checkpoint (ucp_manifest.json)" :
                  "DeepSpeed's universal checkpoint (ds_to_universal.py)") + ", converted already: ucp-reshard reads it; "
                  "ucp-convert --from-atomic copies a ucp one into another store");
    L = formats::IndexSource(o.source);
    if (!L.errors.empty()) throw Error(FirstFault(L.errors, o.source + ": unreadable, malformed or not supported", o.source));
    if (o.strict && !L.problems.empty())
      throw Error(FirstFault(L.problems, o.source + ": the checkpoint is inconsistent" + (FileFault(L.problems.front()) ? "" : " (--no-strict to convert anyway)"), o.source));
    M = patterns::ResolvePatterns(L, {o.pattern_files, o.patterns_dir});
    if (o.strict && !M.problems.empty())
      throw Error(FirstFault(M.problems, o.source + ": pattern problems (--no-strict to convert anyway)", o.source));
    const bool parts = store::WritesParts(kind, L.zero_stage);
    if (!parts && o.split_above > 0)
      L.notes.push_back(std::string("--split-above: every tensor is written whole (") +
                        (kind == store::StoreKind::Hdf5 ? "the HDF5 store writes each dataset whole"
                                                        : "a ZeRO-3 source's universal form is a padded 1-D tensor") +
                        "); the size still cuts larger optimizer files between the ranks that read them");
    else if (o.split_above > 0 && (o.plan_ranks > 0 ? o.plan_ranks : ranks) == 1)
      L.notes.push_back("--split-above: one rank has none to share an item with: every tensor is written whole");
    plan = plan::MakeConvertPlan(L, M, o.plan_ranks > 0 ? o.plan_ranks : ranks, o.buffer_bytes, parts ? o.split_above : 0, o.split_above);
    for (const auto& P : plan.params) store::ParamRelDir(P.name);  // every name must be a safe folder name
  });
  if (AnyFailed(comm, error, err, "ucp-convert")) return 1;
  phase_done("index_and_plan");
  if (talk) {
    err << "ucp-convert: " << L.framework << " " << source::LayoutWords(L)
        << (L.format != "deepspeed" ? "" : "; DeepSpeed " + (L.ds_version.empty() ? "?" : L.ds_version) + ", universal_checkpoint_version " +
            (M.checkpoint_rules && M.checkpoint_rules->version ? VersionString(*M.checkpoint_rules->version) : "none"))
        << "; " << plan.params.size() << " parameters; "
        << (o.plan_ranks > 0 ? "planned for " + std::to_string(o.plan_ranks) + " MPI ranks (--ranks)" : comm.name()) << "\n";
    for (const auto* list : {&L.notes, &M.notes})
      for (const auto& n : *list) err << "ucp-convert: note: " << n << "\n";
    if (!o.strict)
      for (const auto* list : {&L.problems, &M.problems})
        for (const auto& p : *list) err << "ucp-convert: warning: " << p << "\n";
  }
  if (o.plan_only) {
    if (rank == 0) {
      if (o.json) out << plan.ToJson(L).dump(1) << "\n";
      else out << plan.ToText();
    }
    return 0;
  }

  // What the checkpoint stores twice must agree before anything is written (files mixed from other
  // saves, ranks or runs pass every CRC-32): each rank compares the masters of its share of the data files.
  error = Capture([&] {
    const std::string why = map::CheckWeightCopies(L, comm, o.threads > 0 ? o.threads : AvailableCores());
    if (!why.empty()) throw Error(o.source + ": " + why + "; nothing was converted");
  });
  if (AnyFailed(comm, error, err, "ucp-convert")) return 1;
  phase_done("weight_copies");

  // The step each parameter's step.pt holds (its group's, as the source keeps it); nullptr: no step.pt.
  auto step_of = [&](const plan::ParamPlan& P) -> pt::ValuePtr {
    auto it = L.steps.find(P.step_key);
    return it == L.steps.end() || !it->second || it->second->kind == pt::Value::Kind::None ? nullptr : it->second;
  };

  // 2. The output folder (rank 0), then the resume decision (every rank, from the journal).
  const std::string fingerprint = store::Fingerprint(L, M);
  Resume resume = Resume::No;
  std::unique_ptr<OutputFolder> folder;
  std::string lock_note;
  error = rank == 0 ? Capture([&] { PrepareOutput(o, L, fingerprint, &resume, &folder, &lock_note); }) : "";
  if (AnyFailed(comm, error, err, "ucp-convert")) return 1;
  if (talk && !lock_note.empty()) err << "ucp-convert: note: " << lock_note << "\n";
  int64_t flag = static_cast<int64_t>(resume);
  comm.AllreduceMax({&flag, 1});
  if (static_cast<Resume>(flag) == Resume::OnlyCommitLeft) {
    error = rank == 0 ? Capture([&] { FinishCommit(o.output); }) : "";
    if (AnyFailed(comm, error, err, "ucp-convert")) return 1;
    if (talk) err << "ucp-convert: resumed a run killed after its manifest: " << o.output << " is complete\n";
    return 0;
  }
  if (static_cast<Resume>(flag) == Resume::Complete) {
    if (talk) err << "ucp-convert: " << o.output << " is already complete (its manifest verifies, from the same source): nothing to resume\n";
    return 0;
  }
  const bool resuming = static_cast<Resume>(flag) == Resume::Yes;
  std::string previous_latest;  // what <parent>/latest_universal named before this run's commit
  bool points_latest = false;   // whether the commit points it at the output (rank 0)
  std::map<std::string, store::FileRecord> journaled;  // from the interrupted run
  std::vector<char> done(plan.params.size() * plan::kStates, 0);
  if (resuming) {
    std::vector<int64_t> ok(done.size(), 0);
    error = Capture([&] {
      journaled = store::Journal::Load(o.output, fingerprint);
      for (const Item& it : plan.work[rank]) {  // each rank verifies the items it owns
        const auto& P = plan.params[it.param];
        std::vector<std::string> need = {store::StateRelPath(P.name, it.state)};
        if (it.state == State::Fp32 && step_of(P)) need.push_back(store::StepRelPath(P.name));
        bool all = true;
        for (const auto& rel : need) {
          auto j = journaled.find(rel);
          all = all && j != journaled.end() && store::Verify(o.output, j->second);
        }
        ok[it.param * plan::kStates + static_cast<int>(it.state)] = all;
      }
    });
    comm.AllreduceMax(ok);  // outside the capture: every rank takes part, failed or not
    if (AnyFailed(comm, error, err, "ucp-convert")) return 1;
    for (size_t k = 0; k < ok.size(); ++k) done[k] = static_cast<char>(ok[k]);
    plan.SkipDone(done);
    if (talk) {
      int64_t n = std::count(done.begin(), done.end(), 1);
      err << "ucp-convert: resuming: " << n << " of " << done.size() << " parameter states verified done\n";
    }
  }
  phase_done("prepare");

  // 3. Map, shuffle, union, write: in rounds of bounded size.
  Counters c;
  std::vector<std::string> divergences;  // tied copies on later stages that differ (notes)
  std::unique_ptr<store::AtomWriter> writer;
  std::mutex records_mu;
  std::vector<store::FileRecord> records;
  int64_t largest = 0;  // bytes of the largest item (a whole state tensor, or a part of one)
  for (const auto& work : plan.work)
    for (const auto& it : work) largest = std::max(largest, 4 * it.out_numel);
  // Parts this rank wrote: (param, state, part) -> their CRC-32 and XXH64, for the files' completion.
  std::map<std::tuple<int, int, int>, store::AtomWriter::PartDigest> parts_written;
  const int threads = o.threads > 0 ? o.threads : AvailableCores();
  int64_t total_stream = 0;
  for (int r = 0; r < ranks; ++r) total_stream += 4 * plan.work_numel[r];
  ProgressLine progress("ucp-convert", talk && o.progress, total_stream);
  {
    std::unique_ptr<map::Mapper> mapper;
    std::unique_ptr<store::Journal> journal;
    error = Capture([&] {
      mapper = std::make_unique<map::Mapper>(L, plan, rank);
      journal = std::make_unique<store::Journal>(o.output, rank);
    });
    if (AnyFailed(comm, error, err, "ucp-convert")) return 1;
    // Records several ranks read parts of: their CRC-32s, combined, checked before any byte is used.
    if (!plan.shared_records.empty()) {
      std::vector<int64_t> crcs(plan.SharedRanges(), 0);
      error = Timed(c.read, [&] { return Capture([&] { crcs = mapper->SharedRangeCrcs(); }); });
      if (AnyFailed(comm, error, err, "ucp-convert")) return 1;
      Timed(c.exchange, [&] { comm.AllreduceSum(crcs); });
      error = Capture([&] { mapper->CheckSharedRecords(crcs); });
      if (AnyFailed(comm, error, err, "ucp-convert")) return 1;
    }
    // The store, told of every parameter (the HDF5 one creates every dataset now, collectively).
    error = Capture([&] {
      std::map<std::string, const patterns::ParamPattern*> pattern_of;
      for (const auto& p : M.params) pattern_of[p.name] = &p;
      std::vector<store::AtomSpec> specs;
      for (const auto& P : plan.params) {
        const auto& pat = *pattern_of.at(P.name);
        specs.push_back({P.name, P.full_shape, store::ParamMetaJson(L, pat, P), store::UniversalKeysOf(pat, L.zero_stage, pt::Numel(P.joined_shape)), step_of(P),
                         pat.split_dim()});
      }
      writer = store::AtomWriter::Create(kind, o.output, std::move(specs), comm);
    });
    if (AnyFailed(comm, error, err, "ucp-convert")) return 1;
    // Writers hold at most one more atomic tensor than the one being assembled: the memory bound
    // of DESIGN.md 5 is 2x the largest state tensor plus the shuffle buffers.
    TaskPool writers(threads, largest);
    // The side files DeepSpeed's universal loader reads, written alongside, before the store's
    // commit makes the output durable (the .pt store's commit syncs the file system; the HDF5
    // store's syncs only atoms.h5): the model-states files copied by the ranks the plan gave them,
    // zero/optimizer_state.pt by the last rank (rank 0 has the commit to do). Their records reach
    // rank 0 with the others.
    const Durability side_durability = kind == store::StoreKind::Pt ? Durability::Batch : Durability::Now;
    auto side_file = [&](auto make) {
      return [&, make] {
        const auto start = Clock::now();
        store::FileRecord r = make();
        const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
        c.write_ns += ns, c.side_ns += ns;
        std::lock_guard<std::mutex> lock(records_mu);
        c.bytes_written += static_cast<int64_t>(r.bytes), ++c.files_written, records.push_back(r);
      };
    };
    // Submitted after the rounds under MPI: a copy started first would take the core from the
    // mapping that the other ranks wait for in the first exchange. A single process has no one
    // waiting: it starts them first, beside its mapping, rather than leave them as the run's tail.
    const bool side_files_first = ranks == 1;
    auto submit_side_files = [&] {
      if (rank == ranks - 1) {
        writers.Submit(0, side_file([&] { return WriteOptimizerStateFile(L, o.output, side_durability); }));
        // The framework's files beside the tag (Trainer's), as they are: job/<name>.
        if (!L.job.carried.empty()) std::filesystem::create_directories(o.output + "/" + source::kJobFolder);
        for (const std::string& name : L.job.carried)
          writers.Submit(0, side_file([&, name] {
            const std::string& root = L.job.root.empty() ? L.root : L.job.root;
            return store::CopyFileAtomically(root + "/" + name, o.output, std::string(source::kJobFolder) + "/" + name, side_durability);
          }));
      }
      for (size_t f = 0; f < L.files.size(); ++f)
        if (plan.file_carrier[f] == rank)
          writers.Submit(0, side_file([&, f] {
            // Checked against its zip records' CRC-32s as it is copied: DeepSpeed loads it as it is.
            const auto& file = L.files[f];
            if (file.checksummed.empty()) throw Error(L.dir + "/" + file.name + " lists no checksummed record: its bytes cannot be checked");
            return store::CopyFileAtomically(L.dir + "/" + file.name, o.output, file.name, side_durability, file.checksummed);
          }));
    };
    // Tensors are assembled one after another: memory the writers release is handed out again
    // rather than faulted in afresh. What is live at once: the writers' tensors (up to the largest),
    // the one being finished, and the round's open assemblies; the region has room for that with
    // slack for fragmentation (it is address space; only what is used becomes resident).
    BufferPool buffers(3 * largest + o.buffer_bytes);
    const auto& mine = plan.work[rank];
    std::map<size_t, std::unique_ptr<union_::Assembly>> open;  // item index -> assembly
    size_t next_final = 0;
    auto where = [&](const plan::Piece& pc) { return source::FileWhere(L, pc.file); };
    // The memory bound: the writers' tensors and the open assemblies take at most 2x the largest
    // item; a new assembly waits for the writers to finish enough of theirs (they go on without this
    // thread, so it never waits on itself).
    int64_t open_bytes = 0;
    auto assembly = [&](size_t i) -> union_::Assembly& {
      auto& a = open[i];
      if (!a) {
        const int64_t need = 4 * mine[i].out_numel;
        if (writer->concurrent()) Timed(c.wait, [&] { writers.WaitUntilHolding(2 * largest - open_bytes - need); });
        a = std::make_unique<union_::Assembly>(plan.params[mine[i].param], mine[i], buffers.Get(mine[i].out_numel));
        open_bytes += need;
      }
      return *a;
    };
    // Finishes the items that end at or before `upto` and hands them to the writers.
    auto finish_upto = [&](int64_t upto) {
      while (next_final < mine.size() && mine[next_final].work_start + mine[next_final].numel <= upto) {
        size_t i = next_final++;
        auto data = assembly(i).Finish();
        if (auto d = assembly(i).Divergence(); !d.empty()) divergences.push_back(d);
        open.erase(i);
        open_bytes -= 4 * mine[i].out_numel;
        const Item& it = mine[i];
        auto write = [&, i, data = std::move(data)]() {
          const Item& it = mine[i];
          const auto start = Clock::now();
          if (it.split()) {  // a part: in place in the file its parts share, completed after the rounds
            const auto digest = writer->WritePart(plan.params[it.param].name, it.state, it.out_begin, it.out_numel, data.get());
            c.write_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
            std::lock_guard<std::mutex> lock(records_mu);
            c.bytes_written += 4 * it.out_numel;
            parts_written[{it.param, static_cast<int>(it.state), it.part}] = digest;
            return;
          }
          auto recs = writer->Write(plan.params[it.param].name, it.state, data.get());
          c.write_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
          for (const auto& r : recs) journal->Append(r);
          std::lock_guard<std::mutex> lock(records_mu);
          for (const auto& r : recs) {
            c.bytes_written += static_cast<int64_t>(r.bytes);
            ++c.files_written;
            records.push_back(r);
          }
        };
        // A store whose writes must stay on this thread (HDF5 over MPI-IO) writes here.
        if (writer->concurrent()) Timed(c.wait, [&] { writers.Submit(4 * it.out_numel, std::move(write)); });
        else write(), c.bytes_written += 4 * it.out_numel;
      }
    };

    auto shuffled = [&](int r, size_t i, const plan::Piece& pc, int64_t off) { return plan.Shuffled(r, plan.work[r][i], pc, off); };
    if (side_files_first) error = Capture([&] { submit_side_files(); });
    shuffle::Round round(ranks);
    for (int64_t k = 0; k < plan.rounds; ++k) {
      // Pack what this rank maps for every reducer's round k.
      if (error.empty()) error = Timed(c.read, [&] { return Capture([&] {
        round.Reset();
        for (int r = 0; r < ranks; ++r)
          ForEachRoundRun(plan, r, k, [&](size_t i, const plan::Piece& pc, int64_t off, int64_t n) {
            if (pc.mapper == rank && shuffled(r, i, pc, off)) round.CountSend(r, 4 * n);
          });
        ForEachRoundRun(plan, rank, k, [&](size_t i, const plan::Piece& pc, int64_t off, int64_t n) {
          if (shuffled(rank, i, pc, off)) round.CountReceive(pc.mapper, 4 * n);
        });
        round.Allocate();
        for (int r = 0; r < ranks; ++r) {
          ForEachRoundRun(plan, r, k, [&](size_t i, const plan::Piece& pc, int64_t off, int64_t n) {
            if (pc.mapper != rank) return;
            const Item& it = plan.work[r][i];
            const std::string& name = plan.params[it.param].name;
            if (!shuffled(r, i, pc, off)) {
              assembly(i).ApplyInPlace(pc.stream_start + off, n, [&](uint8_t* dst, int64_t o2, int64_t m) {
                mapper->Read(pc, it.state, off + o2, m, dst, name);
              });
              c.bytes_in_place += 4 * n;
              return;
            }
            mapper->Read(pc, it.state, off, n, round.Put(r, 4 * n), name);
          });
        }
      }); });
      std::array<int64_t, 2> sums = {error.empty() ? 0 : 1, c.bytes_received + c.bytes_in_place};
      Timed(c.exchange, [&] { comm.AllreduceSum(sums); });
      if (sums[0] > 0) {
        AnyFailed(comm, error, err, "ucp-convert");
        return 1;
      }
      if (rank == 0) progress.Update(sums[1]);
      Timed(c.exchange, [&] { round.Exchange(comm); });
      c.bytes_sent += round.sent(), c.bytes_received += round.received();
      c.max_round_bytes = std::max(c.max_round_bytes, round.sent() + round.received());
      // Union: every shuffled run lands in its item's atomic tensor, in stream order.
      error = Capture([&] {
        Timed(c.assemble, [&] {
          ForEachRoundRun(plan, rank, k, [&](size_t i, const plan::Piece& pc, int64_t off, int64_t n) {
            if (!shuffled(rank, i, pc, off)) return;
            assembly(i).Apply(pc.stream_start + off, n, round.Take(pc.mapper, 4 * n), where(pc));
          });
        });
        finish_upto(std::min((k + 1) * plan.chunk_elems, plan.work_numel[rank]));
      });
      // An error here is reported at the next round's check, or after the last round.
    }
    if (error.empty()) error = Capture([&] {
      finish_upto(INT64_MAX);  // items of no elements, and a rank with no rounds
      if (!side_files_first) submit_side_files();
      Timed(c.drain, [&] { writers.Drain(); });
    });
    c.bytes_read = static_cast<int64_t>(mapper->bytes_read());
    if (AnyFailed(comm, error, err, "ucp-convert")) return 1;
    // Split items: every part's CRC-32 to every rank (a slot each, in plan order); the rank of one
    // part of a file (the state's number modulo the parts: the three states of a parameter are
    // finished by different ranks) completes it (the tensor's CRC-32 combined from its parts', in
    // row order) and renames it into place, so the files are finished in parallel.
    std::map<std::tuple<int, int, int>, size_t> slot;  // (param, state, part) -> slot
    for (const auto& work : plan.work)
      for (const Item& it : work)
        if (it.split()) slot.emplace(std::make_tuple(it.param, static_cast<int>(it.state), it.part), slot.size());
    // Per slot: 2^32 + the CRC-32 once written, then the XXH64 (each slot written by one rank only).
    std::vector<int64_t> sums(2 * slot.size(), 0);
    for (const auto& [key, d] : parts_written) {
      const size_t k = slot.at(key);
      sums[2 * k] = (int64_t{1} << 32) + d.crc32, sums[2 * k + 1] = static_cast<int64_t>(d.xxh64);
    }
    if (!sums.empty()) Timed(c.exchange, [&] { comm.AllreduceSum(sums); });
    error = Timed(c.finish_parts, [&] { return Capture([&] {
      for (const Item& it : mine) {
        if (!it.split() || it.part != static_cast<int>(it.state) % it.parts) continue;
        const auto& P = plan.params[it.param];
        uint32_t crc = 0;
        std::vector<store::AtomWriter::WrittenPart> parts;
        for (int k = 0; k < it.parts; ++k) {
          const size_t at = slot.at({it.param, static_cast<int>(it.state), k});
          if (sums[2 * at] >> 32 != 1)
            throw Error("internal: '" + P.name + "' " + std::string(plan::StateName(it.state)) + ": part " + std::to_string(k) + " not written");
          const auto [r0, r1] = P.PartRows(k, it.parts);
          const auto part_crc = static_cast<uint32_t>(sums[2 * at] & 0xFFFFFFFF);
          crc = k == 0 ? part_crc : static_cast<uint32_t>(crc32_combine64(crc, part_crc, 4 * (r1 - r0) * P.RowNumel()));
          parts.push_back({r0 * P.RowNumel(), (r1 - r0) * P.RowNumel(), static_cast<uint64_t>(sums[2 * at + 1])});
        }
        const auto recs = writer->FinishParts(P.name, it.state, crc, parts);
        for (const auto& r : recs) journal->Append(r);
        std::lock_guard<std::mutex> lock(records_mu);
        for (const auto& r : recs) ++c.files_written, c.bytes_written += static_cast<int64_t>(r.bytes), records.push_back(r);
        c.bytes_written -= 4 * P.full_numel;  // the tensor's bytes, counted by the ranks that wrote its parts
      }
    }); });
    if (AnyFailed(comm, error, err, "ucp-convert")) return 1;
  }
  store::StoreCommit committed;
  error = Capture([&] { Timed(c.sync, [&] { committed = writer->Commit(); }); });  // collective (HDF5: close, attributes, rename)
  if (AnyFailed(comm, error, err, "ucp-convert")) return 1;
  if (rank == 0) {
    int64_t total = total_stream;
    progress.Update(total, true);
  }
  phase_done("shuffle_union_write");

  // 4. Commit (rank 0): optimizer state, model-states files, manifest last, then latest_universal.
  nlohmann::json mine_json = nlohmann::json::array();
  for (const auto& r : records) mine_json.push_back(r.ToJson());
  auto gathered = comm.GatherToRoot(mine_json.dump());
  nlohmann::json rank_stats = {{"rank", rank}, {"bytes_read", c.bytes_read}, {"bytes_sent", c.bytes_sent},
                               {"bytes_received", c.bytes_received}, {"bytes_read_in_place", c.bytes_in_place}, {"max_round_bytes", c.max_round_bytes}, {"bytes_written", c.bytes_written},
                               {"files_written", c.files_written}, {"seconds", c.SecondsJson()}, {"peak_rss_bytes", PeakRss()}, {"threads", threads},
                               {"notes", divergences}};
  auto stats = comm.GatherToRoot(rank_stats.dump());
  error = "";
  if (rank == 0) {
    error = Capture([&] {
      std::map<std::string, store::FileRecord> files;
      for (const auto& [path, r] : journaled) files[path] = r;  // verified above when resuming
      for (const auto& g : gathered)
        for (const auto& r : nlohmann::json::parse(g)) files[r.at("path").get<std::string>()] = store::FileRecord::FromJson(r);
      // Items skipped on resume must all be in the journal; anything else is an internal error.
      for (const auto& r : committed.files) files[r.path] = r;
      for (const auto& P : plan.params)
        for (int s = 0; s < plan::kStates && kind == store::StoreKind::Pt; ++s)
          if (!files.count(store::StateRelPath(P.name, static_cast<State>(s))))
            throw Error("internal: no file recorded for " + store::StateRelPath(P.name, static_cast<State>(s)));
      std::map<std::string, const patterns::ParamPattern*> pattern_of;
      for (const auto& p : M.params) pattern_of[p.name] = &p;
      nlohmann::json params = nlohmann::json::array();
      for (const auto& P : plan.params) {
        auto p = store::ParamMetaJson(L, *pattern_of.at(P.name), P);
        p.update(committed.storage.at(P.name));
        params.push_back(p);
      }
      auto manifest = store::AssembleManifest(std::string(store::StoreName(kind)), store::SourceJson(L, M),
                                              store::FamilyJson(M), params, files);
      // latest_universal, which DeepSpeed's universal load follows: the .pt store of a checkpoint it resumes,
      // in its tag's checkpoint root.
      points_latest = store::PointsLatestUniversal(o.output, manifest);
      auto latest = points_latest ? store::StageLatestUniversal(o.output) : nullptr;
      if (latest) previous_latest = ReadWholeFile(latest->path()).value_or("");
      folder->Mark({manifest.dump(1) + "\n"});  // the commit point (step 4)
      if (latest) latest->Commit();
      store::Journal::Remove(o.output);
    });
  }
  if (AnyFailed(comm, error, err, "ucp-convert")) return 1;
  // DeepSpeed's load_universal follows latest_universal: moving it is said (it may have named
  // DeepSpeed's own universal folder).
  if (talk && points_latest) {
    const std::string named = fs::path(o.output).lexically_normal().filename().string();
    if (!previous_latest.empty() && previous_latest != named && !named.empty())
      err << "ucp-convert: note: " << fs::path(o.output).lexically_normal().parent_path().string()
          << "/latest_universal named " << previous_latest << "; it now names " << named << "\n";
  }
  phase_done("commit");
  phases["total"] = Seconds(t0);

  if (rank == 0) {
    nlohmann::json per = nlohmann::json::array(), notes = nlohmann::json::array();
    int64_t read = 0, written = 0, peak = 0;
    for (const auto& s : stats) {
      auto j = nlohmann::json::parse(s);
      for (const auto& n : j["notes"]) notes.push_back(n);
      j.erase("notes");
      read += j["bytes_read"].get<int64_t>(), written += j["bytes_written"].get<int64_t>();
      peak = std::max(peak, j["peak_rss_bytes"].get<int64_t>());
      per.push_back(j);
    }
    if (!o.report_path.empty()) {
      nlohmann::json report = {{"source", o.source}, {"output", o.output}, {"ranks", ranks}, {"phases_seconds", phases},
                               {"bytes_read", read}, {"bytes_written", written}, {"per_rank", per},
                               {"resumed_items", std::count(done.begin(), done.end(), 1)}, {"notes", notes},
                               {"plan", {{"rounds", plan.rounds}, {"chunk_bytes", 4 * plan.chunk_elems},
                                         {"imbalance", plan.Imbalance()}}}};
      error = Capture([&] { WriteFileAtomically(o.report_path, report.dump(1) + "\n"); });
      if (!error.empty()) {
        err << "ucp-convert: error: " << error << std::endl;
        return 1;
      }
    }
    if (talk) {
      for (const auto& n : notes) err << "ucp-convert: note: " << n.get<std::string>() << "\n";
      char buf[256];
      std::snprintf(buf, sizeof buf, "ucp-convert: wrote %s: %zu parameters, %s read, %s written in %.2fs (peak RSS %s per rank)\n",
                    o.output.c_str(), plan.params.size(), HumanBytes(double(read)).c_str(), HumanBytes(double(written)).c_str(),
                    phases["total"].get<double>(), HumanBytes(double(peak)).c_str());
      err << buf;
    }
  }
  return 0;
}

}  // namespace ucp::convert
