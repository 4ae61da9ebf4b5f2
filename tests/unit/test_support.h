// Shared helpers of the unit tests: where the ctest-generated inputs live.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace ucp::test {

// The work folder ctest's generator steps write into (UCP_TEST_WORK), or a temporary folder.
inline std::filesystem::path WorkDir() {
  const char* env = std::getenv("UCP_TEST_WORK");
  std::filesystem::path dir = env ? env : std::filesystem::temp_directory_path() / "ucp-test-work";
  std::filesystem::create_directories(dir);
  return dir;
}

inline std::string ReadText(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace ucp::test
