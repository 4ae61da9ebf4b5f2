#include "core/xxhash64.h"

#include <cstdio>
#include <cstring>

#define XXH_STATIC_LINKING_ONLY  // XXH64_state_t by value
#include <xxhash.h>

#include "core/file_blocks.h"

namespace ucp {
struct XxHash64::State {
  XXH64_state_t s;
};

XxHash64::XxHash64(uint64_t seed) : state_(std::make_unique<State>()) { XXH64_reset(&state_->s, seed); }
XxHash64::~XxHash64() = default;
XxHash64::XxHash64(XxHash64&&) noexcept = default;
XxHash64& XxHash64::operator=(XxHash64&&) noexcept = default;

void XxHash64::Update(const void* data, size_t size) {
  if (size == 0) return;  // an empty tensor's data may be null
  XXH64_update(&state_->s, data, size);
}

uint64_t XxHash64::Digest() const { return XXH64_digest(&state_->s); }

uint64_t XxHash64::Of(const void* data, size_t size, uint64_t seed) { return XXH64(size ? data : "", size, seed); }

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
