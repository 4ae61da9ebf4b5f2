// Who reads what: every piece's mapper, the bytes each rank reads, and the records several ranks
// read parts of (their CRC-32s are combined across ranks before the first round).
#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "plan/convert_plan.h"

namespace fs = std::filesystem;

namespace ucp::plan {

namespace {

// The rank whose even share of `total` bytes holds byte `pos`.
int RankAt(int64_t pos, int64_t total, int ranks) {
  if (total <= 0) return 0;
  return static_cast<int>(std::min<__int128>(ranks - 1, static_cast<__int128>(pos) * ranks / total));
}

// A piece and the parameter it is of.
struct Owned {
  size_t param = 0;
  Piece piece;
};

// A run of a record's bytes one mapper reads.
struct Span {
  uint64_t begin = 0, end = 0;
  int mapper = -1;
};

// Every piece of a file (at `before` bytes into the `total` of all data files, `size` its own) cut
// where the file's bytes cross from one rank's share into the next: the elements of the file, in
// (group, src_start) order, stand for equal parts of its bytes. A run at either end of the file of
// less than a quarter of `cut_above` bytes goes to its neighbour instead: a sliver is not worth a
// rank's share of the record's checks.
void CutFile(std::vector<Owned>& pieces, int64_t before, int64_t size, int64_t total, int ranks, int64_t cut_above,
             std::vector<Owned>& out) {
  std::sort(pieces.begin(), pieces.end(), [](const Owned& a, const Owned& b) {
    return std::tie(a.piece.group, a.piece.src_start) < std::tie(b.piece.group, b.piece.src_start);
  });
  int64_t elems = 0;
  for (const auto& o : pieces) elems += o.piece.numel;
  auto rank_of = [&](int64_t e) {  // the rank whose share holds element e of the file
    return RankAt(before + static_cast<int64_t>(static_cast<__int128>(size) * e / std::max<int64_t>(1, elems)), total, ranks);
  };
  std::vector<std::pair<int64_t, int>> runs;  // (first element, rank), in order
  for (int64_t e = 0; e < elems;) {
    const int r = rank_of(e);
    int64_t lo = e + 1, hi = elems;  // the first element past `e` of another rank (or the end)
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (rank_of(mid) == r) lo = mid + 1;
      else hi = mid;
    }
    runs.push_back({e, r});
    e = lo;
  }
  const int64_t sliver = static_cast<int64_t>(static_cast<__int128>(elems) * (cut_above / 4) / std::max<int64_t>(1, size));
  if (runs.size() > 1 && runs[1].first < sliver) runs.erase(runs.begin()), runs[0].first = 0;
  if (runs.size() > 1 && elems - runs.back().first < sliver) runs.pop_back();
  int64_t at = 0;  // the file element the piece starts at
  size_t k = 0;    // the run holding element `at`
  for (const Owned& o : pieces) {
    for (int64_t a = 0; a < o.piece.numel;) {
      while (k + 1 < runs.size() && runs[k + 1].first <= at + a) ++k;
      const int64_t upto = std::min(o.piece.numel, (k + 1 < runs.size() ? runs[k + 1].first : elems) - at);
      Owned q = o;
      q.piece.src_start += a, q.piece.stream_start += a, q.piece.numel = upto - a, q.piece.mapper = runs[k].second;
      out.push_back(q);
      a = upto;
    }
    at += o.piece.numel;
  }
}

// The bytes of state `s` of piece `pc`: (the file holding them, [begin, end)); file -1 when the
// index has no such group (the mapper refuses it by name when it reads it).
std::tuple<int, uint64_t, uint64_t> PieceBytes(const source::SourceIndex& L, const Piece& pc, int s) {
  const auto& groups = L.files[pc.file].groups;
  if (pc.group < 0 || pc.group >= static_cast<int>(groups.size())) return {-1, 0, 0};
  const auto& t = groups[pc.group][s];
  const uint64_t begin = t.offset + 4 * static_cast<uint64_t>(pc.src_start);
  return {t.file >= 0 ? t.file : pc.file, begin, begin + 4 * static_cast<uint64_t>(pc.numel)};
}

// Who checks each record the pieces lie in: one mapper reads it whole; several mappers reading
// runs of it in rank order each check a range (from its first byte to the next one's, the first
// from the record's start, the last to its end); where their runs interleave, each reads it whole.
void ShareRecords(const source::SourceIndex& L, ConvertPlan& plan) {
  std::map<std::pair<int, int>, std::vector<Span>> spans;  // (file, record) -> runs read
  for (const auto& P : plan.params)
    for (const auto& pc : P.pieces)
      for (int s = 0; s < plan.states; ++s) {
        // no structured binding: clang's lambdas cannot capture one
        const auto bytes = PieceBytes(L, pc, s);
        const int file = std::get<0>(bytes);
        const uint64_t begin = std::get<1>(bytes), end = std::get<2>(bytes);
        if (file < 0 || begin == end) continue;
        const auto& recs = L.files[file].checksummed;
        // The records overlapping [begin, end): the first whose end is past `begin`, on.
        auto it = std::partition_point(recs.begin(), recs.end(), [&](const auto& r) { return r.offset + r.size <= begin; });
        for (; it != recs.end() && it->offset < end; ++it)
          spans[{file, static_cast<int>(it - recs.begin())}].push_back(
              {std::max(begin, it->offset), std::min(end, it->offset + it->size), pc.mapper});
      }
  plan.mapped_bytes.assign(plan.ranks, 0);
  plan.shared_records.clear();
  for (auto& [key, list] : spans) {
    const auto& rec = L.files[key.first].checksummed[key.second];
    std::sort(list.begin(), list.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
    std::vector<Span> runs;  // consecutive spans of one mapper joined
    for (const auto& sp : list) {
      if (!runs.empty() && runs.back().mapper == sp.mapper) runs.back().end = std::max(runs.back().end, sp.end);
      else runs.push_back(sp);
    }
    std::set<int> mappers;
    for (const auto& r : runs) mappers.insert(r.mapper);
    if (mappers.size() == 1 || mappers.size() != runs.size()) {
      for (int m : mappers) plan.mapped_bytes[m] += static_cast<int64_t>(rec.size);
      continue;
    }
    SharedRecord shared{key.first, key.second, {}};
    for (size_t i = 0; i < runs.size(); ++i) {
      const uint64_t begin = i == 0 ? rec.offset : runs[i].begin;
      const uint64_t end = i + 1 == runs.size() ? rec.offset + rec.size : runs[i + 1].begin;
      shared.ranges.push_back({runs[i].mapper, begin, end});
      plan.mapped_bytes[runs[i].mapper] += static_cast<int64_t>(end - begin);
    }
    plan.shared_records.push_back(std::move(shared));
  }
}

}  // namespace

void AssignMappers(const source::SourceIndex& L, ConvertPlan& plan) {
  const int ranks = plan.ranks;
  std::map<int, std::vector<Owned>> of_file;  // each data file's pieces
  for (size_t p = 0; p < plan.params.size(); ++p) {
    for (const auto& pc : plan.params[p].pieces) of_file[pc.file].push_back({p, pc});
    plan.params[p].pieces.clear();
  }
  std::vector<int> files;
  for (const auto& [f, list] : of_file) files.push_back(f);
  std::sort(files.begin(), files.end(), [&](int a, int b) {
    const auto &fa = L.files[a], &fb = L.files[b];
    return std::tie(fa.pp, fa.tp, fa.dp, a) < std::tie(fb.pp, fb.tp, fb.dp, b);
  });
  std::vector<int64_t> sizes;
  int64_t total = 0;
  for (int f : files) {
    std::error_code ec;
    auto size = fs::file_size(L.dir + "/" + L.files[f].name, ec);
    sizes.push_back(ec ? 0 : static_cast<int64_t>(size));
    total += sizes.back();
  }
  std::vector<Owned> placed;
  int64_t before = 0;
  for (size_t k = 0; k < files.size(); ++k) {
    auto& list = of_file[files[k]];
    if (ranks > 1 && plan.cut_above > 0 && sizes[k] > plan.cut_above && total > 0) {
      CutFile(list, before, sizes[k], total, ranks, plan.cut_above, placed);
    } else {
      // The rank whose even share holds this file's middle byte (files of no size: by count).
      const double middle = total > 0 ? (before + sizes[k] / 2.0) / static_cast<double>(total)
                                      : (k + 0.5) / static_cast<double>(files.size());
      const int r = std::min(ranks - 1, static_cast<int>(middle * ranks));
      for (auto o : list) o.piece.mapper = r, placed.push_back(o);
    }
    before += sizes[k];
  }
  for (const auto& o : placed) plan.params[o.param].pieces.push_back(o.piece);
  for (auto& P : plan.params)
    std::sort(P.pieces.begin(), P.pieces.end(), [](const Piece& a, const Piece& b) { return a.stream_start < b.stream_start; });
  ShareRecords(L, plan);
}

std::vector<int> ConvertPlan::FilesMappedBy(int rank) const {
  std::set<int> files;
  for (const auto& P : params)
    for (const auto& pc : P.pieces)
      if (pc.mapper == rank) files.insert(pc.file);
  return {files.begin(), files.end()};
}

size_t ConvertPlan::SharedRanges() const {
  size_t n = 0;
  for (const auto& r : shared_records) n += r.ranges.size();
  return n;
}

double ConvertPlan::ReadImbalance() const {
  int64_t total = 0, most = 0;
  for (int64_t b : mapped_bytes) total += b, most = std::max(most, b);
  return total ? static_cast<double>(most) * ranks / static_cast<double>(total) : 1.0;
}

}  // namespace ucp::plan
