// The shape of a Value tree the unpickler built: its longest chain of values and whether a value
// holds itself, which torch.save never writes and a walk over the tree would loop on.
#pragma once

#include <cstddef>
#include <unordered_set>

#include "pt/value.h"

namespace ucp::pt {

struct TreeShape {
  size_t depth = 0;
  bool cycle = false;
  std::unordered_set<const Value*> values;  // every value in the tree, when measured whole
};

// The longest chain of values from `root` down (1 for a leaf; shared values walked once), and
// whether a value holds itself, directly or further down (a list appended to itself through the
// memo, an object whose state is itself). One iterative depth-first search; it stops at a cycle or
// once a chain is longer than `limit`, else it lists every value of the tree.
TreeShape MeasureTree(const ValuePtr& root, size_t limit);

}  // namespace ucp::pt
