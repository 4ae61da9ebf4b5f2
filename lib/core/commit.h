// The one commit protocol of every folder a ucp tool writes (an atomic checkpoint, a resharded
// checkpoint), in four steps:
//   1. claim  rank 0 locks the folder (OutputLock) and finds it empty, or clears it (--force): the
//             markers go first, the commit point first of all, so that the folder stops looking
//             complete before anything it named is removed; then the tool's contents; then the
//             temporaries of killed runs;
//   2. write  every rank writes its files, each under a temporary name renamed into place without
//             an fsync of its own (Durability::Batch);
//   3. seal   every rank, after its last file: one sync of the file system (Seal);
//   4. mark   rank 0, once every rank has sealed: the markers, in order, each written atomically;
//             the last one is the commit point.
// A run killed anywhere leaves no marker that names an incomplete folder (a marker of the run
// before it was removed in step 1), and the next run that claims the folder removes what it left.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/output_lock.h"

namespace ucp {

class OutputFolder {
 public:
  // Step 1's lock: refuses a path that is a file, creates the folder, takes its lock (throws
  // ucp::Error naming the holder). `markers` are file names relative to the folder, in the order
  // step 4 writes them, the commit point last.
  OutputFolder(std::string dir, const std::string& tool, std::vector<std::string> markers, std::string* note = nullptr);

  const std::string& dir() const { return dir_; }
  // Whether the folder holds nothing but the lock.
  bool Empty() const;
  // Step 1 for a folder a run writes from nothing: an empty folder is taken as it is; one holding
  // something is refused ("<dir>: exists and is not empty; <hint>") unless `force`, then cleared.
  void RequireEmpty(bool force, const std::vector<std::string>& contents, const std::string& hint = "use --force to overwrite it");
  // Removes the markers (the commit point first), then `contents` (paths relative to the folder,
  // files or folders), then every temporary under the folder.
  void Clear(const std::vector<std::string>& contents);
  // Step 4: the markers in order, the i-th with texts[i]; a marker whose text is nullopt is not
  // written (a file the tool keeps only where it was before). Rank 0, after every rank's Seal.
  void Mark(const std::vector<std::optional<std::string>>& texts);

 private:
  std::string dir_;
  std::vector<std::string> markers_;
  OutputLock lock_;
};

// Whether `dir` holds nothing a run completed: folders, temporaries and the lock, what a tool's run
// killed before its first marker or claim leaves. Such a folder is the tool's to take over.
bool HoldsOnlyLeftovers(const std::string& dir);

// Step 3: one sync of the file system holding `dir` (every file written there so far, renames
// included, durable when it returns). Throws ucp::Error naming the folder.
void Seal(const std::string& dir);

}  // namespace ucp
