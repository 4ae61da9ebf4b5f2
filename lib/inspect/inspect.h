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
  bool verify = false;                     // check every storage's CRC32
  bool json = false;
};

// Exit codes: 0 clean (or problems without --strict), 1 problems under --strict, 2 unreadable input.
int RunInspect(const std::string& dir, const InspectOptions& options, std::ostream& out, std::ostream& err);

// The report RunInspect prints with --json.
nlohmann::json InspectReport(const std::string& dir, const InspectOptions& options);

// --list-patterns: the pattern vocabulary and the family files available.
int ListPatterns(const std::string& patterns_dir, bool json, std::ostream& out, std::ostream& err);

}  // namespace ucp::inspect
