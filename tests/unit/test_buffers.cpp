// BufferPool and ScratchBytes: buffers come back instead of being faulted in afresh, within the
// cap. Crc32: the fast path agrees with zlib's.
#include <catch2/catch.hpp>
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <cstring>
#include <memory>
#include <vector>

#include "core/buffer_pool.h"
#include "pt/zip_archive.h"

using namespace ucp;

TEST_CASE("a released buffer is handed out again, also for a smaller request", "[buffers]") {
  BufferPool pool(int64_t{64} << 20);
  float* first = nullptr;
  {
    auto a = pool.Get(1 << 20);
    first = a.get();
    std::memset(a.get(), 0x5a, 4 << 20);  // every byte writable
  }
  auto b = pool.Get(1000);
  CHECK(b.get() == first);  // the smallest kept buffer that is large enough
  auto c = pool.Get(1000);  // none kept now: a new one
  CHECK(c.get() != first);
}

TEST_CASE("the pool keeps at most its cap, dropping the largest buffers first", "[buffers]") {
  BufferPool pool(int64_t{3} << 20);  // 3 MiB
  float* small = nullptr;
  {
    auto a = pool.Get(int64_t{512} << 10);  // 2 MiB
    auto b = pool.Get(int64_t{128} << 10);  // 512 KiB
    small = b.get();
    auto c = pool.Get(int64_t{256} << 10);  // 1 MiB: 3.5 MiB released in all, over the cap
  }
  CHECK(pool.held_bytes() == (int64_t{3} << 19));  // the 2 MiB buffer went; 1.5 MiB kept
  auto d = pool.Get(int64_t{128} << 10);
  CHECK(d.get() == small);
  CHECK(pool.held_bytes() == (int64_t{1} << 20));
}

TEST_CASE("a buffer outliving its pool is freed, not returned", "[buffers]") {
  std::shared_ptr<float[]> kept;
  {
    BufferPool pool(int64_t{16} << 20);
    kept = pool.Get(4096);
  }
  kept[4095] = 1.0f;
  kept.reset();  // the pool is gone: its deleter must not touch it (ASan checks)
  SUCCEED();
}

TEST_CASE("scratch bytes keep their buffer while it is large enough and grow otherwise", "[buffers]") {
  ScratchBytes s;
  uint8_t* a = s.Reserve(1000);
  std::memset(a, 1, 1000);
  CHECK(s.Reserve(10) == a);
  CHECK(s.Reserve(1000) == a);
  uint8_t* b = s.Reserve(int64_t{5} << 20);
  std::memset(b, 2, size_t{5} << 20);
  CHECK(s.data() == b);
  CHECK(reinterpret_cast<uintptr_t>(b) % (2u << 20) == 0);  // large buffers sit on huge-page boundaries
}

TEST_CASE("the zip CRC-32 equals zlib's for every length, alignment and starting value", "[crc]") {
  std::mt19937_64 rng(7);
  std::vector<uint8_t> data((size_t{3} << 20) + 64);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 1100; ++n) lengths.push_back(n);
  for (size_t n : {size_t{4095}, size_t{4096}, size_t{65537}, size_t{1} << 20, (size_t{3} << 20) + 7}) lengths.push_back(n);
  for (size_t n : lengths)
    for (size_t align : {size_t{0}, size_t{1}, size_t{7}, size_t{16}, size_t{33}}) {
      if (align + n > data.size()) continue;
      const uint32_t start = n % 3 == 0 ? 0u : static_cast<uint32_t>(rng());
      const uint8_t* p = data.data() + align;
      const uint32_t want = static_cast<uint32_t>(::crc32(start, p, static_cast<uInt>(n)));
      INFO("length " << n << ", offset " << align << ", start " << start);
      REQUIRE(pt::Crc32(start, {p, n}) == want);
    }
  // Chained over pieces, as the zip writer streams an entry.
  uint32_t chained = 0;
  for (size_t at = 0; at < data.size(); at += 100003) chained = pt::Crc32(chained, {data.data() + at, std::min<size_t>(100003, data.size() - at)});
  CHECK(chained == static_cast<uint32_t>(::crc32(0, data.data(), static_cast<uInt>(data.size()))));
}
