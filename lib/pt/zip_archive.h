// The zip container of a torch.save file: central directory (zip64 aware), stored entries only,
// every offset and size checked against the file before use. Entry payloads are spans into the
// memory-mapped file, never copies.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "core/error.h"
#include "core/mapped_file.h"

namespace ucp::pt {

struct ZipEntry {
  std::string name;
  uint64_t data_offset = 0;  // of the payload inside the file
  uint64_t size = 0;
  uint32_t crc32 = 0;
};

class ZipArchive {
 public:
  // Parses the central directory of `file`. Throws ucp::Error naming the file on malformed input.
  explicit ZipArchive(std::shared_ptr<MappedFile> file);
  // A zip that is bytes [base, base + size) of `file` (PyTorch's DCP keeps one torch.save archive
  // per tensor chunk inside its .distcp files): its offsets count from `base`, nothing outside the
  // range is read, and entries' data_offset are the file's.
  ZipArchive(std::shared_ptr<MappedFile> file, uint64_t base, uint64_t size);

  const std::string& path() const { return file_->path(); }
  const std::shared_ptr<MappedFile>& file() const { return file_; }
  const std::map<std::string, ZipEntry>& entries() const { return entries_; }
  const ZipEntry* Find(const std::string& name) const;
  std::span<const uint8_t> Payload(const ZipEntry& entry) const;
  // Throws if the payload's CRC32 differs from the central directory's.
  void VerifyCrc(const ZipEntry& entry) const;

 private:
  std::shared_ptr<MappedFile> file_;
  std::map<std::string, ZipEntry> entries_;
};

uint32_t Crc32(uint32_t crc, std::span<const uint8_t> bytes);

// The one refusal of a record whose bytes do not give its stored CRC-32: "PATH: record 'NAME': CRC-32
// mismatch (stored .., computed ..[, how]): the file is damaged[; consequence]".
Error CrcMismatch(const std::string& path, const std::string& record, uint32_t stored, uint32_t computed,
                  const std::string& how = "", const std::string& consequence = "");

}  // namespace ucp::pt
