#include "formats/megatron/mcore_target.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <set>

#include "core/error.h"
#include "formats/dcp/dcp_files.h"
#include "formats/dcp/target.h"
#include "formats/hf/model.h"
#include "formats/hf/names.h"
#include "formats/megatron/legacy_names.h"
#include "formats/megatron/mcore_args.h"
#include "formats/megatron/mcore_cross_optimizer.h"
#include "formats/megatron/mcore_keys.h"
#include "layout/naming.h"
#include "pt/torch_file.h"
#include "source/megatron_groups.h"
#include "source/megatron_stacking.h"
#include "source/megatron_tracker.h"

namespace ucp::formats::megatron {
using pt::Value;
using pt::ValuePtr;
using reshard::ExportTensor;

namespace {

// The new layout: TP x PP x DP ranks, numbered as Megatron-Core numbers them by default (tp fastest,
// then dp, then pp); DP rank 0 saves every value. A MoE model's experts: EP ranks among the DP ranks,
// expert TP = TP (Megatron-LM's default), numbered tp, ep, expert dp, pp: the rank of EP rank e and
// expert DP rank 0 is DP rank e's, which saves its experts.
struct Grid {
  int64_t tp = 1, pp = 1, dp = 1, ep = 1;
  bool ep_given = false;  // --ep, else the source's
  bool dp_given = true;   // --dp, else 1
  int64_t Rank(int64_t t, int64_t p, int64_t e = 0) const { return t + tp * (e + dp * p); }
  std::string text() const {
    return "TP=" + std::to_string(tp) + " PP=" + std::to_string(pp) + " DP=" + std::to_string(dp) + (ep > 1 ? " EP=" + std::to_string(ep) : "");
  }
};

// The optimizer state's form in the files: the job's optimizer's (its args), each loaded at any TP / PP.
enum class Form { None, Distributed, Mixed, Fp32 };

// The source's common state: Megatron-Core's common.pt, or the file a legacy source's args went to.
const Value& CommonState(const reshard::Source& S) {
  const Value* c = S.args_file.root ? S.args_file.root.get() : S.model_states.root.get();
  if (!c || !c->Get("args") || c->Get("args")->kind != Value::Kind::Object)
    throw Error(S.reader->dir() + ": no Megatron-LM args in the atomic checkpoint: --format mcore writes the job's own args at the new "
                "layout (Megatron-LM checks the model's against them), so it needs a source that saved them (a Megatron-Core or "
                "Megatron-LM checkpoint)");
  return *c;
}

int64_t Number(const Value& args, const char* name, int64_t otherwise) { return source::ArgInt(&args, name, otherwise); }
bool IsSet(const Value& args, const char* name) { return source::ArgSet(&args, name); }

// One TP rank's boxes of a tensor (in its per-layer shape); none where the rank holds a copy it does not save.
struct Piece {
  std::vector<int64_t> offsets, sizes;
};

std::vector<Piece> PiecesOf(const McoreKey& p, int64_t t, int64_t tp) {
  Piece whole{std::vector<int64_t>(p.shape.size(), 0), p.shape};
  if (p.name.split == DistName::Whole) return t == 0 ? std::vector<Piece>{whole} : std::vector<Piece>{};
  const size_t d = p.name.split == DistName::Rows ? 0 : 1;
  const int64_t parts = p.name.gated ? 2 : 1, n = p.shape.at(d) / parts, step = n / tp;
  std::vector<Piece> out;
  for (int64_t k = 0; k < parts; ++k) {  // SwiGLU's [gate; up]: each rank's part of each half
    Piece one = whole;
    one.offsets[d] = k * n + t * step, one.sizes[d] = step;
    out.push_back(one);
  }
  return out;
}

// The stage a tensor outside the decoder's layers is on: the embedding on the first, the head on the last.
int64_t StageOf(const std::string& key, int64_t pp) { return key.rfind("embedding.", 0) == 0 ? 0 : pp - 1; }

pt::DType TypeOf(const std::string& dtype) { return dtype == "bf16" ? pt::DType::BF16 : dtype == "fp16" ? pt::DType::F16 : pt::DType::F32; }

class McorePlan {
 public:
  McorePlan(const reshard::Source& S, const Grid& g, int64_t layers) : S_(S), g_(g), layers_(layers) {}

  // Every chunk of `key` (a model key or an optimizer state's), values of state `state` in `dtype`: each
  // TP rank's piece of each layer, one chunk per run of rows it takes from a source tensor.
  void Chunks(const McoreKey& p, const std::string& key, int state, const std::string& dtype) {
    if (p.experts > 0) return ExpertChunks(p, key, state, dtype);
    const pt::DType type = TypeOf(dtype);
    std::vector<int64_t> global = p.shape;
    if (p.stacked) global.insert(global.begin(), layers_);
    for (int64_t stage = 0; stage < g_.pp; ++stage) {
      if (!p.stacked && StageOf(p.key, g_.pp) != stage) continue;  // (the model key's stage: its optimizer state lies beside it)
      const int64_t first = p.stacked ? stage * layers_ / g_.pp : -1, last = p.stacked ? (stage + 1) * layers_ / g_.pp : 0;
      for (int64_t t = 0; t < g_.tp; ++t)
        for (const Piece& piece : PiecesOf(p, t, g_.tp))
          for (int64_t l = first; l < std::max<int64_t>(last, first + 1); ++l) {
            const int64_t r0 = piece.offsets[0], r1 = r0 + piece.sizes[0];
            int64_t at = 0;  // the first row of the key's layer segment s holds
            for (const Segment& s : p.layers.at(p.stacked ? l : 0)) {
              const int64_t lo = std::max(r0, at), hi = std::min(r1, at + s.count);
              at += s.count;
              if (lo >= hi) continue;
              dcp::PlannedItem it;
              it.saved.key = key, it.saved.shape = global, it.saved.dtype = type;
              it.saved.offsets = piece.offsets, it.saved.sizes = piece.sizes;
              it.saved.offsets[0] = lo, it.saved.sizes[0] = hi - lo;
              if (p.stacked) it.saved.offsets.insert(it.saved.offsets.begin(), l), it.saved.sizes.insert(it.saved.sizes.begin(), 1);
              it.data = s.rows;
              it.data.name = key, it.data.state = state, it.data.dtype = dtype, it.data.layer_axis = p.stacked;
              it.data.box_offsets = piece.offsets, it.data.box_sizes = piece.sizes;
              it.data.box_offsets[0] = s.first + (lo - (at - s.count)), it.data.box_sizes[0] = hi - lo;
              Add(g_.Rank(t, stage), std::move(it));
            }
          }
    }
  }

  // A MoE layer's experts: each expert TP rank's piece of each expert of each layer, saved by the
  // expert's EP rank (expert DP rank 0), as chunks [1, 1, piece...] of [layers, experts, ...].
  void ExpertChunks(const McoreKey& p, const std::string& key, int state, const std::string& dtype) {
    std::vector<int64_t> global = p.shape;
    global.insert(global.begin(), {layers_, p.experts});
    const int64_t per_rank = p.experts / g_.ep;
    for (int64_t l = 0; l < layers_; ++l) {
      const int64_t stage = l * g_.pp / layers_;
      for (int64_t e = 0; e < p.experts; ++e)
        for (int64_t t = 0; t < g_.tp; ++t)
          for (const Piece& piece : PiecesOf(p, t, g_.tp)) {
            dcp::PlannedItem it;
            it.saved.key = key, it.saved.shape = global, it.saved.dtype = TypeOf(dtype);
            it.saved.offsets = piece.offsets, it.saved.sizes = piece.sizes;
            it.saved.offsets.insert(it.saved.offsets.begin(), {l, e}), it.saved.sizes.insert(it.saved.sizes.begin(), {1, 1});
            it.data = p.layers.at(l).at(e).rows;
            it.data.name = key, it.data.state = state, it.data.dtype = dtype, it.data.layer_axis = true;
            it.data.box_offsets = piece.offsets, it.data.box_sizes = piece.sizes;
            Add(g_.Rank(t, stage, e / per_rank), std::move(it));
          }
    }
  }

  // A ShardedObject on rank `rank`: a bytes item, the torch.save file of its value inside a one-element
  // list (as Megatron-Core saves every ShardedObject, and its load takes the list apart).
  void Object(const std::string& key, ValuePtr value, int64_t rank) {
    dcp::PlannedItem it;
    it.saved.key = key, it.saved.bytes = true;
    auto list = Value::Make(Value::Kind::List);
    list->items.push_back(std::move(value));
    it.data.name = key, it.data.payload = pt::TorchFileBytes(*list);
    Add(rank, std::move(it));
  }

  // Each rank's file, rank by rank, into P (under `folder`) and c.
  void Lay(const std::string& folder, reshard::ExportPlan& P, dcp::SavedCheckpoint& c) {
    for (auto& [rank, items] : files_) dcp::LayDcpFile(static_cast<int>(rank), folder, std::move(items), P, c);
    for (const std::string& key : keys_) {
      auto path = Value::Make(Value::Kind::Tuple);
      path->items.push_back(Value::Str(key));
      c.planner_data.emplace_back(key, path);
    }
  }

 private:
  void Add(int64_t rank, dcp::PlannedItem it) {
    if (seen_.insert(it.saved.key).second) keys_.push_back(it.saved.key);
    files_[rank].push_back(std::move(it));
  }
  const reshard::Source& S_;
  Grid g_;
  int64_t layers_;
  std::map<int64_t, std::vector<dcp::PlannedItem>> files_;
  std::vector<std::string> keys_;
  std::set<std::string> seen_;
};

// Refused where a key's TP cut does not divide.
void CheckCuts(const std::vector<McoreKey>& keys, const Grid& g) {
  for (const McoreKey& p : keys) {
    if (p.name.split == DistName::Whole) continue;
    const size_t d = p.name.split == DistName::Rows ? 0 : 1;
    const int64_t parts = p.name.gated ? 2 : 1;
    if (p.shape.size() <= d || p.shape[d] % (parts * g.tp) != 0) {
      std::vector<int64_t> shape = p.shape;
      if (p.stacked) shape.insert(shape.begin(), static_cast<int64_t>(p.layers.size()));
      throw Error("--tp " + std::to_string(g.tp) + ": parameter '" + p.key + "' of shape " + pt::ShapeString(shape) + " has " +
                  (p.shape.size() > d ? std::to_string(p.shape[d]) : "no") + (d == 0 ? " rows" : " columns") +
                  (parts == 2 ? " in two halves (SwiGLU's gate and up)" : "") + ", which " + std::to_string(g.tp) +
                  " tensor-parallel ranks cannot share evenly");
    }
  }
}

// The vocabulary rows: Megatron-LM pads the tokenizer's vocabulary at every launch to a multiple of
// make_vocab_size_divisible_by x TP (_vocab_size_with_padding), and its load refuses another shape. The
// rows written are the checkpoint's, so the job at the new TP must compute the same number: proven from
// the vocabulary size where the args hold it (vocab_size), else from the padding the rows already have
// (a multiple of the old padding's that divides the rows gives them back for any vocabulary they can
// hold). Returns the divisor the job pads with; refused naming one that would keep the rows.
int64_t VocabDivisor(const reshard::Source& S, const Value& args, const Grid& g, int64_t asked, std::vector<std::string>& notes) {
  int64_t rows = -1;
  for (const reshard::Atom& a : S.atoms)
    if (a.name == "embedding.word_embeddings.weight" || (rows < 0 && a.name == "output_layer.weight")) rows = a.shape.at(0);
  const int64_t d = asked > 0 ? asked : Number(args, "make_vocab_size_divisible_by", 128);
  if (rows < 0) return d;
  if (d < 1 || Number(args, "make_vocab_size_divisible_by", 128) < 1)
    throw Error(S.reader->dir() + ": the args' make_vocab_size_divisible_by is not a positive number: Megatron-LM could not pad the "
                "vocabulary with it");
  if (Number(args, "padded_vocab_size", -1) < 0) {  // args that no Megatron-LM launch validated: what padding made the rows is not known
    // A job padding to a multiple of d x TP cannot compute rows that are not one: refused where the user gave d (the
    // args' own divisor is not known to be what made these rows: said, not refused).
    if (asked > 0 && rows % (d * g.tp) != 0)
      throw Error("--tp " + std::to_string(g.tp) + ": Megatron-LM pads the vocabulary to a multiple of make_vocab_size_divisible_by (" +
                  std::to_string(d) + ") x TP = " + std::to_string(d * g.tp) + " rows, and this checkpoint's embedding has " +
                  std::to_string(rows) + " rows, not a multiple: the job at TP=" + std::to_string(g.tp) + " would refuse its shape" +
                  (rows % g.tp == 0 ? " (give --make-vocab-size-divisible-by a divisor of " + std::to_string(rows / g.tp) +
                                          " to the job and to ucp-reshard)" : ""));
    notes.push_back("the args record no padded_vocab_size: the " + std::to_string(rows) + " vocabulary rows are written as they are; "
                    "the job's tokenizer and --make-vocab-size-divisible-by (x TP " + std::to_string(g.tp) + ") must pad to the same rows" +
                    (rows % (d * g.tp) != 0 ? " (the args' make_vocab_size_divisible_by " + std::to_string(d) + " x TP " + std::to_string(g.tp) +
                                                  " would not: it is not what made these rows" +
                                                  (rows % g.tp == 0 ? "; give the job and ucp-reshard a divisor of " + std::to_string(rows / g.tp) : std::string()) + ")"
                                            : std::string()));
    return d;
  }
  const int64_t vocab = Number(args, "vocab_size", -1);
  const int64_t old_multiple = Number(args, "make_vocab_size_divisible_by", 128) * Number(args, "tensor_model_parallel_size", 1);
  auto keeps = [&](int64_t divisor) {  // whether a job padding with `divisor` at the new TP computes `rows`
    const int64_t m = divisor * g.tp;
    if (vocab > 0) return (vocab + m - 1) / m * m == rows;
    return rows % m == 0 && m >= old_multiple;
  };
  if (keeps(d)) return d;
  int64_t fits = 0;  // the largest divisor that would keep the rows
  for (int64_t x = rows / g.tp; x >= 1 && !fits; --x)
    if (keeps(x)) fits = x;
  throw Error("--tp " + std::to_string(g.tp) + ": Megatron-LM pads the vocabulary" + (vocab > 0 ? " (" + std::to_string(vocab) + " tokens)" : "") +
              " to a multiple of make_vocab_size_divisible_by (" + std::to_string(d) + ") x TP = " + std::to_string(d * g.tp) +
              " rows, and this checkpoint's embedding has " + std::to_string(rows) + " rows" + (vocab > 0 ? "" : " (the vocabulary size is not in its args)") +
              ": the job at TP=" + std::to_string(g.tp) + " would refuse its shape" +
              (fits ? "; launch it with --make-vocab-size-divisible-by " + std::to_string(fits) + " (" + std::to_string(fits) + " x " +
                          std::to_string(g.tp) + " keeps " + std::to_string(rows) + " rows) and give ucp-reshard the same flag"
                    : "; no divisor keeps these rows at this TP (re-padding the vocabulary is not written yet)"));
}

// The args at the new layout: a copy of the source's Namespace with its parallel sizes, its rank 0 and
// what the files hold (no RNG state; no optimizer state where there is none).
ValuePtr ArgsAt(const Value& args, const Grid& g, bool optimizer, int64_t vocab_divisor) {
  auto a = std::make_shared<Value>(args);
  a->state = std::make_shared<Value>(*args.state);
  auto set = [&](const char* name, ValuePtr v) { pt::SetItem(*a->state, name, std::move(v)); };
  set("tensor_model_parallel_size", Value::Int(g.tp));
  set("pipeline_model_parallel_size", Value::Int(g.pp));
  if (args.Get("transformer_pipeline_model_parallel_size")) set("transformer_pipeline_model_parallel_size", Value::Int(g.pp));
  set("data_parallel_size", Value::Int(g.dp));
  if (args.Get("expert_model_parallel_size")) set("expert_model_parallel_size", Value::Int(g.ep));
  if (args.Get("expert_tensor_parallel_size") && IsSet(args, "num_experts")) set("expert_tensor_parallel_size", Value::Int(g.tp));
  set("world_size", Value::Int(g.tp * g.pp * g.dp));
  set("rank", Value::Int(0));
  set("ckpt_format", Value::Str("torch_dist"));
  set("no_save_rng", Value::Bool(true));
  if (vocab_divisor > 0) set("make_vocab_size_divisible_by", Value::Int(vocab_divisor));  // the job's, where the user gave it
  if (!optimizer) set("no_save_optim", Value::Bool(true));
  return a;
}

// The source's param groups, as saved.
const std::vector<ValuePtr>& SourceGroups(const reshard::Source& S) {
  const ValuePtr groups = S.optimizer.root ? S.optimizer.root->Get("param_groups") : nullptr;
  if (!groups || !groups->IsSequence()) throw Error(S.reader->dir() + "/zero/optimizer_state.pt: no param_groups list");
  for (const ValuePtr& g : groups->items)
    if (!g || g->kind != Value::Kind::Dict) throw Error(S.reader->dir() + "/zero/optimizer_state.pt: a param group is not a dict");
  return groups->items;
}

bool ExpertGroup(const Value& group) { return source::ArgSet(&group, "is_expert_parallel"); }

// A ChainedOptimizer source's group counts per optimizer (source::kMegatronChained; dense, then expert): empty for one optimizer.
std::vector<int64_t> ChainOf(const reshard::Source& S) {
  std::vector<int64_t> out;
  const ValuePtr chain = S.optimizer.root ? S.optimizer.root->Get(source::kMegatronChained) : nullptr;
  if (!chain) return out;
  const std::string where = S.reader->dir() + "/zero/optimizer_state.pt: " + source::kMegatronChained;
  if (!chain->IsSequence()) throw Error(where + " is not a list");
  for (const ValuePtr& n : chain->items) {
    if (!n || n->kind != Value::Kind::Int || n->i < 1) throw Error(where + " holds a count that is not a positive integer");
    out.push_back(n->i);
  }
  const std::vector<ValuePtr>& groups = SourceGroups(S);
  // Megatron-LM chains the dense optimizer, then the expert one: the counts must split the groups so
  size_t at = 0;
  for (size_t k = 0; k < out.size() && out.size() == 2; ++k)
    for (int64_t i = 0; i < out[k]; ++i, ++at)
      if (at >= groups.size() || ExpertGroup(*groups[at]) != (k == 1)) at = groups.size() + 1;
  if (out.size() != 2 || at != groups.size())
    throw Error(where + ": a chain of " + std::to_string(out.size()) + " optimizers that does not split the " + std::to_string(groups.size()) +
                " param groups into dense, then expert-parallel ones, as Megatron-LM's does");
  return out;
}

// Whether two groups hold the same options, but which parameters and whether they are expert-parallel.
bool TwinGroups(const Value& a, const Value& b) {
  return reshard::SameGroupOptions(a, b, [](const std::string& k) { return k == "params" || k == "step" || k == "is_expert_parallel"; });
}

// Megatron's param groups as common.pt keeps them: the source's options (no `params`: Megatron saves
// none), with the step in each where the distributed optimizer keeps it there. A job whose experts are
// not expert-parallel (EP 1: Megatron-Core marks them so only at EP > 1) has no expert groups: each
// merges into the group of the same options, as _get_param_groups builds them there. `twins`: source
// groups whose expert-parallel twins follow (an EP 1 source at EP > 1: ExpertTwins).
ValuePtr ParamGroups(const reshard::Source& S, double step, bool with_step, bool expert_groups, const std::vector<int>& twins) {
  const std::vector<ValuePtr>& groups = SourceGroups(S);
  auto copy = [&](const Value& group, bool expert_twin) {  // its options (no params), the step where the form keeps it there
    auto g = Value::Make(Value::Kind::Dict);
    for (const auto& kv : group.AsDict().items())
      if (kv.key->kind == Value::Kind::Str && kv.key->s != "params" && kv.key->s != "step") g->dict.Set(kv.key, kv.value);
    if (expert_twin) pt::SetItem(*g, "is_expert_parallel", Value::Bool(true));
    if (with_step) pt::SetItem(*g, "step", Value::Float(step));
    return g;
  };
  auto out = Value::Make(Value::Kind::List);
  for (const ValuePtr& group : groups) {
    if (!expert_groups && ExpertGroup(*group)) {
      if (std::none_of(groups.begin(), groups.end(), [&](const ValuePtr& g) { return !ExpertGroup(*g) && TwinGroups(*g, *group); }))
        throw Error(S.reader->dir() + ": an expert-parallel param group has options no other group has: at EP 1 Megatron-Core puts the "
                    "experts in the dense groups, which would change their options (keep --ep > 1)");
      continue;
    }
    out->items.push_back(copy(*group, false));
  }
  for (int i : twins) out->items.push_back(copy(*groups.at(static_cast<size_t>(i)), true));
  return out;
}

// One Megatron optimizer's common state in `form` over `groups` (Megatron's param groups, options only).
ValuePtr OptimizerCommon(ValuePtr groups, Form form, double step) {
  if (form == Form::Distributed) {
    auto inner = Value::Make(Value::Kind::Dict), optimizer = Value::Make(Value::Kind::Dict);
    pt::SetItem(*inner, "param_groups", std::move(groups));
    pt::SetItem(*optimizer, "optimizer", inner);
    pt::SetItem(*optimizer, "param_state_sharding_type", Value::Str("fully_reshardable"));
    return optimizer;
  }
  auto value = std::make_shared<float>(static_cast<float>(step));
  auto state = Value::Make(Value::Kind::Dict), torch_state = Value::Make(Value::Kind::Dict);
  pt::SetItem(*state, "common_step", pt::OwnedTensor(value, value.get(), pt::DType::F32, {}));
  pt::SetItem(*torch_state, "state", state);
  pt::SetItem(*torch_state, "param_groups", std::move(groups));
  if (form != Form::Mixed) return torch_state;
  auto optimizer = Value::Make(Value::Kind::Dict);  // Float16OptimizerWithFloat16Params: torch's state dict inside its own
  pt::SetItem(*optimizer, "optimizer", torch_state);
  return optimizer;
}

// The optimizer's common state: one optimizer's, or (`chained`) a ChainedOptimizer's as Megatron-LM's
// get_megatron_optimizer builds it at EP > 1: {0: the dense groups' optimizer, 1: the expert groups'}.
ValuePtr OptimizerState(ValuePtr groups, Form form, double step, bool chained) {
  if (!chained) return OptimizerCommon(groups, form, step);
  auto dense = Value::Make(Value::Kind::List), experts = Value::Make(Value::Kind::List);
  for (const ValuePtr& g : groups->items) (ExpertGroup(*g) ? experts : dense)->items.push_back(g);
  auto out = Value::Make(Value::Kind::Dict);
  out->dict.Set(Value::Int(0), OptimizerCommon(dense, form, step));
  out->dict.Set(Value::Int(1), OptimizerCommon(experts, form, step));
  return out;
}

// common.pt: `args`, the source's common state `common` (its version, iteration, scheduler; none: version
// 3.0, iteration 0), the optimizer's part in `form` over `groups`.
std::string CommonFile(ValuePtr args, const Value* common, Form form, double step, ValuePtr groups, bool chained) {
  const Value none;
  const Value& c = common ? *common : none;
  auto root = Value::Make(Value::Kind::Dict);
  pt::SetItem(*root, "args", std::move(args));
  auto version = c.Get("checkpoint_version");
  pt::SetItem(*root, "checkpoint_version", version ? version : Value::Float(3.0));
  auto iteration = c.Get("iteration");
  pt::SetItem(*root, "iteration", iteration ? iteration : Value::Int(0));
  auto content = Value::Make(Value::Kind::Dict);
  if (form != Form::None) pt::SetItem(*root, "optimizer", OptimizerState(std::move(groups), form, step, chained));
  if (form == Form::Distributed) {
    pt::SetItem(*content, "distrib_optim_sharding_type", Value::Str("fully_reshardable"));
    pt::SetItem(*content, "distrib_optim_fully_reshardable_mem_efficient", Value::Bool(false));
  }
  for (const char* key : {"opt_param_scheduler", "num_floating_point_operations_so_far"})
    if (auto v = c.Get(key); v && form != Form::None) pt::SetItem(*root, key, v);
  pt::SetItem(*content, "singleton_local_shards", Value::Bool(false));
  pt::SetItem(*content, "chained_optim_avoid_prefix", Value::Bool(true));
  pt::SetItem(*root, "content_metadata", content);
  return pt::TorchFileBytes(*root);
}

// The decoder's linears, whose (empty) extra state Megatron-Core saves per layer as a ShardedObject.
const char* const kLinears[] = {"self_attention.linear_qkv", "self_attention.linear_proj", "mlp.linear_fc1", "mlp.linear_fc2",
                                "mlp.experts.experts.linear_fc1", "mlp.experts.experts.linear_fc2"};

// Whether `names` are a Megatron-Core model's (every one in legacy_names.h's table).
bool McoreNames(const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    try {
      DistNameOfKey(name, false);
    } catch (const Error&) {
      return false;
    }
  }
  return true;
}

// Names of neither Megatron-Core nor a family whose Llama the Hugging Face target translates (a Trainer
// job's own names): refused, the first named.
void RefuseOtherNames(const std::vector<std::string>& names, const std::string& dir) {
  if (names.empty() || McoreNames(names) || hf::TranslatedNaming(names)) return;
  throw Error(dir + ": parameter '" + names.front() + "' is not a Megatron-Core model's, nor a Llama's under Megatron-DeepSpeed's or "
              "torchtitan's names (a Hugging Face Trainer or Accelerate job's own names): --format mcore does not translate them "
              "yet; --format hf writes this model");
}

// What the files hold beyond the tensors' values.
struct McoreJob {
  std::vector<McoreKey> keys;
  int64_t layers = 0;
  Form form = Form::None;
  std::string dtype;                 // the model keys'
  std::string folder, tracker;       // the iteration folder and the tracker's text
  std::string common;                // common.pt's bytes
  double step = 0;
  std::string model;                 // for messages
  std::vector<std::string> notes;
};

// Refused where --pp does not divide the layers or --tp the heads and query groups.
void CheckDegrees(const Grid& g, int64_t layers, int64_t heads, int64_t groups) {
  if (layers % g.pp != 0)
    throw Error("--pp " + std::to_string(g.pp) + " does not divide the model's " + std::to_string(layers) +
                " layers: Megatron-LM's pipeline stages hold equal numbers of layers");
  if (heads < 1 || heads % g.tp != 0 || groups % g.tp != 0)
    throw Error("--tp " + std::to_string(g.tp) + " does not divide the model's " +
                (heads >= 1 && heads % g.tp == 0 ? std::to_string(groups) + " query groups (of its " + std::to_string(heads) + " attention heads)"
                                                 : std::to_string(heads) + " attention heads") +
                ": each tensor-parallel rank holds whole heads and query groups");
}

// The DP a refusal names: "--dp 4", or "DP 1 (--dp not given)".
std::string DpWords(int64_t dp, bool given) { return given ? "--dp " + std::to_string(dp) : "DP 1 (--dp not given)"; }

// A MoE model's experts (SequentialMLP, every layer MoE) at g.ep EP ranks, which must divide the experts
// and the DP ranks (Megatron-LM's expert grid: TP x EP x expert DP x PP over the same ranks); a dense
// model at EP 1.
void CheckExperts(const std::vector<McoreKey>& keys, const Value& args, const Grid& g, const std::string& dir, std::vector<std::string>& notes) {
  int64_t experts = 0;
  for (const McoreKey& k : keys) experts = std::max(experts, k.experts);
  if (experts == 0) return;  // (--ep on a dense model: RefuseEpWithoutExperts)
  for (const char* name : {"moe_grouped_gemm", "moe_shared_expert_intermediate_size", "moe_use_legacy_grouped_gemm", "moe_router_enable_expert_bias"})
    if (IsSet(args, name))
      throw Error(dir + ": the args set " + name + ": --format mcore writes SequentialMLP experts without shared experts or a router's "
                  "expert bias (not yet this one)");
  // Every expert tensor, the router's expert axis and the args count the same experts.
  for (const McoreKey& k : keys) {
    const bool router = k.key.rfind("decoder.layers.mlp.router.", 0) == 0;
    const int64_t n = router ? (k.shape.empty() ? -1 : k.shape[0]) : k.experts;
    if ((router || k.name.experts) && n != experts)
      throw Error(dir + ": parameter '" + k.key + "' holds " + std::to_string(n) + " experts, another " + std::to_string(experts) +
                  ": the model's expert tensors disagree");
  }
  if (const int64_t n = Number(args, "num_experts", experts); n != experts)
    throw Error(dir + ": the args say num_experts " + std::to_string(n) + ", the expert tensors hold " + std::to_string(experts));
  if (auto f = args.Get("moe_layer_freq"); f && f->kind != Value::Kind::None && !(f->kind == Value::Kind::Int && f->i == 1))
    throw Error(dir + ": the args set moe_layer_freq (dense and MoE layers mixed): --format mcore writes models whose every layer is MoE "
                "(not yet this one)");
  if (experts % g.ep != 0 || g.dp % g.ep != 0)
    throw Error((g.ep_given ? "--ep " : "the source's EP ") + std::to_string(g.ep) + (experts % g.ep != 0 ? " does not divide the model's " + std::to_string(experts) + " experts"
                                                                      : " does not divide " + DpWords(g.dp, g.dp_given)) +
                ": Megatron-LM places the experts evenly over EP ranks taken from the DP ranks (give --ep, a divisor of both)");
  notes.push_back(std::to_string(experts) + " experts per layer over EP=" + std::to_string(g.ep) + " (" + std::to_string(experts / g.ep) +
                  " per EP rank), expert TP = TP = " + std::to_string(g.tp) + " (args.expert_tensor_parallel_size), expert DP " +
                  std::to_string(g.dp / g.ep));
}

// A MoE job at EP > 1 from a source whose experts were not expert-parallel (EP 1, no expert group): the
// source's groups whose twins (the same options, is_expert_parallel) Megatron-Core builds for the experts
// there, in order: those Megatron-Core's default rule puts the experts' parameters in. Empty where no
// group is to be made; refused where the source's groups are not the default rule's (which groups the
// experts would get is then not known).
std::vector<int> ExpertTwins(const reshard::Source& S, const std::vector<McoreKey>& keys, const Value& args, const Grid& g) {
  const bool experts = std::any_of(keys.begin(), keys.end(), [](const McoreKey& k) { return k.experts > 0; });
  const std::vector<ValuePtr>& groups = SourceGroups(S);
  if (!experts || g.ep == 1 || std::any_of(groups.begin(), groups.end(), [](const ValuePtr& p) { return ExpertGroup(*p); })) return {};
  std::vector<std::pair<std::string, std::vector<int64_t>>> params;
  for (const reshard::Atom& a : S.atoms) params.emplace_back(a.name, a.shape);
  const ValuePtr saved = S.optimizer.root->Get("param_groups");
  const source::MegatronGroups rule = source::MegatronGroupsOf(saved.get(), &args, params);
  std::set<int> twins;
  for (const auto& [name, shape] : params)
    if (source::StackedDims(name) == 2) {
      auto it = rule.group_of.find(name);
      if (it == rule.group_of.end())
        throw Error("EP=" + std::to_string(g.ep) + ": the source's experts were not expert-parallel (EP 1) and its " +
                    std::to_string(groups.size()) + " param groups are not Megatron-Core's default pair, so which expert groups "
                    "Megatron builds at EP > 1 is not known; give --ep 1, or --weights-only to write the model alone");
      twins.insert(it->second);
    }
  return {twins.begin(), twins.end()};
}

// The job of a Megatron-Core source: its own keys, args, iteration, optimizer and scheduler.
McoreJob OwnJob(const reshard::Source& S, const reshard::ExportOptions& o, const Grid& g) {
  const std::string dir = S.reader->dir();
  McoreJob j;
  const Value& common = CommonState(S);
  const Value& args = *common.Get("args");
  for (const char* name : {"num_layers_per_virtual_pipeline_stage", "virtual_pipeline_model_parallel_size", "pipeline_model_parallel_layout",
                           "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers", "mtp_num_layers"})
    if (IsSet(args, name))
      throw Error(dir + ": the args set " + name + ": --format mcore writes even pipeline stages without multi-token prediction "
                  "(not yet this one)");
  if (Number(args, "context_parallel_size", 1) != 1)
    throw Error(dir + ": the args set context_parallel_size " + std::to_string(Number(args, "context_parallel_size", 1)) +
                ": --format mcore writes TP x PP x DP layouts (not yet context parallelism)");
  j.layers = Number(args, "num_layers", -1);
  if (j.layers < 1) throw Error(dir + ": the args give no num_layers");
  const int64_t heads = Number(args, "num_attention_heads", -1);
  CheckDegrees(g, j.layers, heads, IsSet(args, "group_query_attention") ? Number(args, "num_query_groups", heads) : heads);
  j.keys = KeysOfMcoreAtoms(S, IsSet(args, "swiglu"), j.layers);
  CheckExperts(j.keys, args, g, dir, j.notes);
  CheckCuts(j.keys, g);
  const int64_t vocab_divisor = VocabDivisor(S, args, g, o.vocab_divisible_by, j.notes);

  j.dtype = S.manifest["source"].value("dtype", "fp32");
  j.form = Form::Fp32;
  if (S.manifest["source"].value("weights_only", false) || o.weights_only) j.form = Form::None;
  else if (IsSet(args, "use_distributed_optimizer")) j.form = Form::Distributed;
  else if (j.dtype != "fp32") j.form = Form::Mixed;
  if (o.distributed_optimizer && j.form != Form::Distributed)
    throw Error(j.form == Form::None ? std::string("--use-distributed-optimizer: no optimizer state is written (the model alone)")
                                     : dir + ": the source's args say use_distributed_optimizer False: --format mcore writes a Megatron-Core "
                                             "source's optimizer in its own job's form (leave --use-distributed-optimizer out)");
  if (j.form != Form::None)
    if (auto step = reshard::CommonStep(S, "Megatron-LM's optimizers keep one step for every parameter")) j.step = pt::StepValue(*step);
  auto iteration = common.Get("iteration");
  const int64_t it = iteration && iteration->kind == Value::Kind::Int ? iteration->i : 0;
  j.folder = source::IterationFolderName(std::to_string(it)), j.tracker = std::to_string(it);
  // At EP > 1 the job's optimizer is Megatron-LM's chain of a dense and an expert optimizer where the source's
  // was (a chained save), or where the source's experts were not expert-parallel (EP 1: the expert groups
  // are then made, twins of the dense groups the default rule puts the experts in); at EP 1 there are no experts' groups.
  const std::vector<int> twins = j.form != Form::None ? ExpertTwins(S, j.keys, args, g) : std::vector<int>{};
  const bool source_chain = j.form != Form::None && !ChainOf(S).empty();  // (a recorded chain checked at every EP)
  const bool chained = j.form != Form::None && g.ep > 1 && (source_chain || !twins.empty());
  const ValuePtr groups = j.form != Form::None ? ParamGroups(S, j.step, j.form == Form::Distributed, g.ep > 1, twins) : nullptr;
  j.common = CommonFile(ArgsAt(args, g, j.form != Form::None, o.vocab_divisible_by > 0 ? vocab_divisor : 0), &common, j.form, j.step,
                        groups, chained);
  if (chained)
    j.notes.push_back("the optimizer's state as Megatron-LM's ChainedOptimizer at EP > 1 (get_megatron_optimizer): a dense and an expert "
                      "optimizer" + std::string(twins.empty() ? " (the source's)" : "; the experts' groups made from the source's EP 1 groups, "
                      "as Megatron-Core's default rule builds them at EP > 1"));
  if (chained && j.form == Form::Mixed)  // what the real loads checked: FP32Optimizer and DistributedOptimizer chains (tests/data/real-mcore)
    j.notes.push_back("the chain of mixed-precision optimizers is written as Megatron-LM 0.17 saves it, but ucp's tests have loaded "
                      "chains of FP32Optimizers and of distributed optimizers only: check the resumed job's first losses");
  j.model = "Megatron-Core GPTModel, " + g.text();
  const bool legacy = S.manifest["source"].value("framework", std::string()) == "megatron-lm";
  j.notes.push_back("launch Megatron-LM on " + std::to_string(g.tp * g.pp * g.dp) + " GPUs with the job's flags and --tensor-model-parallel-size " +
                    std::to_string(g.tp) + " --pipeline-model-parallel-size " + std::to_string(g.pp) +
                    (g.ep > 1 || IsSet(args, "num_experts") ? " --expert-model-parallel-size " + std::to_string(g.ep) : "") +
                    " --ckpt-format torch_dist --load " + (o.output.empty() ? "ROOT" : o.output) +
                    (legacy ? " (the source was saved with --ckpt-format torch: the output is torch_dist)" : ""));
  if (g.tp > 1 && IsSet(args, "num_experts") && !IsSet(args, "sequence_parallel"))
    j.notes.push_back("the args say sequence_parallel False: Megatron-Core trains MoE layers at TP > 1 only with --sequence-parallel "
                      "(MoELayer refuses otherwise); launch with it");
  return j;
}

// Whether the names are Megatron-DeepSpeed's (GPTModel's language_model.*, GPTModelPipe's numbered
// layers and tied modules), not torchtitan's.
bool MegatronDeepSpeedNames(const std::vector<std::string>& names) {
  return std::any_of(names.begin(), names.end(), [](const std::string& n) {
    return n.starts_with("language_model.") || n.starts_with("tied_modules.") || (!n.empty() && std::isdigit(static_cast<unsigned char>(n[0])));
  });
}

// Whether --format mcore carries the optimizer state of a source of another family: a DeepSpeed checkpoint
// of Megatron-DeepSpeed's GPT (with Megatron's args or without); not yet torchtitan's, nor a Hugging Face
// import's fresh one.
bool CarriesOptimizer(const std::string& framework, bool deepspeed_names) {
  return deepspeed_names && (framework == "megatron-deepspeed" || framework == "deepspeed");
}

// A source of another family whose optimizer state --format mcore would drop: refused, naming --weights-only.
Error OptimizerStateRefusal(const std::string& what, const std::string& framework) {
  return Error(what + " holds the optimizer's state, which --format mcore carries from DeepSpeed checkpoints of Megatron-DeepSpeed's GPT only, not yet from " +
               (framework == "torch-dcp" ? std::string("torchtitan's") : framework == "hf" ? "a Hugging Face import's" : framework + "'s") +
               ": give --weights-only to write the model alone (Megatron-LM then starts a fresh optimizer from it, at iteration 0)");
}

// The job of a model under another family's names (Megatron-DeepSpeed's, a Hugging Face import's,
// torchtitan's Llama): its tensors re-joined as Megatron-Core's keys, args from the model's facts. A
// DeepSpeed checkpoint's optimizer state travels (mcore_cross_optimizer.h): written at its iteration. Without
// optimizer state (or --weights-only), the model alone as Megatron-LM's release checkpoint (its form for
// weights from elsewhere: the job's --load starts at iteration 0 with a fresh optimizer and its own RNG).
McoreJob OtherFamilyJob(const reshard::Source& S, const reshard::ExportOptions& o, const Grid& g, const std::vector<std::string>& names) {
  const std::string dir = S.reader->dir();
  McoreJob j;
  if (S.manifest["source"].value("moe", false))
    throw Error(dir + ": a Mixture-of-Experts model under another family's names: --format mcore writes Megatron-Core's own MoE models, "
                "and dense GPT / Llama models from other families (not yet their experts)");
  const bool deepspeed = MegatronDeepSpeedNames(names);
  const OtherFamilyModel model = [&] {
    if (deepspeed) return ModelOfMegatronDeepSpeed(S, o, j.notes);
    const hf::LlamaFacts m = [&] {
      try {
        return hf::LlamaFactsOf(S, o, j.notes);
      } catch (const Error& e) {
        throw Error(std::string("--format mcore writes torchtitan's Llama as --format hf writes it (LlamaForCausalLM): ") + e.what());
      }
    }();
    return ModelOfLlama(hf::LlamaTensors(S, m), m, dir);
  }();
  const ModelFacts& m = model.facts;
  CheckDegrees(g, m.layers, m.heads, m.groups);
  j.layers = m.layers;
  j.keys = model.keys;
  CheckCuts(j.keys, g);
  const std::string framework = S.manifest["source"].value("framework", std::string("DeepSpeed"));
  const bool carried = !S.manifest["source"].value("weights_only", false) && !o.weights_only;
  if (carried && !CarriesOptimizer(framework, deepspeed)) throw OptimizerStateRefusal(dir + ": the atomic checkpoint", framework);
  const int64_t divisor = KeptVocabDivisor(m.vocab, g.tp, o.vocab_divisible_by);
  j.dtype = S.manifest["source"].value("dtype", "fp32");
  if (!carried && o.distributed_optimizer)
    throw Error("--use-distributed-optimizer: no optimizer state is written (" +
                std::string(o.weights_only ? "--weights-only" : "a weights-only atomic checkpoint") + ": the model alone)");
  std::string job_flags;  // the optimizer's flags of the job's launch
  if (!carried) {
    j.form = Form::None;
    j.folder = j.tracker = "release";
    j.common = CommonFile(ArgsOf(m, g.tp, g.pp, g.dp, j.dtype, divisor), nullptr, Form::None, 0, nullptr, false);
  } else {
    // A Megatron-DeepSpeed run's optimizer: the form of the job's (FP32Optimizer, the mixed-precision one in bf16 /
    // fp16, or the distributed optimizer's fully_reshardable where asked), at the source's iteration.
    j.form = o.distributed_optimizer ? Form::Distributed : j.dtype == "fp32" ? Form::Fp32 : Form::Mixed;
    const ValuePtr step = reshard::CommonStep(S, "Megatron-LM's optimizers keep one step for every parameter");
    if (!step) throw Error(dir + ": no parameter to write");
    j.step = pt::StepValue(*step);
    CrossOptimizer x = DeepSpeedOptimizerForMcore(S, SourceGroups(S), j.keys);
    if (j.form == Form::Distributed)
      for (const ValuePtr& group : x.groups->items) pt::SetItem(*group, "step", Value::Float(j.step));
    j.folder = source::IterationFolderName(std::to_string(x.iteration)), j.tracker = std::to_string(x.iteration);
    const RunArgs run{x.consumed_samples, x.consumed_valid_samples, j.form == Form::Distributed};
    j.common = CommonFile(ArgsOf(m, g.tp, g.pp, g.dp, j.dtype, divisor, &run), x.common.get(), j.form, j.step, x.groups, false);
    for (std::string& note : x.notes) j.notes.push_back(std::move(note));
    if (j.dtype == "fp16")
      j.notes.push_back("the fp16 loss scale is not carried: Megatron-LM's mixed-precision optimizer starts its own (--initial-loss-scale), "
                        "skipping steps until it finds one");
    if (j.form == Form::Distributed) job_flags += " --use-distributed-optimizer";
    job_flags += " --weight-decay " + FormatNumber(x.weight_decay);  // Megatron's scheduler sets each group's decay from it
    if (!x.schedule_carried) job_flags += " --override-opt_param-scheduler";
  }
  j.model = std::string("Megatron-Core GPTModel (from ") + (deepspeed ? "Megatron-DeepSpeed's" : "torchtitan's") + " names), " + g.text();
  j.notes.push_back("the model's " + std::to_string(m.vocab) + " vocabulary rows kept: launch the job with --make-vocab-size-divisible-by " +
                    std::to_string(divisor) + " (" + std::to_string(divisor) + " x TP " + std::to_string(g.tp) + " divides them) and a tokenizer of " +
                    std::to_string(m.vocab) + " tokens, or Megatron-LM pads to other rows and refuses the shape");
  j.notes.push_back("launch Megatron-LM (pretrain_gpt.py) on " + std::to_string(g.tp * g.pp * g.dp) + " GPUs with the model's flags: " +
                    LaunchFlags(m, g.tp, g.pp, j.dtype, divisor, o.output.empty() ? "ROOT" : o.output) + job_flags +
                    " (and a tokenizer of " + std::to_string(m.vocab) + " tokens)");
  j.notes.push_back(std::string("a ") + (m.rms_norm ? "RMSNorm" : "LayerNorm") + ", " + (m.learned_positions ? "learned-position" : "rotary") +
                    ", " + (m.swiglu ? "SwiGLU" : m.openai_gelu || m.bias_gelu_fusion ? "tanh-GeLU" : "GeLU") + " model" +
                    (m.bias_linear ? " with biases" : m.bias_qkv ? " with query-key-value biases" : "") +
                    (m.tied ? ", output tied to the embedding" : "") +
                    (carried ? "; the job's --load resumes it at iteration " + j.tracker + " with its optimizer's state and its own RNG state"
                             : "; Megatron-LM's release checkpoint (release/, the tracker says 'release'): the job's --load takes the weights "
                               "and starts at iteration 0 with a fresh optimizer and its own RNG state") +
                    "; common.pt's args are written from the model's facts (Megatron-LM checks num_layers, hidden_size and "
                    "num_attention_heads against the job's)");
  return j;
}

// The plan of `j`'s files: each rank's chunks, the linears' extra state, common.pt, metadata.json,
// .metadata, then the tracker.
reshard::ExportPlan LayOut(const reshard::Source& S, const Grid& g, McoreJob& j) {
  reshard::ExportPlan P;
  P.dtype = j.dtype;
  P.model = j.model;
  P.notes = std::move(j.notes);
  McorePlan plan(S, g, j.layers);
  for (const McoreKey& k : j.keys) plan.Chunks(k, k.key, 0, j.dtype);
  std::set<std::string> linears;  // those with a weight or bias (not only a fused norm's)
  int64_t experts = 0;
  for (const McoreKey& k : j.keys)
    for (const char* m : kLinears)
      if (k.stacked && k.key.rfind(std::string("decoder.layers.") + m + ".", 0) == 0 && k.key.find(".layer_norm_") == std::string::npos)
        linears.insert(m), experts = std::max(experts, k.experts);
  const std::string L = std::to_string(j.layers), E = std::to_string(experts);
  for (const char* m : kLinears)
    if (linears.count(m))
      for (int64_t l = 0; l < j.layers; ++l) {
        const int64_t stage = l * g.pp / j.layers;
        if (std::string(m).find(".experts.") == std::string::npos) {
          plan.Object("decoder.layers." + std::string(m) + "._extra_state/shard_" + std::to_string(l) + "_" + L, Value::None(), g.Rank(0, stage));
          continue;
        }
        for (int64_t e = 0; e < experts; ++e)  // one per layer and expert: shard_<layer>.<expert>_<layers>.<experts>
          plan.Object("decoder.layers." + std::string(m) + "._extra_state/shard_" + std::to_string(l) + "." + std::to_string(e) + "_" + L + "." + E,
                      Value::None(), g.Rank(0, stage, e / (experts / g.ep)));
      }
  if (j.form != Form::None)
    for (const McoreKey& k : j.keys) {
      if (j.form == Form::Distributed) plan.Chunks(k, "optimizer.state.param." + k.key, 0, "fp32");
      if (j.form == Form::Mixed) plan.Chunks(k, "optimizer.state.fp32_param." + k.key, 0, "fp32");
      plan.Chunks(k, "optimizer.state.exp_avg." + k.key, 1, "fp32");
      plan.Chunks(k, "optimizer.state.exp_avg_sq." + k.key, 2, "fp32");
    }
  dcp::SavedCheckpoint c;
  plan.Lay(j.folder + "/", P, c);
  c.checkpoint_id = j.folder;
  c.save_id = dcp::SaveIdOf(S, g.text());
  P.side_files.emplace_back(j.folder + "/common.pt", std::move(j.common));
  P.side_files.emplace_back(j.folder + "/metadata.json",
                            R"({"sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch", "common_backend_version": 1})");
  P.side_files.emplace_back(j.folder + "/.metadata", dcp::MetadataPickle(c));
  P.marker = source::kMegatronTracker;
  P.marker_text = j.tracker;
  P.notes.push_back(std::string("optimizer state: ") +
                    (j.form == Form::Distributed ? "the distributed optimizer's fully_reshardable form (args.use_distributed_optimizer)"
                     : j.form == Form::Mixed     ? "the mixed-precision optimizer's fp32 masters and moments (a " + j.dtype + " job)"
                     : j.form == Form::Fp32      ? "FP32Optimizer's moments (an fp32 job)"
                     : j.tracker == "release"    ? "none (the model alone)"
                                                 : std::string(S.manifest["source"].value("weights_only", false) ? "none (a weights-only atomic checkpoint"
                                                                                                                 : "none (--weights-only") +
                                                       ": args.no_save_optim; Megatron-LM loads it, as its own --no-save-optim saves, with "
                                                       "--no-load-optim or --finetune)") +
                    "; no RNG state (args.no_save_rng: Megatron-LM keeps its own); the linears' extra state saved as None");
  return P;
}


// Whether a model's parameter names hold experts (Megatron-Core's experts.experts.*, or another family's).
bool HasExperts(const std::vector<std::string>& names) {
  return std::any_of(names.begin(), names.end(), [](const std::string& n) { return n.find(".experts.") != std::string::npos; });
}

// --ep above 1 for a model without experts: refused.
void RefuseEpWithoutExperts(const std::vector<std::string>& names, int64_t ep) {
  if (ep > 1 && !HasExperts(names)) throw Error("--ep " + std::to_string(ep) + ": a dense model has no experts to place (leave --ep out)");
}

// Where the source's index says the layers and heads (its args, a Megatron-DeepSpeed model's names,
// --model-config), a layout they do not divide is refused before a conversion.
void CheckDegreesOfIndex(const source::SourceIndex& L, const reshard::ExportOptions& o, const std::vector<std::string>& names) {
  const Value* args = source::MegatronArgsOf(L);
  auto fact = [&](const char* name) -> int64_t {
    if (const int64_t v = args ? Number(*args, name, -1) : -1; v > 0) return v;
    if (o.model_config.is_object() && o.model_config.contains(name) && o.model_config[name].is_number_integer())
      return o.model_config[name].get<int64_t>();
    return -1;
  };
  int64_t layers = fact("num_layers");
  if (layers < 1 && MegatronDeepSpeedNames(names))
    layers = reshard::LayerCountOf(names, reshard::GptModelNames(names) ? reshard::Naming::Plain : reshard::Naming::Pipe);
  const int64_t heads = fact("num_attention_heads");
  int64_t groups = fact("num_key_value_heads");
  if (groups < 1 && args && IsSet(*args, "group_query_attention")) groups = fact("num_query_groups");
  const Grid g{o.tp, o.pp, o.dp};
  if (layers > 0 && layers % g.pp != 0) CheckDegrees(g, layers, 1, 1);
  if (layers > 0 && heads > 0) CheckDegrees(g, layers, heads, groups > 0 ? groups : heads);
  RefuseEpWithoutExperts(names, o.ep);
  if (o.ep > 1) {  // --ep: experts to place, over EP ranks taken from the DP ranks
    if (o.dp % o.ep != 0)
      throw Error("--ep " + std::to_string(o.ep) + " does not divide " + DpWords(o.dp, o.dp_given) +
                  ": Megatron-LM places the experts evenly "
                  "over EP ranks taken from the DP ranks (give --ep, a divisor of both)");
  }
}

}  // namespace

void CheckMcoreSource(const source::SourceIndex& L, const reshard::ExportOptions& o) {
  std::vector<std::string> names;
  for (const auto& p : L.params) names.push_back(p.name);
  RefuseOtherNames(names, L.root);
  CheckDegreesOfIndex(L, o, names);
  if (o.distributed_optimizer && o.weights_only)
    throw Error("--use-distributed-optimizer: no optimizer state is written (--weights-only: the model alone)");
  if (const Value* args = source::MegatronArgsOf(L); o.distributed_optimizer && McoreNames(names) && args && !IsSet(*args, "use_distributed_optimizer"))
    throw Error(L.root + ": the source's args say use_distributed_optimizer False: --format mcore writes a Megatron-Core source's optimizer "
                "in its own job's form (leave --use-distributed-optimizer out)");
  if (!McoreNames(names) && L.optimizer != "none" && !o.weights_only && !CarriesOptimizer(L.framework, MegatronDeepSpeedNames(names)))
    throw OptimizerStateRefusal(L.root + ": the checkpoint", L.framework);
}

reshard::ExportPlan PlanMcore(const reshard::Source& S, const reshard::ExportOptions& o) {
  const std::string dir = S.reader->dir();
  Grid g{o.tp, o.pp, o.dp};
  if (g.tp < 1 || g.pp < 1 || g.dp < 1) throw Error("--tp, --pp and --dp must be at least 1");
  std::vector<std::string> names;
  for (const reshard::Atom& a : S.atoms) names.push_back(a.name);
  const bool own = McoreNames(names);
  for (const reshard::Atom& a : S.atoms)
    if (!own && (a.name.find(".experts.") != std::string::npos || a.name.find(".router.") != std::string::npos ||
                 a.name.find("deepspeed_moe") != std::string::npos))
      throw Error(dir + ": parameter '" + a.name + "': a Mixture-of-Experts model under another family's names: --format mcore writes "
                  "Megatron-Core's own MoE models, and dense GPT / Llama models from other families (not yet their experts)");
  RefuseOtherNames(names, dir);
  g.ep_given = o.ep > 0, g.dp_given = o.dp_given;
  g.ep = g.ep_given ? o.ep : 1;
  RefuseEpWithoutExperts(names, g.ep);
  if (!g.ep_given && own && HasExperts(names))
    g.ep = std::max<int64_t>(1, Number(*CommonState(S).Get("args"), "expert_model_parallel_size", 1));
  const std::string job = S.manifest["source"].value("dtype", "fp32");
  if (!o.dtype.empty() && o.dtype != job)
    throw Error("--dtype " + o.dtype + ": --format mcore writes the model in the job's dtype (" + job + ") and the optimizer's "
                "state in fp32, as Megatron-LM saves them (leave --dtype out; --format hf --dtype " + o.dtype + " writes the weights in " +
                o.dtype + ")");
  McoreJob j = own ? OwnJob(S, o, g) : OtherFamilyJob(S, o, g, names);
  return LayOut(S, g, j);
}

void WriteMcoreFile(const reshard::ExportPlan& P, size_t f, reshard::RowSource& rows, const std::string& path) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  dcp::WriteDcpFile(P, f, rows, path);
}

}  // namespace ucp::formats::megatron
