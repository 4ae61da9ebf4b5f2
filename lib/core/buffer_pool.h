// Float buffers handed out again once released, so that a run that assembles tensor after tensor
// does not fault in (and have the kernel zero) fresh pages for each one. A released buffer is kept
// while the pool holds at most `cap_bytes` of them; Get hands out the smallest kept buffer that is
// large enough (and not more than twice the size asked for), else allocates, uninitialised.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

namespace ucp {

class BufferPool {
 public:
  explicit BufferPool(int64_t cap_bytes);
  // At least `numel` floats, contents undefined. The buffer returns to the pool when the last
  // shared_ptr to it goes, from any thread, also after the pool itself is gone.
  std::shared_ptr<float[]> Get(int64_t numel);

 private:
  struct Kept {
    std::mutex mu;
    std::multimap<int64_t, std::unique_ptr<float[]>> free;  // by capacity, in floats
    int64_t held_bytes = 0, cap_bytes = 0;
  };
  std::shared_ptr<Kept> kept_;
};

}  // namespace ucp
