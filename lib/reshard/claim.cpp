#include "reshard/claim.h"

#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/output_lock.h"

namespace ucp::reshard {

namespace {
constexpr const char* kTool = "ucp-reshard";
constexpr const char* kClaimFile = ".ucp-reshard.json";
// The files that mark a folder of any target complete: removed before anything they name.
const std::set<std::string> kCommitPoints = {"latest", "latest_checkpointed_iteration.txt", "model.safetensors.index.json"};
}  // namespace

std::unique_ptr<OutputFolder> ClaimOutput(const std::string& output, const std::string& input, bool force,
                                          const std::vector<std::string>& markers, const std::vector<std::string>& contents,
                                          const std::string& what, std::string* lock_note) {
  if (force) {  // what --force clears must not hold what this run reads
    std::error_code ec;
    const auto in = std::filesystem::weakly_canonical(input, ec).string(), out = std::filesystem::weakly_canonical(output, ec).string();
    if (!in.empty() && !out.empty() && (in == out || in.rfind(out + "/", 0) == 0))
      throw Error(output + ": --force would remove what it holds, and it holds the checkpoint this run reads (" + input +
                  "): choose another -o");
  }
  auto folder = std::make_unique<OutputFolder>(output, kTool, markers, lock_note);
  if (force && !folder->Empty() && !std::filesystem::exists(output + "/" + kClaimFile) && !HoldsOnlyLeftovers(output))
    throw Error(output + ": not written by ucp-reshard (no " + kClaimFile + "): --force replaces only folders "
                "ucp-reshard wrote; remove it yourself or choose another -o");
  // --force replaces the folder whole: what this target writes, and anything an earlier run of ucp-reshard
  // wrote there for another target or layout (other files, other tags), the commit points first, so that
  // nothing stale stays beside the new files looking like part of them.
  std::vector<std::string> all, rest;
  if (force)
    for (const auto& e : std::filesystem::directory_iterator(output)) {
      const std::string name = e.path().filename().string();
      if (name.rfind(OutputLock::kFileName, 0) == 0 || name == kClaimFile) continue;
      (kCommitPoints.count(name) ? all : rest).push_back(name);
    }
  all.insert(all.end(), contents.begin(), contents.end());
  all.insert(all.end(), rest.begin(), rest.end());
  folder->RequireEmpty(force, all);
  WriteFileAtomically(output + "/" + kClaimFile,
                      nlohmann::json({{"tool", kTool}, {"ucp_version", UCP_VERSION}, {"what", what}}).dump() + "\n");
  return folder;
}

}  // namespace ucp::reshard
