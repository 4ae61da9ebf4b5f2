#include "core/buffer_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <map>
#include <mutex>
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

struct BufferPool::Region {
  static constexpr int64_t kUnit = 64 << 10;  // ranges are whole units: few, and page aligned
  uint8_t* base = nullptr;
  int64_t size = 0;
  mutable std::mutex mu;
  std::map<int64_t, int64_t> free;  // offset -> length, disjoint, never adjacent (merged)
  int64_t free_bytes = 0, outside_bytes = 0;

  explicit Region(int64_t bytes) {
    constexpr int64_t kHuge = int64_t{2} << 20;
    size = std::max<int64_t>(kHuge, (bytes + kHuge - 1) / kHuge * kHuge);
    // Mapped with a huge page of slack, then started on a huge-page boundary.
    void* p = ::mmap(nullptr, static_cast<size_t>(size + kHuge), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {  // no address space for it: every request goes outside
      size = 0;
      return;
    }
    mapped = p;
    base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(p) + kHuge - 1) / kHuge * kHuge);
    ::madvise(base, static_cast<size_t>(size), MADV_HUGEPAGE);  // advice only
    free.emplace(0, size);
    free_bytes = size;
  }
  ~Region() {
    if (mapped) ::munmap(mapped, static_cast<size_t>(size + (int64_t{2} << 20)));
  }
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  // The offset of `bytes` (a multiple of kUnit) taken first-fit, or -1.
  int64_t Take(int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu);
    for (auto it = free.begin(); it != free.end(); ++it) {
      if (it->second < bytes) continue;
      const int64_t at = it->first, left = it->second - bytes;
      free.erase(it);
      if (left > 0) free.emplace(at + bytes, left);
      free_bytes -= bytes;
      return at;
    }
    return -1;
  }

  void Give(int64_t at, int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu);
    free_bytes += bytes;
    auto next = free.lower_bound(at);
    if (next != free.end() && at + bytes == next->first) bytes += next->second, next = free.erase(next);
    if (next != free.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == at) {
        prev->second += bytes;
        return;
      }
    }
    free.emplace(at, bytes);
  }

  void* mapped = nullptr;
};

BufferPool::BufferPool(int64_t region_bytes) : region_(std::make_shared<Region>(region_bytes)) {}

std::shared_ptr<float[]> BufferPool::Get(int64_t numel) {
  const int64_t bytes = (4 * std::max<int64_t>(1, numel) + Region::kUnit - 1) / Region::kUnit * Region::kUnit;
  if (const int64_t at = region_->Take(bytes); at >= 0) {
    auto* p = reinterpret_cast<float*>(region_->base + at);
    return std::shared_ptr<float[]>(p, [region = region_, at, bytes](float*) { region->Give(at, bytes); });
  }
  {
    std::lock_guard<std::mutex> lock(region_->mu);
    region_->outside_bytes += bytes;
  }
  auto* raw = reinterpret_cast<float*>(AllocateBytes(static_cast<size_t>(bytes)).release());
  return std::shared_ptr<float[]>(raw, [](float* p) { std::free(p); });
}

int64_t BufferPool::free_bytes() const {
  std::lock_guard<std::mutex> lock(region_->mu);
  return region_->free_bytes;
}

int64_t BufferPool::outside_bytes() const {
  std::lock_guard<std::mutex> lock(region_->mu);
  return region_->outside_bytes;
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
