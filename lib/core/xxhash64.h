// XXH64 (Yann Collet's xxHash, 64-bit variant), streaming: the checksum of every file ucp writes,
// computed by the xxHash library (Debian's libxxhash). Fast enough to run at memory bandwidth while
// the bytes are still in cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace ucp {

class XxHash64 {
 public:
  explicit XxHash64(uint64_t seed = 0);
  ~XxHash64();
  XxHash64(XxHash64&&) noexcept;
  XxHash64& operator=(XxHash64&&) noexcept;
  void Update(const void* data, size_t size);
  uint64_t Digest() const;
  static uint64_t Of(const void* data, size_t size, uint64_t seed = 0);

 private:
  struct State;  // the library's XXH64_state_t
  std::unique_ptr<State> state_;
};

std::string HexDigest(uint64_t digest);  // 16 lowercase hex digits
// XXH64 of a whole file, read in large blocks; throws ucp::Error naming the path.
uint64_t XxHash64File(const std::string& path, uint64_t* size = nullptr);

}  // namespace ucp
