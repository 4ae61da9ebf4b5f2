#include "core/buffer_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <new>

namespace ucp {

std::unique_ptr<uint8_t[], FreeDeleter> AllocateBytes(size_t bytes) {
  constexpr size_t kHuge = size_t{2} << 20;
  void* p = nullptr;
  bytes = std::max<size_t>(bytes, 1);
  if (bytes >= kHuge) {
    bytes = (bytes + kHuge - 1) / kHuge * kHuge;
    p = std::aligned_alloc(kHuge, bytes);
    if (p) ::madvise(p, bytes, MADV_HUGEPAGE);  // advice only: 4 KiB pages if the kernel declines
  } else {
    p = std::malloc(bytes);
  }
  if (!p) throw std::bad_alloc();
  return std::unique_ptr<uint8_t[], FreeDeleter>(static_cast<uint8_t*>(p));
}

BufferPool::BufferPool(int64_t cap_bytes) : kept_(std::make_shared<Kept>()) { kept_->cap_bytes = cap_bytes; }

std::shared_ptr<float[]> BufferPool::Get(int64_t numel) {
  numel = std::max<int64_t>(1, numel);
  std::unique_ptr<uint8_t[], FreeDeleter> buffer;
  int64_t capacity = numel;
  {
    std::lock_guard<std::mutex> lock(kept_->mu);
    auto it = kept_->free.lower_bound(numel);
    if (it != kept_->free.end()) {
      capacity = it->first;
      buffer = std::move(it->second);
      kept_->free.erase(it);
      kept_->held_bytes -= 4 * capacity;
    }
  }
  if (!buffer) buffer = AllocateBytes(4 * static_cast<size_t>(numel));
  std::weak_ptr<Kept> home = kept_;
  auto* raw = reinterpret_cast<float*>(buffer.release());
  return std::shared_ptr<float[]>(raw, [home, capacity](float* p) {
    std::unique_ptr<uint8_t[], FreeDeleter> owned(reinterpret_cast<uint8_t*>(p));
    if (auto kept = home.lock()) {
      std::lock_guard<std::mutex> lock(kept->mu);
      kept->held_bytes += 4 * capacity;
      kept->free.emplace(capacity, std::move(owned));
      while (kept->held_bytes > kept->cap_bytes) {  // the largest go first: sizes that come back often are small
        auto largest = std::prev(kept->free.end());
        kept->held_bytes -= 4 * largest->first;
        kept->free.erase(largest);
      }
    }
  });
}

int64_t BufferPool::held_bytes() const {
  std::lock_guard<std::mutex> lock(kept_->mu);
  return kept_->held_bytes;
}

uint8_t* ScratchBytes::Reserve(size_t bytes) {
  if (bytes > capacity_) {
    data_.reset();  // the old pages go before the new ones come
    capacity_ = std::max(bytes, capacity_ + capacity_ / 2);
    data_ = AllocateBytes(capacity_);
  }
  return data_.get();
}

}  // namespace ucp
