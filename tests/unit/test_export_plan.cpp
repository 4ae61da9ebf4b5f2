// The export plan's row maps (layout/export_plan.h) against tensors built whole and cut by hand:
// Megatron's head-by-head fused QKV read back as [q; k; v] (rows in parts), and a Conv1D weight,
// the transpose of the rows taken.
#include <catch2/catch.hpp>

#include <vector>

#include "layout/export_plan.h"

using ucp::reshard::ExportTensor;

namespace {

// The atomic rows a tensor's rows [0, n) are, in order.
std::vector<int64_t> RowsOf(const ExportTensor& t, int64_t n) {
  std::vector<int64_t> rows;
  ucp::reshard::ForEachAtomRun(t, 0, n, [&](int64_t first, int64_t count) {
    for (int64_t r = first; r < first + count; ++r) rows.push_back(r);
  });
  return rows;
}

}  // namespace

TEST_CASE("rows in parts: head-by-head [q_i; k_i; v_i] rows read as q, then k, then v", "[export_plan]") {
  const int64_t heads = 3, hd = 2, h = heads * hd;
  ExportTensor t{"c_attn", 0, "qkv", 0, 3 * h, {3 * h}};
  t.part_rows = h, t.part_step = hd, t.block = hd, t.stride = 3 * hd;
  std::vector<int64_t> want;  // atomic row of head i, part p (q, k, v), element d: i * 3hd + p * hd + d
  for (int64_t p = 0; p < 3; ++p)
    for (int64_t i = 0; i < heads; ++i)
      for (int64_t d = 0; d < hd; ++d) want.push_back(i * 3 * hd + p * hd + d);
  CHECK(RowsOf(t, 3 * h) == want);
  std::vector<int64_t> tail;  // a run starting mid-part
  ucp::reshard::ForEachAtomRun(t, h - 1, h + 3, [&](int64_t first, int64_t count) {
    for (int64_t r = first; r < first + count; ++r) tail.push_back(r);
  });
  CHECK(tail == std::vector<int64_t>(want.begin() + h - 1, want.begin() + h + 3));
}

TEST_CASE("transposed: the rows taken become the target's columns", "[export_plan]") {
  ExportTensor t{"c_fc", 0, "dense_h_to_4h", 0, 3, {2, 3}};  // atomic [3 rows, 2 columns] -> target [2, 3]
  t.transposed = true;
  CHECK(t.source_rows() == 3);
  CHECK(t.rows() == 2);
  const std::vector<float> in = {1, 2, 3, 4, 5, 6};  // rows (1, 2), (3, 4), (5, 6)
  std::vector<float> out(6);
  ucp::reshard::ToTargetRowOrder(t, in.data(), out.data(), 3, 2);
  CHECK(out == std::vector<float>{1, 3, 5, 2, 4, 6});
}
