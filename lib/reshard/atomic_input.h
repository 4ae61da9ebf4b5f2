// The folder ucp-reshard reads must be an atomic checkpoint (or DeepSpeed's universal folder): a
// training checkpoint given in its place is said as such, with the command that converts it.
#pragma once

#include <string>

namespace ucp::reshard {

// Throws ucp::Error when `dir` has no ucp_manifest.json and is a source checkpoint of a format ucp
// reads (ucp-convert it first), or a DeepSpeed tag folder (global_stepN: give its root). Otherwise
// returns: the atomic reader says what else is wrong.
void RefuseNonAtomicInput(const std::string& dir);

}  // namespace ucp::reshard
