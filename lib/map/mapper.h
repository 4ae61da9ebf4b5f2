// Map (Extract): a mapper rank's view of the optimizer files the plan gives it. It locates every
// param group's flat fp32 / exp_avg / exp_avg_sq tensor inside each file and copies runs of them
// straight from the file into the shuffle's send buffer with pread: no mapping stays resident, so
// the rank's memory does not grow with the size of the files it reads.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/file_descriptor.h"
#include "plan/convert_plan.h"
#include "source/source_index.h"

namespace ucp::map {

class Mapper {
 public:
  // Opens and indexes the files of `layout` that `plan` maps on `rank`; throws ucp::Error naming
  // the file and its rank coordinates.
  // `verified`: per file and checksummed record, 1 where the weight-copy check computed its CRC-32 and
  // found it equal (map/weight_copies.h, as it read the masters): not read a second time here.
  Mapper(const source::SourceIndex& layout, const plan::ConvertPlan& plan, int rank,
         const std::vector<std::vector<char>>* verified = nullptr);
  Mapper(const Mapper&) = delete;
  Mapper& operator=(const Mapper&) = delete;

  // Copies `numel` float32 elements of `piece` (state `state`), starting `offset` elements into
  // the piece, to `dst`. `param` names the parameter in errors.
  void Read(const plan::Piece& piece, plan::State state, int64_t offset, int64_t numel, uint8_t* dst,
            const std::string& param);
  uint64_t bytes_read() const { return bytes_read_; }
  uint64_t crc_bytes() const { return crc_bytes_; }  // bytes read for records' CRC-32 (whole records, or this rank's ranges)

  // Records several mappers read parts of (ConvertPlan::shared_records), checked collectively before
  // any of their bytes is used: SharedRangeCrcs gives, per range slot (all ranges of all shared
  // records, in plan order), 2^32 + the CRC-32 of each range this rank reads, 0 in the others'; the
  // caller sums that over the ranks, and CheckSharedRecords combines each record's ranges in byte
  // order against its stored CRC-32 (every rank checks every record, so all refuse alike, naming the
  // file, the record and the ranks that read it).
  std::vector<int64_t> SharedRangeCrcs();
  void CheckSharedRecords(const std::vector<int64_t>& summed);

 private:
  struct Tensor {
    uint64_t file_offset = 0, numel = 0;
    int file = -1;  // the file whose bytes hold it (index into SourceIndex::files)
  };
  struct Open {
    std::string where;  // "path (pp=, tp=, dp=)", for errors
    std::vector<std::array<Tensor, plan::kStates>> groups;
  };
  struct File {  // open for pread
    Fd fd;
    std::string path;
    std::vector<bool> checked;  // per ShardFile::checksummed record
  };
  int OpenFd(const source::SourceIndex& layout, int file);
  // The CRC-32 of bytes [begin, end) of `file`, read by pread; `record` names them in errors.
  uint32_t CrcOf(int file, uint64_t begin, uint64_t end, const std::string& record);
  // Checks the zip CRC-32 of every record [pos, pos + len) of `file` lies in, the first time one is
  // touched (read whole, by pread, before any of its bytes is used): a flipped byte is refused
  // naming the file and the record, never converted.
  void CheckRecords(int file, uint64_t pos, uint64_t len, const std::string& context);
  const source::SourceIndex& layout_;
  const plan::ConvertPlan& plan_;
  const int rank_;
  const std::vector<std::vector<char>>* verified_;
  std::map<int, Open> files_;
  std::map<int, File> fds_;  // every file a mapped file's tensors lie in: itself, and others it names
  uint64_t bytes_read_ = 0, crc_bytes_ = 0;
};

}  // namespace ucp::map
