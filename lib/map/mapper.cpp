#include "map/mapper.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <zlib.h>

#include "core/error.h"
#include "core/mapped_file.h"
#include "pt/record_crc.h"
#include "pt/zip_archive.h"

namespace ucp::map {

Mapper::Mapper(const source::SourceIndex& L, const plan::ConvertPlan& plan, int rank, const std::vector<std::vector<char>>* verified)
    : layout_(L), plan_(plan), rank_(rank), verified_(verified) {
  for (const int fi : plan.FilesMappedBy(rank)) {
    const auto& f = L.files[fi];
    Open o;
    o.where = source::FileWhere(L, static_cast<int>(fi));
    WithContext(o.where, [&] {
      OpenFd(L, static_cast<int>(fi));
      for (const auto& g : f.groups) {
        std::array<Tensor, plan::kStates> t;
        for (int s = 0; s < plan::kStates; ++s) {
          const int holder = g[s].file >= 0 ? g[s].file : static_cast<int>(fi);
          if (holder >= static_cast<int>(L.files.size())) throw Error("internal: tensor in file " + std::to_string(holder));
          OpenFd(L, holder);
          t[s] = {g[s].offset, static_cast<uint64_t>(g[s].numel), holder};
        }
        o.groups.push_back(t);
      }
    });
    files_.emplace(static_cast<int>(fi), std::move(o));
  }
}

int Mapper::OpenFd(const source::SourceIndex& L, int file) {
  auto it = fds_.find(file);
  if (it != fds_.end()) return it->second.fd.get();
  File d;
  d.path = L.dir + "/" + L.files[file].name;
  d.fd = Fd::OpenOrThrow(d.path, O_RDONLY);
  ::posix_fadvise(d.fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
  d.checked.assign(L.files[file].checksummed.size(), false);
  if (verified_ && static_cast<size_t>(file) < verified_->size() && (*verified_)[file].size() == d.checked.size())
    for (size_t k = 0; k < d.checked.size(); ++k) d.checked[k] = (*verified_)[file][k] != 0;
  return fds_.emplace(file, std::move(d)).first->second.fd.get();
}

void Mapper::Read(const plan::Piece& piece, plan::State state, int64_t offset, int64_t numel, uint8_t* dst,
                  const std::string& param) {
  auto it = files_.find(piece.file);
  if (it == files_.end() || piece.mapper != rank_)
    throw Error("internal: a piece of file " + std::to_string(piece.file) + " is not mapped on this rank");
  Open& o = it->second;
  auto fail = [&](const std::string& why) {
    return Error(o.where + ": parameter '" + param + "' " + std::string(plan::StateName(state)) + ": " + why);
  };
  if (piece.group >= static_cast<int>(o.groups.size())) throw fail("no param group " + std::to_string(piece.group));
  const Tensor& t = o.groups[piece.group][static_cast<int>(state)];
  uint64_t first = static_cast<uint64_t>(piece.src_start + offset);
  if (first + static_cast<uint64_t>(numel) > t.numel)
    throw fail("elements [" + std::to_string(first) + ", " + std::to_string(first + numel) +
               ") lie outside its flat partition of " + std::to_string(t.numel));
  const File& d = fds_.at(t.file);
  const std::string in = t.file == piece.file ? "" : " (its bytes are in " + d.path + ")";
  uint64_t pos = t.file_offset + first * 4, left = static_cast<uint64_t>(numel) * 4;
  CheckRecords(t.file, pos, left, o.where + ": parameter '" + param + "' " + std::string(plan::StateName(state)));
  while (left > 0) {
    ssize_t n = ::pread(d.fd.get(), dst, std::min<uint64_t>(left, 1u << 30), static_cast<off_t>(pos));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw fail(std::string("read failed: ") + std::strerror(errno) + in);
    if (n == 0) throw fail("the file ends at byte " + std::to_string(pos) + ", inside the tensor (truncated?)" + in);
    dst += n, pos += static_cast<uint64_t>(n), left -= static_cast<uint64_t>(n);
  }
  bytes_read_ += static_cast<uint64_t>(numel) * 4;
}

void Mapper::CheckRecords(int file, uint64_t pos, uint64_t len, const std::string& context) {
  File& d = fds_.at(file);
  const auto& ranges = layout_.files[file].checksummed;
  if (ranges.empty()) throw Error(context + ": " + d.path + " lists no checksummed record: its bytes cannot be checked");
  const uint64_t held = pt::ForEachRecordHolding(ranges, pos, len, [&](size_t i) {
    if (d.checked[i]) return;
    const auto& r = ranges[i];
    const uint32_t crc = CrcOf(file, r.offset, r.offset + r.size, r.name);
    if (crc != r.crc32) throw pt::CrcMismatch(d.path, r.name, r.crc32, crc, "", "nothing of it was converted (" + context + " lies in it)");
    d.checked[i] = true;
  });
  if (held < pos + len)
    throw Error(context + ": bytes [" + std::to_string(pos) + ", " + std::to_string(pos + len) + ") of " + d.path +
                " lie outside every zip record");
}

uint32_t Mapper::CrcOf(int file, uint64_t begin, uint64_t end, const std::string& record) {
  const File& d = fds_.at(file);
  const uint32_t crc = pt::Crc32Of(d.fd.get(), begin, end - begin, d.path, record);
  crc_bytes_ += end - begin;
  return crc;
}

std::vector<int64_t> Mapper::SharedRangeCrcs() {
  std::vector<int64_t> slots(plan_.SharedRanges(), 0);
  size_t slot = 0;
  for (const auto& rec : plan_.shared_records)
    for (const auto& range : rec.ranges) {
      if (range.mapper == rank_) {
        const std::string& name = layout_.files[rec.file].checksummed[rec.record].name;
        OpenFd(layout_, rec.file);
        slots[slot] = (int64_t{1} << 32) + CrcOf(rec.file, range.begin, range.end, name);
      }
      ++slot;
    }
  return slots;
}

void Mapper::CheckSharedRecords(const std::vector<int64_t>& summed) {
  if (summed.size() != plan_.SharedRanges()) throw Error("internal: " + std::to_string(summed.size()) + " shared range CRC-32s");
  size_t slot = 0;
  for (const auto& rec : plan_.shared_records) {
    const auto& r = layout_.files[rec.file].checksummed[rec.record];
    const std::string path = layout_.dir + "/" + layout_.files[rec.file].name;
    uint32_t crc = 0;
    std::string readers;
    for (size_t k = 0; k < rec.ranges.size(); ++k, ++slot) {
      const auto& range = rec.ranges[k];
      readers += (k ? ", " : "") + std::to_string(range.mapper);
      if (summed[slot] >> 32 != 1) throw Error("internal: the CRC-32 of a range of " + path + " record '" + r.name + "' is missing");
      const auto part = static_cast<uint32_t>(summed[slot]);
      crc = k == 0 ? part : static_cast<uint32_t>(crc32_combine64(crc, part, static_cast<z_off64_t>(range.end - range.begin)));
    }
    if (crc != r.crc32) {
      std::string held;  // a parameter with elements in the file, for the user's bearings
      for (const auto& P : plan_.params)
        if (held.empty() && std::any_of(P.pieces.begin(), P.pieces.end(), [&](const plan::Piece& pc) { return pc.file == rec.file; }))
          held = ", parameter '" + P.name + "' among those it holds";
      throw pt::CrcMismatch(source::FileWhere(layout_, rec.file), r.name, r.crc32, crc, "read in ranges by ranks " + readers, "nothing of it was converted" + held);
    }
    if (auto it = fds_.find(rec.file); it != fds_.end()) it->second.checked[rec.record] = true;
  }
}

}  // namespace ucp::map
