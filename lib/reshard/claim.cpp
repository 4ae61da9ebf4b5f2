#include "reshard/claim.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"

namespace ucp::reshard {

namespace {
constexpr const char* kTool = "ucp-reshard";
constexpr const char* kClaimFile = ".ucp-reshard.json";
}  // namespace

std::unique_ptr<OutputFolder> ClaimOutput(const std::string& output, bool force, const std::vector<std::string>& markers,
                                          const std::vector<std::string>& contents, const std::string& what,
                                          std::string* lock_note) {
  auto folder = std::make_unique<OutputFolder>(output, kTool, markers, lock_note);
  if (force && !folder->Empty() && !std::filesystem::exists(output + "/" + kClaimFile) && !HoldsOnlyLeftovers(output))
    throw Error(output + ": not written by ucp-reshard (no " + kClaimFile + "): --force replaces only folders "
                "ucp-reshard wrote; remove it yourself or choose another -o");
  folder->RequireEmpty(force, contents);
  WriteFileAtomically(output + "/" + kClaimFile,
                      nlohmann::json({{"tool", kTool}, {"ucp_version", UCP_VERSION}, {"what", what}}).dump() + "\n");
  return folder;
}

}  // namespace ucp::reshard
