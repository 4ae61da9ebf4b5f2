// Whether a process named in a file (an output lock, a temporary's name) still runs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ucp {

std::string HostName();  // gethostname, "unknown" when it fails

// The start time of process `pid` in clock ticks since boot (field 22 of /proc/PID/stat), or ""
// when there is no such process (or no /proc). Tells a pid's process from a later one given it.
std::string StartTicks(long pid);

// Whether process `pid` of this host is known to be gone: no such process, a zombie (it holds
// nothing any more; in a container nothing may ever reap it), or, when `start_ticks` is given, a
// process started at another time (the pid was reused).
bool ProcessGone(long pid, const std::string& start_ticks = "");

// This process's peak resident set so far, in bytes (getrusage's ru_maxrss): each tool's --report.
int64_t PeakRssBytes();

}  // namespace ucp
