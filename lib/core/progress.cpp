#include "core/progress.h"

#include <algorithm>
#include <cstdio>

#include "core/format.h"

namespace ucp {

ProgressLine::ProgressLine(std::string tool, bool on, int64_t total)
    : tool_(std::move(tool)), on_(on), total_(total), start_(Clock::now()), last_(start_) {}

void ProgressLine::Update(int64_t done, bool final) {
  if (!on_) return;
  const auto now = Clock::now();
  if (!final && std::chrono::duration<double>(now - last_).count() < 0.25) return;
  last_ = now;
  const double secs = std::max(1e-6, std::chrono::duration<double>(now - start_).count());
  const double rate = static_cast<double>(done) / secs;
  const double eta = rate > 0 ? static_cast<double>(total_ - done) / rate : 0;
  std::fprintf(stderr, "\r%s: %s / %s  %s/s  ETA %.0fs   ", tool_.c_str(), HumanBytes(double(done)).c_str(),
               HumanBytes(double(total_)).c_str(), HumanBytes(rate).c_str(), eta);
  if (final) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

}  // namespace ucp
