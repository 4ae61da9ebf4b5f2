#include "formats/megatron/legacy_folder.h"

#include <algorithm>
#include <filesystem>
#include <regex>

#include "core/atomic_file.h"
#include "core/error.h"
#include "source/megatron_tracker.h"

namespace ucp::formats::megatron {

namespace fs = std::filesystem;

namespace {

const std::regex kRankName(R"(^mp_rank_(\d{2,6})(?:_(\d{3,6}))?(?:_(\d{3,6}))?$)");

std::vector<RankFolder> RankFolders(const fs::path& iter) {
  std::vector<RankFolder> out;
  std::error_code ec;
  for (const auto& child : fs::directory_iterator(iter, ec)) {
    const std::string name = child.path().filename().string();
    std::smatch m;
    if (!std::regex_match(name, m, kRankName) || !fs::exists(child.path() / "model_optim_rng.pt", ec)) continue;
    RankFolder r;
    r.name = name;
    for (size_t k = 1; k < m.size(); ++k)
      if (m[k].matched) r.numbers.push_back(std::stoi(m[k]));
    r.distrib_optim = fs::exists(child.path() / "distrib_optim.pt", ec);
    out.push_back(r);
  }
  std::sort(out.begin(), out.end(), [](const RankFolder& a, const RankFolder& b) { return a.name < b.name; });
  return out;
}

// The iteration folder the root's latest_checkpointed_iteration.txt names, or "" without that file.
std::string Tracked(const fs::path& root, bool throw_if_bad) {
  const source::MegatronTracker tracker = source::ReadMegatronTracker(root.string());
  if (tracker.present && tracker.folder.empty() && throw_if_bad)
    throw Error((root / source::kMegatronTracker).string() + " holds '" + tracker.text.substr(0, 40) + "', not an iteration");
  return tracker.folder;
}

}  // namespace

bool LooksLikeLegacy(const std::string& dir) {
  const fs::path d(dir);
  if (!RankFolders(d).empty()) return true;
  const std::string tracked = Tracked(d, false);
  return !tracked.empty() && !RankFolders(d / tracked).empty();
}

LegacyFolder FindLegacy(const std::string& dir) {
  LegacyFolder F;
  F.root = dir;
  const fs::path d(dir);
  fs::path iter = d;
  if (RankFolders(d).empty()) {
    const std::string tracked = Tracked(d, true);
    if (tracked.empty()) throw Error(dir + ": no mp_rank_*/model_optim_rng.pt and no latest_checkpointed_iteration.txt: not a Megatron-LM legacy checkpoint");
    iter = d / tracked;
    std::error_code ec;
    if (!fs::is_directory(iter, ec))
      throw Error(dir + "/latest_checkpointed_iteration.txt names " + tracked + ", but " + iter.string() + " is not there");
  }
  F.iter_dir = iter.string();
  F.tag = iter.filename().string();
  static const std::regex iter_name(R"(^iter_(\d{7,9})$)");
  std::smatch m;
  if (std::regex_match(F.tag, m, iter_name)) F.iteration = std::stoll(m[1]);
  F.ranks = RankFolders(iter);
  if (F.ranks.empty()) throw Error(F.iter_dir + ": no mp_rank_*/model_optim_rng.pt: the iteration's rank files are missing");
  return F;
}

}  // namespace ucp::formats::megatron
