// Large buffers that cost little to fill. Fresh pages cost a fault each (and a kernel zeroing)
// when first written, which for the bytes ucp moves costs as much as moving them: buffers from
// here come in 2 MiB huge pages where the kernel allows it (one fault per 2 MiB), and the pool
// hands released buffers out again instead of faulting in new ones.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>

namespace ucp {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
// `bytes` bytes, uninitialised; from 2 MiB up, aligned to 2 MiB and advised into huge pages.
std::unique_ptr<uint8_t[], FreeDeleter> AllocateBytes(size_t bytes);

// Float buffers carved from one region of memory that stays mapped while the pool (or any of its
// buffers) lives. A released range is handed out again, whole or in part, so a run that assembles
// tensor after tensor of differing sizes faults in (and has the kernel zero) only the pages of its
// largest working set, once, rather than every tensor's. Requests are served first-fit from the
// region's low end, which keeps the touched part compact; one the region cannot hold at the moment
// is allocated on its own (AllocateBytes) and freed when released. The region is only address
// space until touched: its size is a ceiling, not a reservation of memory.
class BufferPool {
 public:
  explicit BufferPool(int64_t region_bytes);
  // At least `numel` floats, contents undefined, 64-byte aligned. The range returns to the pool
  // when the last shared_ptr to it goes, from any thread, also after the pool itself is gone.
  std::shared_ptr<float[]> Get(int64_t numel);
  int64_t free_bytes() const;        // of the region, now
  int64_t outside_bytes() const;     // handed out so far from outside the region (it was full)

 private:
  struct Region;
  std::shared_ptr<Region> region_;
};

// A byte buffer used round after round (the shuffle's send and receive buffers): it grows when a
// round needs more and otherwise keeps its pages, and it is never cleared, since every round
// overwrites the bytes it uses.
class ScratchBytes {
 public:
  uint8_t* Reserve(size_t bytes);  // at least `bytes`, contents undefined
  uint8_t* data() { return data_.get(); }

 private:
  std::unique_ptr<uint8_t[], FreeDeleter> data_;
  size_t capacity_ = 0;
};

}  // namespace ucp
