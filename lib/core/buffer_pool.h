// Large buffers that cost little to fill. Fresh pages cost a fault each (and a kernel zeroing)
// when first written, which for the bytes ucp moves costs as much as moving them: buffers from
// here come in 2 MiB huge pages where the kernel allows it (one fault per 2 MiB), and the pool
// hands released buffers out again instead of faulting in new ones.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>

namespace ucp {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
// `bytes` bytes, uninitialised; from 2 MiB up, aligned to 2 MiB and advised into huge pages.
std::unique_ptr<uint8_t[], FreeDeleter> AllocateBytes(size_t bytes);

// Float buffers handed out again once released, so that a run that assembles tensor after tensor
// does not fault in fresh pages for each one. Released buffers are kept up to `cap_bytes`, the
// largest dropped first when they exceed it; Get hands out the smallest kept buffer that is large
// enough, else allocates (AllocateBytes).
class BufferPool {
 public:
  explicit BufferPool(int64_t cap_bytes);
  // At least `numel` floats, contents undefined. The buffer returns to the pool when the last
  // shared_ptr to it goes, from any thread, also after the pool itself is gone.
  std::shared_ptr<float[]> Get(int64_t numel);
  int64_t held_bytes() const;  // kept now, for reuse

 private:
  struct Kept {
    std::mutex mu;
    std::multimap<int64_t, std::unique_ptr<uint8_t[], FreeDeleter>> free;  // by capacity, in floats
    int64_t held_bytes = 0, cap_bytes = 0;
  };
  std::shared_ptr<Kept> kept_;
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
