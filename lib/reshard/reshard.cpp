#include "reshard/reshard.h"

#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/buffer_pool.h"
#include "core/error.h"
#include "core/format.h"
#include "core/names.h"
#include "core/commit.h"
#include "core/progress.h"
#include "formats/registry.h"
#include "reshard/atomic_input.h"
#include "reshard/claim.h"
#include "reshard/export.h"
#include "reshard/job_output.h"
#include "reshard/rank_totals.h"
#include "patterns/rules.h"
#include "plan/convert_plan.h"
#include "layout/naming.h"
#include "layout/reshard_plan.h"
#include "source/source_index.h"
#include "shuffle/agree.h"
#include "shuffle/round.h"
#include "store/atom_store.h"
#include "store/atomic_store.h"
#include "store/universal_folder.h"
#include "reshard/tool_name.h"

namespace ucp::reshard {
namespace fs = std::filesystem;
using nlohmann::json;
using shuffle::AnyFailed;
using shuffle::Capture;

namespace {

// Every file of the .pt atomic checkpoint `atomic` that rank `rank` of `ranks` is dealt, against the
// manifest's size and XXH64 (the HDF5 store's atoms.h5 is hashed whole already; DeepSpeed's own
// universal folder, with no manifest, is checked as it is read). Throws ucp::Error naming the file.
void VerifyAtomsShare(const std::string& atomic, int rank, int ranks) {
  if (!store::IsAtomicCheckpoint(atomic)) return;
  const nlohmann::json m = store::ReadAtomicManifest(atomic);
  const auto files = m.find("files");
  if (files == m.end() || !files->is_array()) return;  // the manifest's reader refuses it below
  size_t k = 0;
  for (const auto& f : *files) {
    if (k++ % static_cast<size_t>(ranks) != static_cast<size_t>(rank)) continue;
    const store::FileRecord rec = store::FileRecord::FromJson(f);
    if (rec.path == store::kAtomsH5) continue;
    std::string why;
    if (!store::Verify(atomic, rec, &why))
      throw Error(atomic + "/" + rec.path + ": " + why + " (checked before --force replaces the output: nothing of it was changed)");
  }
}

// Megatron's record of the iteration `latest` names, written before it.
constexpr const char* kIterationFile = "latest_checkpointed_iteration.txt";

// --- reading --------------------------------------------------------------------------------

// Local elements [a, b) of a TP piece, state s, into dst: a hyperslab read of the atomic tensor per
// run of whole rows; rows past the atomic tensor (vocabulary padding) are zeros, and so are the Adam
// moments of a weights-only source (the one place that reads them): a fresh optimizer's.
void ReadLocal(const Source& S, const UnitParam& up, int s, int64_t a, int64_t b, float* dst) {
  const Atom& atom = S.atoms[up.atom];
  plan::ForEachJoinedSlab(up.copy, a, b, [&](const std::vector<int64_t>& start, std::vector<int64_t> count, int64_t local) {
    float* to = dst + (local - a);
    int64_t n = pt::Numel(count);
    if (!start.empty() && start[0] + count[0] > atom.shape[0]) {
      const int64_t keep = std::max<int64_t>(0, atom.shape[0] - start[0]), row = n / count[0];
      std::memset(to + keep * row, 0, static_cast<size_t>((count[0] - keep) * row) * 4);
      count[0] = keep, n = keep * row;
    }
    if (n > 0 && s > 0 && S.weights_only) std::memset(to, 0, static_cast<size_t>(n) * 4);  // a fresh optimizer's moments
    else if (n > 0) S.reader->ReadSlab(atom.name, static_cast<plan::State>(s), start, count, to);
  });
}

// The shared pieces this rank holds: the ones it reads, then the others' over MPI, in rounds of at
// most `round_bytes` sent and received per rank. A piece is freed after its last unit here.
class HeldPieces {
 public:
  HeldPieces(const Source& S, const Plan& P, int rank) : S_(S), P_(P), rank_(rank) {
    for (size_t i = 0; i < P.shared.size(); ++i) {
      const SharedPiece& sp = P.shared[i];
      if (!std::binary_search(sp.ranks.begin(), sp.ranks.end(), rank)) continue;
      held_[static_cast<int>(i)] = AllocateBytes(static_cast<size_t>(plan::kStates * sp.numel) * 4);  // not cleared: every element is read or received
      for (const auto& [u, k] : sp.users) uses_[static_cast<int>(i)] += P.owner[u] == rank;
    }
  }

  void ReadMine() {
    for (auto& [i, data] : held_) {
      const SharedPiece& sp = P_.shared[i];
      if (sp.reader != rank_) continue;
      const UnitParam& up = P_.units[sp.unit].params[sp.param];
      for (int s = 0; s < plan::kStates; ++s) ReadLocal(S_, up, s, sp.begin, sp.begin + sp.numel, Floats(data) + s * sp.numel);
    }
  }

  // Collective. Every rank computes the same rounds from the plan. Returns {rounds, bytes sent}.
  std::pair<int64_t, int64_t> Exchange(shuffle::Comm& comm, int64_t round_bytes) {
    struct Transfer {
      int piece, src, dst;
      int64_t done = 0, total = 0;  // floats of the piece's three states, in order
    };
    struct Part {
      size_t transfer;
      int64_t at, n;
    };
    std::vector<Transfer> transfers;
    for (size_t i = 0; i < P_.shared.size(); ++i)
      for (int r : P_.shared[i].ranks)
        if (r != P_.shared[i].reader)
          transfers.push_back({static_cast<int>(i), P_.shared[i].reader, r, 0, plan::kStates * P_.shared[i].numel});
    const int ranks = comm.size();
    const int64_t cap = std::max<int64_t>(1, round_bytes / 4);
    shuffle::Round round(ranks);
    int64_t rounds = 0, sent_bytes = 0;
    for (bool left = !transfers.empty(); left; ++rounds) {
      std::vector<int64_t> sent(ranks, 0), got(ranks, 0);
      std::vector<Part> parts;
      for (size_t t = 0; t < transfers.size(); ++t) {
        Transfer& x = transfers[t];
        const int64_t n = std::min({x.total - x.done, cap - sent[x.src], cap - got[x.dst]});
        if (n <= 0) continue;
        parts.push_back({t, x.done, n});
        x.done += n, sent[x.src] += n, got[x.dst] += n;
      }
      left = std::any_of(transfers.begin(), transfers.end(), [](const Transfer& x) { return x.done < x.total; });
      round.Reset();
      for (const Part& p : parts) {
        const Transfer& x = transfers[p.transfer];
        if (x.src == rank_) round.CountSend(x.dst, 4 * p.n);
        if (x.dst == rank_) round.CountReceive(x.src, 4 * p.n);
      }
      round.Allocate();
      for (const Part& p : parts) {  // parts to each rank in round order: the receiver reads them alike
        const Transfer& x = transfers[p.transfer];
        if (x.src != rank_) continue;
        std::memcpy(round.Put(x.dst, 4 * p.n), Floats(held_.at(x.piece)) + p.at, static_cast<size_t>(p.n) * 4);
      }
      round.Exchange(comm);
      sent_bytes += round.sent();
      for (const Part& p : parts) {
        const Transfer& x = transfers[p.transfer];
        if (x.dst != rank_) continue;
        std::memcpy(Floats(held_.at(x.piece)) + p.at, round.Take(x.src, 4 * p.n), static_cast<size_t>(p.n) * 4);
      }
    }
    return {rounds, sent_bytes};
  }

  // Local element `at` of a held piece, state s.
  const float* Get(int piece, int s, int64_t at) const {
    const SharedPiece& sp = P_.shared[piece];
    return Floats(held_.at(piece)) + s * sp.numel + (at - sp.begin);
  }

  // Unit `u` (of this rank) is written: its pieces lose a user here, and go with the last.
  void Done(const Unit& u) {
    for (const auto& up : u.params)
      if (up.shared >= 0 && --uses_.at(up.shared) == 0) held_.erase(up.shared);
  }

 private:
  const Source& S_;
  const Plan& P_;
  int rank_;
  using Bytes = std::unique_ptr<uint8_t[], FreeDeleter>;
  static float* Floats(const Bytes& b) { return reinterpret_cast<float*>(b.get()); }
  std::map<int, Bytes> held_;
  std::map<int, int> uses_;
};

// The values of one unit, as its target writer asks for them: from a held piece, or read from the
// store (the time spent reading counted).
class UnitSlices final : public SliceSource {
 public:
  UnitSlices(const Source& S, const HeldPieces& H, const Unit& U) : S_(S), H_(H), U_(U) {}

  void Read(size_t k, int s, int64_t a, int64_t b, float* dst) override {
    const UnitParam& up = U_.params[k];
    const auto t0 = std::chrono::steady_clock::now();
    if (up.shared >= 0) {
      std::memcpy(dst, H_.Get(up.shared, s, a), static_cast<size_t>(b - a) * 4);
    } else {
      ReadAligned(k, s, a, b, dst);
    }
    read_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  // Seconds spent reading the atomic tensors (or copying held pieces).
  double read_seconds() const { return read_seconds_; }

 private:
  // Local elements [a, b) of unit param k, state s, into dst, read in whole rows of the store's
  // read blocks (HDF5 chunks). The partitions visit a piece's elements in order, a few MiB at a
  // time, so the block a request ends in is kept for the next request of that piece instead of
  // being read twice (the kept tails stay within kTailBytes, least recently used out first).
  void ReadAligned(size_t k, int s, int64_t a, int64_t b, float* dst) {
    const UnitParam& up = U_.params[k];
    const auto& shape = up.copy.shape;
    if (shape.empty() || shape[0] == 0 || (s > 0 && S_.weights_only)) return ReadLocal(S_, up, s, a, b, dst);
    const int64_t inner = up.local_numel / shape[0];
    const auto block = S_.reader->ReadBlock(S_.atoms[up.atom].name, static_cast<plan::State>(s));
    if (block.empty()) return ReadLocal(S_, up, s, a, b, dst);  // a store without blocks reads any range as cheaply
    const int64_t step = block[0] * inner;  // elements per row of blocks
    Tail& t = tails_[{k, s}];
    tail_bytes_ -= 4 * static_cast<int64_t>(t.data.size());
    int64_t lo = a / step * step;
    const int64_t hi = std::min(up.local_numel, (b + step - 1) / step * step);
    std::vector<float> data(static_cast<size_t>(hi - lo));
    int64_t from = lo;
    if (t.lo <= lo && lo < t.hi) {  // the kept tail starts the range
      const int64_t n = std::min(t.hi, hi) - lo;
      std::memcpy(data.data(), t.data.data() + (lo - t.lo), static_cast<size_t>(n) * 4);
      from = lo + n;
    }
    if (from < hi) ReadLocal(S_, up, s, from, hi, data.data() + (from - lo));
    std::memcpy(dst, data.data() + (a - lo), static_cast<size_t>(b - a) * 4);
    const int64_t keep = std::max(lo, b / step * step);
    if (b < hi) {
      t.data.assign(data.begin() + (keep - lo), data.end());
      t.lo = keep, t.hi = hi, t.used = ++clock_;
      tail_bytes_ += 4 * static_cast<int64_t>(t.data.size());
    } else {
      tails_.erase({k, s});
    }
    while (tail_bytes_ > kTailBytes && !tails_.empty()) {
      auto oldest = tails_.begin();
      for (auto it = tails_.begin(); it != tails_.end(); ++it)
        if (it->second.used < oldest->second.used) oldest = it;
      tail_bytes_ -= 4 * static_cast<int64_t>(oldest->second.data.size());
      tails_.erase(oldest);
    }
  }

  const Source& S_;
  const HeldPieces& H_;
  const Unit& U_;
  double read_seconds_ = 0;
  struct Tail {
    int64_t lo = 0, hi = 0;
    uint64_t used = 0;
    std::vector<float> data;
  };
  static constexpr int64_t kTailBytes = int64_t{32} << 20;
  std::map<std::pair<size_t, int>, Tail> tails_;
  int64_t tail_bytes_ = 0;
  uint64_t clock_ = 0;
};



// ", fp32 -> bf16 as --dtype asks" where the target trains in another precision than the source
// did: never a default (ResolvedDtype), always said.
std::string PrecisionChange(const Source& S, const TargetLayout& T) {
  const std::string from = S.manifest["source"].value("dtype", "");
  return from.empty() || from == T.dtype ? "" : " (" + from + " -> " + T.dtype + ", as --dtype asks)";
}

// What the writer does to the experts' Adam moments where the expert gradient scale changes
// (ExpertMomentRatio): said, as it changes values the files hold.
std::string ExpertMomentScaling(const Source& S, const TargetLayout& T) {
  const double r = ExpertMomentRatio(S, T);
  const int from_zero = S.manifest["source"].value("zero_stage", 1), to_ep = std::max(1, T.ep);
  auto job = [](const std::string& release, int zero, int ep) {
    return "(" + (release.empty() ? std::string("no DeepSpeed release recorded") : "DeepSpeed " + release) + ", ZeRO-" +
           std::to_string(zero) + ", ep=" + std::to_string(ep) + ")";
  };
  char factors[64];
  std::snprintf(factors, sizeof factors, "exp_avg x%g, exp_avg_sq x%g", r, r * r);
  return std::string("the experts' Adam moments scaled, ") + factors + ": an expert's gradient was " +
         std::to_string(ExpertGradientScale(SourceRelease(S, T), from_zero, S.ep)) + "x the mean in the source job " +
         job(SourceRelease(S, T), from_zero, S.ep) + " and is " + std::to_string(ExpertGradientScale(TargetRelease(S, T), T.zero_stage, to_ep)) +
         "x in the target's " + job(TargetRelease(S, T), T.zero_stage, to_ep) + " (README, Mixture of Experts)";
}

// What a reshard works from: the atomic checkpoint, the target and the plan.
struct Resharding {
  Source S;
  TargetLayout T;
  LayoutChoice choice;  // with --gpus: the planner's
  Plan P;               // not made for --gpus --plan-only (the layout chosen, not the work of writing it)
  std::string tag;      // the source's, the target's folder name
};

// The atomic checkpoint loaded, the target layout resolved (chosen with --gpus) and the plan made.
// Throws ucp::Error.
Resharding PlanReshard(const ReshardOptions& o, int ranks) {
  Resharding R;
  if (!o.plan_only && !o.in_place) RefuseOutputWithin(o.output, o.atomic_dir, "the atomic checkpoint");
  RefuseNonAtomicInput(o.atomic_dir);
  R.S = LoadSource(o.atomic_dir);
  RefuseMisnamedCheckpoint(source::JobFiles::FromJson(R.S.manifest["source"].value("job", nlohmann::json())), o.output, o.in_place);
  WithContext(o.atomic_dir + "/" + store::kManifestName, [&] {
    R.tag = R.S.manifest.at("source").at("tag").get<std::string>();
    // A Hugging Face model's weights have no tag: DeepSpeed's own for the iteration (global_step0).
    if (R.tag.empty() && R.S.weights_only) R.tag = "global_step" + std::to_string(R.S.manifest.at("source").value("iteration", 0));
    RequirePlainName(R.tag, "source.tag");
  });
  R.T = o.target;
  if (o.planner.gpus > 0) {
    R.choice = ChooseFor(R.S, o.planner);
    if (R.choice.chosen < 0 && !o.plan_only) throw Error(R.choice.reason);
    if (R.choice.chosen >= 0) R.T = R.choice.candidates[R.choice.chosen].layout;
    if (o.plan_only) return R;
  }
  R.T = ResolveModel(R.S, R.T);
  SettleOptimizer(R.S, R.T, o.optimizer_block, o.optimizer_config);
  R.P = MakePlan(R.S, R.T, ranks, o.share_bytes);
  return R;
}

// Rank 0's account of the run about to start: the layout chosen, from what to what, and what it
// changes beyond moving values.
void SayWhatIsDone(const ReshardOptions& o, const Resharding& R, const shuffle::Comm& comm, std::ostream& err) {
  const Source& S = R.S;
  const TargetLayout& T = R.T;
  const Plan& P = R.P;
  if (o.planner.gpus > 0) err << kTool << ": layout for " << o.planner.gpus << (o.planner.gpus == 1 ? " GPU: " : " GPUs: ") << R.choice.reason << "\n";
  if (!R.choice.job_change.empty()) err << kTool << ": note: " << R.choice.job_change << "\n";
  err << kTool << ": " << o.atomic_dir << " (" << S.atoms.size() << " parameters, from dp=" << S.manifest["source"]["dp"]
      << (S.manifest["source"].value("sp", 1) > 1 ? " sp=" + S.manifest["source"]["sp"].dump() : "") << " tp=" << S.manifest["source"]["tp"] << " pp=" << S.manifest["source"]["pp"]
      << (S.moe ? " ep=" + std::to_string(S.ep) : "") << ") to " << T.Describe(DdpBf16Wrapper(S, T)) << PrecisionChange(S, T)
      << "; " << P.units.size()
      << (T.zero_stage == 3 ? " (model-parallel, DP) ranks' files" : P.units.size() == 1 ? " model-parallel rank" : " model-parallel ranks")
      << " on " << comm.name() << "\n";
  if (T.no_optimizer)
    err << kTool << ": the model's files only (--no-optimizer): no optimizer files; load them with "
        << "load_checkpoint(load_optimizer_states=False) or load_module_only=True (Megatron-DeepSpeed: --finetune)\n";
  else if (S.weights_only)
    err << kTool << ": a fresh optimizer (weights only in " << o.atomic_dir << "): fp32 masters = the weights, exp_avg = "
        << "exp_avg_sq = 0, step 0, param_groups from " << o.optimizer_config << "\n";
  if (ExpertMomentRatio(S, T) != 1.0) err << kTool << ": " << ExpertMomentScaling(S, T) << "\n";
  if (P.padded_vocab > 0 && T.vocab_divisible_by <= 0 && S.divisible_by <= 0 && T.tp != S.tp)
    err << kTool << ": note: the checkpoint has no args.make_vocab_size_divisible_by; " << DerivedDivisibleBy(S)
        << " fits its padded_vocab_size " << S.padded_vocab << " at tp=" << S.tp << ", so the vocabulary is padded to "
        << P.padded_vocab << " rows (--make-vocab-size-divisible-by to choose)\n";
}

// --plan-only as text: the stages, each unit's rank, reads and files, the pieces read once.
void PrintPlanText(const Plan& P, const json& j, std::ostream& out) {
  out << "stages (layer specs): ";
  for (size_t s = 0; s + 1 < P.parts.size(); ++s) out << "[" << P.parts[s] << ", " << P.parts[s + 1] << ") ";
  out << "\n";
  for (const auto& u : j["units"])
    out << "  pp=" << u["pp"] << " tp=" << u["tp"] << (u["dp"] >= 0 ? " dp=" + u["dp"].dump() : "") << " rank "
        << u["rank"] << ": " << u["params"].size() << " parameters, reads "
        << HumanBytes(u["bytes_read"].get<double>()) << ", writes " << u["optimizer_files"] << " optimizer file"
        << (u["optimizer_files"] == 1 ? "\n" : "s\n");
  int64_t across = 0;
  for (const auto& sp : j["shared"]) across += sp["ranks"].size() > 1;
  out << "  " << j["shared"].size() << " pieces needed by several units read once (" << across
      << " of them sent to other ranks)\n";
  char buf[128];
  std::snprintf(buf, sizeof buf, "reads %.3fx the atomic tensor bytes (%s of %s)\n", j["read_ratio"].get<double>(),
                HumanBytes(j["bytes_read"].get<double>()).c_str(), HumanBytes(j["atomic_bytes"].get<double>()).c_str());
  out << buf;
}

// The output folder of a run, claimed (core/commit.h, step 1): its markers are Megatron's iteration
// file and `latest`, the commit point; it is refused when it holds something, unless --force (then
// `latest` goes first, then what it named, and what killed runs left). In place, `latest` keeps
// naming the checkpoint it named until the new one is complete.
struct Claimed {
  std::string tag, dir;  // the target's tag, and its folder
  JobOutput job;         // the training framework's files beside the tag (Trainer's checkpoint-N), listed in the claim
  std::unique_ptr<ClaimedOutput> claim;  // rank 0's
};

// Claims the output for R (collective). False when it failed (the lowest failing rank said why).
bool ClaimTarget(const ReshardOptions& o, const Resharding& R, shuffle::Comm& comm, std::ostream& err, Claimed& c) {
  const int rank = comm.rank();
  const bool talk = rank == 0 && !o.quiet;
  c.tag = o.output_tag.empty() ? R.tag : o.output_tag;
  c.dir = o.output + "/" + c.tag;
  c.job = PlanJobOutput(R.S, R.T, o.output, o.in_place);
  std::vector<std::string> writes = {c.tag};
  for (const auto& n : c.job.names()) writes.push_back(n);
  if (talk)
    for (const auto& note : c.job.notes) err << kTool << ": note: " << note << "\n";
  // --force clears a complete checkpoint at the claim; a .pt store's atoms are otherwise checked as
  // they are read, after it: checked first (the ranks share the files), so that a damaged input
  // leaves the old output as it was.
  if (!o.in_place && o.force && fs::exists(o.output + "/latest")) {
    const std::string error = Capture([&] { VerifyAtomsShare(o.atomic_dir, rank, comm.size()); });
    if (AnyFailed(comm, error, err, kTool)) return false;
  }
  std::string lock_note;
  const std::string error = rank == 0 ? Capture([&] {
    if (o.in_place) {
      auto folder = std::make_unique<OutputFolder>(o.output, kTool, std::vector<std::string>{kIterationFile, "latest"}, &lock_note);
      fs::remove_all(c.dir);  // what a killed run left: `latest` never named it
      // the root, its markers and its other tags are the training run's: only the tag folder is this run's
      c.claim = std::make_unique<ClaimedOutput>(std::move(folder), writes, false, false);
    } else {
      c.claim = ClaimOutput(o.output, o.atomic_dir, o.force, {kIterationFile, "latest"}, writes, "DeepSpeed checkpoint " + c.tag, &lock_note);
    }
    fs::create_directories(c.dir);
  }) : "";
  if (AnyFailed(comm, error, err, kTool)) return false;
  if (talk && !lock_note.empty()) err << kTool << ": note: " << lock_note << "\n";
  return true;
}

// Seconds since the last call: where this rank's time goes.
class Lap {
 public:
  double operator()() {
    const auto now = std::chrono::steady_clock::now();
    return std::chrono::duration<double>(now - std::exchange(last_, now)).count();
  }

 private:
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

// This rank's units written into `dir` from the pieces `held` (and the store), rank 0's progress
// line on the way; the reads' and the writes' seconds into `seconds`. Throws ucp::Error.
struct UnitsWritten {
  int64_t bytes = 0, files = 0;
  int64_t planned = 0;  // the atomic bytes the plan has this rank read for them
};
UnitsWritten WriteUnits(const ReshardOptions& o, const Resharding& R, const formats::TargetDriver& driver, HeldPieces& held,
                        const std::string& dir, int rank, double* read_seconds) {
  const Plan& P = R.P;
  const bool talk = rank == 0 && !o.quiet;
  int64_t my_bytes = 0;  // the atomic bytes of this rank's units, for rank 0's progress line
  for (size_t k = 0; k < P.units.size(); ++k) my_bytes += P.owner[k] == rank ? P.units[k].bytes : 0;
  ProgressLine progress(kTool, talk && o.progress, my_bytes);
  UnitsWritten w;
  ScratchBytes arena;
  int64_t done = 0;
  for (size_t k = 0; k < P.units.size(); ++k) {
    if (P.owner[k] != rank) continue;
    UnitSlices slices(R.S, held, P.units[k]);
    const UnitFiles wrote = driver.write_unit(R.S, R.T, P, P.units[k], slices, dir, arena);
    *read_seconds += slices.read_seconds();
    w.bytes += wrote.bytes, w.files += wrote.files;
    held.Done(P.units[k]);
    w.planned += P.units[k].bytes;
    progress.Update(done += P.units[k].bytes);
  }
  progress.Update(done, true);
  return w;
}

// Every rank's share of the writing, up to the one sync: the shared pieces read by one rank each,
// exchanged and held until their last unit is done, then this rank's units, then (rank 0) the job's
// files. Collective. Returns this rank's record for the report, or nothing when it failed (the
// claim taken back).
std::optional<json> WriteTarget(const ReshardOptions& o, const Resharding& R, const formats::TargetDriver& driver,
                                const Claimed& c, shuffle::Comm& comm, std::ostream& err) {
  const int rank = comm.rank();
  std::string error;
  auto failed = [&] { return AnyFailedAbandoning(comm, error, err, c.claim.get()); };
  json seconds = json::object();
  Lap lap;
  HeldPieces held(R.S, R.P, rank);
  error = Capture([&] { held.ReadMine(); });
  seconds["read_shared"] = lap();
  if (failed()) return std::nullopt;
  std::pair<int64_t, int64_t> exchanged{0, 0};
  error = Capture([&] { exchanged = held.Exchange(comm, o.exchange_round_bytes); });
  seconds["exchange"] = lap();
  if (failed()) return std::nullopt;
  int64_t planned = 0;
  for (const auto& sp : R.P.shared) planned += sp.reader == rank ? sp.bytes : 0;
  double unit_reads = 0;
  UnitsWritten w;
  error = Capture([&] { w = WriteUnits(o, R, driver, held, c.dir, rank, &unit_reads); });
  planned += w.planned;
  const double units = lap();
  seconds["read"] = unit_reads, seconds["write"] = units - unit_reads;
  // The shard files were written without an fsync each: one sync of the file system makes them
  // durable together, on every rank, before rank 0 writes `latest` (core/commit.h, step 3).
  if (error.empty() && rank == 0) error = Capture([&] { WriteJobOutput(R.S, c.job, o.output); });
  if (error.empty()) error = Capture([&] { Seal(c.dir); });
  seconds["sync"] = lap();
  if (failed()) return std::nullopt;
  // Bytes read as the store counts them: the slabs asked for, and what storage delivered for them
  // (HDF5 reads whole chunks).
  return json{{"rank", rank}, {"bytes_read", static_cast<int64_t>(R.S.reader->storage_bytes_read())},
              {"slab_bytes", static_cast<int64_t>(R.S.reader->bytes_read())}, {"planned_bytes", planned},
              {"bytes_written", w.bytes}, {"files_written", w.files},
              {"exchange_rounds", exchanged.first}, {"exchange_bytes_sent", exchanged.second}, {"seconds", seconds},
              {"peak_rss_bytes", PeakRssBytes()}};
}

// Step 4, `latest` last (rank 0): a run killed before it leaves no checkpoint DeepSpeed would load
// (in place: `latest` still names the checkpoint it named). In place, the iteration file is kept
// only where the training run keeps one. Throws ucp::Error.
void CommitTarget(const ReshardOptions& o, const Resharding& R, const Claimed& c) {
  if (o.in_place) WriteFileAtomically(c.dir + "/" + source::kReshardMarker, o.marker.dump(1) + "\n");
  std::optional<std::string> iteration = std::to_string(R.S.manifest["source"]["iteration"].get<int64_t>());
  if (o.in_place && !fs::exists(o.output + "/" + kIterationFile)) iteration.reset();
  if (R.S.naming == Naming::Module) iteration.reset();  // Megatron's file: a plain engine's job keeps none
  c.claim->folder().Mark({iteration, c.tag});
}

// Rank 0: the --report file and the summary line. False when the report cannot be written.
bool ReportReshard(const ReshardOptions& o, const Resharding& R, const std::vector<std::string>& stats, int ranks,
                   std::chrono::steady_clock::time_point t0, std::ostream& err) {
  const RankTotals t = SumRanks(stats);
  const int64_t total = t.bytes_read, peak = t.peak_rss;
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double ratio = R.P.needed_bytes ? static_cast<double>(total) / static_cast<double>(R.P.needed_bytes) : 1.0;
  if (!WriteReport(o.report_path, {{"atomic", o.atomic_dir}, {"store", store::StoreName(R.S.reader->store())}, {"output", o.output},
                                       {"ranks", ranks}, {"seconds", secs}, {"bytes_read", total}, {"atomic_bytes", R.P.needed_bytes},
                                       {"read_ratio", ratio}, {"bytes_written", t.bytes_written}, {"optimizer", OptimizerOf(R.S, R.T)}, {"per_rank", t.per_rank}}, err, kTool)) return false;
  if (!o.quiet) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s: wrote %s: read %s (%.3fx the atomic tensors) in %.2fs, peak RSS %s per rank\n",
                  kTool, o.output.c_str(), HumanBytes(double(total)).c_str(), ratio, secs, HumanBytes(double(peak)).c_str());
    err << buf;
  }
  return true;
}

// --plan-only: the layout chosen (with --gpus), or the plan of the files; rank 0 prints it.
int PrintPlanOnly(const ReshardOptions& o, const Resharding& R, int rank, int ranks, std::ostream& out) {
  if (o.planner.gpus > 0) {  // the layout chosen, not the work of writing it
    if (rank == 0) {
      if (o.json)
        out << R.choice.ToJson(o.planner).dump(1) << "\n";
      else
        R.choice.Print(out, o.planner);
    }
    return R.choice.chosen >= 0 ? 0 : 1;
  }
  if (rank == 0) {
    json j = PlanJson(R.S, R.T, R.P, ranks);
    if (o.json)
      out << j.dump(1) << "\n";
    else
      PrintPlanText(R.P, j, out);
  }
  return 0;
}

}  // namespace

LayoutChoice ChooseLayoutFor(const std::string& atomic_dir, const PlannerRequest& request) {
  return ChooseFor(LoadSource(atomic_dir), request);
}

int RunReshard(const ReshardOptions& o, shuffle::Comm& comm, std::ostream& out, std::ostream& err) {
  const int rank = comm.rank(), ranks = comm.size();
  const bool talk = rank == 0 && !o.quiet;
  const auto t0 = std::chrono::steady_clock::now();
  const formats::TargetDriver* target_driver = nullptr;
  std::string error = Capture([&] { target_driver = &formats::FindTarget(o.format); });
  if (AnyFailed(comm, error, err, kTool)) return 1;
  // Rank 0 hashes atoms.h5 whole before any rank's HDF5 reads a byte of it (a plan reads no data).
  error = rank == 0 && !o.plan_only ? Capture([&] { store::CheckAtomsH5Whole(o.atomic_dir); }) : "";
  if (AnyFailed(comm, error, err, kTool)) return 1;
  if (target_driver->plan_export) return RunExport(o, *target_driver, comm, out, err);
  Resharding R;
  error = Capture([&] { R = PlanReshard(o, ranks); });
  if (AnyFailed(comm, error, err, kTool)) return 1;
  if (o.planner.gpus > 0 && o.plan_only) return PrintPlanOnly(o, R, rank, ranks, out);
  if (talk) SayWhatIsDone(o, R, comm, err);
  if (o.plan_only) return PrintPlanOnly(o, R, rank, ranks, out);
  Claimed claimed;
  if (!ClaimTarget(o, R, comm, err, claimed)) return 1;
  // From here a failure takes back what this run made.
  const std::optional<json> mine = WriteTarget(o, R, *target_driver, claimed, comm, err);
  if (!mine) return 1;
  auto stats = comm.GatherToRoot(mine->dump());
  error = rank == 0 ? Capture([&] { CommitTarget(o, R, claimed); }) : "";
  if (AnyFailed(comm, error, err, kTool)) return 1;  // not taken back: the commit point may be written
  if (rank == 0 && !ReportReshard(o, R, stats, ranks, t0, err)) return 1;
  return 0;
}

}  // namespace ucp::reshard
