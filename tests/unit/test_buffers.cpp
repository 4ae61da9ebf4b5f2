// BufferPool and ScratchBytes: memory comes back instead of being faulted in afresh, within the
// region. Crc32: the fast path agrees with zlib's.
#include <catch2/catch.hpp>
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "core/buffer_pool.h"
#include "pt/zip_archive.h"

using namespace ucp;

TEST_CASE("a released range is handed out again, also for a smaller request", "[buffers]") {
  BufferPool pool(int64_t{64} << 20);
  float* first = nullptr;
  {
    auto a = pool.Get(1 << 20);
    first = a.get();
    std::memset(a.get(), 0x5a, 4 << 20);  // every byte writable
  }
  CHECK(pool.free_bytes() == (int64_t{64} << 20));
  auto b = pool.Get(1000);
  CHECK(b.get() == first);  // first fit: the low end again
  auto c = pool.Get(1000);
  CHECK(c.get() == first + (64 << 10) / 4);  // the next unit of 64 KiB
  CHECK(reinterpret_cast<uintptr_t>(b.get()) % 64 == 0);
}

TEST_CASE("one large released range serves several smaller requests, and ranges merge again", "[buffers]") {
  BufferPool pool(int64_t{8} << 20);
  float* base = nullptr;
  {
    auto big = pool.Get(int64_t{1} << 20);  // 4 MiB
    base = big.get();
  }
  auto a = pool.Get(int64_t{256} << 10);  // 1 MiB each, all inside the 4 MiB released
  auto b = pool.Get(int64_t{256} << 10);
  auto c = pool.Get(int64_t{256} << 10);
  CHECK(a.get() == base);
  CHECK(b.get() == base + (int64_t{256} << 10));
  CHECK(c.get() == base + (int64_t{512} << 10));
  b.reset();
  a.reset();  // merges with b's range: 2 MiB free at the base
  auto d = pool.Get(int64_t{512} << 10);
  CHECK(d.get() == base);
  c.reset();
  d.reset();
  CHECK(pool.free_bytes() == (int64_t{8} << 20));
  auto whole = pool.Get(int64_t{2} << 20);  // all 8 MiB: everything merged back into one range
  CHECK(whole.get() == base);
  CHECK(pool.outside_bytes() == 0);
}

TEST_CASE("a request the region cannot hold is allocated outside it, and freed", "[buffers]") {
  BufferPool pool(int64_t{2} << 20);
  auto a = pool.Get(int64_t{384} << 10);  // 1.5 MiB of the 2 MiB
  auto b = pool.Get(int64_t{256} << 10);  // 1 MiB: does not fit beside it
  std::memset(b.get(), 1, size_t{1} << 20);
  CHECK(pool.outside_bytes() == (int64_t{1} << 20));
  CHECK(pool.free_bytes() == (int64_t{512} << 10));
  b.reset();  // outside: freed (ASan checks), the region unchanged
  CHECK(pool.free_bytes() == (int64_t{512} << 10));
}

TEST_CASE("a buffer outliving its pool stays valid until released", "[buffers]") {
  std::shared_ptr<float[]> kept;
  {
    BufferPool pool(int64_t{16} << 20);
    kept = pool.Get(4096);
  }
  kept[4095] = 1.0f;  // the region lives while a buffer of it does
  CHECK(kept[4095] == 1.0f);
  kept.reset();
}

TEST_CASE("buffers taken and released from many threads leave the region whole", "[buffers]") {
  BufferPool pool(int64_t{32} << 20);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&pool, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      for (int k = 0; k < 500; ++k) {
        auto a = pool.Get(1 + static_cast<int64_t>(rng() % (1 << 19)));
        a[0] = static_cast<float>(k);
        auto b = pool.Get(1 + static_cast<int64_t>(rng() % 4096));
        b[0] = a[0];
      }
    });
  for (auto& th : threads) th.join();
  CHECK(pool.free_bytes() == (int64_t{32} << 20));
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
