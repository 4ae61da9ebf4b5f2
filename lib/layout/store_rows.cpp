#include "layout/store_rows.h"

#include <vector>

namespace ucp::reshard {

void StoreRows::Read(int atom, int64_t layer, int64_t expert, int state, int64_t a, int64_t b, int64_t c0, int64_t c1, float* dst) {
  const Atom& at = S_.atoms.at(atom);
  std::vector<int64_t> start(at.shape.size(), 0), count = at.shape;
  const size_t d = layer < 0 ? 0 : expert < 0 ? 1 : 2;  // the rows' dimension
  if (layer >= 0) start.at(0) = layer, count.at(0) = 1;
  if (layer >= 0 && expert >= 0) start.at(1) = expert, count.at(1) = 1;
  if (count.size() > d) start[d] = a, count[d] = b - a;
  if (c1 >= 0 && count.size() > d + 1) start[d + 1] = c0, count[d + 1] = c1 - c0;
  S_.reader->ReadSlab(at.name, static_cast<plan::State>(state), start, count, dst);
}

void ReadWholeTensor(RowSource& rows, const ExportTensor& t, float* dst) {
  const int64_t n = t.source_rows();
  if (n <= 0) return;
  const int64_t per_row = t.numel() / n;
  if (t.rotary_head_dim <= 0 && !t.transposed) {
    rows.ReadRows(t, 0, n, per_row, dst);
    return;
  }
  std::vector<float> selected(static_cast<size_t>(t.numel()));
  rows.ReadRows(t, 0, n, per_row, selected.data());
  ToTargetRowOrder(t, selected.data(), dst, n, per_row);
}

}  // namespace ucp::reshard
