// The conversion plan every rank computes from the index alone, identically and without talking
// to the others (DESIGN.md section 1): which rank maps which optimizer files, which rank reduces
// which (parameter, state) item, and where every source fragment lands in the atomic tensor.
//
// Coordinates. A parameter's *stream* is the concatenation of its copies: one TP-local tensor per
// (pp stage, tp rank) that holds it, flattened, in the order Place copies first, then the copies
// that are only compared (Replicate, tied across PP) or summed (Partial). Every fragment of every
// optimizer file is a run of that stream; the three states (fp32, exp_avg, exp_avg_sq) share it.
// A reducer's *work* is the concatenation of the streams of the items it owns; the shuffle moves
// it in rounds of at most `chunk_elems` elements per reducer, which bounds the bytes in flight.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "patterns/resolve.h"
#include "source/source_index.h"

namespace ucp::plan {

enum class State { Fp32 = 0, ExpAvg = 1, ExpAvgSq = 2 };
inline constexpr int kStates = 3;
std::string_view StateName(State s);  // "fp32", "exp_avg", "exp_avg_sq": the atomic file names

// Place: lands in the tensor. Compare: must equal what landed (TP-replicated copies). Accumulate:
// summed in (Partial). Observe: a pipeline-replicated (tied) parameter's copy on a later stage,
// which DeepSpeed ignores (only the tied weight is kept in sync): differences become a note.
enum class CopyMode { Place, Compare, Accumulate, Observe };

// Along the split dimension, local rows [local_start, +length) of a copy are joined rows
// [joined_start, +length) of the full (vocabulary-padded) tensor.
struct Block {
  int64_t local_start = 0, length = 0, joined_start = 0;
};

struct Copy {
  int pp = 0, tp = 0;
  CopyMode mode = CopyMode::Place;
  std::vector<int64_t> shape;  // TP-local
  int64_t numel = 0, stream_start = 0;
  int split_dim = -1;  // -1: the copy is the whole tensor
  std::vector<Block> blocks;
};

// A fragment in stream coordinates: stream[stream_start, +numel) = file's flat group tensor
// [src_start, +numel), read by rank `mapper` (AssignMappers).
struct Piece {
  int file = -1, group = 0;
  int64_t src_start = 0, numel = 0, stream_start = 0;
  int mapper = -1;
};

// A checksummed record that several mappers read parts of (a file cut between ranks): each reads
// and checks the CRC-32 of its own range, and the ranges' CRC-32s, combined in byte order, must
// give the record's before any of its bytes is used. A record one mapper reads, it checks whole.
struct SharedRecord {
  struct Range {
    int mapper = -1;
    uint64_t begin = 0, end = 0;  // file offsets
  };
  int file = -1;    // SourceIndex::files index of the file holding the record
  int record = -1;  // into that file's `checksummed`
  std::vector<Range> ranges;  // in byte order, tiling the record
};

struct ParamPlan {
  int index = -1;  // into SourceIndex::params and ModelPatterns::params
  std::string name;
  std::vector<int64_t> joined_shape;  // TP pieces joined, vocabulary padding still in
  std::vector<int64_t> full_shape;    // the atomic tensor
  int64_t full_numel = 0;
  std::vector<Copy> copies;
  int64_t stream_numel = 0;
  bool averaged = false;       // Partial model pattern: DeepSpeed's sum(copies) / len(copies), even at TP=1
  int accumulated_copies = 1;  // how many copies that mean divides by
  std::vector<Piece> pieces;   // sorted by stream_start; they tile the stream exactly
  std::array<int, kStates> reducer{};
  std::tuple<int, int, int> step_key;  // (pp, tp, group) of SourceIndex::steps

  // The copy that stream element `stream_pos` belongs to.
  const Copy& CopyAt(int64_t stream_pos) const;
  // Whether the copy holding `stream_pos` is placed as it is (Place, not averaged): its runs can be
  // read straight into the atomic tensor, without passing through a shuffle buffer.
  bool PlacedAsIs(int64_t stream_pos) const { return !averaged && CopyAt(stream_pos).mode == CopyMode::Place; }
  // The runs of the stream, (stream_start, numel) in stream order, that land in rows [row_begin,
  // row_end) of the atomic tensor (its dimension 0): one per copy, or per block of a copy split on
  // dimension 0. Every copy contributes, so that replicated copies are compared and partial ones summed.
  std::vector<std::pair<int64_t, int64_t>> RowSegments(int64_t row_begin, int64_t row_end) const;
  // Elements per row of the atomic tensor (1 for a 0-dim or 1-D one).
  int64_t RowNumel() const;
  // Rows [first, second) of the atomic tensor that part k of `parts` holds: even shares in order.
  std::pair<int64_t, int64_t> PartRows(int k, int parts) const {
    const int64_t rows = full_shape.empty() ? 1 : full_shape[0];
    return {rows * k / parts, rows * (k + 1) / parts};
  }
};

// What a reducer makes: one (parameter, state) of the atomic checkpoint, or, when the plan splits a
// large one, a part of it: rows [out_begin, + out_numel) in elements of the atomic tensor, written
// into the one file all parts share, assembled from `segments` of the stream.
struct Item {
  int param = -1;
  State state = State::Fp32;
  int64_t work_start = 0;  // in the reducer's work stream
  int part = 0, parts = 1;
  int64_t out_begin = 0, out_numel = 0;
  std::vector<std::pair<int64_t, int64_t>> segments;  // (stream_start, numel), in stream order
  int64_t numel = 0;                                  // stream elements: the segments' sum
  bool split() const { return parts > 1; }
};

// Every sub-run of item `it`'s stream elements [begin, end) (item-relative: 0 is its first segment's
// first element), as fn(piece, offset within the piece, numel, item-relative position of the run).
template <typename Fn>
void ForEachItemRun(const ParamPlan& param, const Item& it, int64_t begin, int64_t end, Fn&& fn);

struct ConvertPlan {
  int ranks = 1;
  // The states converted, the first `states` of State: kStates, or 1 for the fp32 weights alone (a
  // weights-only atomic checkpoint: no moment is read, checked or written).
  int states = kStates;
  // The shuffle's round: at most chunk_elems elements of each reducer's work, chosen as large as keeps
  // every rank's bytes in flight in every round (what it sends plus what it receives) within
  // buffer_bytes: fewer rounds are fewer collectives, which at hundreds of ranks cost more than the bytes.
  int64_t chunk_elems = 0, buffer_bytes = 0;
  int64_t split_above = 0;  // bytes: an item larger is split into parts of about this size (0: none)
  int64_t cut_above = 0;    // bytes: a data file larger is read by the ranks whose shares it spans (0: none)
  std::vector<ParamPlan> params;
  std::vector<SharedRecord> shared_records;  // records read by several mappers, by (file, record)
  std::vector<std::vector<Item>> work;    // per reducer, in processing order
  std::vector<int64_t> work_numel;        // per reducer
  std::vector<int64_t> mapped_bytes;      // per rank: checksummed bytes it reads (whole records, or its ranges)
  std::vector<int64_t> reduced_bytes;     // per rank: atomic tensor bytes it writes
  // The model-states files carried over as they are (DeepSpeed's universal loader reads them):
  // per SourceIndex::files index, the rank that copies it (-1: not carried); they count in the
  // balance of the reducers' work, as their bytes are read and written too.
  std::vector<int> file_carrier;
  std::vector<int64_t> carried_bytes;     // per rank
  int64_t rounds = 0;

  double Imbalance() const;      // max / mean of the bytes each rank writes (reduced and carried)
  double ReadImbalance() const;  // max / mean of mapped_bytes
  std::vector<int> FilesMappedBy(int rank) const;  // the data files `rank` reads pieces of
  size_t SharedRanges() const;   // the ranges of all shared records: the slots of their CRC-32s
  // Whether a run of `it` (reducer `reducer`'s item) at `off` elements into piece `pc` passes through
  // the shuffle buffers: all but those its reducer maps itself into a copy placed as it is, which go
  // straight from the file into the atomic tensor.
  bool Shuffled(int reducer, const Item& it, const Piece& pc, int64_t off) const {
    return !(pc.mapper == reducer && params[it.param].PlacedAsIs(pc.stream_start + off));
  }
  // The most bytes any rank has in flight in one round (sent plus received) with rounds of `chunk`
  // elements per reducer; -1 when that would take more than `max_cells` (rank, round) counters to tell.
  int64_t MaxInFlight(int64_t chunk, int64_t max_cells = int64_t{1} << 24) const;
  // Sets chunk_elems (and rounds) from buffer_bytes for the work as it is (MakeConvertPlan, SkipDone).
  void ChooseRounds();
  // Drops items already done (resume): done[param * kStates + state]. Work streams, the round
  // count and the byte counts are recomputed; every rank must pass the same flags.
  void SkipDone(const std::vector<char>& done);
  nlohmann::json ToJson(const source::SourceIndex& layout) const;
  std::string ToText() const;
};

// Throws ucp::Error with every reason the layout cannot be converted (shapes that do not add up,
// sub-parameter widths that do not divide, ...).
// `split_above`: a (parameter, state) of more bytes is split by rows into parts of at most that size
// (as many as it has rows and there are ranks), each reduced and written by its own rank; 0: none;
// < 0: automatic (AutoSplitBytes). `cut_above`: a data file of more bytes is cut between mappers
// (AssignMappers); 0: none; < 0: automatic, the same size.
ConvertPlan MakeConvertPlan(const source::SourceIndex& layout, const patterns::ModelPatterns& patterns, int ranks,
                            int64_t buffer_bytes, int64_t split_above = 0, int64_t cut_above = 0, int states = kStates);
// One parameter's plan (plan/param_plan.cpp): its copies in stream order, Place copies first, each
// with the blocks its split dimension joins at. Throws saying why its shapes do not join.
ParamPlan PlanParam(const source::SourceIndex& layout, const patterns::ModelPatterns& patterns, int index,
                    const patterns::ParamPattern& pattern);
// The automatic split size: a quarter of an even share of the bytes written per rank (an item of
// more would leave its rank's load lumpy), at most 1 GiB (a part is in memory twice while it is
// written), at least 64 MiB (smaller parts cost more in completing their files than they balance).
int64_t AutoSplitBytes(int64_t bytes_out, int ranks);

// Mappers (plan/mappers.cpp): every piece's reading rank, `mapped_bytes` and `shared_records`. The
// data files, in (pp, tp, dp) order, are cut at even shares of their bytes: a file of at most
// `cut_above` bytes (or any, when it is 0) goes whole to the rank whose share holds its middle byte;
// a larger one is cut between ranks at the share boundaries, its pieces split there.
void AssignMappers(const source::SourceIndex& layout, ConvertPlan& plan);

// Longest-processing-time-first assignment of weighted items to `bins`: returns each item's bin.
// Ties go to the lowest bin, so every rank computes the same answer.
std::vector<int> AssignLpt(const std::vector<int64_t>& weights, int bins);

// The same items, heaviest first, each to the bin of highest affinity(item, bin) > 0 whose load
// stays within (1 + slack) x an even share (or the heaviest item), else to the lightest bin. The
// bins start with loads `load` (one per bin).
std::vector<int> AssignLocal(const std::vector<int64_t>& weights, std::vector<int64_t> load,
                             const std::function<int64_t(size_t, int)>& affinity, double slack = 0.05);

// Every sub-run of `param`'s stream in [begin, end), as (piece, offset within the piece, numel).
template <typename Fn>
void ForEachPieceRun(const ParamPlan& param, int64_t begin, int64_t end, Fn&& fn);

// The copy-local elements [begin, end) as hyperslabs of the joined tensor: fn(start, count, local)
// per slab, `local` the copy-local index of its first element; a slab's elements, in row-major
// order, are consecutive copy-local elements. Slabs are as large as the blocks allow (whole rows
// wherever the range has them), so that a reader issues few of them (ucp-reshard: one HDF5 read each).
using SlabFn = std::function<void(const std::vector<int64_t>& start, const std::vector<int64_t>& count, int64_t local)>;
void ForEachJoinedSlab(const Copy& copy, int64_t begin, int64_t end, const SlabFn& fn);

// Calls fn(local_offset, joined_offset, n) for the runs of copy-local elements [begin, end) that
// are contiguous both in the copy and in the joined tensor.
template <typename Fn>
void ForEachJoinedRun(const Copy& copy, const std::vector<int64_t>& joined_shape, int64_t begin, int64_t end, Fn&& fn);

// ---------------------------------------------------------------------------------------------

template <typename Fn>
void ForEachPieceRun(const ParamPlan& param, int64_t begin, int64_t end, Fn&& fn) {
  const auto& ps = param.pieces;
  size_t lo = 0, hi = ps.size();  // first piece whose end is past `begin`
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (ps[mid].stream_start + ps[mid].numel <= begin) lo = mid + 1;
    else hi = mid;
  }
  for (size_t k = lo; k < ps.size() && ps[k].stream_start < end; ++k) {
    int64_t a = std::max(begin, ps[k].stream_start), b = std::min(end, ps[k].stream_start + ps[k].numel);
    if (a < b) fn(ps[k], a - ps[k].stream_start, b - a);
  }
}

template <typename Fn>
void ForEachItemRun(const ParamPlan& param, const Item& it, int64_t begin, int64_t end, Fn&& fn) {
  int64_t at = 0;  // item-relative start of the segment
  for (const auto& seg : it.segments) {
    const int64_t start = seg.first, n = seg.second;  // no structured binding: clang's lambdas cannot capture one
    if (at >= end) break;
    const int64_t a = std::max(begin, at), b = std::min(end, at + n);
    if (a < b)
      ForEachPieceRun(param, start + (a - at), start + (b - at), [&](const Piece& pc, int64_t off, int64_t m) {
        fn(pc, off, m, at + (pc.stream_start + off - start));
      });
    at += n;
  }
}

template <typename Fn>
void ForEachJoinedRun(const Copy& copy, const std::vector<int64_t>& joined_shape, int64_t begin, int64_t end, Fn&& fn) {
  if (copy.split_dim < 0) {
    if (begin < end) fn(begin, begin, end - begin);
    return;
  }
  const int d = copy.split_dim;
  int64_t inner = 1;
  for (size_t k = d + 1; k < copy.shape.size(); ++k) inner *= copy.shape[k];
  const int64_t local_rows = copy.shape[d], joined_rows = joined_shape[d];
  const int64_t local_slab = local_rows * inner, joined_slab = joined_rows * inner;
  int64_t i = begin;
  while (i < end) {
    int64_t outer = i / local_slab, rem = i % local_slab, row = rem / inner, col = rem % inner;
    const Block* b = nullptr;
    for (const auto& blk : copy.blocks)
      if (row >= blk.local_start && row < blk.local_start + blk.length) b = &blk;
    int64_t n = std::min(end - i, (b->local_start + b->length - row) * inner - col);
    fn(i, outer * joined_slab + (b->joined_start + row - b->local_start) * inner + col, n);
    i += n;
  }
}

}  // namespace ucp::plan
