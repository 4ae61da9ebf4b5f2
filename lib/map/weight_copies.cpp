#include "map/weight_copies.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <zlib.h>

#include "core/error.h"
#include "core/mapped_file.h"
#include "pt/low_precision.h"
#include "pt/zip_archive.h"

namespace ucp::map {
namespace {

using source::SourceIndex;
using source::WeightCopy;

// Elements compared at once: 256 KiB of masters, read by pread into a buffer that stays in the core's
// cache while its CRC-32 is computed and it is rounded and compared (a chunk of megabytes is read back
// from memory by each of those passes).
constexpr int64_t kChunk = int64_t{1} << 16;
constexpr size_t kBlock = 2048;  // elements rounded at once, into a buffer on the stack, and compared

// The files a check reads, read by pread (nothing stays resident). The few last read stay open: a
// thread's units take their masters and copies from one or two files in turn, and a job of
// thousands of files must not hold a descriptor for each.
class Files {
 public:
  explicit Files(const SourceIndex& L) : L_(L) {}
  void Read(int file, uint64_t offset, size_t n, void* dst) { At(file).ReadAt(offset, n, dst); }
  // Checks the zip CRC-32 of every record that bytes [pos, pos + len) of `file` lie in (a copy file
  // outside the shard folder, safetensors, has none).
  void CheckRecords(int file, uint64_t pos, uint64_t len) {
    if (static_cast<size_t>(file) >= L_.files.size()) return;
    for (const auto& r : L_.files[static_cast<size_t>(file)].checksummed) {
      if (r.offset + r.size <= pos || r.offset >= pos + len) continue;
      uint32_t crc = 0;
      std::vector<uint8_t> block;
      for (uint64_t at = 0; at < r.size; at += block.size()) {
        block.resize(static_cast<size_t>(std::min<uint64_t>(r.size - at, 8u << 20)));
        Read(file, r.offset + at, block.size(), block.data());
        crc = pt::Crc32(crc, block);
      }
      if (crc != r.crc32) throw pt::CrcMismatch(source::FileWhere(L_, file), r.name, r.crc32, crc, "", "nothing was converted");
    }
  }

 private:
  static constexpr size_t kOpen = 4;
  const MappedFile& At(int file) {
    auto it = std::find_if(open_.begin(), open_.end(), [&](const auto& o) { return o.first == file; });
    if (it == open_.end()) {
      if (open_.size() == kOpen) open_.pop_back();
      open_.emplace_back(file, MappedFile::Open(static_cast<size_t>(file) < L_.files.size() ? L_.dir + "/" + L_.files[static_cast<size_t>(file)].name
                                                                                          : L_.copy_files[static_cast<size_t>(file) - L_.files.size()],
                                                /*keep_read_fd=*/true));
      it = std::prev(open_.end());
    }
    std::rotate(open_.begin(), it, std::next(it));  // the last read first
    return *open_.front().second;
  }
  const SourceIndex& L_;
  std::vector<std::pair<int, std::shared_ptr<MappedFile>>> open_;  // the last read first
};

// How far a copy is from its master: the elements whose bits differ from the rounded master, and
// the largest difference between the copy's value and the master's.
struct Difference {
  int64_t elements = 0;
  double largest = 0;
};

void Compare(const float* master, const uint8_t* copy, pt::DType dtype, int64_t n, Difference& d) {
  const auto count = static_cast<size_t>(n);
  if (dtype == pt::DType::F32 && std::memcmp(master, copy, count * 4) == 0) return;
  uint16_t rounded[kBlock];
  for (size_t b = 0; b < count; b += kBlock) {  // a block at a time, rounded and compared while it is in the cache
    const size_t m = std::min(kBlock, count - b);
    if (dtype != pt::DType::F32) {
      if (dtype == pt::DType::BF16) pt::Fp32ToBf16(master + b, rounded, m);
      else pt::Fp32ToFp16(master + b, rounded, m);
      if (std::memcmp(rounded, copy + 2 * b, m * 2) == 0) continue;
    }
    for (size_t i = b; i < b + m; ++i) {
      float value;
      bool differs;
      if (dtype == pt::DType::F32) {
        std::memcpy(&value, copy + 4 * i, 4);
        differs = std::memcmp(&value, master + i, 4) != 0;
      } else {
        uint16_t bits;
        std::memcpy(&bits, copy + 2 * i, 2);
        differs = bits != rounded[i - b];
        value = dtype == pt::DType::BF16 ? pt::Bf16ToFp32(bits) : pt::Fp16ToFp32(bits);
      }
      if (!differs) continue;
      ++d.elements;
      const double gap = std::fabs(static_cast<double>(value) - static_cast<double>(master[i]));
      d.largest = std::isnan(gap) ? INFINITY : std::max(d.largest, gap);
    }
  }
}

// What disagrees in each file, in int64s that add across ranks: a data file is checked by one rank,
// the others add zeros, so the sum is that rank's finding, the same on every rank; a weight file's
// copies are compared by the ranks of the data files holding their masters, and their counts add.
// kParams: the fragments (of parameters) that disagree; kAgreed: those that agree.
enum Field { kParams, kAgreed, kElements, kLargestBits, kWorstParam, kWorstWeightFile, kFields };
using Verdicts = std::vector<int64_t>;  // kFields per file of SourceIndex::files

int64_t& At(Verdicts& v, int file, Field f) { return v[static_cast<size_t>(file) * kFields + f]; }
int64_t At(const Verdicts& v, int file, Field f) { return v[static_cast<size_t>(file) * kFields + f]; }
double Largest(const Verdicts& v, int file) {
  double d;
  const int64_t bits = At(v, file, kLargestBits);
  std::memcpy(&d, &bits, 8);
  return d;
}

// A file's name in the shard folder, or a copy file's path.
std::string NameOf(const SourceIndex& L, int file) {
  const auto f = static_cast<size_t>(file);
  return f < L.files.size() ? L.files[f].name : L.copy_files[f - L.files.size()];
}

std::string Names(const SourceIndex& L, const std::vector<int>& files) {
  std::string s;
  for (size_t i = 0; i < files.size() && i < 3; ++i) s += (i ? ", " : "") + NameOf(L, files[i]);
  return s + (files.size() > 3 ? ", ... (" + std::to_string(files.size()) + " files)" : "");
}

// The fault, said of the odd files: a weight file none of whose weights any master gives (a file of
// another layer, rank or run), while others at its (pp, tp) agree; where every weight file at a
// (pp, tp) disagrees somewhere, and so does every optimizer file there, either side may be foreign (TP ranks' files swapped: the contents
// cannot tell which) and both are named, where every optimizer file there disagrees too; else the
// optimizer files whose masters disagree.
std::string Message(const SourceIndex& L, const Verdicts& v) {
  auto bad = [&](int f) { return At(v, f, kParams) > 0; };
  if (!L.on_grid) {  // a DCP: the model's tensors and the optimizer's masters lie side by side, in the same files
    std::vector<int> odd;  // the files whose masters were found to disagree (a file holding only copies has no worst parameter)
    int64_t elements = 0;
    for (size_t f = 0; f < L.files.size(); ++f)
      if (L.files[f].data && At(v, static_cast<int>(f), kElements) > 0 && At(v, static_cast<int>(f), kWorstParam) > 0)
        odd.push_back(static_cast<int>(f)), elements += At(v, static_cast<int>(f), kElements);
    if (odd.empty()) return "the optimizer's fp32 master weights disagree with the model's own tensors saved beside them";
    int worst = odd.front();
    for (int f : odd)
      if (Largest(v, f) > Largest(v, worst)) worst = f;
    char largest[32];
    std::snprintf(largest, sizeof largest, "%.3g", Largest(v, worst));
    return "the optimizer's fp32 master weights in " + Names(L, odd) + " disagree with the model's own tensors saved beside them (" +
           std::to_string(elements) + " element(s); '" + L.params[static_cast<size_t>(At(v, worst, kWorstParam) - 1)].name + "' by up to " +
           largest + "): the checkpoint stores each weight twice and the two differ, so its optimizer state is not its model's. Its "
           "files are of different saves or ranks (swapped or renamed: put back the files the save wrote), or the save wrote the "
           "state wrongly" + (L.format == "dcp" ? " (Megatron-Core 0.17.1's fully_reshardable form does, for the distributed optimizer "
                                                  "with several gradient buckets; its default dp_reshardable form does not)" : std::string()) +
           ": convert another save";
  }
  std::map<int, std::vector<int>> data_of;                   // weight file -> the data files holding its masters
  std::map<std::pair<int, int>, std::set<int>> weights_at;   // (pp, tp) -> its weight files
  std::map<std::tuple<int, int, int>, int> copy_file;        // (param, pp, tp) -> weight file
  for (const auto& c : L.weight_copies) copy_file[{c.param, c.pp, c.tp}] = c.file, weights_at[{c.pp, c.tp}].insert(c.file);
  for (const auto& fr : L.fragments) {
    const auto it = copy_file.find({fr.param, L.files[static_cast<size_t>(fr.file)].pp, L.CopyTp(fr)});
    if (it == copy_file.end()) continue;
    auto& list = data_of[it->second];
    if (std::find(list.begin(), list.end(), fr.file) == list.end()) list.push_back(fr.file);
  }
  std::vector<int> odd_weights, odd_data, both_weights, both_data;
  for (const auto& [at, weights] : weights_at) {
    std::vector<int> data;  // the data files at this (pp, tp)
    for (int w : weights)
      for (int f : data_of[w])
        if (std::find(data.begin(), data.end(), f) == data.end()) data.push_back(f);
    const bool every = std::all_of(weights.begin(), weights.end(), bad) && std::all_of(data.begin(), data.end(), bad);
    for (int w : weights)
      if (!every && bad(w) && At(v, w, kAgreed) == 0) odd_weights.push_back(w);
    if (every && both_weights.empty()) both_weights.assign(weights.begin(), weights.end()), both_data = data;
  }
  for (size_t f = 0; f < L.files.size(); ++f)
    if (L.files[f].data && bad(static_cast<int>(f))) odd_data.push_back(static_cast<int>(f));
  if (!odd_weights.empty()) both_weights.clear(), both_data.clear();
  const int first = both_data.empty() ? odd_data.front() : both_data.front();
  char largest[32];
  std::snprintf(largest, sizeof largest, "%.3g", Largest(v, first));
  const std::string example = "'" + L.params[static_cast<size_t>(At(v, first, kWorstParam) - 1)].name + "' by up to " + largest;
  std::string s;
  const int outside = static_cast<int>(L.files.size());  // the first copy file outside the shard folder
  if (!both_weights.empty() && both_weights.front() >= outside) {
    s = "the fp32 master weights in " + L.dir + "/" + Names(L, both_data) + " disagree with " + Names(L, both_weights) +
        ", the copy of every weight gathered when the checkpoint was saved (" + example + "): the optimizer files are "
        "swapped between DP ranks or renamed, or they and the weights are of different saves";
  } else if (!odd_weights.empty()) {
    s = "the model's own weights in " + L.dir + "/" + Names(L, odd_weights) + " disagree with the fp32 master weights of " +
        "every optimizer file that holds them (" + Names(L, data_of[odd_weights.front()]) + "; " + example +
        "), not one of them equal, while the other weight files there agree: " + (odd_weights.size() > 1 ? "these files are the odd ones" : "this file is the odd one");
  } else if (!both_weights.empty()) {
    const source::ShardFile& d = L.files[static_cast<size_t>(first)];
    s = "at (pp=" + std::to_string(d.pp) + ", tp=" + std::to_string(d.tp) + ") the model's own weights in " + L.dir + "/" +
        Names(L, both_weights) + " and the fp32 master weights of every optimizer file there (" + Names(L, both_data) + "; " +
        example + ") disagree: one side is another rank's, save's or run's (TP ranks' files swapped or renamed?), and "
        "their contents cannot tell which";
  } else {
    s = "the fp32 master weights in " + source::FileWhere(L, first) + " disagree with the model's own weights in " +
        NameOf(L, static_cast<int>(At(v, first, kWorstWeightFile) - 1)) + " (" + std::to_string(At(v, first, kParams)) +
        " parameter(s), " + std::to_string(At(v, first, kElements)) + " element(s); " + example + ")" +
        (odd_data.size() > 1 ? ", and so do those of " + Names(L, {odd_data.begin() + 1, odd_data.end()}) : "") +
        ": " + (odd_data.size() > 1 ? "these files are the odd ones" : "this file is the odd one");
  }
  return s + ": a value the checkpoint stores twice differs, so its files come from different saves, ranks or runs; "
             "put back the files the save wrote (swapped ones swapped back), or convert another save";
}

// A chunk of one fragment's masters and the copy's elements they must give; with no copy, masters
// read only for the CRC-32 of the record they lie in (a fragment the module keeps no copy of, e.g. a
// pipeline's tied embedding on its last stage, in a record with fragments that have one).
struct Unit {
  const source::Fragment* fragment;
  const WeightCopy* copy;  // nullptr: CRC-32 only
  uint64_t masters;  // file offset of the fragment's group's fp32 partition
  int64_t at, n;     // elements [at, at + n) of the fragment
  int64_t copy_at;   // the copy's element that element `at` must give
};

// Each unit compared, by `threads` threads taking units in turn (the bytes are in the page cache
// or on a disk that serves several readers: memory bandwidth is the bound, not one core); the CRC-32
// of each unit's master bytes into crc[u].
std::vector<Difference> CompareUnits(const SourceIndex& L, const std::vector<Unit>& units, int threads, std::vector<uint32_t>& crc) {
  std::vector<Difference> diff(units.size());
  crc.assign(units.size(), 0);
  std::atomic<size_t> next{0};
  std::vector<std::exception_ptr> failed(static_cast<size_t>(std::max(1, threads)));
  auto work = [&](size_t t) {
    try {
      Files files(L);
      std::vector<float> master;
      std::vector<uint8_t> copy;
      for (size_t u = next++; u < units.size(); u = next++) {
        const Unit& w = units[u];
        const size_t n = static_cast<size_t>(w.n);
        master.resize(n);
        files.Read(w.fragment->file, w.masters + 4 * static_cast<uint64_t>(w.fragment->src_start + w.at), n * 4, master.data());
        crc[u] = pt::Crc32(0, {reinterpret_cast<const uint8_t*>(master.data()), n * 4});
        if (!w.copy) continue;
        const size_t es = pt::ElementSize(w.copy->dtype);
        copy.resize(n * es);
        files.Read(w.copy->file, w.copy->offset + es * static_cast<uint64_t>(w.copy_at), n * es, copy.data());
        Compare(master.data(), copy.data(), w.copy->dtype, w.n, diff[u]);
      }
    } catch (...) {
      failed[t] = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < failed.size(); ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& th : pool) th.join();
  for (const auto& e : failed)
    if (e) std::rethrow_exception(e);
  return diff;
}

// The records of data file `file` that this rank's master runs lie in whose CRC-32 the runs (crc of
// their bytes) and the record's other bytes, read here, give: flags[k] = 1 for its k-th checksummed
// record. A record a run crosses the end of, or whose runs overlap, is left unverified.
void VerifyRecords(const SourceIndex& L, int file, std::vector<std::tuple<uint64_t, uint64_t, uint32_t>> runs, int64_t* flags) {
  std::sort(runs.begin(), runs.end());
  const auto& records = L.files[static_cast<size_t>(file)].checksummed;
  Files files(L);
  std::vector<uint8_t> gap;
  size_t next = 0;
  for (size_t k = 0; k < records.size(); ++k) {
    const auto& r = records[k];
    while (next < runs.size() && std::get<0>(runs[next]) < r.offset) ++next;
    if (next == runs.size() || std::get<0>(runs[next]) >= r.offset + r.size) continue;  // no run in it
    uint64_t at = r.offset;
    uint32_t crc = 0;
    bool ok = true;
    auto add_gap = [&](uint64_t end) {
      for (; at < end;) {
        gap.resize(static_cast<size_t>(std::min<uint64_t>(end - at, 4 * kChunk)));
        files.Read(file, at, gap.size(), gap.data());
        crc = static_cast<uint32_t>(crc32_combine64(crc, pt::Crc32(0, gap), static_cast<z_off64_t>(gap.size())));
        at += gap.size();
      }
    };
    for (; next < runs.size() && std::get<0>(runs[next]) < r.offset + r.size; ++next) {
      const auto [pos, len, part] = runs[next];
      if (pos < at || pos + len > r.offset + r.size) {
        ok = false;
        break;
      }
      add_gap(pos);
      crc = static_cast<uint32_t>(crc32_combine64(crc, part, static_cast<z_off64_t>(len)));
      at = pos + len;
    }
    if (!ok) continue;
    add_gap(r.offset + r.size);
    if (crc == r.crc32) flags[k] = 1;
  }
}

}  // namespace

std::string CheckWeightCopies(const SourceIndex& L, shuffle::Comm& comm, int threads, std::vector<std::vector<char>>* verified) {
  if (L.weight_copies.empty()) return "";
  std::map<std::tuple<int, int, int>, const WeightCopy*> copy_of;  // (param, pp, tp)
  std::map<std::pair<int, int>, std::vector<const WeightCopy*>> slot_copies;  // (data file, slot): a DCP's copies
  for (const auto& c : L.weight_copies)
    if (c.slot_file >= 0) slot_copies[{c.slot_file, c.slot_group}].push_back(&c);
    else copy_of[{c.param, c.pp, c.tp}] = &c;
  std::map<int, int> checker;  // data file -> the rank that checks it, dealt in turn
  for (size_t fi = 0, k = 0; fi < L.files.size(); ++fi)
    if (L.files[fi].data) checker[static_cast<int>(fi)] = static_cast<int>(k++ % static_cast<size_t>(comm.size()));
  std::vector<Unit> units;  // this rank's share, in chunks
  std::set<int> compared;     // the data files with a unit that has a copy
  std::vector<const source::Fragment*> uncopied;  // this rank's fragments of masters without a copy
  for (const auto& fr : L.fragments) {
    if (checker[fr.file] != comm.rank()) continue;
    const source::ShardFile& f = L.files[static_cast<size_t>(fr.file)];
    const source::Extent& m = f.groups[static_cast<size_t>(fr.group)][0];
    if (m.file >= 0) continue;  // masters that are the weights themselves
    if (auto slot = slot_copies.find({fr.file, fr.group}); slot != slot_copies.end()) {
      for (const WeightCopy* c : slot->second) {  // the copies of the slot's elements this fragment holds
        const int64_t a = std::max(fr.src_start, c->slot_start), b = std::min(fr.src_start + fr.numel, c->slot_start + c->numel);
        for (int64_t at = a; at < b; at += kChunk)
          units.push_back({&fr, c, m.offset, at - fr.src_start, std::min(kChunk, b - at), at - c->slot_start});
        if (a < b) compared.insert(fr.file);
      }
      continue;
    }
    const auto it = copy_of.find({fr.param, f.pp, L.CopyTp(fr)});
    if (it == copy_of.end()) {  // no copy
      uncopied.push_back(&fr);
      continue;
    }
    if (fr.dst_start < 0 || fr.dst_start + fr.numel > it->second->numel) continue;  // the index's coverage check says so
    for (int64_t at = 0; at < fr.numel; at += kChunk)
      units.push_back({&fr, it->second, m.offset, at, std::min(kChunk, fr.numel - at), fr.dst_start + at});
    compared.insert(fr.file);
  }
  // The masters without a copy in the files read here, read on the threads too for the CRC-32 of
  // their records (else read by VerifyRecords as a gap, on one thread); the per-fragment verdicts
  // below skip them.
  if (verified)
    for (const source::Fragment* fr : uncopied)
      if (compared.count(fr->file))
        for (int64_t at = 0; at < fr->numel; at += kChunk)
          units.push_back({fr, nullptr, L.files[static_cast<size_t>(fr->file)].groups[static_cast<size_t>(fr->group)][0].offset, at,
                           std::min(kChunk, fr->numel - at), 0});
  // Every rank reaches the sum below, whatever it found: a damaged record is thrown after it. After the
  // verdicts and the damage flag, one slot per checksummed record of every file: verified (VerifyRecords).
  std::string damage;
  const size_t verdicts = (L.files.size() + L.copy_files.size()) * kFields + 1;
  std::vector<size_t> first_record(L.files.size() + 1, verdicts);
  for (size_t f = 0; f < L.files.size(); ++f) first_record[f + 1] = first_record[f] + L.files[f].checksummed.size();
  Verdicts v(first_record.back(), 0);
  const size_t damaged = verdicts - 1;
  try {
    std::vector<uint32_t> crc;
    const std::vector<Difference> diff = CompareUnits(L, units, threads, crc);
    if (verified) {  // per data file, its master runs: (file offset, bytes, CRC-32)
      std::map<int, std::vector<std::tuple<uint64_t, uint64_t, uint32_t>>> runs;
      for (size_t u = 0; u < units.size(); ++u)
        runs[units[u].fragment->file].emplace_back(units[u].masters + 4 * static_cast<uint64_t>(units[u].fragment->src_start + units[u].at),
                                                   4 * static_cast<uint64_t>(units[u].n), crc[u]);
      for (auto& [file, list] : runs) VerifyRecords(L, file, std::move(list), v.data() + first_record[static_cast<size_t>(file)]);
    }
    for (size_t u = 0; u < units.size();) {  // per fragment and copy
      if (!units[u].copy) {
        ++u;
        continue;
      }
      const size_t first = u;
      const source::Fragment& fr = *units[u].fragment;
      const WeightCopy& c = *units[u].copy;
      Difference d;
      int64_t n = 0;
      for (; u < units.size() && units[u].fragment == &fr && units[u].copy == &c; ++u)
        d.elements += diff[u].elements, d.largest = std::max(d.largest, diff[u].largest), n += units[u].n;
      if (d.elements == 0) {
        At(v, fr.file, kAgreed) += 1, At(v, c.file, kAgreed) += 1;
        continue;
      }
      // A damaged byte is damage, said as such, before the copies are said to come from elsewhere.
      const size_t es = pt::ElementSize(c.dtype);
      Files files(L);
      files.CheckRecords(fr.file, units[first].masters + 4 * static_cast<uint64_t>(fr.src_start + units[first].at), 4 * static_cast<uint64_t>(n));
      files.CheckRecords(c.file, c.offset + es * static_cast<uint64_t>(units[first].copy_at), es * static_cast<uint64_t>(n));
      At(v, fr.file, kParams) += 1, At(v, fr.file, kElements) += d.elements, At(v, c.file, kParams) += 1;
      if (d.largest > Largest(v, fr.file) || At(v, fr.file, kWorstParam) == 0) {
        std::memcpy(&At(v, fr.file, kLargestBits), &d.largest, 8);
        At(v, fr.file, kWorstParam) = fr.param + 1, At(v, fr.file, kWorstWeightFile) = c.file + 1;
      }
    }
  } catch (const std::exception& e) {
    damage = e.what();
    v[damaged] = 1;
  }
  comm.AllreduceSum(v);
  if (!damage.empty()) throw Error(damage);
  if (v[damaged] > 0) return "";  // another rank found damage: its error says it
  if (verified) {
    verified->assign(L.files.size(), {});
    for (size_t f = 0; f < L.files.size(); ++f)
      for (size_t k = first_record[f]; k < first_record[f + 1]; ++k) (*verified)[f].push_back(v[k] > 0 ? 1 : 0);
  }
  for (size_t f = 0; f < L.files.size(); ++f)
    if (At(v, static_cast<int>(f), kElements) > 0) return Message(L, v);  // a data file's elements: the copy files' add none
  return "";
}

}  // namespace ucp::map
