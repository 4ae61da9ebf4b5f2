// The pieces of convert and reshard that need no checkpoint: checksums, the byte-balanced
// assignment, the mapping of copy-local runs into the joined tensor, the in-process communicator,
// the fp32 to fp16 / bf16 rounding of the layer files.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/xxhash64.h"
#include "plan/convert_plan.h"
#include "pt/low_precision.h"
#include "pt/torch_file.h"
#include "shuffle/comm.h"
#include "test_support.h"

using namespace ucp;

TEST_CASE("XXH64 matches the reference implementation (python3-xxhash vectors)", "[plan]") {
  CHECK(HexDigest(XxHash64::Of("", 0)) == "ef46db3751d8e999");
  CHECK(HexDigest(XxHash64::Of("a", 1)) == "d24ec4f1a98c6e5b");
  CHECK(HexDigest(XxHash64::Of("abc", 3)) == "44bc2cf5ad770999");
  CHECK(HexDigest(XxHash64::Of("abc", 3, 7)) == "9e755206156676d7");
  std::string data;
  for (int k = 0; k < 4; ++k)
    for (int b = 0; b < 256; ++b) data += static_cast<char>(b);
  data += "xyz";
  CHECK(HexDigest(XxHash64::Of(data.data(), data.size())) == "e146cb31b65bc21a");
  // Streaming in uneven pieces gives the same digest as one call.
  for (size_t step : {1, 3, 31, 32, 33, 100}) {
    XxHash64 h;
    for (size_t at = 0; at < data.size(); at += step) h.Update(data.data() + at, std::min(step, data.size() - at));
    CHECK(HexDigest(h.Digest()) == "e146cb31b65bc21a");
  }
}

TEST_CASE("reducers of a BLOOM-176B-shaped parameter list are balanced within 1.05 on 64 ranks", "[plan]") {
  const int64_t h = 14336, vocab = 250880, layers = 70;
  std::vector<int64_t> numel = {vocab * h, h, h, h, h};  // embedding, its layer norm, final layer norm
  for (int64_t l = 0; l < layers; ++l)
    for (int64_t n : {h, h, 3 * h * h, 3 * h, h * h, h, h, h, 4 * h * h, 4 * h, 4 * h * h, h}) numel.push_back(n);
  std::vector<int64_t> weights;  // three states per parameter, bytes received + written (TP=1)
  for (int64_t n : numel)
    for (int s = 0; s < 3; ++s) weights.push_back(8 * n);
  auto bins = plan::AssignLpt(weights, 64);
  std::vector<int64_t> load(64, 0);
  for (size_t k = 0; k < weights.size(); ++k) load[bins[k]] += weights[k];
  int64_t total = std::accumulate(load.begin(), load.end(), int64_t{0});
  double imbalance = static_cast<double>(*std::max_element(load.begin(), load.end())) * 64 / static_cast<double>(total);
  INFO("imbalance " << imbalance << " over " << weights.size() << " items");
  CHECK(total > int64_t{176} * 1000 * 1000 * 1000 * 3 * 8 * 99 / 100);  // about 176 B parameters
  CHECK(imbalance <= 1.05);
  // Deterministic: the same answer twice (every rank computes it independently).
  CHECK(plan::AssignLpt(weights, 64) == bins);
}

TEST_CASE("items go to the bin that holds most of their bytes while its load stays near an even share", "[plan]") {
  // 40 items of weight 10; 30 prefer bin 0 and 10 prefer bin 1; nothing prefers bin 2 or 3.
  std::vector<int64_t> weights(40, 10);
  auto affinity = [](size_t k, int b) -> int64_t { return (k < 30 ? b == 0 : b == 1) ? 100 : 0; };
  auto bins = plan::AssignLocal(weights, std::vector<int64_t>(4, 0), affinity, 0.05);
  std::vector<int64_t> load(4, 0);
  int local = 0;
  for (size_t k = 0; k < weights.size(); ++k) load[bins[k]] += weights[k], local += affinity(k, bins[k]) > 0;
  // An even share is 100 and the cap 105: bin 0 takes 10 of the 30 that prefer it and nothing
  // else; the rest spread so that no bin passes the cap.
  for (size_t k = 0; k < weights.size(); ++k)
    if (bins[k] == 0) CHECK(k < 30);
  CHECK(load[0] == 100);
  CHECK(*std::max_element(load.begin(), load.end()) <= 105);
  CHECK(local > 10);  // bin 1 took some of its own too
  CHECK(plan::AssignLocal(weights, std::vector<int64_t>(4, 0), affinity, 0.05) == bins);  // deterministic
  // Starting loads count: a bin that starts full gets only what fits.
  auto started = plan::AssignLocal(weights, {300, 0, 0, 0}, affinity, 0.05);
  CHECK(std::count(started.begin(), started.end(), 0) == 0);
}

TEST_CASE("copy-local runs land where the pattern puts them in the joined tensor", "[plan]") {
  // A fused [q; k; v] of 4 + 2 + 2 rows x 3 columns, TP=2: rank 1 holds q rows 2-3, k row 1, v row 1.
  plan::Copy c;
  c.shape = {4, 3};
  c.numel = 12;
  c.split_dim = 0;
  c.blocks = {{0, 2, 2}, {2, 1, 5}, {3, 1, 7}};
  std::vector<int64_t> joined(8 * 3, -1);
  plan::ForEachJoinedRun(c, {8, 3}, 0, 12, [&](int64_t local, int64_t at, int64_t n) {
    for (int64_t k = 0; k < n; ++k) joined[at + k] = local + k;
  });
  std::vector<int64_t> want = {-1, -1, -1, -1, -1, -1, 0, 1, 2, 3, 4, 5, -1, -1, -1, 6, 7, 8, -1, -1, -1, 9, 10, 11};
  CHECK(joined == want);
  // Shard-H: rank 1 of a [2, 4] tensor split on dim 1 holds columns 2-3; a run starting mid-row.
  plan::Copy r;
  r.shape = {2, 2};
  r.numel = 4;
  r.split_dim = 1;
  r.blocks = {{0, 2, 2}};
  std::vector<int64_t> out(8, -1);
  plan::ForEachJoinedRun(r, {2, 4}, 1, 4, [&](int64_t local, int64_t at, int64_t n) {
    for (int64_t k = 0; k < n; ++k) out[at + k] = local + k;
  });
  CHECK(out == std::vector<int64_t>{-1, -1, -1, 1, -1, -1, 2, 3});
}

TEST_CASE("the single-process communicator exchanges with itself", "[plan]") {
  auto comm = shuffle::MakeLocalComm();
  CHECK(comm->size() == 1);
  std::vector<uint8_t> send = {1, 2, 3, 4}, recv(4, 0);
  comm->Alltoallv(send.data(), {4}, {0}, recv.data(), {4}, {0});
  CHECK(recv == send);
  CHECK(comm->GatherToRoot("x") == std::vector<std::string>{"x"});
}

TEST_CASE("fp32 to fp16 and bf16 rounds exactly as torch's .to()", "[rounding]") {
  auto path = test::WorkDir() / "rounding" / "rounding.pt";
  REQUIRE(std::filesystem::exists(path));
  pt::TorchFile f = pt::ReadTorchFile(path.string());
  const auto& x = f.root->At("fp32").AsTensor();
  const auto& h = f.root->At("fp16").AsTensor();
  const auto& b = f.root->At("bf16").AsTensor();
  REQUIRE(x.numel() == h.numel());
  REQUIRE(x.numel() == b.numel());
  size_t fp16_wrong = 0, bf16_wrong = 0;
  for (uint64_t k = 0; k < x.numel(); ++k) {
    float v;
    uint16_t want_h, want_b;
    std::memcpy(&v, x.data() + 4 * k, 4);
    std::memcpy(&want_h, h.data() + 2 * k, 2);
    std::memcpy(&want_b, b.data() + 2 * k, 2);
    // torch keeps a NaN's payload where ucp writes the canonical quiet NaN: both are NaN.
    bool nan = std::isnan(v);
    if (pt::Fp32ToFp16(v) != want_h && !(nan && (want_h & 0x7C00) == 0x7C00 && (want_h & 0x3FF))) ++fp16_wrong;
    if (pt::Fp32ToBf16(v) != want_b && !(nan && (want_b & 0x7F80) == 0x7F80 && (want_b & 0x7F))) ++bf16_wrong;
  }
  // The array forms (blocks of 8 the compiler vectorizes, then a scalar tail), from every start
  // modulo 8: Fp32ToBf16 against torch's rounding; ToFp32 of torch's bf16 bytes, which widening
  // gives exactly (the bf16 bits are the float's top 16).
  size_t array_wrong = 0, widen_wrong = 0;
  std::vector<float> xs(x.numel());
  std::memcpy(xs.data(), x.data(), 4 * xs.size());
  for (size_t start = 0; start < 8 && start < xs.size(); ++start) {
    const size_t n = xs.size() - start;
    std::vector<uint16_t> rounded(n);
    std::vector<float> widened(n);
    pt::Fp32ToBf16(xs.data() + start, rounded.data(), n);
    pt::ToFp32(b.data() + 2 * start, pt::DType::BF16, n, widened.data());
    for (size_t k = 0; k < n; ++k) {
      uint16_t want_b;
      uint32_t got_bits;
      std::memcpy(&want_b, b.data() + 2 * (start + k), 2);
      std::memcpy(&got_bits, &widened[k], 4);
      const bool nan = std::isnan(xs[start + k]);
      if (rounded[k] != want_b && !(nan && (want_b & 0x7F80) == 0x7F80 && (want_b & 0x7F))) ++array_wrong;
      if (got_bits != uint32_t{want_b} << 16) ++widen_wrong;
    }
  }
  INFO(x.numel() << " values");
  CHECK(fp16_wrong == 0);
  CHECK(bf16_wrong == 0);
  CHECK(array_wrong == 0);
  CHECK(widen_wrong == 0);
}

TEST_CASE("joined slabs cover exactly the elements joined runs map, in copy-local order", "[plan]") {
  // Random copies: 1-3 dimensions, a split dimension (or none), blocks that tile the local extent
  // and land anywhere in the joined extent; every sub-range of local elements, against
  // ForEachJoinedRun element by element.
  std::mt19937 rng(7);
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  int checked = 0;
  for (int trial = 0; trial < 300; ++trial) {
    plan::Copy c;
    const int nd = static_cast<int>(uniform(0, 3));
    for (int k = 0; k < nd; ++k) c.shape.push_back(uniform(1, 5));
    std::vector<int64_t> joined = c.shape;
    c.split_dim = nd == 0 ? -1 : static_cast<int>(uniform(-1, nd - 1));
    if (c.split_dim >= 0) {
      const int d = c.split_dim;
      const int64_t parts = uniform(1, 3), spare = uniform(0, 4);
      joined[d] = c.shape[d] * parts + spare;
      // Tile the local extent with blocks of random lengths, each at a random free joined position.
      int64_t at = 0, slot = 0;
      std::vector<int64_t> slots(static_cast<size_t>(parts));
      std::iota(slots.begin(), slots.end(), 0);
      std::shuffle(slots.begin(), slots.end(), rng);
      while (at < c.shape[d]) {
        const int64_t len = std::min(c.shape[d] - at, uniform(1, c.shape[d]));
        c.blocks.push_back({at, len, slots[static_cast<size_t>(slot++ % parts)] * c.shape[d] + at});
        at += len;
      }
    }
    const int64_t numel = pt::Numel(c.shape);
    const auto strides = pt::ContiguousStrides(joined);
    for (int64_t a = 0; a <= numel; ++a)
      for (int64_t b = a; b <= numel; ++b) {
        std::vector<int64_t> want(static_cast<size_t>(b - a), -1), got(static_cast<size_t>(b - a), -1);
        plan::ForEachJoinedRun(c, joined, a, b, [&](int64_t local, int64_t j, int64_t n) {
          for (int64_t i = 0; i < n; ++i) want[static_cast<size_t>(local - a + i)] = j + i;
        });
        plan::ForEachJoinedSlab(c, a, b, [&](const std::vector<int64_t>& start, const std::vector<int64_t>& count, int64_t local) {
          std::vector<int64_t> idx(start.size(), 0);
          for (int64_t i = 0; i < pt::Numel(count); ++i) {
            int64_t j = 0;
            for (size_t k = 0; k < idx.size(); ++k) j += (start[k] + idx[k]) * strides[k];
            REQUIRE(local - a + i >= 0);
            REQUIRE(local - a + i < b - a);
            REQUIRE(got[static_cast<size_t>(local - a + i)] == -1);  // no element twice
            got[static_cast<size_t>(local - a + i)] = j;
            for (size_t k = idx.size(); k-- > 0;)
              if (++idx[k] < count[k]) break;
              else idx[k] = 0;
          }
        });
        REQUIRE(got == want);
        ++checked;
      }
  }
  CHECK(checked > 10000);
}
