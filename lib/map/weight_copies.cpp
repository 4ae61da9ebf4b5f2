#include "map/weight_copies.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "core/mapped_file.h"
#include "pt/low_precision.h"
#include "pt/zip_archive.h"

namespace ucp::map {
namespace {

using source::SourceIndex;
using source::WeightCopy;

constexpr int64_t kChunk = int64_t{1} << 20;  // elements compared at once: 4 MiB of masters

// The files a check reads, opened once, read by pread (nothing stays resident).
class Files {
 public:
  explicit Files(const SourceIndex& L) : L_(L) {}
  void Read(int file, uint64_t offset, size_t n, void* dst) { At(file).ReadAt(offset, n, dst); }
  // Checks the zip CRC-32 of every record that bytes [pos, pos + len) of `file` lie in.
  void CheckRecords(int file, uint64_t pos, uint64_t len) {
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
  const MappedFile& At(int file) {
    auto& m = open_[file];
    if (!m) m = MappedFile::Open(L_.dir + "/" + L_.files[static_cast<size_t>(file)].name);
    return *m;
  }
  const SourceIndex& L_;
  std::map<int, std::shared_ptr<MappedFile>> open_;
};

float HalfToFloat(uint16_t h) {
  const int exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  const float sign = (h & 0x8000) ? -1.0f : 1.0f;
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), -24);
  if (exponent == 31) return mantissa ? NAN : sign * INFINITY;
  return sign * std::ldexp(static_cast<float>(mantissa | 0x400), exponent - 25);
}

// How far a copy is from its master: the elements whose bits differ from the rounded master, and
// the largest difference between the copy's value and the master's.
struct Difference {
  int64_t elements = 0;
  double largest = 0;
};

void Compare(const float* master, const uint8_t* copy, pt::DType dtype, int64_t n, std::vector<uint16_t>& rounded,
             Difference& d) {
  const auto count = static_cast<size_t>(n);
  if (dtype == pt::DType::F32 && std::memcmp(master, copy, count * 4) == 0) return;
  if (dtype != pt::DType::F32) {
    rounded.resize(count);
    if (dtype == pt::DType::BF16) pt::Fp32ToBf16(master, rounded.data(), count);
    else pt::Fp32ToFp16(master, rounded.data(), count);
    if (std::memcmp(rounded.data(), copy, count * 2) == 0) return;
  }
  for (size_t i = 0; i < count; ++i) {
    float value;
    bool differs;
    if (dtype == pt::DType::F32) {
      std::memcpy(&value, copy + 4 * i, 4);
      differs = std::memcmp(&value, master + i, 4) != 0;
    } else {
      uint16_t bits;
      std::memcpy(&bits, copy + 2 * i, 2);
      differs = bits != rounded[i];
      const uint32_t wide = uint32_t{bits} << 16;
      if (dtype == pt::DType::BF16) std::memcpy(&value, &wide, 4);
      else value = HalfToFloat(bits);
    }
    if (!differs) continue;
    ++d.elements;
    const double gap = std::fabs(static_cast<double>(value) - static_cast<double>(master[i]));
    d.largest = std::isnan(gap) ? INFINITY : std::max(d.largest, gap);
  }
}

// What disagrees in one data file: its masters against the weight files' copies.
struct Disagreement {
  std::set<int> weight_files;
  int64_t params = 0, elements = 0;
  std::string worst;  // the parameter of the largest difference
  double largest = -1;
};

std::string Message(const SourceIndex& L, const std::map<int, Disagreement>& found) {
  const auto& [file, first] = *found.begin();
  std::string weights;
  for (int w : first.weight_files) weights += (weights.empty() ? "" : ", ") + L.files[static_cast<size_t>(w)].name;
  char largest[32];
  std::snprintf(largest, sizeof largest, "%.3g", first.largest);
  std::string s = "the fp32 master weights in " + source::FileWhere(L, file) + " disagree with the model's own weights in " +
                  weights + " (" + std::to_string(first.params) + " parameter(s), " + std::to_string(first.elements) +
                  " element(s); '" + first.worst + "' by up to " + largest + ")";
  if (found.size() > 1) {
    s += ", and so do those of " + std::to_string(found.size() - 1) + " more file(s) (";
    int listed = 0;
    for (auto it = std::next(found.begin()); it != found.end() && listed < 3; ++it, ++listed)
      s += (listed ? ", " : "") + L.files[static_cast<size_t>(it->first)].name;
    s += found.size() > 4 ? ", ...)" : ")";
  }
  return s + ": a value the checkpoint stores twice differs, so its files come from different saves, ranks or runs "
             "(swapped, renamed or copied in from elsewhere); nothing was converted";
}

// A chunk of one fragment's masters and the copy's elements they must give.
struct Unit {
  const source::Fragment* fragment;
  const WeightCopy* copy;
  uint64_t masters;  // file offset of the fragment's group's fp32 partition
  int64_t at, n;     // elements [at, at + n) of the fragment
};

// Each unit compared, by `threads` threads taking units in turn (the bytes are in the page cache
// or on a disk that serves several readers: memory bandwidth is the bound, not one core).
std::vector<Difference> CompareUnits(const SourceIndex& L, const std::vector<Unit>& units, int threads) {
  std::vector<Difference> diff(units.size());
  std::atomic<size_t> next{0};
  std::vector<std::exception_ptr> failed(static_cast<size_t>(std::max(1, threads)));
  auto work = [&](size_t t) {
    try {
      Files files(L);
      std::vector<float> master;
      std::vector<uint8_t> copy;
      std::vector<uint16_t> rounded;
      for (size_t u = next++; u < units.size(); u = next++) {
        const Unit& w = units[u];
        const size_t es = pt::ElementSize(w.copy->dtype), n = static_cast<size_t>(w.n);
        master.resize(n), copy.resize(n * es);
        files.Read(w.fragment->file, w.masters + 4 * static_cast<uint64_t>(w.fragment->src_start + w.at), n * 4, master.data());
        files.Read(w.copy->file, w.copy->offset + es * static_cast<uint64_t>(w.fragment->dst_start + w.at), n * es, copy.data());
        Compare(master.data(), copy.data(), w.copy->dtype, w.n, rounded, diff[u]);
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

}  // namespace

std::string CheckWeightCopies(const SourceIndex& L, int rank, int ranks, int threads) {
  if (L.weight_copies.empty()) return "";
  std::map<std::tuple<int, int, int>, const WeightCopy*> copy_of;  // (param, pp, tp)
  for (const auto& c : L.weight_copies) copy_of[{c.param, c.pp, c.tp}] = &c;
  std::map<int, int> checker;  // data file -> the rank that checks it, dealt in turn
  for (size_t fi = 0, k = 0; fi < L.files.size(); ++fi)
    if (L.files[fi].data) checker[static_cast<int>(fi)] = static_cast<int>(k++ % static_cast<size_t>(ranks));
  std::vector<Unit> units;  // this rank's share, in chunks
  for (const auto& fr : L.fragments) {
    if (checker[fr.file] != rank) continue;
    const source::ShardFile& f = L.files[static_cast<size_t>(fr.file)];
    const auto it = copy_of.find({fr.param, f.pp, L.CopyTp(fr)});
    const source::Extent& m = f.groups[static_cast<size_t>(fr.group)][0];
    if (it == copy_of.end() || m.file >= 0) continue;  // no copy; or masters that are the weights themselves
    if (fr.dst_start < 0 || fr.dst_start + fr.numel > it->second->numel) continue;  // the index's coverage check says so
    for (int64_t at = 0; at < fr.numel; at += kChunk) units.push_back({&fr, it->second, m.offset, at, std::min(kChunk, fr.numel - at)});
  }
  const std::vector<Difference> diff = CompareUnits(L, units, threads);
  std::map<int, Disagreement> found;  // data file -> what disagrees in it
  for (size_t u = 0; u < units.size();) {
    const source::Fragment& fr = *units[u].fragment;
    const WeightCopy& c = *units[u].copy;
    Difference d;
    for (; u < units.size() && units[u].fragment == &fr; ++u)
      d.elements += diff[u].elements, d.largest = std::max(d.largest, diff[u].largest);
    if (d.elements == 0) continue;
    // A damaged byte is damage, said as such, before the copies are said to come from elsewhere.
    const size_t es = pt::ElementSize(c.dtype);
    Files files(L);
    const uint64_t master = L.files[static_cast<size_t>(fr.file)].groups[static_cast<size_t>(fr.group)][0].offset;
    files.CheckRecords(fr.file, master + 4 * static_cast<uint64_t>(fr.src_start), 4 * static_cast<uint64_t>(fr.numel));
    files.CheckRecords(c.file, c.offset + es * static_cast<uint64_t>(fr.dst_start), es * static_cast<uint64_t>(fr.numel));
    Disagreement& p = found[fr.file];
    p.weight_files.insert(c.file);
    p.params += 1, p.elements += d.elements;
    if (d.largest > p.largest) p.largest = d.largest, p.worst = L.params[static_cast<size_t>(fr.param)].name;
  }
  return found.empty() ? "" : Message(L, found);
}

}  // namespace ucp::map
