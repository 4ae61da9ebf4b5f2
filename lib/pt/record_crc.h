// Zip records checked as they are read through a file descriptor: which records a byte range lies
// in, and a record's CRC-32 read by pread. What every reader that checks a record before it uses a
// byte of it shares (the conversion's mapper, the partitions store).
#pragma once

#include <cstdint>
#include <string>

namespace ucp::pt {

// The CRC-32 of bytes [offset, offset + size) of open file `fd`, read by pread in blocks of at most
// 8 MiB. Throws ucp::Error naming `path` and `record` on a failed read or a file ending inside them.
uint32_t Crc32Of(int fd, uint64_t offset, uint64_t size, const std::string& path, const std::string& record);

// Calls hold(i) for each record of `records` (in byte order, each with .offset and .size) that bytes
// [pos, pos + len) lie in, in order, while they cover the range without a gap. Returns the first byte
// of the range no record holds: pos + len when the records hold all of it.
template <typename Records, typename Hold>
uint64_t ForEachRecordHolding(const Records& records, uint64_t pos, uint64_t len, Hold&& hold) {
  uint64_t covered = pos;
  for (size_t i = 0; i < records.size() && covered < pos + len; ++i) {
    const auto& r = records[i];
    if (r.offset + r.size <= covered || r.offset > covered) continue;
    covered = r.offset + r.size;
    hold(i);
  }
  return covered < pos + len ? covered : pos + len;
}

}  // namespace ucp::pt
