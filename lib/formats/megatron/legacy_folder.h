// Megatron-LM's legacy checkpoint folders (`--ckpt-format torch`): a root whose
// latest_checkpointed_iteration.txt names the iteration Megatron-LM loads, its `iter_NNNNNNN` (or
// `release`) folder, and in it one `mp_rank_TT[_PPP][_EEE]` folder per tensor / pipeline (/ expert)
// rank holding `model_optim_rng.pt`, and `distrib_optim.pt` beside it under the distributed optimizer.
// Names only here; the files are read by legacy_index.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ucp::formats::megatron {

// One rank folder: its name and the numbers in it (TT, then PPP and / or EEE: which is which depends
// on the job's PP and EP, read from the args).
struct RankFolder {
  std::string name;             // "mp_rank_01_000"
  std::vector<int> numbers;     // {1, 0}
  bool distrib_optim = false;   // distrib_optim.pt beside model_optim_rng.pt
};

struct LegacyFolder {
  std::string root;        // the folder the user named
  std::string iter_dir;    // the iteration's folder
  std::string tag;         // "iter_0000003" or "release"
  int64_t iteration = -1;  // from the folder's name; -1 for "release"
  std::vector<RankFolder> ranks;  // sorted by name
};

// Whether `dir` is a legacy root or iteration folder (names only: an mp_rank_* folder holding
// model_optim_rng.pt, directly or in the iteration latest_checkpointed_iteration.txt names).
bool LooksLikeLegacy(const std::string& dir);

// The folder's iteration and rank folders. Throws ucp::Error naming the file for a
// latest_checkpointed_iteration.txt that names no iteration or a missing folder, and for a folder
// without rank folders.
LegacyFolder FindLegacy(const std::string& dir);

}  // namespace ucp::formats::megatron
