#include "reshard/reshard.h"

#include <sys/resource.h>

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
#include "core/output_lock.h"
#include "core/progress.h"
#include "patterns/rules.h"
#include "plan/convert_plan.h"
#include "pt/low_precision.h"
#include "pt/torch_file.h"
#include "reshard/naming.h"
#include "reshard/reshard_plan.h"
#include "source/source_index.h"
#include "formats/deepspeed/names.h"
#include "shuffle/agree.h"
#include "store/atom_store.h"

namespace ucp::reshard {
namespace fs = std::filesystem;
using nlohmann::json;
using pt::IntList;
using pt::SetItem;
using pt::Value;
using pt::ValuePtr;
using shuffle::AnyFailed;
using shuffle::Capture;

namespace {

constexpr const char* kTool = "ucp-reshard";

// --- values ---------------------------------------------------------------------------------

ValuePtr Copied(const Value& v) { return std::make_shared<Value>(v); }  // shallow: shares the children

void PutIfPresent(Value& dict, const std::string& key, ValuePtr v) {
  if (dict.dict.Get(key)) SetItem(dict, key, std::move(v));
}

ValuePtr OrderedDict() {
  auto d = Value::Make(Value::Kind::Dict);
  d->module = "collections", d->name = "OrderedDict";
  return d;
}
ValuePtr TorchSize(const std::vector<int64_t>& shape) {
  auto t = Value::Make(Value::Kind::Tuple);
  for (int64_t d : shape) t->items.push_back(Value::Int(d));
  t->module = "torch", t->name = "Size";
  return t;
}
ValuePtr TorchDtype(const std::string& dtype) {
  auto g = Value::Make(Value::Kind::Global);
  g->module = "torch", g->name = dtype == "bf16" ? "bfloat16" : dtype == "fp16" ? "float16" : "float32";
  return g;
}
ValuePtr Float(double f) { return Value::Float(f); }

// DeepSpeed's loss scalers, as their __init__ leaves them.
ValuePtr LossScalerFor(const std::string& dtype, const ValuePtr& source) {
  const bool dynamic = dtype == "fp16";
  const char* cls = dynamic ? "DynamicLossScaler" : "LossScaler";
  if (source && source->kind == Value::Kind::Object && source->name == cls) return source;
  auto state = Value::Make(Value::Kind::Dict);
  if (dynamic) {
    SetItem(*state, "cur_scale", Float(65536.0));
    SetItem(*state, "cur_iter", Value::Int(0));
    SetItem(*state, "last_overflow_iter", Value::Int(-1));
    SetItem(*state, "scale_factor", Float(2.0));
    SetItem(*state, "scale_window", Value::Int(1000));
    SetItem(*state, "min_scale", Value::Int(1));
    SetItem(*state, "delayed_shift", Value::Int(1));
    SetItem(*state, "cur_hysteresis", Value::Int(1));
    SetItem(*state, "consecutive_hysteresis", Value::Bool(false));
    SetItem(*state, "raise_error_at_min_scale", Value::Bool(true));
    SetItem(*state, "dynamic", Value::Bool(true));
    SetItem(*state, "dtype", TorchDtype("fp16"));
  } else {
    SetItem(*state, "cur_scale", Float(1.0));
    SetItem(*state, "dynamic", Value::Bool(false));
  }
  auto obj = Value::MakeObject("deepspeed.runtime.fp16.loss_scaler", cls, nullptr, state);
  obj->via_new = true;
  return obj;
}

ValuePtr FragmentAddress(int64_t numel, int64_t start) {
  auto state = Value::Make(Value::Kind::Dict);
  SetItem(*state, "numel", Value::Int(numel));
  SetItem(*state, "start", Value::Int(start));
  auto obj = Value::MakeObject("deepspeed.utils.tensor_fragment", "fragment_address", nullptr, state);
  obj->via_new = true;
  return obj;
}

struct LowPrecision {
  pt::DType dtype;
  size_t size;
};
LowPrecision LpOf(const std::string& dtype) {
  if (dtype == "bf16") return {pt::DType::BF16, 2};
  if (dtype == "fp16") return {pt::DType::F16, 2};
  return {pt::DType::F32, 4};
}

// --- writing one unit -----------------------------------------------------------------------


// --- reading --------------------------------------------------------------------------------

// Local elements [a, b) of a TP piece, state s, into dst: a hyperslab read of the atomic tensor per
// run of whole rows; rows past the atomic tensor (vocabulary padding) are zeros.
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
    if (n > 0) S.reader->ReadSlab(atom.name, static_cast<plan::State>(s), start, count, to);
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
    ScratchBytes send, recv;
    int64_t rounds = 0, sent_bytes = 0;
    for (bool left = !transfers.empty(); left; ++rounds) {
      std::vector<int64_t> sent(ranks, 0), got(ranks, 0);
      std::vector<Part> round;
      for (size_t t = 0; t < transfers.size(); ++t) {
        Transfer& x = transfers[t];
        const int64_t n = std::min({x.total - x.done, cap - sent[x.src], cap - got[x.dst]});
        if (n <= 0) continue;
        round.push_back({t, x.done, n});
        x.done += n, sent[x.src] += n, got[x.dst] += n;
      }
      left = std::any_of(transfers.begin(), transfers.end(), [](const Transfer& x) { return x.done < x.total; });
      std::vector<int64_t> scount(ranks, 0), sdispl(ranks, 0), rcount(ranks, 0), rdispl(ranks, 0);
      for (const Part& p : round) {
        const Transfer& x = transfers[p.transfer];
        if (x.src == rank_) scount[x.dst] += 4 * p.n;
        if (x.dst == rank_) rcount[x.src] += 4 * p.n;
      }
      for (int r = 1; r < ranks; ++r) sdispl[r] = sdispl[r - 1] + scount[r - 1], rdispl[r] = rdispl[r - 1] + rcount[r - 1];
      send.Reserve(static_cast<size_t>(sdispl[ranks - 1] + scount[ranks - 1]));
      recv.Reserve(static_cast<size_t>(rdispl[ranks - 1] + rcount[ranks - 1]));
      std::vector<int64_t> put = sdispl, take = rdispl;
      for (const Part& p : round) {  // parts to each rank in round order: the receiver reads them alike
        const Transfer& x = transfers[p.transfer];
        if (x.src != rank_) continue;
        std::memcpy(send.data() + put[x.dst], Floats(held_.at(x.piece)) + p.at, static_cast<size_t>(p.n) * 4);
        put[x.dst] += 4 * p.n;
        sent_bytes += 4 * p.n;
      }
      comm.Alltoallv(send.data(), scount, sdispl, recv.data(), rcount, rdispl);
      for (const Part& p : round) {
        const Transfer& x = transfers[p.transfer];
        if (x.dst != rank_) continue;
        std::memcpy(Floats(held_.at(x.piece)) + p.at, recv.data() + take[x.src], static_cast<size_t>(p.n) * 4);
        take[x.src] += 4 * p.n;
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

// Where a key sits inside its Megatron module (registration order), for the order of a model's
// state_dict; keys it does not know come after, in the atomic checkpoint's order.
int LocalKeyRank(const std::string& local) {
  static const std::vector<std::string> order = {
      "word_embeddings.weight", "position_embeddings.weight", "input_layernorm.weight", "input_layernorm.bias",
      "self_attention.query_key_value.weight", "self_attention.query_key_value.bias", "self_attention.dense.weight",
      "self_attention.dense.bias", "post_attention_layernorm.weight", "post_attention_layernorm.bias",
      "mlp.dense_h_to_4h.weight", "mlp.dense_h_to_4h.bias", "mlp.dense_4h_to_h.weight", "mlp.dense_4h_to_h.bias",
      "weight", "bias"};
  auto it = std::find(order.begin(), order.end(), local);
  return it == order.end() ? static_cast<int>(order.size()) : static_cast<int>(it - order.begin());
}

// The model's order of parameters: layer spec, then the key's place in its module.
bool InModelOrder(const LayerPlace& a, const LayerPlace& b) {
  return std::make_pair(a.spec, LocalKeyRank(a.local)) < std::make_pair(b.spec, LocalKeyRank(b.local));
}

class UnitWriter {
 public:
  // `arena` holds the unit's training-dtype weights; kept by the caller from unit to unit, so that
  // its pages are faulted in (and zeroed by the kernel) once per run, not once per unit.
  UnitWriter(const Source& S, const TargetLayout& T, const Plan& P, const HeldPieces& H, const Unit& U, std::string dir,
             ScratchBytes& arena)
      : S_(S), T_(T), P_(P), H_(H), U_(U), dir_(std::move(dir)), arena_(arena) {}

  // The files of this unit: under ZeRO-3 its DP rank's model-states and optimizer files; else the
  // optimizer files of every DP rank, the layer files and the model-states file.
  void Write() {
    if (T_.zero_stage == 3) {
      WriteZero3OptimizerFile(U_.dp);
      WriteShardFile(deepspeed::Zero3ModelStatesFileName(U_.dp, Mp()),
                     *ModelStates(Zero3Module()));
      return;
    }
    const auto lp = LpOf(T_.dtype);
    auto size = [&](const UnitParam& up) { return (std::max<int64_t>(1, up.local_numel) * lp.size + 63) / 64 * 64; };
    int64_t total = 0;
    for (const auto& up : U_.params) total += size(up);
    uint8_t* at = arena_.Reserve(static_cast<size_t>(total));  // filled whole from the fp32 weights, so not cleared
    for (const auto& up : U_.params) {
      lp_.push_back(std::shared_ptr<uint8_t[]>(std::shared_ptr<void>(), at));  // not owning: the arena outlives the unit
      at += size(up);
    }
    for (int d = 0; d < T_.dp; ++d) WriteOptimizerFile(d);  // fills lp_ from the fp32 weights
    if (NamingOf(T_) == Naming::Plain) {
      WriteShardFile(deepspeed::ModelStatesFileName(Mp()), *ModelStates(PlainModule()));
      return;
    }
    WriteLayerFiles();
    WriteShardFile(deepspeed::ModelStatesFileName(Mp()), *ModelStates(Value::None()));
  }

  // Seconds spent reading the atomic tensors (or copying held pieces) while writing.
  double read_seconds() const { return read_seconds_; }
  // Bytes and files of the target this writer has written.
  int64_t bytes_written() const { return bytes_written_; }
  int64_t files_written() const { return files_written_; }

 private:
  // One file of the target, written without an fsync of its own (the run syncs the file system
  // once before `latest` names the folder) and without a digest (nothing records one).
  void WriteShardFile(const std::string& name, const Value& root) {
    const std::string path = dir_ + "/" + name;
    pt::WriteTorchFile(path, root, Durability::Batch, Digest::None);
    bytes_written_ += static_cast<int64_t>(fs::file_size(path)), ++files_written_;
  }

  // Copies local elements [a, b) of unit param k, state s, to dst (float32), from the held piece
  // or the store; fp32 also to the layer files' weights.
  void Fill(size_t k, int s, int64_t a, int64_t b, float* dst) {
    const UnitParam& up = U_.params[k];
    const auto t0 = std::chrono::steady_clock::now();
    if (up.shared >= 0) {
      std::memcpy(dst, H_.Get(up.shared, s, a), static_cast<size_t>(b - a) * 4);
    } else {
      ReadAligned(k, s, a, b, dst);
    }
    read_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s == 0 && !lp_.empty()) {  // the training-dtype weights of the layer files, from the same fp32 values
      uint8_t* lp = lp_[k].get();
      const int64_t n = b - a;
      if (T_.dtype == "bf16") {
        for (int64_t i = 0; i < n; ++i) {
          const uint16_t h = pt::Fp32ToBf16(dst[i]);
          std::memcpy(lp + 2 * (a + i), &h, 2);
        }
      } else if (T_.dtype == "fp16") {
        for (int64_t i = 0; i < n; ++i) {
          const uint16_t h = pt::Fp32ToFp16(dst[i]);
          std::memcpy(lp + 2 * (a + i), &h, 2);
        }
      } else {
        std::memcpy(lp + 4 * a, dst, static_cast<size_t>(n) * 4);
      }
    }
  }

  // Local elements [a, b) of unit param k, state s, into dst, read in whole rows of the store's
  // read blocks (HDF5 chunks). The partitions visit a piece's elements in order, a few MiB at a
  // time, so the block a request ends in is kept for the next request of that piece instead of
  // being read twice (the kept tails stay within kTailBytes, least recently used out first).
  void ReadAligned(size_t k, int s, int64_t a, int64_t b, float* dst) {
    const UnitParam& up = U_.params[k];
    const auto& shape = up.copy.shape;
    if (shape.empty() || shape[0] == 0) return ReadLocal(S_, up, s, a, b, dst);
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

  // Elements [at, at + n) of a flat ZeRO tensor are unit parameter k's local elements [local, local + n).
  struct Segment {
    int k;
    int64_t local, at, n;
  };

  // A flat float32 ZeRO tensor of `len` elements, produced while its file is written: the segments'
  // elements of state `s`, zeros elsewhere (alignment padding). Nothing of it is held in memory.
  ValuePtr FlatState(std::vector<Segment> segs, int64_t len, int s) {
    return pt::ProducedTensor(pt::DType::F32, {len}, [this, segs = std::move(segs), s](uint64_t off, uint64_t size, uint8_t* dst) {
      const int64_t a = static_cast<int64_t>(off / 4), b = static_cast<int64_t>((off + size) / 4);
      float* out = reinterpret_cast<float*>(dst);
      int64_t filled = a;  // [a, filled) written; segments come in flat order, the gaps between them are zeros
      for (const auto& sg : segs) {
        const int64_t f0 = std::max(a, sg.at), f1 = std::min(b, sg.at + sg.n);
        if (f0 >= f1) continue;
        std::fill(out + (filled - a), out + (f0 - a), 0.0f);
        Fill(static_cast<size_t>(sg.k), s, sg.local + (f0 - sg.at), sg.local + (f1 - sg.at), out + (f0 - a));
        filled = f1;
      }
      std::fill(out + (filled - a), out + (b - a), 0.0f);
    });
  }

  int Mp() const { return U_.pp * T_.tp + U_.tp; }  // the model-parallel rank in DeepSpeed's file names

  ValuePtr DsConfig() const {
    auto cfg = S_.model_states.root->Get("ds_config");
    if (!cfg || cfg->kind != Value::Kind::Dict) return cfg ? cfg : Value::None();
    auto out = Copied(*cfg);
    auto section = [&](const char* key, const char* field, ValuePtr v) {
      auto sec = out->Get(key);
      if (!sec || sec->kind != Value::Kind::Dict) return;
      auto copy = Copied(*sec);
      SetItem(*copy, field, std::move(v));
      SetItem(*out, key, copy);
    };
    section("zero_optimization", "stage", Value::Int(T_.zero_stage));
    section("bf16", "enabled", Value::Bool(T_.dtype == "bf16"));
    section("fp16", "enabled", Value::Bool(T_.dtype == "fp16"));
    return out;
  }

  void WriteOptimizerFile(int d) {
    const int groups = static_cast<int>(U_.groups.size());
    const int64_t alignment = 2 * T_.dp;  // DeepSpeed: nccl_start_alignment_factor (2) x DP
    auto state = Value::Make(Value::Kind::Dict);
    auto single = Value::Make(Value::Kind::List), paddings = Value::Make(Value::Kind::List);
    auto mappings = Value::Make(Value::Kind::List);
    for (int g = 0; g < groups; ++g) {
      int64_t total = 0;
      for (int k : U_.groups[g]) total += U_.params[k].local_numel;
      const int64_t padded = (total + alignment - 1) / alignment * alignment, ps = padded / T_.dp;
      const int64_t lo = d * ps, hi = lo + ps;
      std::vector<Segment> segs;
      auto m = OrderedDict();
      int64_t at = 0;
      for (int k : U_.groups[g]) {
        const int64_t n = U_.params[k].local_numel, f0 = std::max(at, lo), f1 = std::min(at + n, hi);
        if (f0 < f1) {
          segs.push_back({k, f0 - at, f0 - lo, f1 - f0});
          SetItem(*m, P_.names[U_.params[k].atom], FragmentAddress(f1 - f0, f0 - lo));
        }
        at += n;
      }
      // Padding: the BF16 optimizer counts it on the last rank; ZeRO-1/2 on every rank it reaches,
      // and stores that rank's fp32 partition without it.
      int64_t pad = T_.bf16_optimizer() ? (d == T_.dp - 1 ? padded - total : 0)
                                        : (total <= lo ? ps : (total < hi ? hi - total : 0));
      paddings->items.push_back(Value::Int(pad));
      const int64_t fp32_len = T_.bf16_optimizer() ? ps : ps - pad;
      single->items.push_back(FlatState(segs, fp32_len, 0));
      state->dict.Set(Value::Int(g), AdamState(g, std::move(segs), ps));
      mappings->items.push_back(m);
    }
    auto osd = Value::Make(Value::Kind::Dict);
    if (!T_.bf16_optimizer()) PutLossScaling(*osd);
    SetItem(*osd, "clip_grad", SourceOr("clip_grad", Float(0.0)));
    SetItem(*osd, "base_optimizer_state", TorchOptimizerState(state));
    SetItem(*osd, "single_partition_of_fp32_groups", single);
    if (!T_.bf16_optimizer()) SetItem(*osd, "zero_stage", ZeroStage());
    SetItem(*osd, "group_paddings", paddings);
    SetItem(*osd, "partition_count", IntList(std::vector<int64_t>(groups, T_.dp)));
    SetItem(*osd, "ds_version", DsVersion());
    SetItem(*osd, "param_slice_mappings", mappings);
    WriteOptimizerRoot(d, osd);
  }

  // DeepSpeed's engine saves {optimizer_state_dict, ds_config, ds_version} per DP rank.
  void WriteOptimizerRoot(int d, ValuePtr osd) {
    auto root = Value::Make(Value::Kind::Dict);
    SetItem(*root, "optimizer_state_dict", std::move(osd));
    SetItem(*root, "ds_config", DsConfig());
    SetItem(*root, "ds_version", DsVersion());
    WriteShardFile(deepspeed::OptimStatesFileName(T_.dtype == "bf16" ? "bf16_" : "", d, Mp()), *root);
  }

  // Group g's Adam state over a flat tensor of `len` elements: the step and the two moments.
  ValuePtr AdamState(int g, std::vector<Segment> segs, int64_t len) {
    auto gs = Value::Make(Value::Kind::Dict);
    SetItem(*gs, "step", GroupStep(g));
    SetItem(*gs, "exp_avg", FlatState(segs, len, 1));
    SetItem(*gs, "exp_avg_sq", FlatState(std::move(segs), len, 2));
    return gs;
  }

  // torch's optimizer.state_dict(): the per-group state and the source's param_groups.
  ValuePtr TorchOptimizerState(ValuePtr state) const {
    auto base = Value::Make(Value::Kind::Dict);
    SetItem(*base, "state", std::move(state));
    SetItem(*base, "param_groups", S_.optimizer.root->Get("param_groups"));
    return base;
  }

  // The fp16 / ZeRO optimizers' loss scaling: the scaler the dtype needs, and the source's overflow flag.
  void PutLossScaling(Value& osd) const {
    SetItem(osd, "loss_scaler", LossScalerFor(T_.dtype, S_.optimizer.root->Get("loss_scaler")));
    SetItem(osd, "dynamic_loss_scale", Value::Bool(T_.dtype == "fp16"));
    SetItem(osd, "overflow", SourceOr("overflow", Value::Bool(false)));
  }

  ValuePtr SourceOr(const char* key, ValuePtr fallback) const {
    auto v = S_.optimizer.root->Get(key);
    return v ? v : fallback;
  }

  ValuePtr ZeroStage() const {
    auto stage = Value::MakeObject("deepspeed.runtime.zero.config", "ZeroStageEnum");
    stage->args->items.push_back(Value::Int(T_.zero_stage));
    return stage;
  }

  // ZeRO-3: DP rank d's flat group is the concatenation of its slices of the group's parameters
  // (each padded to its piece), in the group's parameter order.
  void WriteZero3OptimizerFile(int d) {
    auto state = Value::Make(Value::Kind::Dict), flat = Value::Make(Value::Kind::List);
    for (size_t g = 0; g < U_.groups.size(); ++g) {
      int64_t total = 0;
      std::vector<Segment> segs;
      for (int k : U_.groups[g]) {
        const UnitParam& up = U_.params[k];
        if (up.begin < up.end) segs.push_back({k, up.begin, total, up.end - up.begin});
        total += Zero3Piece(up.local_numel, T_.dp);
      }
      flat->items.push_back(FlatState(segs, total, 0));
      state->dict.Set(Value::Int(static_cast<int64_t>(g)), AdamState(static_cast<int>(g), std::move(segs), total));
    }
    auto osd = Value::Make(Value::Kind::Dict);
    SetItem(*osd, "zero_stage", ZeroStage());
    PutLossScaling(*osd);
    SetItem(*osd, "partition_count", Value::Int(T_.dp));
    SetItem(*osd, "optimizer_state_dict", TorchOptimizerState(state));
    SetItem(*osd, "fp32_flat_groups", flat);
    WriteOptimizerRoot(d, osd);
  }

  // DeepSpeed saves module.state_dict() under ZeRO-3 too: GPTModel's flat names, every parameter
  // an empty placeholder of the training dtype (the weights are in the optimizer files).
  ValuePtr Zero3Module() const {
    static const auto placeholder_owner = std::make_shared<uint8_t>(0);
    const auto lp = LpOf(T_.dtype);
    auto module = OrderedDict();
    for (size_t k : ModelOrder())
      SetItem(*module, P_.names[U_.params[k].atom], pt::OwnedTensor(placeholder_owner, placeholder_owner.get(), lp.dtype, {0}));
    return module;
  }

  // The unit's parameters in the model's order (layer spec, then the key's place in its module):
  // the order of a model's state_dict and of its layer files.
  std::vector<size_t> ModelOrder() const {
    std::vector<size_t> order(U_.params.size());
    for (size_t k = 0; k < order.size(); ++k) order[k] = k;
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
      return InModelOrder(S_.atoms[U_.params[x].atom].place, S_.atoms[U_.params[y].atom].place);
    });
    return order;
  }

  ValuePtr DsVersion() const {
    auto v = S_.optimizer.root->Get("ds_version");
    if (!v) v = S_.model_states.root->Get("ds_version");
    return v ? v : Value::Str("0.14.5");
  }

  ValuePtr GroupStep(int g) {
    for (const auto& a : S_.atoms)
      if (a.group == g && a.has_step) {
        auto it = steps_.find(g);
        if (it == steps_.end()) it = steps_.emplace(g, S_.reader->ReadStep(a.name)).first;
        return it->second;
      }
    return Value::None();
  }

  // A model that is not a PipelineModule: its state_dict, this TP rank's weights in the training
  // dtype under GPTModel's names, in the model's order (embedding, layers, final norm).
  ValuePtr PlainModule() const {
    const auto lp = LpOf(T_.dtype);
    auto module = OrderedDict();
    for (size_t k : ModelOrder())
      SetItem(*module, P_.names[U_.params[k].atom], pt::OwnedTensor(lp_[k], lp_[k].get(), lp.dtype, U_.params[k].copy.shape));
    return module;
  }

  void WriteLayerFiles() {
    const auto lp = LpOf(T_.dtype);
    std::map<int, ValuePtr> files;  // spec -> OrderedDict
    for (size_t k : ModelOrder()) {
      const Atom& a = S_.atoms[U_.params[k].atom];
      if (a.tied() && U_.pp != P_.embedding_stage) continue;  // the tied head writes no layer file
      auto& f = files[a.spec()];
      if (!f) f = OrderedDict();
      auto owner = lp_[k];
      SetItem(*f, a.place.local, pt::OwnedTensor(owner, owner.get(), lp.dtype, U_.params[k].copy.shape));
    }
    for (const auto& [spec, dict] : files) {
      WriteShardFile(deepspeed::LayerStatesFileName(spec, U_.tp), *dict);
    }
  }

  // Megatron-DeepSpeed names the TP rules (replicated, averaged, row-parallel) in its info only at
  // TP > 1. A TP > 1 target of a source whose info lacks one of them gets it from the rules that
  // decided the parameters (the manifest's, the model family's where the checkpoint was silent), in
  // the model's order, placed before the sub-parameter keys as Megatron-DeepSpeed places them.
  ValuePtr WithTpRules(const Value& info) const {
    std::vector<std::pair<std::string, ValuePtr>> missing;
    std::vector<size_t> order(S_.atoms.size());
    for (size_t k = 0; k < order.size(); ++k) order[k] = k;
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return InModelOrder(S_.atoms[x].place, S_.atoms[y].place); });
    for (const char* key : {patterns::kAverageKey, patterns::kReplicateKey, patterns::kRowParallelKey}) {
      if (info.Get(key)) continue;
      auto list = Value::Make(Value::Kind::List);
      std::set<std::string> seen;
      for (size_t k : order) {
        const auto& rule = S_.atoms[k].meta.value("rule", json::object());
        if (!rule.is_object() || rule.value("key", "") != key) continue;
        const std::string re = rule.value("regex", "");
        if (!re.empty() && seen.insert(re).second) list->items.push_back(Value::Str(re));
      }
      if (!list->items.empty()) missing.emplace_back(key, list);
    }
    auto out = Copied(info);
    if (missing.empty()) return out;
    out->dict = pt::Dict();
    auto put_missing = [&] {
      for (auto& [key, list] : missing) SetItem(*out, key, list);
      missing.clear();
    };
    for (const auto& item : info.dict.items()) {
      const std::string key = item.key->kind == Value::Kind::Str ? item.key->s : "";
      if (key == patterns::kTwoSubParamsKey || key == patterns::kSubParamsKey || key == "sub_param_shard_widths") put_missing();
      out->dict.Set(item.key, item.value);
    }
    put_missing();
    return out;
  }

  ValuePtr ModelStates(ValuePtr module) const {
    auto root = Copied(*S_.model_states.root);
    SetItem(*root, "module", std::move(module));
    auto shapes = Value::Make(Value::Kind::List);
    for (const auto& grp : U_.groups) {
      auto m = OrderedDict();
      for (int k : grp) SetItem(*m, P_.names[U_.params[k].atom], TorchSize(U_.params[k].copy.shape));
      shapes->items.push_back(m);
    }
    SetItem(*root, "param_shapes", shapes);
    // DeepSpeed records frozen parameters (none here) when ZeRO partitions gradients (stage 2, 3).
    for (const char* key : {"frozen_param_shapes", "frozen_param_fragments"})
      PutIfPresent(*root, key, T_.zero_stage >= 2 ? OrderedDict() : Value::None());
    SetItem(*root, "dp_world_size", Value::Int(T_.dp));
    SetItem(*root, "mp_world_size", Value::Int(T_.tp * T_.pp));
    SetItem(*root, "ds_config", DsConfig());
    if (auto args = root->Get("args"); args && args->kind == Value::Kind::Object && args->state) {
      auto a = Copied(*args);
      a->state = Copied(*args->state);
      Value& st = *a->state;
      PutIfPresent(st, "tensor_model_parallel_size", Value::Int(T_.tp));
      PutIfPresent(st, "pipeline_model_parallel_size", Value::Int(T_.pp));
      PutIfPresent(st, "data_parallel_size", Value::Int(T_.dp));
      PutIfPresent(st, "world_size", Value::Int(T_.dp * T_.tp * T_.pp));
      if (P_.padded_vocab > 0) PutIfPresent(st, "padded_vocab_size", Value::Int(P_.padded_vocab));
      PutIfPresent(st, "fp16", Value::Bool(T_.dtype == "fp16"));
      PutIfPresent(st, "bf16", Value::Bool(T_.dtype == "bf16"));
      PutIfPresent(st, "params_dtype", TorchDtype(T_.dtype));
      PutIfPresent(st, "zero_stage", Value::Int(T_.zero_stage));
      PutIfPresent(st, "no_pipeline_parallel", Value::Bool(NamingOf(T_) == Naming::Plain));
      SetItem(*root, "args", a);
    }
    if (auto info = root->Get("universal_checkpoint_info"); info && info->kind == Value::Kind::Dict) {
      auto i = T_.tp > 1 ? WithTpRules(*info) : Copied(*info);
      if (P_.padded_vocab > 0) PutIfPresent(*i, "padded_vocab_size", Value::Int(P_.padded_vocab));
      if (auto widths = info->Get("sub_param_shard_widths"); widths && widths->kind == Value::Kind::Dict) {
        auto w = Copied(*widths);
        w->dict = pt::Dict();
        for (const auto& item : widths->dict.items()) {
          auto per = Value::Make(Value::Kind::List);
          for (const auto& sub : item.value->AsSequence()) {
            int64_t size = 0;
            for (const auto& x : sub->AsSequence()) size += x->AsInt();
            per->items.push_back(IntList(std::vector<int64_t>(T_.tp, size / T_.tp)));
          }
          w->dict.Set(item.key, per);
        }
        SetItem(*i, "sub_param_shard_widths", w);
      }
      std::vector<std::pair<std::string, std::string>> names;
      for (size_t k = 0; k < S_.atoms.size(); ++k) names.emplace_back(S_.atoms[k].name, P_.names[k]);
      SetItem(*root, "universal_checkpoint_info", RenameRules(*i, names, S_.naming, NamingOf(T_), S_.layers));
    }
    return root;
  }

  const Source& S_;
  const TargetLayout& T_;
  const Plan& P_;
  const HeldPieces& H_;
  const Unit& U_;
  std::string dir_;
  ScratchBytes& arena_;
  std::vector<std::shared_ptr<uint8_t[]>> lp_;
  std::map<int, ValuePtr> steps_;
  double read_seconds_ = 0;
  int64_t bytes_written_ = 0, files_written_ = 0;
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

}  // namespace

LayoutChoice ChooseLayoutFor(const std::string& atomic_dir, const PlannerRequest& request) {
  return ChooseFor(LoadSource(atomic_dir), request);
}

int RunReshard(const ReshardOptions& o, shuffle::Comm& comm, std::ostream& out, std::ostream& err) {
  const int rank = comm.rank(), ranks = comm.size();
  const bool talk = rank == 0 && !o.quiet;
  const auto t0 = std::chrono::steady_clock::now();
  Source S;
  Plan P;
  TargetLayout T;
  LayoutChoice choice;
  std::string tag;  // the source's, the target's folder name
  std::string error = Capture([&] {
    if (!o.plan_only && !o.in_place) RefuseOutputWithin(o.output, o.atomic_dir, "the atomic checkpoint");
    S = LoadSource(o.atomic_dir);
    WithContext(o.atomic_dir + "/" + store::kManifestName, [&] {
      tag = S.manifest.at("source").at("tag").get<std::string>();
      RequirePlainName(tag, "source.tag");
    });
    T = o.target;
    if (o.planner.gpus > 0) {
      choice = ChooseFor(S, o.planner);
      if (choice.chosen < 0 && !o.plan_only) throw Error(choice.reason);
      if (choice.chosen >= 0) T = choice.candidates[choice.chosen].layout;
      if (o.plan_only) return;
    }
    T = ResolveModel(S, T);
    P = MakePlan(S, T, ranks, o.share_bytes);
  });
  if (AnyFailed(comm, error, err, kTool)) return 1;
  if (o.planner.gpus > 0 && o.plan_only) {  // the layout chosen, not the work of writing it
    if (rank == 0) {
      if (o.json)
        out << choice.ToJson(o.planner).dump(1) << "\n";
      else
        choice.Print(out, o.planner);
    }
    return choice.chosen >= 0 ? 0 : 1;
  }
  if (talk && o.planner.gpus > 0) err << kTool << ": layout for " << o.planner.gpus << " GPUs: " << choice.reason << "\n";
  if (talk)
    err << kTool << ": " << o.atomic_dir << " (" << S.atoms.size() << " parameters, from dp=" << S.manifest["source"]["dp"]
        << " tp=" << S.manifest["source"]["tp"] << " pp=" << S.manifest["source"]["pp"] << ") to " << T.Describe()
        << "; " << P.units.size() << (T.zero_stage == 3 ? " (model-parallel, DP) ranks' files" : " model-parallel ranks")
        << " on " << comm.name() << "\n";
  if (talk && P.padded_vocab > 0 && T.vocab_divisible_by <= 0 && S.divisible_by <= 0 && T.tp != S.tp)
    err << kTool << ": note: the checkpoint has no args.make_vocab_size_divisible_by; " << DerivedDivisibleBy(S)
        << " fits its padded_vocab_size " << S.padded_vocab << " at tp=" << S.tp << ", so the vocabulary is padded to "
        << P.padded_vocab << " rows (--make-vocab-size-divisible-by to choose)\n";
  if (o.plan_only) {
    if (rank == 0) {
      json j = PlanJson(S, T, P, ranks);
      if (o.json) {
        out << j.dump(1) << "\n";
      } else {
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
    }
    return 0;
  }

  // The output folder, locked first: refused when it holds something, unless --force (then
  // `latest` goes first, then what it named, and what killed runs left).
  const std::string out_tag = o.output_tag.empty() ? tag : o.output_tag;
  const std::string dir = o.output + "/" + out_tag;
  std::unique_ptr<OutputLock> lock;
  std::string lock_note;
  error = rank == 0 ? Capture([&] {
    if (fs::exists(o.output) && !fs::is_directory(o.output)) throw Error(o.output + ": exists and is not a folder");
    lock = std::make_unique<OutputLock>(o.output, kTool, &lock_note);
    if (o.in_place) {
      fs::remove_all(dir);  // what a killed run left: `latest` never named it
    } else if (!OutputLock::HoldsOnlyLock(o.output)) {
      if (!o.force)
        throw Error(o.output + ": exists and is not empty; use --force to overwrite it");
      fs::remove(o.output + "/latest");
      fs::remove(o.output + "/latest_checkpointed_iteration.txt");
      fs::remove_all(dir);
      RemoveTemporaries(o.output);
    }
    fs::create_directories(dir);
  }) : "";
  if (AnyFailed(comm, error, err, kTool)) return 1;
  if (talk && !lock_note.empty()) err << kTool << ": note: " << lock_note << "\n";

  // Where this rank's time goes: the shared pieces read and exchanged, the units' reads (while
  // their files are written) and the rest of writing them, the one sync.
  json seconds = json::object();
  auto lap = [last = std::chrono::steady_clock::now()]() mutable {
    const auto now = std::chrono::steady_clock::now();
    return std::chrono::duration<double>(now - std::exchange(last, now)).count();
  };
  // The shared pieces first: read by one rank each, exchanged, held until their last unit is done.
  HeldPieces held(S, P, rank);
  error = Capture([&] { held.ReadMine(); });
  seconds["read_shared"] = lap();
  if (AnyFailed(comm, error, err, kTool)) return 1;
  std::pair<int64_t, int64_t> exchanged{0, 0};
  error = Capture([&] { exchanged = held.Exchange(comm, o.exchange_round_bytes); });
  seconds["exchange"] = lap();
  if (AnyFailed(comm, error, err, kTool)) return 1;
  int64_t planned = 0;
  for (const auto& sp : P.shared) planned += sp.reader == rank ? sp.bytes : 0;
  double unit_reads = 0;
  int64_t bytes_written = 0, files_written = 0;
  int64_t my_bytes = 0;  // the atomic bytes of this rank's units, for rank 0's progress line
  for (size_t k = 0; k < P.units.size(); ++k) my_bytes += P.owner[k] == rank ? P.units[k].bytes : 0;
  ProgressLine progress(kTool, talk && o.progress, my_bytes);
  error = Capture([&] {
    ScratchBytes arena;
    int64_t done = 0;
    for (size_t k = 0; k < P.units.size(); ++k) {
      if (P.owner[k] != rank) continue;
      UnitWriter writer(S, T, P, held, P.units[k], dir, arena);
      writer.Write();
      unit_reads += writer.read_seconds();
      bytes_written += writer.bytes_written(), files_written += writer.files_written();
      held.Done(P.units[k]);
      planned += P.units[k].bytes;
      progress.Update(done += P.units[k].bytes);
    }
    progress.Update(done, true);
  });
  const double units = lap();
  seconds["read"] = unit_reads, seconds["write"] = units - unit_reads;
  // The shard files were written without an fsync each: one sync of the file system makes them
  // durable together, on every rank, before rank 0 writes `latest`.
  if (error.empty()) error = Capture([&] { SyncFileSystemOf(dir); });
  seconds["sync"] = lap();
  if (AnyFailed(comm, error, err, kTool)) return 1;
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  // Bytes read as the store counts them: the slabs asked for, and what storage delivered for them
  // (HDF5 reads whole chunks).
  json mine = {{"rank", rank}, {"bytes_read", static_cast<int64_t>(S.reader->storage_bytes_read())},
               {"slab_bytes", static_cast<int64_t>(S.reader->bytes_read())}, {"planned_bytes", planned},
               {"bytes_written", bytes_written}, {"files_written", files_written},
               {"exchange_rounds", exchanged.first}, {"exchange_bytes_sent", exchanged.second}, {"seconds", seconds},
               {"peak_rss_bytes", static_cast<int64_t>(ru.ru_maxrss) * 1024}};
  auto stats = comm.GatherToRoot(mine.dump());
  error = rank == 0 ? Capture([&] {
    // `latest` last: a run killed before this line leaves no checkpoint DeepSpeed would load (in
    // place: `latest` still names the checkpoint it named).
    if (o.in_place) WriteFileAtomically(dir + "/" + source::kReshardMarker, o.marker.dump(1) + "\n");
    const std::string iteration_file = o.output + "/latest_checkpointed_iteration.txt";
    if (!o.in_place || fs::exists(iteration_file))
      WriteFileAtomically(iteration_file, std::to_string(S.manifest["source"]["iteration"].get<int64_t>()));
    WriteFileAtomically(o.output + "/latest", out_tag);
  }) : "";
  if (AnyFailed(comm, error, err, kTool)) return 1;
  if (rank == 0) {
    int64_t total = 0, peak = 0, written = 0;
    json per = json::array();
    for (const auto& s : stats) {
      auto j = json::parse(s);
      total += j["bytes_read"].get<int64_t>(), written += j["bytes_written"].get<int64_t>();
      peak = std::max(peak, j["peak_rss_bytes"].get<int64_t>());
      per.push_back(j);
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double ratio = P.needed_bytes ? static_cast<double>(total) / static_cast<double>(P.needed_bytes) : 1.0;
    if (!o.report_path.empty()) {
      json report = {{"atomic", o.atomic_dir}, {"store", store::StoreName(S.reader->store())}, {"output", o.output},
                     {"ranks", ranks}, {"seconds", secs}, {"bytes_read", total}, {"atomic_bytes", P.needed_bytes},
                     {"read_ratio", ratio}, {"bytes_written", written}, {"per_rank", per}};
      error = Capture([&] { WriteFileAtomically(o.report_path, report.dump(1) + "\n"); });
      if (!error.empty()) {
        err << kTool << ": error: " << error << std::endl;
        return 1;
      }
    }
    if (talk) {
      char buf[256];
      std::snprintf(buf, sizeof buf, "%s: wrote %s: read %s (%.3fx the atomic tensors) in %.2fs, peak RSS %s per rank\n",
                    kTool, o.output.c_str(), HumanBytes(double(total)).c_str(), ratio, secs, HumanBytes(double(peak)).c_str());
      err << buf;
    }
  }
  return 0;
}

}  // namespace ucp::reshard
