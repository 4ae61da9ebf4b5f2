// Step 3 of a conversion: map, shuffle, union, write, in rounds of bounded size. Each round, every
// rank packs what it maps for every reducer's share of the round (or reads it straight into place
// when it reduces it itself), the ranks exchange it, and each unites what it received into its
// items' atomic tensors; a finished tensor goes to the writer threads. Memory stays within 2x the
// largest item plus the shuffle buffers (DESIGN.md 5).
#include <algorithm>

#include "convert/steps.h"
#include "core/buffer_pool.h"
#include "core/error.h"
#include "core/progress.h"
#include "map/mapper.h"
#include "shuffle/agree.h"
#include "shuffle/round.h"
#include "union/assembly.h"

namespace ucp::convert {
using plan::ConvertPlan;
using plan::Item;
using shuffle::AnyFailed;
using shuffle::Capture;

namespace {

// The runs of reducer r's round k, in one order every rank agrees on.
template <typename Fn>
void ForEachRoundRun(const ConvertPlan& plan, int r, int64_t k, Fn&& fn) {
  const auto& items = plan.work[r];
  const int64_t begin = k * plan.chunk_elems, end = std::min(begin + plan.chunk_elems, plan.work_numel[r]);
  if (begin >= end) return;
  size_t lo = 0, hi = items.size();  // first item ending after `begin`
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (items[mid].work_start + items[mid].numel <= begin) lo = mid + 1;
    else hi = mid;
  }
  for (size_t i = lo; i < items.size() && items[i].work_start < end; ++i) {
    const auto& it = items[i];
    int64_t a = std::max<int64_t>(0, begin - it.work_start), b = std::min(it.numel, end - it.work_start);
    plan::ForEachItemRun(plan.params[it.param], it, a, b, [&](const plan::Piece& pc, int64_t off, int64_t n, int64_t) { fn(i, pc, off, n); });
  }
}

// Bytes of the largest item (a whole state tensor, or a part of one).
int64_t LargestItemBytes(const ConvertPlan& plan) {
  int64_t largest = 0;
  for (const auto& work : plan.work)
    for (const auto& it : work) largest = std::max(largest, 4 * it.out_numel);
  return largest;
}

// One rank's rounds: its open assemblies, the writer threads and the buffers they share.
class Rounds {
 public:
  Rounds(const ConvertOptions& o, const Planned& x, shuffle::Comm& comm, map::Mapper& mapper, store::Journal& journal,
         ProgressLine& progress, RankOutput& out)
      : o_(o), x_(x), plan_(x.plan), comm_(comm), mapper_(mapper), journal_(journal), progress_(progress), out_(out),
        c_(out.c), writer_(*out.writer), rank_(comm.rank()), ranks_(comm.size()), mine_(x.plan.work[rank_]),
        largest_(LargestItemBytes(x.plan)),
        // Writers hold at most one more atomic tensor than the one being assembled: the memory bound
        // of DESIGN.md 5 is 2x the largest state tensor plus the shuffle buffers.
        writers_(out.threads, largest_),
        // Tensors are assembled one after another: memory the writers release is handed out again
        // rather than faulted in afresh. What is live at once: the writers' tensors (up to the largest),
        // the one being finished, and the round's open assemblies; the region has room for that with
        // slack for fragmentation (it is address space; only what is used becomes resident).
        buffers_(3 * largest_ + o.buffer_bytes) {}

  // Every round, then the last items and the writers drained. False when a rank failed (said on `err`).
  bool Run(std::ostream& err);
  const PartsWritten& parts_written() const { return parts_written_; }

 private:
  bool Shuffled(int r, size_t i, const plan::Piece& pc, int64_t off) const { return plan_.Shuffled(r, plan_.work[r][i], pc, off); }
  union_::Assembly& AssemblyOf(size_t i);
  void FinishUpto(int64_t upto);
  void Write(size_t i, const float* data);
  void Pack(shuffle::Round& round, int64_t k);
  void Unite(shuffle::Round& round, int64_t k);
  void SubmitSideFiles() { convert::SubmitSideFiles(o_, x_, rank_, ranks_, writers_, out_); }

  const ConvertOptions& o_;
  const Planned& x_;
  const ConvertPlan& plan_;
  shuffle::Comm& comm_;
  map::Mapper& mapper_;
  store::Journal& journal_;
  ProgressLine& progress_;
  RankOutput& out_;
  Counters& c_;
  store::AtomWriter& writer_;
  const int rank_, ranks_;
  const std::vector<Item>& mine_;
  const int64_t largest_;
  PartsWritten parts_written_;  // outlives the writers, which add to it
  TaskPool writers_;
  BufferPool buffers_;
  std::map<size_t, std::unique_ptr<union_::Assembly>> open_;  // item index -> assembly
  size_t next_final_ = 0;
  int64_t open_bytes_ = 0;
};

// The memory bound: the writers' tensors and the open assemblies take at most 2x the largest
// item; a new assembly waits for the writers to finish enough of theirs (they go on without this
// thread, so it never waits on itself).
union_::Assembly& Rounds::AssemblyOf(size_t i) {
  auto& a = open_[i];
  if (!a) {
    const int64_t need = 4 * mine_[i].out_numel;
    if (writer_.concurrent()) Timed(c_.wait, [&] { writers_.WaitUntilHolding(2 * largest_ - open_bytes_ - need); });
    a = std::make_unique<union_::Assembly>(plan_.params[mine_[i].param], mine_[i], buffers_.Get(mine_[i].out_numel));
    open_bytes_ += need;
  }
  return *a;
}

// Writes item i's tensor (a writer thread's task, or this thread's).
void Rounds::Write(size_t i, const float* data) {
  const Item& it = mine_[i];
  const auto start = Clock::now();
  if (it.split()) {  // a part: in place in the file its parts share, completed after the rounds
    const auto digest = writer_.WritePart(plan_.params[it.param].name, it.state, it.out_begin, it.out_numel, data);
    c_.write_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
    std::lock_guard<std::mutex> lock(out_.mu);
    c_.bytes_written += 4 * it.out_numel;
    parts_written_[{it.param, static_cast<int>(it.state), it.part}] = digest;
    return;
  }
  auto recs = writer_.Write(plan_.params[it.param].name, it.state, data);
  c_.write_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
  for (const auto& r : recs) journal_.Append(r);
  out_.Record(recs);
}

// Finishes the items that end at or before `upto` and hands them to the writers.
void Rounds::FinishUpto(int64_t upto) {
  while (next_final_ < mine_.size() && mine_[next_final_].work_start + mine_[next_final_].numel <= upto) {
    size_t i = next_final_++;
    auto data = AssemblyOf(i).Finish();
    if (auto d = AssemblyOf(i).Divergence(); !d.empty()) out_.divergences.push_back(d);
    open_.erase(i);
    open_bytes_ -= 4 * mine_[i].out_numel;
    const Item& it = mine_[i];
    auto write = [this, i, data = std::move(data)]() { Write(i, data.get()); };
    // A store whose writes must stay on this thread (HDF5 over MPI-IO) writes here.
    if (writer_.concurrent()) Timed(c_.wait, [&] { writers_.Submit(4 * it.out_numel, std::move(write)); });
    else {
      write();
      std::lock_guard<std::mutex> lock(out_.mu);  // the writer threads add their side files' bytes meanwhile
      c_.bytes_written += 4 * it.out_numel;
    }
  }
}

// Packs what this rank maps for every reducer's round k; what it reduces itself of a copy placed
// as it is goes straight into place.
void Rounds::Pack(shuffle::Round& round, int64_t k) {
  round.Reset();
  for (int r = 0; r < ranks_; ++r)
    ForEachRoundRun(plan_, r, k, [&](size_t i, const plan::Piece& pc, int64_t off, int64_t n) {
      if (pc.mapper == rank_ && Shuffled(r, i, pc, off)) round.CountSend(r, 4 * n);
    });
  ForEachRoundRun(plan_, rank_, k, [&](size_t i, const plan::Piece& pc, int64_t off, int64_t n) {
    if (Shuffled(rank_, i, pc, off)) round.CountReceive(pc.mapper, 4 * n);
  });
  round.Allocate();
  for (int r = 0; r < ranks_; ++r) {
    ForEachRoundRun(plan_, r, k, [&](size_t i, const plan::Piece& pc, int64_t off, int64_t n) {
      if (pc.mapper != rank_) return;
      const Item& it = plan_.work[r][i];
      const std::string& name = plan_.params[it.param].name;
      if (!Shuffled(r, i, pc, off)) {
        AssemblyOf(i).ApplyInPlace(pc.stream_start + off, n, [&](uint8_t* dst, int64_t o2, int64_t m) {
          mapper_.Read(pc, it.state, off + o2, m, dst, name);
        });
        c_.bytes_in_place += 4 * n;
        return;
      }
      mapper_.Read(pc, it.state, off, n, round.Put(r, 4 * n), name);
    });
  }
}

// Union: every shuffled run lands in its item's atomic tensor, in stream order.
void Rounds::Unite(shuffle::Round& round, int64_t k) {
  ForEachRoundRun(plan_, rank_, k, [&](size_t i, const plan::Piece& pc, int64_t off, int64_t n) {
    if (!Shuffled(rank_, i, pc, off)) return;
    AssemblyOf(i).Apply(pc.stream_start + off, n, round.Take(pc.mapper, 4 * n), source::FileWhere(x_.L, pc.file));
  });
}

bool Rounds::Run(std::ostream& err) {
  // Side files are submitted after the rounds under MPI: a copy started first would take the core
  // from the mapping that the other ranks wait for in the first exchange. A single process has no
  // one waiting: it starts them first, beside its mapping, rather than leave them as the run's tail.
  const bool side_files_first = ranks_ == 1;
  std::string error;
  if (side_files_first) error = Capture([&] { SubmitSideFiles(); });
  shuffle::Round round(ranks_);
  for (int64_t k = 0; k < plan_.rounds; ++k) {
    if (error.empty()) error = Timed(c_.read, [&] { return Capture([&] { Pack(round, k); }); });
    std::array<int64_t, 2> sums = {error.empty() ? 0 : 1, c_.bytes_received + c_.bytes_in_place};
    Timed(c_.exchange, [&] { comm_.AllreduceSum(sums); });
    if (sums[0] > 0) {
      AnyFailed(comm_, error, err, "ucp-convert");
      return false;
    }
    if (rank_ == 0) progress_.Update(sums[1]);
    Timed(c_.exchange, [&] { round.Exchange(comm_); });
    c_.bytes_sent += round.sent(), c_.bytes_received += round.received();
    c_.max_round_bytes = std::max(c_.max_round_bytes, round.sent() + round.received());
    error = Capture([&] {
      Timed(c_.assemble, [&] { Unite(round, k); });
      FinishUpto(std::min((k + 1) * plan_.chunk_elems, plan_.work_numel[rank_]));
    });
    // An error here is reported at the next round's check, or after the last round.
  }
  if (error.empty()) error = Capture([&] {
    FinishUpto(INT64_MAX);  // items of no elements, and a rank with no rounds
    if (!side_files_first) SubmitSideFiles();
    Timed(c_.drain, [&] { writers_.Drain(); });
  });
  c_.bytes_read = static_cast<int64_t>(mapper_.bytes_read());
  c_.crc_bytes = static_cast<int64_t>(mapper_.crc_bytes());
  return !AnyFailed(comm_, error, err, "ucp-convert");
}

// Records several ranks read parts of: their CRC-32s, combined, checked before any byte is used.
bool CheckSharedRecords(const ConvertPlan& plan, map::Mapper& mapper, shuffle::Comm& comm, std::ostream& err, Counters& c) {
  if (plan.shared_records.empty()) return true;
  std::vector<int64_t> crcs(plan.SharedRanges(), 0);
  std::string error = Timed(c.read, [&] { return Capture([&] { crcs = mapper.SharedRangeCrcs(); }); });
  if (AnyFailed(comm, error, err, "ucp-convert")) return false;
  Timed(c.exchange, [&] { comm.AllreduceSum(crcs); });
  error = Capture([&] { mapper.CheckSharedRecords(crcs); });
  return !AnyFailed(comm, error, err, "ucp-convert");
}

// The store, told of every parameter (the HDF5 one creates every dataset now, collectively).
std::unique_ptr<store::AtomWriter> CreateWriter(const ConvertOptions& o, const Planned& x, shuffle::Comm& comm) {
  std::map<std::string, const patterns::ParamPattern*> pattern_of;
  for (const auto& p : x.M.params) pattern_of[p.name] = &p;
  std::vector<store::AtomSpec> specs;
  for (const auto& P : x.plan.params) {
    const auto& pat = *pattern_of.at(P.name);
    specs.push_back({P.name, P.full_shape, store::ParamMetaJson(x.L, pat, P), store::UniversalKeysOf(pat, x.L.zero_stage, pt::Numel(P.joined_shape)),
                     o.weights_only ? nullptr : StepOf(x.L, P), pat.split_dim()});
    specs.back().weights_only = o.weights_only;
  }
  return store::AtomWriter::Create(x.kind, o.output, std::move(specs), comm);
}

// The bytes every reducer's work streams through the rounds: what the progress line counts to.
int64_t TotalStreamBytes(const ConvertPlan& plan) {
  int64_t total = 0;
  for (int r = 0; r < plan.ranks; ++r) total += 4 * plan.work_numel[r];
  return total;
}

}  // namespace

bool MapShuffleWrite(const ConvertOptions& o, const Planned& x, shuffle::Comm& comm, std::ostream& err, RankOutput& out) {
  const bool talk = comm.rank() == 0 && !o.quiet;
  out.threads = ThreadsOf(o);
  const int64_t total_stream = TotalStreamBytes(x.plan);
  ProgressLine progress("ucp-convert", talk && o.progress, total_stream);
  {
    std::unique_ptr<map::Mapper> mapper;
    std::unique_ptr<store::Journal> journal;
    std::string error = Capture([&] {
      mapper = std::make_unique<map::Mapper>(x.L, x.plan, comm.rank(), &x.verified);
      journal = std::make_unique<store::Journal>(o.output, comm.rank());
    });
    if (AnyFailed(comm, error, err, "ucp-convert")) return false;
    if (!CheckSharedRecords(x.plan, *mapper, comm, err, out.c)) return false;
    error = Capture([&] { out.writer = CreateWriter(o, x, comm); });
    if (AnyFailed(comm, error, err, "ucp-convert")) return false;
    Rounds rounds(o, x, comm, *mapper, *journal, progress, out);
    if (!rounds.Run(err)) return false;
    if (!FinishSplitParts(x.plan, rounds.parts_written(), *out.writer, *journal, comm, err, out)) return false;
  }
  // Collective (HDF5: close, attributes, rename).
  const std::string error = Capture([&] { Timed(out.c.sync, [&] { out.committed = out.writer->Commit(); }); });
  if (AnyFailed(comm, error, err, "ucp-convert")) return false;
  if (comm.rank() == 0) progress.Update(total_stream, true);
  return true;
}

}  // namespace ucp::convert
