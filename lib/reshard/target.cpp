#include "reshard/target.h"

#include <limits>

namespace ucp::reshard {

std::string TargetLayout::Describe() const {
  return "dp=" + std::to_string(dp) + " tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) + " ZeRO-" +
         std::to_string(zero_stage) + " " + dtype + (bf16_optimizer() ? " (BF16 optimizer)" : "");
}

std::vector<int> PartitionUniform(int num_items, int num_parts) {
  std::vector<int> parts(num_parts + 1, 0);
  if (num_items <= num_parts) {
    for (int p = 0; p <= num_parts; ++p) parts[p] = std::min(p, num_items);
    return parts;
  }
  const int chunk = num_items / num_parts, residual = num_items - chunk * num_parts;
  for (int p = 0; p <= num_parts; ++p) parts[p] = p * chunk + std::min(p, residual);  // the first parts get one more
  return parts;
}

// The linear partition problem by dynamic programming, as DeepSpeed solves it: minimise the spread
// (largest part minus smallest); on ties the latest split wins (its `>=`), and infinities behave
// as numpy's do.
std::vector<int> PartitionBalanced(const std::vector<double>& weights, int num_parts) {
  const int n = static_cast<int>(weights.size()), m = num_parts;
  if (n <= m) return PartitionUniform(n, m);
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> dp_max(n + 1, std::vector<double>(m + 1, inf)), dp_min = dp_max, dp_cost = dp_max;
  std::vector<std::vector<int>> position(n + 1, std::vector<int>(m + 1, 0));
  std::vector<double> prefix(n + 1, 0.0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + weights[i];
  dp_max[0][0] = 0;
  dp_cost[0][0] = 0;
  for (int i = 1; i <= n; ++i)
    for (int j = 1; j <= std::min(i, m); ++j)
      for (int k = 0; k < i; ++k) {
        double part = prefix[i] - prefix[k];
        double max_sum = std::max(dp_max[k][j - 1], part), min_sum = std::min(dp_min[k][j - 1], part);
        double cost = max_sum - min_sum;  // inf - inf is NaN, and NaN compares false, as in numpy
        if (dp_cost[i][j] >= cost) {
          dp_cost[i][j] = cost;
          dp_max[i][j] = max_sum;
          dp_min[i][j] = min_sum;
          position[i][j] = k;
        }
      }
  std::vector<int> parts = {n};
  for (int j = m; j >= 1; --j) parts.push_back(position[parts.back()][j]);
  return {parts.rbegin(), parts.rend()};
}

}  // namespace ucp::reshard
