#include "core/commit.h"

#include <filesystem>
#include <utility>

#include "core/atomic_file.h"
#include "core/error.h"

namespace ucp {
namespace fs = std::filesystem;

namespace {
// The folder to lock, refused first when it is a file (the lock would create it).
const std::string& FolderToLock(const std::string& dir) {
  if (fs::exists(dir) && !fs::is_directory(dir)) throw Error(dir + ": exists and is not a folder");
  return dir;
}
}  // namespace

OutputFolder::OutputFolder(std::string dir, const std::string& tool, std::vector<std::string> markers, std::string* note)
    : dir_(std::move(dir)), markers_(std::move(markers)), lock_(FolderToLock(dir_), tool, note) {}

bool OutputFolder::Empty() const { return OutputLock::HoldsOnlyLock(dir_); }

void OutputFolder::RequireEmpty(bool force, const std::vector<std::string>& contents, const std::string& hint) {
  if (Empty()) return;
  if (!force) throw Error(dir_ + ": exists and is not empty; " + hint);
  Clear(contents);
}

void OutputFolder::Clear(const std::vector<std::string>& contents) {
  for (auto m = markers_.rbegin(); m != markers_.rend(); ++m) fs::remove(dir_ + "/" + *m);
  for (const auto& c : contents) fs::remove_all(dir_ + "/" + c);
  RemoveTemporaries(dir_);  // of killed runs, the lock's private names too
}

void OutputFolder::Mark(const std::vector<std::optional<std::string>>& texts) {
  if (texts.size() != markers_.size()) throw Error("internal: " + dir_ + ": " + std::to_string(texts.size()) +
                                                   " marker texts for " + std::to_string(markers_.size()) + " markers");
  for (size_t i = 0; i < markers_.size(); ++i)
    if (texts[i]) WriteFileAtomically(dir_ + "/" + markers_[i], *texts[i]);
}

void Seal(const std::string& dir) { SyncFileSystemOf(dir); }

bool HoldsOnlyLeftovers(const std::string& dir) {
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!it->is_directory() && !IsTemporaryName(name) && name.rfind(OutputLock::kFileName, 0) != 0) return false;
  }
  return !ec;
}

}  // namespace ucp
