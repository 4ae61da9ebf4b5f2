// Which build of ucp is running: its version, the commit it was built from, the build type and the
// MPI and HDF5 it was compiled against. One place for --version and for what ucp records in the files
// it writes (the manifest's ucp_commit).
#pragma once

#include <string>

namespace ucp {

// "0.1.0"
const char* Version();
// The source tree's commit at build time ("1a2b3c4d5e6f", "...-dirty" with uncommitted changes,
// "unknown" outside a git checkout).
const char* GitCommit();
// The --version text: "<tool> 0.1.0 (commit ..., Release build; Open MPI 4.1.4, HDF5 1.10.8)".
std::string VersionText(const std::string& tool);

}  // namespace ucp
