#include "reshard/claim.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/commit.h"
#include "core/error.h"
#include "core/format.h"
#include "core/names.h"
#include "core/output_lock.h"
#include "shuffle/agree.h"
#include "reshard/tool_name.h"
#include "store/atomic_store.h"

namespace ucp::reshard {
namespace fs = std::filesystem;

namespace {
constexpr const char* kClaimFile = ".ucp-reshard.json";
// The files that mark a folder of any target complete: removed before anything they name.
const std::set<std::string> kCommitPoints = {"latest", "latest_checkpointed_iteration.txt", "model.safetensors.index.json"};

// What a claim neither counts nor clears: the lock (and what taking one leaves), temporaries, and the
// scratch atomic checkpoint a run from a training run's root reads (reshard/in_place.h).
bool NotContents(const std::string& name) {
  return name.rfind(OutputLock::kFileName, 0) == 0 || IsTemporaryName(name) || name == kScratchAtomic || name == kScratchRemoved;
}

// Whether `output` holds nothing of its own (or does not exist).
bool HoldsNothing(const std::string& output) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(output, ec))
    if (!NotContents(e.path().filename().string())) return false;
  return true;
}

// `names` with the commit points first: a folder stops looking complete before what they name goes.
std::vector<std::string> CommitPointsFirst(std::vector<std::string> names) {
  std::stable_partition(names.begin(), names.end(), [](const std::string& n) { return kCommitPoints.count(n) > 0; });
  return names;
}

// What --force clears must not hold what this run reads (its own scratch atomic checkpoint aside: never cleared).
void RefuseForceOverInput(const std::string& output, const std::string& input) {
  std::error_code ec;
  const auto in = fs::weakly_canonical(input, ec).string(), out = fs::weakly_canonical(output, ec).string();
  if (in.empty() || out.empty() || in == out + "/" + kScratchAtomic) return;
  if (in == out || in.rfind(out + "/", 0) == 0)
    throw Error(output + ": --force would remove what it holds, and it holds the checkpoint this run reads (" + input +
                "): choose another -o");
}

// What the claim file of the run before lists as written by it (nothing, for a claim of a ucp
// before claims listed their files).
std::vector<std::string> ListedWrites(const std::string& output) {
  const std::string path = output + "/" + kClaimFile;
  const auto text = ReadWholeFile(path);
  const nlohmann::json j = text ? nlohmann::json::parse(*text, nullptr, false) : nlohmann::json();
  if (!j.is_object() || j.value("tool", "") != kTool)
    throw Error(path + ": not ucp-reshard's claim file, so --force cannot tell what it may remove: remove the folder "
                "yourself, or choose another -o");
  std::vector<std::string> writes;
  for (const auto& w : j.value("writes", nlohmann::json::array())) {
    // what --force removes stays inside the folder, whatever the file says
    if (!w.is_string()) throw Error(path + ": writes holds " + w.dump() + ", not a file name");
    RequirePlainName(w.get<std::string>(), path + ": writes");
    writes.push_back(w.get<std::string>());
  }
  return writes;
}

// --force removes only what `listed` names: anything else in the folder (a tag a training run saved
// there since), and a `latest` naming a tag not among it, is refused by name.
void RefuseUnlisted(const std::string& output, const std::vector<std::string>& listed) {
  const std::set<std::string> ours(listed.begin(), listed.end());
  std::vector<std::string> foreign;
  for (const auto& e : fs::directory_iterator(output)) {
    const std::string name = e.path().filename().string();
    if (name != kClaimFile && !NotContents(name) && !ours.count(name)) foreign.push_back(name);
  }
  std::sort(foreign.begin(), foreign.end());
  const std::string lists = std::string(" (its ") + kClaimFile + " lists " + (listed.empty() ? "nothing" : JoinNames(listed)) + ")";
  if (!foreign.empty())
    throw Error(output + ": --force replaces only what ucp-reshard wrote there" + lists + ", and " + JoinNames(foreign) +
                (foreign.size() == 1 ? " is" : " are") + " not among it (a training run may have saved into this folder "
                "since): move " + (foreign.size() == 1 ? "it" : "them") + " away, or choose another -o");
  if (!ours.count("latest")) return;
  std::string tag = ReadWholeFile(output + "/latest").value_or("");
  tag.erase(tag.find_last_not_of(" \t\r\n") + 1);
  if (!tag.empty() && !ours.count(tag))
    throw Error(output + "/latest names " + tag + ", which ucp-reshard did not write there" + lists + ": a training run "
                "may have resumed from this folder, and --force would rewind it; choose another -o, or remove the folder yourself");
}

// What --force clears in a folder holding something: what the claim of the run before lists; in a
// folder no run claimed, what a killed run left before its claim (folders without files,
// temporaries). Throws ucp::Error for anything else.
std::vector<std::string> ForceClearList(const std::string& output) {
  if (fs::exists(output + "/" + kClaimFile)) {
    const std::vector<std::string> listed = ListedWrites(output);
    RefuseUnlisted(output, listed);
    return CommitPointsFirst(listed);
  }
  if (!HoldsOnlyLeftovers(output))
    throw Error(output + ": not written by ucp-reshard (no " + kClaimFile + "): --force replaces only folders "
                "ucp-reshard wrote; remove it yourself or choose another -o");
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(output))
    if (const std::string name = e.path().filename().string(); !NotContents(name) || IsTemporaryName(name)) left.push_back(name);
  return left;
}

}  // namespace

ClaimedOutput::ClaimedOutput(std::unique_ptr<OutputFolder> folder, std::vector<std::string> writes, bool made_folder, bool made_claim)
    : folder_(std::move(folder)), dir_(folder_->dir()), writes_(CommitPointsFirst(std::move(writes))), made_folder_(made_folder),
      made_claim_(made_claim) {}

void ClaimedOutput::Abandon() {
  std::error_code ec;  // best effort: the run has failed already, with its own error
  for (const auto& w : writes_) fs::remove_all(dir_ + "/" + w, ec);
  for (const auto& e : fs::directory_iterator(dir_, ec)) {  // this run's temporaries beside them
    const std::string name = e.path().filename().string();
    if (IsTemporaryName(name) && std::any_of(writes_.begin(), writes_.end(), [&](const std::string& w) { return name.rfind(w, 0) == 0; }))
      fs::remove(e.path(), ec);
  }
  if (made_claim_) fs::remove(dir_ + "/" + kClaimFile, ec);
  folder_.reset();  // the lock goes
  if (made_folder_) fs::remove(dir_, ec);  // only when nothing else is in it
}

bool AnyFailedAbandoning(shuffle::Comm& comm, const std::string& error, std::ostream& err, ClaimedOutput* claim) {
  if (!shuffle::AnyFailed(comm, error, err, kTool)) return false;
  if (claim) claim->Abandon();  // every rank has stopped writing: AnyFailed is collective
  return true;
}

namespace {

// Whether the folder holds a run that never reached its commit point (killed): its claim file lists
// its markers, and none of them is there. Such a run's files are the next run's to replace, without
// --force (nothing of them looks complete). A claim file of a ucp before claims listed markers: false.
bool Unfinished(const std::string& output) {
  const auto text = ReadWholeFile(output + "/" + kClaimFile);
  const nlohmann::json j = text ? nlohmann::json::parse(*text, nullptr, false) : nlohmann::json();
  if (!j.is_object() || j.value("tool", "") != kTool || !j.contains("markers") || !j["markers"].is_array() || j["markers"].empty())
    return false;
  std::error_code ec;
  for (const auto& m : j["markers"])
    if (!m.is_string() || fs::exists(output + "/" + m.get<std::string>(), ec)) return false;
  return true;
}

// A folder in the way: --force is the remedy only where an earlier ucp-reshard run wrote it.
Error NotEmpty(const std::string& output, bool claimed) {
  if (claimed) return Error(output + ": exists and holds an earlier ucp-reshard run's output; use --force to replace it");
  return Error(output + ": exists and is not empty, and no ucp-reshard run wrote it (no " + std::string(kClaimFile) +
               "): choose another -o, or empty it yourself (--force replaces only what ucp-reshard wrote)");
}

}  // namespace

std::unique_ptr<ClaimedOutput> ClaimOutput(const std::string& output, const std::string& input, bool force,
                                           const std::vector<std::string>& markers, const std::vector<std::string>& contents,
                                           const std::string& what, std::string* lock_note) {
  if (force) RefuseForceOverInput(output, input);
  std::error_code ec;
  const bool made_folder = !fs::exists(output, ec);
  auto folder = std::make_unique<OutputFolder>(output, kTool, markers, lock_note);
  const bool claimed = fs::exists(output + "/" + kClaimFile, ec);
  if (!HoldsNothing(output)) {  // under the lock
    const bool unfinished = claimed && Unfinished(output);
    if (!force && !unfinished) throw NotEmpty(output, claimed);
    folder->Clear(ForceClearList(output));
    if (unfinished && !force && lock_note)
      *lock_note += std::string(lock_note->empty() ? "" : "; ") + output + " held an earlier ucp-reshard run that stopped before "
                    "its commit point (killed?): what it wrote was removed, and this run writes the folder afresh";
  } else {
    folder->Clear({});  // what killed runs left that counts as nothing: their temporaries
  }
  std::vector<std::string> writes = markers;
  for (const std::string& c : contents)  // a file inside a folder (Megatron-LM's iter_NNNNNNN/): the folder
    if (const std::string top = c.substr(0, c.find('/')); std::find(writes.begin(), writes.end(), top) == writes.end()) writes.push_back(top);
  WriteFileAtomically(output + "/" + kClaimFile,
                      nlohmann::json({{"tool", kTool}, {"ucp_version", UCP_VERSION}, {"what", what}, {"writes", writes},
                                      {"markers", markers}}).dump() + "\n");
  return std::make_unique<ClaimedOutput>(std::move(folder), std::move(writes), made_folder, !claimed);
}

void RefuseClaim(const std::string& output, const std::string& input, bool force) {
  if (force) RefuseForceOverInput(output, input);
  if (HoldsNothing(output)) return;
  std::error_code ec;
  const bool claimed = fs::exists(output + "/" + kClaimFile, ec);
  if (!force && !(claimed && Unfinished(output))) throw NotEmpty(output, claimed);
  ForceClearList(output);  // refuses what --force would refuse to clear
}

void RefuseForeignScratch(const std::string& scratch) {
  std::error_code ec;
  fs::remove_all(fs::path(scratch).parent_path() / kScratchRemoved, ec);
  // A live run writing the folder or its scratch (its lock held) is refused by name, before this run
  // converts anything or removes a scratch that run reads; a killed run's lock goes.
  const bool locked = fs::exists(scratch + "/" + OutputLock::kFileName);  // a ucp run's, killed (a live one is refused next)
  for (const std::string& dir : {fs::path(scratch).parent_path().string(), scratch})
    if (fs::is_directory(dir)) OutputLock::RemoveStale(dir, kTool);
  if (fs::exists(scratch) && !locked && !store::IsAtomicCheckpoint(scratch) && !fs::exists(scratch + "/" + store::kJournalDir) &&
      !HoldsOnlyLeftovers(scratch))
    throw Error(scratch + ": not written by ucp, and a run that converts into it removes it: remove it yourself or choose another -o");
}

void RemoveScratch(const std::string& scratch, const std::string& output, bool created_output, bool talk, std::ostream& err) {
  std::error_code ec;
  if (fs::is_directory(scratch)) try {
      OutputLock::RemoveStale(scratch, kTool);  // throws where a live run holds it
    } catch (const Error& e) {
      if (talk) err << kTool << ": note: left " << scratch << " to the run converting into it: " << e.what() << "\n";
      return;
    }
  const fs::path removed = fs::path(scratch).parent_path() / kScratchRemoved;
  fs::remove_all(removed, ec);
  fs::rename(scratch, removed, ec);
  fs::remove_all(ec ? fs::path(scratch) : removed, ec);
  if (created_output && fs::is_empty(output, ec)) fs::remove(output, ec);
  if (talk) err << kTool << ": removed the scratch atomic checkpoint " << scratch << "\n";
}

}  // namespace ucp::reshard
