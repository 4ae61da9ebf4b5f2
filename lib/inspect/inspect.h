// ucp-inspect: what a checkpoint holds, as a JSON report (schemas/inspect.schema.json) or a table.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ucp::inspect {

struct InspectOptions {
  std::vector<std::string> pattern_files;  // --patterns
  std::string patterns_dir;                // model-family files for auto-detection
  std::string params_regex;                // --params: only parameters whose name matches (search)
  bool strict = true;                      // problems make the exit code non-zero
  bool verify = false;                     // source: every storage's CRC32; atomic: every file's XXH64
  bool json = false;
};

// Exit codes: 0 clean (or problems without --strict), 1 problems under --strict, 2 unreadable input.
int RunInspect(const std::string& dir, const InspectOptions& options, std::ostream& out, std::ostream& err);

// An atomic checkpoint (a folder with ucp_manifest.json): the manifest's contents; with verify,
// every file's size and XXH64 recomputed. Exit codes: 0 clean, 1 mismatches, 2 unreadable.
// RunInspect dispatches here for such folders.
int RunInspectAtomic(const std::string& dir, const InspectOptions& options, std::ostream& out, std::ostream& err);
nlohmann::json AtomicReport(const std::string& dir, const InspectOptions& options);

// The report RunInspect prints with --json.
nlohmann::json InspectReport(const std::string& dir, const InspectOptions& options);

// --list-patterns: the pattern vocabulary and the family files available.
int ListPatterns(const std::string& patterns_dir, bool json, std::ostream& out, std::ostream& err);

}  // namespace ucp::inspect
