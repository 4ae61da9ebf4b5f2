// A run's claim on the folder it writes: OUT/.ucp-lock, created exclusively (O_EXCL), naming the
// tool, host, pid and the process's start time. A second run into a folder that a live run holds
// is refused with the holder named. A lock whose holder is gone (same host, and no process with that
// pid, or one started at another time: the pid was reused) is stale and taken over, so a run
// killed with SIGKILL never blocks its rerun. The lock goes when its owner ends, by any path that
// unwinds (a killed run leaves it, stale).
#pragma once

#include <string>

namespace ucp {

class OutputLock {
 public:
  static constexpr const char* kFileName = ".ucp-lock";

  // Creates `dir` if needed and takes its lock. Throws ucp::Error naming the folder and the holder.
  // `note`, when given, receives a sentence when a stale lock was taken over ("" otherwise).
  OutputLock(const std::string& dir, const std::string& tool, std::string* note = nullptr);
  ~OutputLock();
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;

  // A lock in `dir` whose holder is gone, taken over and released: a run killed after its commit
  // point (its folder complete) leaves its lock behind, which a run that reads the folder as it
  // is removes, so that the folder holds only what its manifest lists. Returns the takeover's
  // note, "" when there was no stale lock. Throws as the constructor does when a live run holds it.
  static std::string RemoveStale(const std::string& dir, const std::string& tool);

  // Whether `dir` holds nothing but (perhaps) a lock and the private names a run killed while
  // taking one can leave (.ucp-lock.*): an output folder that is empty for a run.
  static bool HoldsOnlyLock(const std::string& dir);

 private:
  std::string path_, content_;
};

// Refuses (ucp::Error naming both) an output folder that is `input` or lies inside it, symbolic
// links resolved: a run would write into what it reads, and --force would delete it. `what` names
// the input, e.g. "the source checkpoint folder".
void RefuseOutputWithin(const std::string& output, const std::string& input, const std::string& what, const std::string& fix = "");

}  // namespace ucp
