// The -o folder of ucp-reshard, claimed (core/commit.h, step 1) by rank 0, whatever the target
// format: refused when it holds something unless --force, and --force replaces only what an earlier
// ucp-reshard run wrote there, as its claim file (.ucp-reshard.json, "writes") lists it, or what a
// killed run left before its claim; anything else in the folder (a tag training saved there since,
// a `latest` naming one) is refused by name, never removed. Never a training run's own checkpoint
// root, whose files look alike. A run that fails before its commit point takes back what it made.
#pragma once

#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "core/commit.h"
#include "shuffle/comm.h"

namespace ucp::reshard {

// OUT/.ucp-scratch-atomic: the atomic checkpoint a run from a training run's root converts into when
// it needs one (reshard/in_place.h); the run's own input, never counted as the folder's contents,
// never cleared by a claim.
inline constexpr const char* kScratchAtomic = ".ucp-scratch-atomic";
// A scratch folder being removed: renamed to this first, so that a run killed while removing it leaves a
// folder ucp knows by its name (the next run removes it).
inline constexpr const char* kScratchRemoved = ".ucp-scratch-atomic.removing";

// A folder a run writes into, locked, with what undoing the run removes.
class ClaimedOutput {
 public:
  // `writes`: what the run writes there (its markers and contents, names relative to the folder);
  // `made_folder` / `made_claim`: whether this run created the folder / its claim file.
  ClaimedOutput(std::unique_ptr<OutputFolder> folder, std::vector<std::string> writes, bool made_folder, bool made_claim);
  OutputFolder& folder() { return *folder_; }
  // For a run that failed before its commit point, once no rank writes any more (after the ranks
  // agreed it failed): removes what it wrote (`writes`, the commit point first, and temporaries),
  // the claim file if it made it, and the folder if it made it; never what was there before.
  void Abandon();

 private:
  std::unique_ptr<OutputFolder> folder_;
  std::string dir_;
  std::vector<std::string> writes_;
  bool made_folder_, made_claim_;
};

// `markers`: the folder's markers, the commit point last; `contents`: what a run of this target
// writes there besides (a path inside a folder is recorded, and taken back, as its top folder); both
// are recorded in the claim file. A folder whose claim file lists markers none of which is there holds
// a run killed before its commit point: it is replaced as --force would, without it (said in
// *lock_note). --force removes what the claim file
// of the run before lists (the commit points first), then what killed runs left; refused when the
// folder holds anything else, when its `latest` names a tag that list lacks, or when the folder
// holds `input`, what the run reads. Throws ucp::Error naming the folder and what is in the way.
std::unique_ptr<ClaimedOutput> ClaimOutput(const std::string& output, const std::string& input, bool force,
                                           const std::vector<std::string>& markers, const std::vector<std::string>& contents,
                                           const std::string& what, std::string* lock_note);

// Collective, for a run past its claim: whether any rank failed (shuffle::AnyFailed, said by the
// lowest failing rank); if so, the claim (rank 0's; null elsewhere) is abandoned.
bool AnyFailedAbandoning(shuffle::Comm& comm, const std::string& error, std::ostream& err, ClaimedOutput* claim);

// What ClaimOutput would refuse, without claiming: for a run with work to do before its claim (a
// conversion into the scratch folder), refused before that work is done for nothing.
void RefuseClaim(const std::string& output, const std::string& input, bool force);

// Refuses a scratch folder (kScratchAtomic) ucp did not write (no manifest or journal, and files of its
// own): the run that converts into it removes it when it ends, and ucp removes only what it wrote. Also
// refused: a live run holding the lock of the scratch or of the folder holding it (output_lock.h). A
// removal a killed run left half done (kScratchRemoved) is finished.
void RefuseForeignScratch(const std::string& scratch);

// Rank 0, once no rank reads it: the scratch folder removed, and `output` with it where the run created
// it and it is left empty; said unless quiet. A scratch another live run holds the lock of (a run that
// lost the race for the folder to it) is left to that run, said.
void RemoveScratch(const std::string& scratch, const std::string& output, bool created_output, bool talk, std::ostream& err);

}  // namespace ucp::reshard
