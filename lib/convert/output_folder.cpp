// Step 2 of a conversion: the output folder claimed (core/commit.h, step 1) and the resume decided:
// afresh, the files of an interrupted run verified and kept, only its commit's end left, or done.
#include <algorithm>
#include <filesystem>

#include "convert/steps.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/output_lock.h"
#include "shuffle/agree.h"
#include "store/universal_folder.h"

namespace ucp::convert {
namespace fs = std::filesystem;
using plan::Item;
using plan::State;
using shuffle::AnyFailed;
using shuffle::Capture;

namespace {

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
    RefuseForeignForce(o, **folder);
    // --force offered only where it would be taken: over what a ucp-convert run wrote.
    const bool converted = fs::exists(o.output + "/" + store::kJournalDir) || store::IsAtomicCheckpoint(o.output) ||
                           HoldsOnlyLeftovers(o.output);
    (*folder)->RequireEmpty(o.force, store::AtomicFolderContents(),
                            converted ? "use --resume to finish an interrupted conversion or --force to overwrite it"
                                      : "it holds files no ucp-convert run wrote (another tool's, or ucp-reshard's output), "
                                        "which --force does not replace: choose another -o, or empty it yourself");
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

// The items of this rank whose files the interrupted run's journal lists and that verify:
// ok[param * kStates + state] set (each rank verifies the items it owns).
void VerifyJournaled(const ConvertOptions& o, const Planned& x, int rank, const std::string& fingerprint,
                     OutputClaim& claim, std::vector<int64_t>& ok) {
  claim.journaled = store::Journal::Load(o.output, fingerprint);
  for (const Item& it : x.plan.work[rank]) {
    const auto& P = x.plan.params[it.param];
    std::vector<std::string> need = {store::StateRelPath(P.name, it.state)};
    if (it.state == State::Fp32 && StepOf(x.L, P)) need.push_back(store::StepRelPath(P.name));
    bool all = true;
    for (const auto& rel : need) {
      auto j = claim.journaled.find(rel);
      all = all && j != claim.journaled.end() && store::Verify(o.output, j->second);
    }
    ok[it.param * plan::kStates + static_cast<int>(it.state)] = all;
  }
}

// Resuming: what every rank verified done, agreed, and dropped from the plan. False when a rank failed.
bool SkipVerified(const ConvertOptions& o, Planned& x, shuffle::Comm& comm, std::ostream& err, const std::string& fingerprint,
                  OutputClaim& claim) {
  std::vector<int64_t> ok(claim.done.size(), 0);
  const std::string error = Capture([&] { VerifyJournaled(o, x, comm.rank(), fingerprint, claim, ok); });
  comm.AllreduceMax(ok);  // outside the capture: every rank takes part, failed or not
  if (AnyFailed(comm, error, err, "ucp-convert")) return false;
  for (size_t k = 0; k < ok.size(); ++k) claim.done[k] = static_cast<char>(ok[k]);
  x.plan.SkipDone(claim.done);
  if (comm.rank() == 0 && !o.quiet) {
    int64_t n = std::count(claim.done.begin(), claim.done.end(), 1);
    err << "ucp-convert: resuming: " << n << " of " << claim.done.size() << " parameter states verified done\n";
  }
  return true;
}

}  // namespace

std::optional<int> ClaimOutput(const ConvertOptions& o, Planned& x, shuffle::Comm& comm, std::ostream& err, OutputClaim& claim) {
  const int rank = comm.rank();
  const bool talk = rank == 0 && !o.quiet;
  const std::string fingerprint = store::Fingerprint(x.L, x.M);
  Resume resume = Resume::No;
  std::string lock_note;
  std::string error = rank == 0 ? Capture([&] { PrepareOutput(o, x.L, fingerprint, &resume, &claim.folder, &lock_note); }) : "";
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
  claim.done.assign(x.plan.params.size() * plan::kStates, 0);
  if (static_cast<Resume>(flag) == Resume::Yes && !SkipVerified(o, x, comm, err, fingerprint, claim)) return 1;
  return std::nullopt;
}

void RefuseForeignForce(const ConvertOptions& o, const OutputFolder& folder) {
  if (!o.force || folder.Empty()) return;
  // --force replaces only what ucp wrote: a universal checkpoint without ucp's manifest or
  // journal (DeepSpeed's ds_to_universal.py output) is never cleared.
  const bool run_json = fs::exists(o.output + "/" + store::kJournalDir + "/run.json");
  if (!run_json && store::IsDeepSpeedUniversal(o.output))
    throw Error(o.output + ": holds a universal checkpoint ucp did not write (zero/ without " +
                std::string(store::kManifestName) + ", as DeepSpeed's ds_to_universal.py writes it): --force "
                "replaces only what ucp wrote; choose another -o");
  if (!fs::exists(o.output + "/" + store::kJournalDir) && !store::IsAtomicCheckpoint(o.output) && !HoldsOnlyLeftovers(o.output))
    throw Error(o.output + ": not written by ucp (no " + std::string(store::kManifestName) + " or journal, and files "
                "of its own): --force replaces only what ucp wrote; remove it yourself or choose another -o");
}

}  // namespace ucp::convert
