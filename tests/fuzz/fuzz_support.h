// What every libFuzzer harness shares (scripts/fuzz.sh builds and runs them): the input as a file
// (the readers take paths, as the tools do), and the one rule they check besides the sanitizers'.
// A reader may refuse an input only with ucp::Error; any other exception escaping it (a
// std::bad_alloc from a size it believed, a json type error it did not wrap) is a finding, as is a
// crash, a leak or undefined behaviour.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"

namespace ucp::fuzz {

// A folder of this process's own under $TMPDIR (or /tmp), made once.
inline const std::string& WorkDir() {
  static const std::string dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string d = std::string(tmp && *tmp ? tmp : "/tmp") + "/ucp-fuzz-" + std::to_string(::getpid());
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

// Writes the input to WorkDir()/name and returns the path.
inline std::string AsFile(const uint8_t* data, size_t size, const std::string& name) {
  const std::string path = WorkDir() + "/" + name;
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data),
                                                                 static_cast<std::streamsize>(size));
  return path;
}

// Runs fn; ucp::Error is a refusal (fine), anything else aborts with what escaped.
template <typename Fn>
int Run(Fn&& fn) {
  try {
    fn();
  } catch (const ucp::Error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz: an exception other than ucp::Error escaped: %s\n", e.what());
    std::abort();
  }
  return 0;
}

}  // namespace ucp::fuzz
