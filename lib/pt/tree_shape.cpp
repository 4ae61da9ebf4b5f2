#include "pt/tree_shape.h"

#include <algorithm>
#include <unordered_map>
#include <vector>

namespace ucp::pt {

TreeShape MeasureTree(const ValuePtr& root, size_t limit) {
  if (!root) return {};
  std::unordered_map<const Value*, size_t> height;  // 0: on the current path; else done, its height
  struct Frame {
    const Value* v;
    std::vector<const Value*> next;
    size_t at = 0, below = 0;  // next child; the tallest child so far
  };
  std::vector<Frame> path;
  auto enter = [&](const Value* v) {
    Frame f{v, {}};
    v->ForEachChild([&](const ValuePtr& c) { if (c) f.next.push_back(c.get()); });
    height[v] = 0;
    path.push_back(std::move(f));
  };
  enter(root.get());
  while (!path.empty()) {
    if (path.size() > limit) return {path.size(), false, {}};
    Frame& f = path.back();
    if (f.at == f.next.size()) {
      size_t h = f.below + 1;
      height[f.v] = h;
      path.pop_back();
      if (path.empty()) {
        TreeShape whole{h, false, {}};
        for (const auto& [v, _] : height) whole.values.insert(v);
        return whole;
      }
      path.back().below = std::max(path.back().below, h);
      continue;
    }
    const Value* c = f.next[f.at++];
    auto it = height.find(c);
    if (it == height.end()) {
      enter(c);
    } else if (it->second == 0) {
      return {path.size(), true, {}};
    } else {
      f.below = std::max(f.below, it->second);
      if (path.size() + it->second > limit) return {path.size() + it->second, false, {}};
    }
  }
  return {};
}

}  // namespace ucp::pt
