// What the three tools share on their command line: one exit status for every command-line error
// (2, as --help and the README say; CLI11 itself exits 105, 106, 109, ... by error kind) and
// validators whose refusals are words ("must be at least 1"), not CLI11's numeric range dumps.
#pragma once

#include <CLI/CLI.hpp>

#include <optional>
#include <string>

#include "core/build_info.h"
#include "patterns/rules.h"

namespace ucp::apps {

inline constexpr int kCommandLineError = 2;

// Parses argv. Returns an exit status when the tool should stop now: 0 after --help, 2 after a
// bad command line (CLI11's message printed, prefixed with the tool's name); nothing to go on.
inline std::optional<int> ParseCommandLine(CLI::App& app, int argc, char** argv, const char* tool) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << tool << ": error: " << e.what() << "\n"
              << "Run with --help for more information.\n";
    return kCommandLineError;
  }
  return std::nullopt;
}

// --version: which build this is (core/build_info.h) and where its data is (the pattern files it reads).
inline void AddVersionFlag(CLI::App& app, const char* tool) {
  app.set_version_flag("--version", VersionText(tool) + "\npatterns " + patterns::DefaultPatternsDir(),
                       "print the version, the commit and build it came from, its MPI and HDF5, and where its pattern files are; then exit");
}

// An integer of at least `least`, refused in words.
inline CLI::Validator AtLeast(long long least) {
  return CLI::Validator(
      [least](std::string& v) -> std::string {
        long long x = 0;
        try {
          size_t used = 0;
          x = std::stoll(v, &used);
          if (used != v.size()) return "'" + v + "' is not a whole number";
        } catch (const std::exception&) {
          return "'" + v + "' is not a whole number";
        }
        return x < least ? "must be at least " + std::to_string(least) + ", not " + v : std::string();
      },
      "INT>=" + std::to_string(least));
}

}  // namespace ucp::apps
