// A copy's elements as hyperslabs of the joined tensor (ForEachJoinedSlab): what ucp-reshard reads
// from the HDF5 store, one read per slab.
#include <algorithm>

#include "plan/convert_plan.h"

namespace ucp::plan {

namespace {

int64_t Product(const std::vector<int64_t>& v, size_t from) {
  int64_t p = 1;
  for (size_t k = from; k < v.size(); ++k) p *= v[k];
  return p;
}

// Row-major elements [a, b) of the sub-tensor at dimensions [dim, ...) (the leading ones fixed in
// `start`), whose first element has flat index `origin`, as hyperslabs: a partial row, whole rows,
// a partial row.
void LocalSlabs(const std::vector<int64_t>& shape, size_t dim, std::vector<int64_t>& start, std::vector<int64_t>& count,
                int64_t a, int64_t b, int64_t origin, const SlabFn& emit) {
  if (a >= b) return;
  if (dim == shape.size()) return emit(start, count, origin + a);  // one element
  const int64_t inner = Product(shape, dim + 1);
  auto partial_row = [&](int64_t row, int64_t lo, int64_t hi) {
    start[dim] = row, count[dim] = 1;
    LocalSlabs(shape, dim + 1, start, count, lo - row * inner, hi - row * inner, origin + row * inner, emit);
  };
  if (a % inner != 0 || b - a < inner) {
    const int64_t row = a / inner, stop = std::min(b, (row + 1) * inner);
    partial_row(row, a, stop);
    a = stop;
  }
  if (const int64_t rows = (b - a) / inner; rows > 0) {
    start[dim] = a / inner, count[dim] = rows;
    for (size_t k = dim + 1; k < shape.size(); ++k) start[k] = 0, count[k] = shape[k];
    emit(start, count, origin + a);
    a += rows * inner;
  }
  if (a < b) partial_row(a / inner, a, b);
}

// A copy-local slab in joined coordinates: split where it crosses blocks of the split dimension,
// and, when a dimension before the split one ranges too, row by row along that dimension first
// (so that every slab stays a run of consecutive copy-local elements).
void MapSlab(const Copy& c, std::vector<int64_t> start, std::vector<int64_t> count, int64_t local, const SlabFn& fn) {
  const size_t d = static_cast<size_t>(c.split_dim);
  const int64_t s = start[d], n = count[d];
  const Block* within = nullptr;
  for (const auto& blk : c.blocks)
    if (s >= blk.local_start && s + n <= blk.local_start + blk.length) within = &blk;
  if (within) {
    start[d] = within->joined_start + (s - within->local_start);
    return fn(start, count, local);
  }
  for (size_t k = 0; k < d; ++k)
    if (count[k] > 1) {
      const int64_t step = Product(count, k + 1), first = start[k], rows = count[k];
      count[k] = 1;
      for (int64_t i = 0; i < rows; ++i) {
        start[k] = first + i;
        MapSlab(c, start, count, local + i * step, fn);
      }
      return;
    }
  const int64_t step = Product(count, d + 1);
  for (const auto& blk : c.blocks) {
    const int64_t lo = std::max(s, blk.local_start), hi = std::min(s + n, blk.local_start + blk.length);
    if (lo >= hi) continue;
    std::vector<int64_t> st = start, ct = count;
    st[d] = blk.joined_start + (lo - blk.local_start), ct[d] = hi - lo;
    fn(st, ct, local + (lo - s) * step);
  }
}

}  // namespace

void ForEachJoinedSlab(const Copy& copy, int64_t begin, int64_t end, const SlabFn& fn) {
  std::vector<int64_t> start(copy.shape.size(), 0), count(copy.shape.size(), 1);
  if (copy.split_dim < 0) return LocalSlabs(copy.shape, 0, start, count, begin, end, 0, fn);
  LocalSlabs(copy.shape, 0, start, count, begin, end, 0,
             [&](const std::vector<int64_t>& st, const std::vector<int64_t>& ct, int64_t local) { MapSlab(copy, st, ct, local, fn); });
}

}  // namespace ucp::plan
