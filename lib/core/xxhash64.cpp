#include "core/xxhash64.h"

#include <cstdio>
#include <cstring>

#include "core/file_blocks.h"

namespace ucp {
namespace {

constexpr uint64_t P1 = 0x9E3779B185EBCA87ULL, P2 = 0xC2B2AE3D27D4EB4FULL, P3 = 0x165667B19E3779F9ULL,
                   P4 = 0x85EBCA77C2B2AE63ULL, P5 = 0x27D4EB2F165667C5ULL;

inline uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t Read64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;  // little-endian host (x86-64, aarch64)
}
inline uint32_t Read32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint64_t Round(uint64_t acc, uint64_t input) { return Rotl(acc + input * P2, 31) * P1; }
inline uint64_t Merge(uint64_t acc, uint64_t v) { return (acc ^ Round(0, v)) * P1 + P4; }

}  // namespace

XxHash64::XxHash64(uint64_t seed) : v_{seed + P1 + P2, seed + P2, seed, seed - P1}, seed_(seed) {}

void XxHash64::Update(const void* data, size_t size) {
  if (size == 0) return;  // an empty tensor's data may be null, which memcpy may not be given
  const auto* p = static_cast<const unsigned char*>(data);
  total_ += size;
  if (buffered_ + size < 32) {
    std::memcpy(buf_ + buffered_, p, size);
    buffered_ += size;
    return;
  }
  if (buffered_ > 0) {
    size_t take = 32 - buffered_;
    std::memcpy(buf_ + buffered_, p, take);
    for (int k = 0; k < 4; ++k) v_[k] = Round(v_[k], Read64(buf_ + 8 * k));
    p += take, size -= take, buffered_ = 0;
  }
  uint64_t v0 = v_[0], v1 = v_[1], v2 = v_[2], v3 = v_[3];
  for (; size >= 32; p += 32, size -= 32) {
    v0 = Round(v0, Read64(p)), v1 = Round(v1, Read64(p + 8));
    v2 = Round(v2, Read64(p + 16)), v3 = Round(v3, Read64(p + 24));
  }
  v_[0] = v0, v_[1] = v1, v_[2] = v2, v_[3] = v3;
  std::memcpy(buf_, p, size);
  buffered_ = size;
}

uint64_t XxHash64::Digest() const {
  uint64_t h;
  if (total_ >= 32) {
    h = Rotl(v_[0], 1) + Rotl(v_[1], 7) + Rotl(v_[2], 12) + Rotl(v_[3], 18);
    for (int k = 0; k < 4; ++k) h = Merge(h, v_[k]);
  } else {
    h = seed_ + P5;
  }
  h += total_;
  const unsigned char* p = buf_;
  size_t n = buffered_;
  for (; n >= 8; p += 8, n -= 8) h = Rotl(h ^ Round(0, Read64(p)), 27) * P1 + P4;
  if (n >= 4) {
    h = Rotl(h ^ (uint64_t{Read32(p)} * P1), 23) * P2 + P3;
    p += 4, n -= 4;
  }
  for (; n > 0; ++p, --n) h = Rotl(h ^ (*p * P5), 11) * P1;
  h ^= h >> 33, h *= P2, h ^= h >> 29, h *= P3, h ^= h >> 32;
  return h;
}

uint64_t XxHash64::Of(const void* data, size_t size, uint64_t seed) {
  XxHash64 h(seed);
  h.Update(data, size);
  return h.Digest();
}

std::string HexDigest(uint64_t digest) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(digest));
  return buf;
}

uint64_t XxHash64File(const std::string& path, uint64_t* size) {
  XxHash64 h;
  uint64_t total = ReadFileBlocks(path, [&](const void* p, size_t n) { h.Update(p, n); });
  if (size) *size = total;
  return h.Digest();
}

}  // namespace ucp
