// Megatron-LM's checkpoint root: latest_checkpointed_iteration.txt names the iteration folder its
// --load reads (iter_NNNNNNN, or release). One reading of it for every reader of Megatron-LM's roots.
#pragma once

#include <string>

namespace ucp::source {

inline constexpr const char* kMegatronTracker = "latest_checkpointed_iteration.txt";

// The iteration folder's name Megatron-LM gives the tracker's text ("3" -> "iter_0000003", "release"),
// or "" when the text (trimmed) is neither.
std::string IterationFolderName(const std::string& text);

// The tracker of `root`: whether there is one, its text trimmed, and the folder it names ("" where the
// text names none).
struct MegatronTracker {
  bool present = false;
  std::string text, folder;
};
MegatronTracker ReadMegatronTracker(const std::string& root);

}  // namespace ucp::source
