#include "reshard/claim.h"

#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/output_lock.h"

namespace ucp::reshard {

namespace {
namespace fs = std::filesystem;
constexpr const char* kTool = "ucp-reshard";
constexpr const char* kClaimFile = ".ucp-reshard.json";
// The files that mark a folder of any target complete: removed before anything they name.
const std::set<std::string> kCommitPoints = {"latest", "latest_checkpointed_iteration.txt", "model.safetensors.index.json"};

// What a claim neither counts nor clears: the lock (and what taking one leaves), the scratch atomic checkpoint.
bool NotContents(const std::string& name) { return name.rfind(OutputLock::kFileName, 0) == 0 || name == kScratchAtomic; }

// Whether `output` holds nothing of its own (or does not exist).
bool HoldsNothing(const std::string& output) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(output, ec))
    if (!NotContents(e.path().filename().string())) return false;
  return true;
}

// --force must not clear what this run reads (its own scratch atomic checkpoint aside: never cleared).
void RefuseForceOverInput(const std::string& output, const std::string& input) {
  std::error_code ec;
  const auto in = fs::weakly_canonical(input, ec).string(), out = fs::weakly_canonical(output, ec).string();
  if (in.empty() || out.empty() || in == out + "/" + kScratchAtomic) return;
  if (in == out || in.rfind(out + "/", 0) == 0)
    throw Error(output + ": --force would remove what it holds, and it holds the checkpoint this run reads (" + input +
                "): choose another -o");
}

// A folder holding something: refused without --force, and with it unless ucp-reshard wrote it.
void RefuseContents(const std::string& output, bool force) {
  if (HoldsNothing(output)) return;
  if (!force) throw Error(output + ": exists and is not empty; use --force to overwrite it");
  if (!fs::exists(output + "/" + kClaimFile) && !HoldsOnlyLeftovers(output))
    throw Error(output + ": not written by ucp-reshard (no " + kClaimFile + "): --force replaces only folders "
                "ucp-reshard wrote; remove it yourself or choose another -o");
}
}  // namespace

void RefuseClaim(const std::string& output, const std::string& input, bool force) {
  if (force) RefuseForceOverInput(output, input);
  RefuseContents(output, force);
}

std::unique_ptr<OutputFolder> ClaimOutput(const std::string& output, const std::string& input, bool force,
                                          const std::vector<std::string>& markers, const std::vector<std::string>& contents,
                                          const std::string& what, std::string* lock_note) {
  if (force) RefuseForceOverInput(output, input);
  auto folder = std::make_unique<OutputFolder>(output, kTool, markers, lock_note);
  RefuseContents(output, force);  // under the lock
  // --force replaces the folder whole: what this target writes, and anything an earlier run of ucp-reshard
  // wrote there for another target or layout (other files, other tags), the commit points first, so that
  // nothing stale stays beside the new files looking like part of them.
  if (!HoldsNothing(output)) {
    std::vector<std::string> all, rest;
    for (const auto& e : fs::directory_iterator(output)) {
      const std::string name = e.path().filename().string();
      if (NotContents(name) || name == kClaimFile) continue;
      (kCommitPoints.count(name) ? all : rest).push_back(name);
    }
    all.insert(all.end(), contents.begin(), contents.end());
    all.insert(all.end(), rest.begin(), rest.end());
    folder->Clear(all);
  }
  WriteFileAtomically(output + "/" + kClaimFile,
                      nlohmann::json({{"tool", kTool}, {"ucp_version", UCP_VERSION}, {"what", what}}).dump() + "\n");
  return folder;
}

}  // namespace ucp::reshard
