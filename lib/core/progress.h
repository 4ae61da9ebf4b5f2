// A live progress line on a terminal: "\r<tool>: 1.2 GiB / 4.0 GiB  800 MiB/s  ETA 4s", redrawn at
// most four times a second, ended by a newline on the final update; silent when off (not a
// terminal, --quiet, a rank other than 0).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace ucp {

class ProgressLine {
 public:
  ProgressLine(std::string tool, bool on, int64_t total);
  void Update(int64_t done, bool final = false);

 private:
  using Clock = std::chrono::steady_clock;
  std::string tool_;
  bool on_;
  int64_t total_;
  Clock::time_point start_, last_;
};

}  // namespace ucp
