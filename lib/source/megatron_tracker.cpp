#include "source/megatron_tracker.h"

#include "core/atomic_file.h"

namespace ucp::source {

namespace {

std::string Trimmed(std::string s) {
  s.erase(0, s.find_first_not_of(" \t\r\n"));
  s.erase(s.find_last_not_of(" \t\r\n") + 1);
  return s;
}

}  // namespace

std::string IterationFolderName(const std::string& text) {
  const std::string it = Trimmed(text);
  if (it == "release") return it;
  if (it.empty() || it.size() > 9 || it.find_first_not_of("0123456789") != std::string::npos) return "";
  const std::string n = std::to_string(std::stoll(it));
  return "iter_" + std::string(n.size() < 7 ? 7 - n.size() : 0, '0') + n;
}

MegatronTracker ReadMegatronTracker(const std::string& root) {
  MegatronTracker t;
  const auto text = ReadWholeFile(root + "/" + kMegatronTracker);
  if (!text) return t;
  t.present = true, t.text = Trimmed(*text), t.folder = IterationFolderName(*text);
  return t;
}

}  // namespace ucp::source
