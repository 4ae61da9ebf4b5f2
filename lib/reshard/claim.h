// The -o folder of ucp-reshard, claimed (core/commit.h, step 1) by rank 0, whatever the target
// format: refused when it holds something unless --force, and --force replaces only a folder
// ucp-reshard wrote (its claim file, .ucp-reshard.json, says so) or one a killed run left; never a
// training run's own checkpoint root, whose files look alike.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/commit.h"

namespace ucp::reshard {

// `markers`: the folder's markers, the commit point last; `contents`: what a run of this target
// writes there besides. --force removes the markers, then every commit point of any target, then
// `contents`, then everything else but the lock: the folder is replaced whole; refused when the
// folder holds `input`, what the run reads. Throws ucp::Error naming the folder.
std::unique_ptr<OutputFolder> ClaimOutput(const std::string& output, const std::string& input, bool force,
                                          const std::vector<std::string>& markers, const std::vector<std::string>& contents,
                                          const std::string& what, std::string* lock_note);

}  // namespace ucp::reshard
