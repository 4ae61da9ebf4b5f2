#include "pt/zip_archive.h"

#include <libdeflate.h>

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

// Where the central directory lies and how many entries it declares.
struct CentralDirectory {
  uint64_t count = 0, size = 0, offset = 0;
};

// The end-of-central-directory record (and its zip64 form where a field is saturated), its
// directory checked to lie inside the archive and to be able to hold the entries it declares.
CentralDirectory FindCentralDirectory(const Cursor& in, const std::string& path) {
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

  CentralDirectory cd;
  cd.count = in.U16(eocd + 10, "entry count");
  cd.size = in.U32(eocd + 12, "central directory size");
  cd.offset = in.U32(eocd + 16, "central directory offset");
  if ((cd.count == 0xFFFF || cd.size == 0xFFFFFFFF || cd.offset == 0xFFFFFFFF) && eocd >= kZip64LocatorSize &&
      in.U32(eocd - kZip64LocatorSize, "zip64 locator") == kZip64LocatorSig) {
    uint64_t z64 = in.U64(eocd - kZip64LocatorSize + 8, "zip64 end record offset");
    if (in.U32(z64, "zip64 end record") != kZip64EndSig)
      throw Error(path + ": corrupt zip64 end-of-central-directory record at offset " + std::to_string(z64));
    cd.count = in.U64(z64 + 32, "zip64 entry count");
    cd.size = in.U64(z64 + 40, "zip64 central directory size");
    cd.offset = in.U64(z64 + 48, "zip64 central directory offset");
  }
  if (cd.offset > in.size() || cd.size > in.size() - cd.offset)
    throw Error(path + ": truncated zip: central directory [" + std::to_string(cd.offset) + ", +" +
                std::to_string(cd.size) + ") lies beyond the end of the file (" + std::to_string(in.size()) +
                " bytes)");
  // Far more records than torch.save writes (one per storage, and a few): refused before any is read.
  constexpr uint64_t kMaxEntries = uint64_t{1} << 18;
  if (cd.count > kMaxEntries)
    throw Error(path + ": the zip declares " + std::to_string(cd.count) + " entries; more than " +
                std::to_string(kMaxEntries) + " is not a checkpoint file ucp reads");
  // Each central header is at least 46 bytes: a count larger than that allows is a lie.
  if (cd.count > cd.size / 46 + 1)
    throw Error(path + ": corrupt zip: " + std::to_string(cd.count) + " entries cannot fit in a central directory of " +
                std::to_string(cd.size) + " bytes");
  return cd;
}

// Central directory entry `i` at `off`, its payload checked to be stored and to lie inside the
// archive (data_offset counted from the archive's start); `off` moved on to the next entry.
ZipEntry ReadCentralEntry(const Cursor& in, std::span<const uint8_t> bytes, const std::string& path, uint64_t i,
                          uint64_t& off) {
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
  e.name.assign(reinterpret_cast<const char*>(bytes.data() + name_off), name_len);
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
  off = name_off + name_len + extra_len + comment_len;
  return e;
}

}  // namespace

// libdeflate's CRC-32 (the zip polynomial, zlib's convention): it picks carry-less multiplication
// (x86-64) or the CRC instructions (aarch64) at run time, and takes a size_t length. Chosen over
// zlib's crc32 by scripts/bench_checksums.sh.
uint32_t Crc32(uint32_t crc, std::span<const uint8_t> bytes) {
  if (bytes.empty()) return crc;
  return libdeflate_crc32(crc, bytes.data(), bytes.size());
}

ZipArchive::ZipArchive(std::shared_ptr<MappedFile> f) : ZipArchive(f, 0, f->size()) {}

ZipArchive::ZipArchive(std::shared_ptr<MappedFile> file, uint64_t base, uint64_t size) : file_(std::move(file)) {
  if (base > file_->size() || size > file_->size() - base)
    throw Error(file_->path() + ": bytes [" + std::to_string(base) + ", +" + std::to_string(size) +
                ") lie beyond the end of the file (" + std::to_string(file_->size()) + " bytes)");
  const std::string path = base == 0 && size == file_->size() ? file_->path() :
      file_->path() + " (the archive at bytes [" + std::to_string(base) + ", +" + std::to_string(size) + "))";
  const std::span<const uint8_t> bytes = file_->bytes().subspan(base, size);
  Cursor in(bytes, path);
  if (in.size() < kEndOfCentralSize)
    throw Error(path + ": not a torch.save zip archive: only " + std::to_string(in.size()) + " bytes");
  if (in.size() >= 2 && bytes[0] == 0x80)
    throw Error(path + ": legacy (pre-1.6, non-zip) torch.save format is not supported");

  const CentralDirectory cd = FindCentralDirectory(in, path);
  uint64_t off = cd.offset;
  for (uint64_t i = 0; i < cd.count; ++i) {
    ZipEntry e = ReadCentralEntry(in, bytes, path, i, off);
    e.data_offset += base;
    std::string name = e.name;
    entries_.emplace(std::move(name), std::move(e));
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
  const uint32_t actual = Crc32(0, Payload(entry));
  if (actual != entry.crc32) throw CrcMismatch(path(), entry.name, entry.crc32, actual);
}

Error CrcMismatch(const std::string& path, const std::string& record, uint32_t stored, uint32_t computed,
                  const std::string& how, const std::string& consequence) {
  char hex[64];
  std::snprintf(hex, sizeof hex, "stored %08x, computed %08x", stored, computed);
  return Error(path + ": record '" + record + "': CRC-32 mismatch (" + hex + (how.empty() ? "" : ", " + how) +
               "): the file is damaged (restore it from a good copy)" + (consequence.empty() ? "" : "; " + consequence));
}

}  // namespace ucp::pt
