// The -o folder of ucp-reshard, claimed (core/commit.h, step 1) by rank 0, whatever the target
// format: refused when it holds something unless --force, and --force replaces only a folder
// ucp-reshard wrote (its claim file, .ucp-reshard.json, says so) or one a killed run left; never a
// training run's own checkpoint root, whose files look alike. OUT/.ucp-scratch-atomic, the atomic
// checkpoint a run from a training run's root converts into when it needs one (reshard/in_place.h),
// is the run's own input: never counted as the folder's contents, never cleared by the claim.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/commit.h"

namespace ucp::reshard {

inline constexpr const char* kScratchAtomic = ".ucp-scratch-atomic";

// `markers`: the folder's markers, the commit point last; `contents`: what a run of this target
// writes there besides. --force removes the markers, then every commit point of any target, then
// `contents`, then everything else but the lock and the scratch atomic checkpoint: the folder is
// replaced whole; refused when the folder holds `input`, what the run reads (unless that is the
// scratch atomic checkpoint). Throws ucp::Error naming the folder.
std::unique_ptr<OutputFolder> ClaimOutput(const std::string& output, const std::string& input, bool force,
                                          const std::vector<std::string>& markers, const std::vector<std::string>& contents,
                                          const std::string& what, std::string* lock_note);

// What ClaimOutput would refuse, without claiming: for a run with work to do before its claim (a
// conversion into the scratch folder), refused before that work is done for nothing.
void RefuseClaim(const std::string& output, const std::string& input, bool force);

}  // namespace ucp::reshard
