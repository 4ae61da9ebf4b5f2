// Where a whole-tensor reader takes its values from an atomic checkpoint: the rows (and columns) of
// an atom's state, a stacked atom's layer or expert, read from its store (each atom checked on first
// use, as the store checks it). Thread-safe as the store's reader is.
#pragma once

#include "layout/export_plan.h"
#include "layout/reshard_plan.h"

namespace ucp::reshard {

class StoreRows final : public RowSource {
 public:
  explicit StoreRows(const Source& S) : S_(S) {}
  void Read(int atom, int64_t layer, int64_t expert, int state, int64_t a, int64_t b, int64_t c0, int64_t c1, float* dst) override;

 private:
  const Source& S_;
};

// Target tensor `t` whole, in its own shape and row order (rotary halves, a transposed tensor's
// layout), from `rows` into dst (t.numel() values).
void ReadWholeTensor(RowSource& rows, const ExportTensor& t, float* dst);

}  // namespace ucp::reshard
