#include "pt/zip_archive.h"

#include <immintrin.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace ucp::pt {
namespace {

constexpr uint32_t kLocalHeaderSig = 0x04034b50;
constexpr uint32_t kCentralHeaderSig = 0x02014b50;
constexpr uint32_t kEndOfCentralSig = 0x06054b50;
constexpr uint32_t kZip64EndSig = 0x06064b50;
constexpr uint32_t kZip64LocatorSig = 0x07064b50;
constexpr size_t kEndOfCentralSize = 22;
constexpr size_t kZip64LocatorSize = 20;

// Bounds-checked little-endian reads over the mapped file.
class Cursor {
 public:
  Cursor(std::span<const uint8_t> bytes, const std::string& path) : bytes_(bytes), path_(path) {}
  uint64_t Read(uint64_t offset, int width, const char* what) const {
    if (offset > bytes_.size() || bytes_.size() - offset < static_cast<uint64_t>(width))
      throw Error(path_ + ": truncated zip: " + what + " at offset " + std::to_string(offset) +
                  " lies beyond the end of the file (" + std::to_string(bytes_.size()) + " bytes)");
    uint64_t v = 0;
    for (int i = width - 1; i >= 0; --i) v = (v << 8) | bytes_[offset + i];
    return v;
  }
  uint16_t U16(uint64_t off, const char* what) const { return static_cast<uint16_t>(Read(off, 2, what)); }
  uint32_t U32(uint64_t off, const char* what) const { return static_cast<uint32_t>(Read(off, 4, what)); }
  uint64_t U64(uint64_t off, const char* what) const { return Read(off, 8, what); }
  size_t size() const { return bytes_.size(); }

 private:
  std::span<const uint8_t> bytes_;
  const std::string& path_;
};

}  // namespace

namespace {

// The zip CRC-32 (bit-reflected polynomial 0x04C11DB7) by folding 16-byte blocks with carry-less
// multiplication, after Intel's "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ":
// four lanes fold 64 bytes per step, then one lane, then a Barrett reduction to 32 bits. `raw`
// and the result are the bare register (zlib's value complemented); `len` is a multiple of 16,
// at least 64. The constants are x^k mod P for the fold distances, P itself and floor(x^64 / P).
#define UCP_CLMUL __attribute__((target("pclmul,sse4.1")))
UCP_CLMUL inline __m128i Load16(const uint8_t* q) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(q)); }
UCP_CLMUL inline __m128i Fold16(__m128i x, __m128i k, __m128i next) {
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), next);
}

UCP_CLMUL uint32_t Crc32Clmul(uint32_t raw, const uint8_t* p, size_t len) {
  const __m128i k1k2 = _mm_set_epi64x(0x1c6e41596, 0x154442bd4);
  const __m128i k3k4 = _mm_set_epi64x(0x0ccaa009e, 0x1751997d0);
  const __m128i k5 = _mm_set_epi64x(0, 0x163cd6124);
  const __m128i pu = _mm_set_epi64x(0x1f7011641, 0x1db710641);
  const __m128i low32 = _mm_set_epi32(0, 0, 0, -1);
  __m128i x1 = _mm_xor_si128(Load16(p), _mm_cvtsi32_si128(static_cast<int>(raw)));
  __m128i x2 = Load16(p + 16), x3 = Load16(p + 32), x4 = Load16(p + 48);
  p += 64, len -= 64;
  for (; len >= 64; p += 64, len -= 64) {
    x1 = Fold16(x1, k1k2, Load16(p));
    x2 = Fold16(x2, k1k2, Load16(p + 16));
    x3 = Fold16(x3, k1k2, Load16(p + 32));
    x4 = Fold16(x4, k1k2, Load16(p + 48));
  }
  x1 = Fold16(Fold16(Fold16(x1, k3k4, x2), k3k4, x3), k3k4, x4);
  for (; len >= 16; p += 16, len -= 16) x1 = Fold16(x1, k3k4, Load16(p));
  // 128 -> 64 bits, then 64 -> 32 bits with 32 zero bits appended.
  x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), _mm_clmulepi64_si128(k3k4, x1, 0x01));
  x1 = _mm_xor_si128(_mm_srli_si128(x1, 4), _mm_clmulepi64_si128(_mm_and_si128(x1, low32), k5, 0x00));
  // Barrett reduction.
  __m128i t = _mm_and_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, low32), pu, 0x10), low32);
  t = _mm_xor_si128(_mm_clmulepi64_si128(t, pu, 0x00), x1);
  return static_cast<uint32_t>(_mm_extract_epi32(t, 1));
}

#undef UCP_CLMUL

bool HasClmul() {
  static const bool yes = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  return yes;
}

uint32_t Crc32Zlib(uint32_t crc, const uint8_t* p, size_t left) {
  uLong c = crc;
  while (left > 0) {  // zlib's crc32 takes a 32-bit length: feed it in slices
    uInt n = static_cast<uInt>(std::min<size_t>(left, 1u << 30));
    c = ::crc32(c, p, n);
    p += n;
    left -= n;
  }
  return static_cast<uint32_t>(c);
}

}  // namespace

uint32_t Crc32(uint32_t crc, std::span<const uint8_t> bytes) {
  const size_t n = bytes.size(), folded = n & ~size_t{15};
  if (n < 256 || !HasClmul()) return Crc32Zlib(crc, bytes.data(), n);
  crc = ~Crc32Clmul(~crc, bytes.data(), folded);
  return Crc32Zlib(crc, bytes.data() + folded, n - folded);
}

ZipArchive::ZipArchive(std::shared_ptr<MappedFile> file) : file_(std::move(file)) {
  const std::string& path = file_->path();
  Cursor in(file_->bytes(), path);
  if (in.size() < kEndOfCentralSize)
    throw Error(path + ": not a torch.save zip archive: only " + std::to_string(in.size()) + " bytes");
  if (in.size() >= 2 && file_->bytes()[0] == 0x80)
    throw Error(path + ": legacy (pre-1.6, non-zip) torch.save format is not supported");

  // The end-of-central-directory record sits in the last 22 + 65535 (comment) bytes.
  uint64_t eocd = UINT64_MAX;
  uint64_t lowest = in.size() > kEndOfCentralSize + 65535 ? in.size() - kEndOfCentralSize - 65535 : 0;
  for (uint64_t off = in.size() - kEndOfCentralSize + 1; off-- > lowest;) {
    if (in.U32(off, "end of central directory") == kEndOfCentralSig) {
      eocd = off;
      break;
    }
  }
  if (eocd == UINT64_MAX)
    throw Error(path + ": not a zip archive or truncated: no end-of-central-directory record");

  uint64_t count = in.U16(eocd + 10, "entry count");
  uint64_t cd_size = in.U32(eocd + 12, "central directory size");
  uint64_t cd_offset = in.U32(eocd + 16, "central directory offset");
  if ((count == 0xFFFF || cd_size == 0xFFFFFFFF || cd_offset == 0xFFFFFFFF) && eocd >= kZip64LocatorSize &&
      in.U32(eocd - kZip64LocatorSize, "zip64 locator") == kZip64LocatorSig) {
    uint64_t z64 = in.U64(eocd - kZip64LocatorSize + 8, "zip64 end record offset");
    if (in.U32(z64, "zip64 end record") != kZip64EndSig)
      throw Error(path + ": corrupt zip64 end-of-central-directory record at offset " + std::to_string(z64));
    count = in.U64(z64 + 32, "zip64 entry count");
    cd_size = in.U64(z64 + 40, "zip64 central directory size");
    cd_offset = in.U64(z64 + 48, "zip64 central directory offset");
  }
  if (cd_offset > in.size() || cd_size > in.size() - cd_offset)
    throw Error(path + ": truncated zip: central directory [" + std::to_string(cd_offset) + ", +" +
                std::to_string(cd_size) + ") lies beyond the end of the file (" + std::to_string(in.size()) +
                " bytes)");
  // Far more records than torch.save writes (one per storage, and a few): refused before any is read.
  constexpr uint64_t kMaxEntries = uint64_t{1} << 18;
  if (count > kMaxEntries)
    throw Error(path + ": the zip declares " + std::to_string(count) + " entries; more than " +
                std::to_string(kMaxEntries) + " is not a checkpoint file ucp reads");
  // Each central header is at least 46 bytes: a count larger than that allows is a lie.
  if (count > cd_size / 46 + 1)
    throw Error(path + ": corrupt zip: " + std::to_string(count) + " entries cannot fit in a central directory of " +
                std::to_string(cd_size) + " bytes");

  uint64_t off = cd_offset;
  for (uint64_t i = 0; i < count; ++i) {
    if (in.U32(off, "central directory entry") != kCentralHeaderSig)
      throw Error(path + ": corrupt zip: central directory entry " + std::to_string(i) + " at offset " +
                  std::to_string(off) + " has a bad signature");
    uint16_t method = in.U16(off + 10, "compression method");
    ZipEntry e;
    e.crc32 = in.U32(off + 16, "crc32");
    uint64_t comp_size = in.U32(off + 20, "compressed size");
    e.size = in.U32(off + 24, "size");
    uint16_t name_len = in.U16(off + 28, "name length");
    uint16_t extra_len = in.U16(off + 30, "extra length");
    uint16_t comment_len = in.U16(off + 32, "comment length");
    uint64_t local = in.U32(off + 42, "local header offset");
    uint64_t name_off = off + 46;
    in.Read(name_off + name_len + extra_len, 0, "entry name");  // bounds only
    if (name_off + name_len > in.size()) throw Error(path + ": truncated zip: entry name beyond end of file");
    e.name.assign(reinterpret_cast<const char*>(file_->bytes().data() + name_off), name_len);
    // zip64 extra field: the 64-bit values appear, in order, only for fields saturated above.
    for (uint64_t x = name_off + name_len; x + 4 <= name_off + name_len + extra_len;) {
      uint16_t id = in.U16(x, "extra field id");
      uint16_t len = in.U16(x + 2, "extra field length");
      if (id == 0x0001) {
        uint64_t p = x + 4;
        if (e.size == 0xFFFFFFFF) e.size = in.U64(p, "zip64 size"), p += 8;
        if (comp_size == 0xFFFFFFFF) comp_size = in.U64(p, "zip64 compressed size"), p += 8;
        if (local == 0xFFFFFFFF) local = in.U64(p, "zip64 local header offset"), p += 8;
      }
      x += 4 + len;
    }
    if (method != 0)
      throw Error(path + ": entry '" + e.name + "' is compressed (method " + std::to_string(method) +
                  "); torch.save writes stored entries only");
    if (comp_size != e.size)
      throw Error(path + ": entry '" + e.name + "': stored entry with compressed size " + std::to_string(comp_size) +
                  " != size " + std::to_string(e.size));
    if (in.U32(local, "local header") != kLocalHeaderSig)
      throw Error(path + ": corrupt zip: local header of '" + e.name + "' at offset " + std::to_string(local) +
                  " has a bad signature");
    e.data_offset = local + 30 + in.U16(local + 26, "local name length") + in.U16(local + 28, "local extra length");
    if (e.data_offset > in.size() || e.size > in.size() - e.data_offset)
      throw Error(path + ": truncated: entry '" + e.name + "' needs bytes [" + std::to_string(e.data_offset) + ", " +
                  std::to_string(e.data_offset + e.size) + ") but the file has " + std::to_string(in.size()));
    std::string name = e.name;
    entries_.emplace(std::move(name), std::move(e));
    off = name_off + name_len + extra_len + comment_len;
  }
}

const ZipEntry* ZipArchive::Find(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

std::span<const uint8_t> ZipArchive::Payload(const ZipEntry& entry) const {
  return file_->bytes().subspan(entry.data_offset, entry.size);
}

void ZipArchive::VerifyCrc(const ZipEntry& entry) const {
  uint32_t actual = Crc32(0, Payload(entry));
  if (actual != entry.crc32) {
    char buf[96];
    std::snprintf(buf, sizeof buf, ": CRC32 mismatch (stored %08x, computed %08x)", entry.crc32, actual);
    throw Error(path() + ": entry '" + entry.name + "'" + buf);
  }
}

}  // namespace ucp::pt
