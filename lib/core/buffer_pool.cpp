#include "core/buffer_pool.h"

#include <algorithm>

namespace ucp {

BufferPool::BufferPool(int64_t cap_bytes) : kept_(std::make_shared<Kept>()) { kept_->cap_bytes = cap_bytes; }

std::shared_ptr<float[]> BufferPool::Get(int64_t numel) {
  numel = std::max<int64_t>(1, numel);
  std::unique_ptr<float[]> buffer;
  int64_t capacity = numel;
  {
    std::lock_guard<std::mutex> lock(kept_->mu);
    auto it = kept_->free.lower_bound(numel);
    if (it != kept_->free.end() && it->first <= 2 * numel) {
      capacity = it->first;
      buffer = std::move(it->second);
      kept_->free.erase(it);
      kept_->held_bytes -= 4 * capacity;
    }
  }
  if (!buffer) buffer = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(numel));
  std::weak_ptr<Kept> home = kept_;
  float* raw = buffer.release();
  return std::shared_ptr<float[]>(raw, [home, capacity](float* p) {
    std::unique_ptr<float[]> owned(p);
    if (auto kept = home.lock()) {
      std::lock_guard<std::mutex> lock(kept->mu);
      if (kept->held_bytes + 4 * capacity <= kept->cap_bytes) {
        kept->held_bytes += 4 * capacity;
        kept->free.emplace(capacity, std::move(owned));
      }
    }
  });
}

}  // namespace ucp
