#include "formats/megatron/mcore_target.h"

#include <filesystem>
#include <map>
#include <set>

#include "core/error.h"
#include "formats/dcp/dcp_files.h"
#include "formats/dcp/target.h"
#include "formats/megatron/legacy_names.h"
#include "pt/torch_file.h"
#include "source/megatron_tracker.h"

namespace ucp::formats::megatron {
using pt::Value;
using pt::ValuePtr;
using reshard::ExportTensor;

namespace {

// The new layout: TP x PP x DP ranks, numbered as Megatron-Core numbers them by default (tp fastest,
// then dp, then pp); DP rank 0 saves every value.
struct Grid {
  int64_t tp = 1, pp = 1, dp = 1;
  int64_t Rank(int64_t t, int64_t p) const { return t + tp * dp * p; }
  std::string text() const { return "TP=" + std::to_string(tp) + " PP=" + std::to_string(pp) + " DP=" + std::to_string(dp); }
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

// A tensor of the model: its atom, how TP cuts it, its shape without the layer axis where layers are stacked.
struct Param {
  int atom = -1;
  DistName name;
  bool stacked = false;
  std::vector<int64_t> shape;  // per layer where stacked
};

// One TP rank's boxes of a tensor (in its per-layer shape); none where the rank holds a copy it does not save.
struct Piece {
  std::vector<int64_t> offsets, sizes;
};

std::vector<Piece> PiecesOf(const Param& p, int64_t t, int64_t tp) {
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

class McorePlan {
 public:
  McorePlan(const reshard::Source& S, const Grid& g, int64_t layers) : S_(S), g_(g), layers_(layers) {}

  // Every chunk of `key` (a model key or an optimizer state's), values of state `state` in `dtype`.
  void Chunks(const Param& p, const std::string& key, int state, const std::string& dtype) {
    const reshard::Atom& atom = S_.atoms.at(p.atom);
    const pt::DType type = dtype == "bf16" ? pt::DType::BF16 : dtype == "fp16" ? pt::DType::F16 : pt::DType::F32;
    for (int64_t stage = 0; stage < g_.pp; ++stage) {
      if (!p.stacked && StageOf(key, g_.pp) != stage) continue;
      const int64_t first = p.stacked ? stage * layers_ / g_.pp : -1, last = p.stacked ? (stage + 1) * layers_ / g_.pp : 0;
      for (int64_t t = 0; t < g_.tp; ++t)
        for (const Piece& piece : PiecesOf(p, t, g_.tp))
          for (int64_t l = first; l < std::max<int64_t>(last, first + 1); ++l) {
            dcp::PlannedItem it;
            it.saved.key = key, it.saved.shape = atom.shape, it.saved.dtype = type;
            it.saved.offsets = piece.offsets, it.saved.sizes = piece.sizes;
            if (p.stacked) it.saved.offsets.insert(it.saved.offsets.begin(), l), it.saved.sizes.insert(it.saved.sizes.begin(), 1);
            it.data = reshard::RowsAsTensor(key, p.atom, 0, p.shape.empty() ? 1 : p.shape[0], p.shape);
            it.data.source = atom.name, it.data.state = state, it.data.dtype = dtype;
            it.data.layer = p.stacked ? l : -1, it.data.layer_axis = p.stacked;
            it.data.box_offsets = piece.offsets, it.data.box_sizes = piece.sizes;
            Add(g_.Rank(t, stage), std::move(it));
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

// The model's tensors under their torch_dist keys; refused where a name is not Megatron-Core's or a
// cut does not divide.
std::vector<Param> ParamsOf(const reshard::Source& S, const Grid& g, bool gated, int64_t layers) {
  std::vector<Param> out;
  for (size_t a = 0; a < S.atoms.size(); ++a) {
    const reshard::Atom& atom = S.atoms[a];
    Param p;
    p.atom = static_cast<int>(a);
    p.name = DistNameOfKey(atom.name, gated);
    p.stacked = atom.name.rfind("decoder.layers.", 0) == 0;
    p.shape = atom.shape;
    if (p.stacked) {
      if (atom.shape.empty() || atom.shape[0] != layers)
        throw Error(S.reader->dir() + ": parameter '" + atom.name + "' of shape " + pt::ShapeString(atom.shape) + " does not stack the " +
                    std::to_string(layers) + " layers the args say");
      p.shape.erase(p.shape.begin());
    }
    if (p.name.split != DistName::Whole) {
      const size_t d = p.name.split == DistName::Rows ? 0 : 1;
      const int64_t parts = p.name.gated ? 2 : 1;
      if (p.shape.size() <= d || p.shape[d] % (parts * g.tp) != 0)
        throw Error("--tp " + std::to_string(g.tp) + ": parameter '" + atom.name + "' of shape " + pt::ShapeString(atom.shape) + " has " +
                    (p.shape.size() > d ? std::to_string(p.shape[d]) : "no") + (d == 0 ? " rows" : " columns") +
                    (parts == 2 ? " in two halves (SwiGLU's gate and up)" : "") + ", which " + std::to_string(g.tp) +
                    " tensor-parallel ranks cannot share evenly");
    }
    out.push_back(std::move(p));
  }
  return out;
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
  if (Number(args, "padded_vocab_size", -1) < 0 && asked <= 0) {  // args that no Megatron-LM launch validated
    notes.push_back("the args record no padded_vocab_size: the " + std::to_string(rows) + " vocabulary rows are written as they are");
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
  set("world_size", Value::Int(g.tp * g.pp * g.dp));
  set("rank", Value::Int(0));
  set("ckpt_format", Value::Str("torch_dist"));
  set("no_save_rng", Value::Bool(true));
  if (vocab_divisor > 0) set("make_vocab_size_divisible_by", Value::Int(vocab_divisor));  // the job's, where the user gave it
  if (!optimizer) set("no_save_optim", Value::Bool(true));
  return a;
}

// Megatron's param groups as common.pt keeps them: the source's options (no `params`: Megatron saves
// none), with the step in each where the distributed optimizer keeps it there.
ValuePtr ParamGroups(const reshard::Source& S, double step, bool with_step) {
  const ValuePtr groups = S.optimizer.root ? S.optimizer.root->Get("param_groups") : nullptr;
  if (!groups || !groups->IsSequence()) throw Error(S.reader->dir() + "/zero/optimizer_state.pt: no param_groups list");
  auto out = Value::Make(Value::Kind::List);
  for (const ValuePtr& group : groups->items) {
    auto g = Value::Make(Value::Kind::Dict);
    for (const auto& kv : group->AsDict().items())
      if (kv.key->kind == Value::Kind::Str && kv.key->s != "params" && kv.key->s != "step") g->dict.Set(kv.key, kv.value);
    if (with_step) pt::SetItem(*g, "step", Value::Float(step));
    out->items.push_back(g);
  }
  return out;
}

// The step every parameter shares (Megatron keeps one): refused where they differ.
double CommonStep(const reshard::Source& S) {
  std::optional<double> step;
  for (const reshard::Atom& a : S.atoms) {
    if (!a.has_step) throw Error(S.reader->dir() + ": parameter '" + a.name + "' has no step");
    const double v = pt::StepValue(*S.reader->ReadStep(a.name));
    if (step && *step != v)
      throw Error(S.reader->dir() + ": parameter '" + a.name + "' is at step " + std::to_string(v) + ", others at " + std::to_string(*step) +
                  ": Megatron-LM's optimizers keep one step for every parameter");
    step = v;
  }
  return step.value_or(0);
}

// common.pt: the source's common state at the new layout, the optimizer's part in `form`.
std::string CommonFile(const reshard::Source& S, const Value& common, const Grid& g, Form form, double step, int64_t vocab_divisor) {
  auto root = Value::Make(Value::Kind::Dict);
  pt::SetItem(*root, "args", ArgsAt(*common.Get("args"), g, form != Form::None, vocab_divisor));
  auto version = common.Get("checkpoint_version");
  pt::SetItem(*root, "checkpoint_version", version ? version : Value::Float(3.0));
  auto iteration = common.Get("iteration");
  pt::SetItem(*root, "iteration", iteration ? iteration : Value::Int(0));
  auto content = Value::Make(Value::Kind::Dict);
  if (form == Form::Distributed) {
    auto inner = Value::Make(Value::Kind::Dict), optimizer = Value::Make(Value::Kind::Dict);
    pt::SetItem(*inner, "param_groups", ParamGroups(S, step, true));
    pt::SetItem(*optimizer, "optimizer", inner);
    pt::SetItem(*optimizer, "param_state_sharding_type", Value::Str("fully_reshardable"));
    pt::SetItem(*root, "optimizer", optimizer);
    pt::SetItem(*content, "distrib_optim_sharding_type", Value::Str("fully_reshardable"));
    pt::SetItem(*content, "distrib_optim_fully_reshardable_mem_efficient", Value::Bool(false));
  } else if (form != Form::None) {
    auto value = std::make_shared<float>(static_cast<float>(step));
    auto state = Value::Make(Value::Kind::Dict), torch_state = Value::Make(Value::Kind::Dict);
    pt::SetItem(*state, "common_step", pt::OwnedTensor(value, value.get(), pt::DType::F32, {}));
    pt::SetItem(*torch_state, "state", state);
    pt::SetItem(*torch_state, "param_groups", ParamGroups(S, step, false));
    if (form == Form::Mixed) {  // Float16OptimizerWithFloat16Params: torch's state dict inside its own
      auto optimizer = Value::Make(Value::Kind::Dict);
      pt::SetItem(*optimizer, "optimizer", torch_state);
      pt::SetItem(*root, "optimizer", optimizer);
    } else {
      pt::SetItem(*root, "optimizer", torch_state);
    }
  }
  for (const char* key : {"opt_param_scheduler", "num_floating_point_operations_so_far"})
    if (auto v = common.Get(key); v && form != Form::None) pt::SetItem(*root, key, v);
  pt::SetItem(*content, "singleton_local_shards", Value::Bool(false));
  pt::SetItem(*content, "chained_optim_avoid_prefix", Value::Bool(true));
  pt::SetItem(*root, "content_metadata", content);
  return pt::TorchFileBytes(*root);
}

// The decoder's linears, whose (empty) extra state Megatron-Core saves per layer as a ShardedObject.
const char* const kLinears[] = {"self_attention.linear_qkv", "self_attention.linear_proj", "mlp.linear_fc1", "mlp.linear_fc2"};

// Parameters that are not a Megatron-Core model's (a Megatron-DeepSpeed, Trainer or torchtitan job's):
// refused, the first named.
void RefuseOtherNames(const std::vector<std::string>& names, const std::string& dir) {
  for (const std::string& name : names) {
    try {
      DistNameOfKey(name, false);
    } catch (const Error&) {
      throw Error(dir + ": parameter '" + name + "' is not a Megatron-Core model's: --format mcore writes from Megatron-Core "
                  "torch_dist and Megatron-LM legacy checkpoints, whose tensors carry Megatron-Core's names (from "
                  "Megatron-DeepSpeed, Hugging Face or torchtitan names: not yet)");
    }
  }
}

}  // namespace

void CheckMcoreSource(const source::SourceIndex& L, const reshard::ExportOptions&) {
  std::vector<std::string> names;
  for (const auto& p : L.params) names.push_back(p.name);
  RefuseOtherNames(names, L.root);
}

reshard::ExportPlan PlanMcore(const reshard::Source& S, const reshard::ExportOptions& o) {
  const std::string dir = S.reader->dir();
  const Grid g{o.tp, o.pp, o.dp};
  if (g.tp < 1 || g.pp < 1 || g.dp < 1) throw Error("--tp, --pp and --dp must be at least 1");
  for (const reshard::Atom& a : S.atoms)
    if (a.name.find(".experts.") != std::string::npos || a.name.find(".router.") != std::string::npos)
      throw Error(dir + ": parameter '" + a.name + "': a Mixture-of-Experts model: --format mcore writes dense GPT / Llama models (not "
                  "yet experts)");
  std::vector<std::string> names;
  for (const reshard::Atom& a : S.atoms) names.push_back(a.name);
  RefuseOtherNames(names, dir);
  const Value& common = CommonState(S);
  const Value& args = *common.Get("args");
  for (const char* name : {"num_layers_per_virtual_pipeline_stage", "virtual_pipeline_model_parallel_size", "pipeline_model_parallel_layout",
                           "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers", "num_experts", "mtp_num_layers"})
    if (IsSet(args, name))
      throw Error(dir + ": the args set " + name + ": --format mcore writes even pipeline stages of a dense model without "
                  "multi-token prediction (not yet this one)");
  if (Number(args, "context_parallel_size", 1) != 1)
    throw Error(dir + ": the args set context_parallel_size " + std::to_string(Number(args, "context_parallel_size", 1)) +
                ": --format mcore writes TP x PP x DP layouts (not yet context parallelism)");
  const int64_t layers = Number(args, "num_layers", -1);
  if (layers < 1) throw Error(dir + ": the args give no num_layers");
  if (layers % g.pp != 0)
    throw Error("--pp " + std::to_string(g.pp) + " does not divide the model's " + std::to_string(layers) +
                " layers: Megatron-LM's pipeline stages hold equal numbers of layers");
  const int64_t heads = Number(args, "num_attention_heads", -1);
  const int64_t groups = IsSet(args, "group_query_attention") ? Number(args, "num_query_groups", heads) : heads;
  if (heads < 1 || heads % g.tp != 0 || groups % g.tp != 0)
    throw Error("--tp " + std::to_string(g.tp) + " does not divide the model's " +
                (heads >= 1 && heads % g.tp == 0 ? std::to_string(groups) + " query groups (of its " + std::to_string(heads) + " attention heads)"
                                                 : std::to_string(heads) + " attention heads") +
                ": each tensor-parallel rank holds whole heads and query groups");
  const bool gated = IsSet(args, "swiglu");
  const std::vector<Param> params = ParamsOf(S, g, gated, layers);
  std::vector<std::string> notes;
  const int64_t vocab_divisor = VocabDivisor(S, args, g, o.vocab_divisible_by, notes);

  const std::string job = S.manifest["source"].value("dtype", "fp32");
  Form form = Form::Fp32;
  if (S.manifest["source"].value("weights_only", false)) form = Form::None;
  else if (IsSet(args, "use_distributed_optimizer")) form = Form::Distributed;
  else if (job != "fp32") form = Form::Mixed;
  if (!o.dtype.empty() && o.dtype != job)
    throw Error("--dtype " + o.dtype + ": --format mcore writes the model in the job's dtype (" + job + ") and the optimizer's "
                "state in fp32, as Megatron-LM saves them");

  reshard::ExportPlan P;
  P.dtype = job;
  P.model = "Megatron-Core GPTModel, " + g.text();
  P.notes = notes;
  McorePlan plan(S, g, layers);
  for (const Param& p : params) plan.Chunks(p, S.atoms[p.atom].name, 0, job);
  std::set<std::string> linears;
  for (const Param& p : params)
    for (const char* m : kLinears)
      if (p.stacked && S.atoms[p.atom].name.rfind(std::string("decoder.layers.") + m + ".", 0) == 0) linears.insert(m);
  for (const char* m : kLinears)
    if (linears.count(m))
      for (int64_t l = 0; l < layers; ++l)
        plan.Object("decoder.layers." + std::string(m) + "._extra_state/shard_" + std::to_string(l) + "_" + std::to_string(layers),
                    Value::None(), g.Rank(0, l * g.pp / layers));
  double step = 0;
  if (form != Form::None) {
    step = CommonStep(S);
    for (const Param& p : params) {
      const std::string& key = S.atoms[p.atom].name;
      if (form == Form::Distributed) plan.Chunks(p, "optimizer.state.param." + key, 0, "fp32");
      if (form == Form::Mixed) plan.Chunks(p, "optimizer.state.fp32_param." + key, 0, "fp32");
      plan.Chunks(p, "optimizer.state.exp_avg." + key, 1, "fp32");
      plan.Chunks(p, "optimizer.state.exp_avg_sq." + key, 2, "fp32");
    }
  }
  auto iteration = common.Get("iteration");
  const int64_t it = iteration && iteration->kind == Value::Kind::Int ? iteration->i : 0;
  const std::string folder = source::IterationFolderName(std::to_string(it));
  dcp::SavedCheckpoint c;
  plan.Lay(folder + "/", P, c);
  c.checkpoint_id = folder;
  c.save_id = dcp::SaveIdOf(S, g.text());
  P.side_files.emplace_back(folder + "/common.pt", CommonFile(S, common, g, form, step, o.vocab_divisible_by > 0 ? vocab_divisor : 0));
  P.side_files.emplace_back(folder + "/metadata.json",
                            R"({"sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch", "common_backend_version": 1})");
  P.side_files.emplace_back(folder + "/.metadata", dcp::MetadataPickle(c));
  P.marker = source::kMegatronTracker;
  P.marker_text = std::to_string(it);
  P.notes.push_back(std::string("optimizer state: ") +
                    (form == Form::Distributed ? "the distributed optimizer's fully_reshardable form (args.use_distributed_optimizer)"
                     : form == Form::Mixed     ? "the mixed-precision optimizer's fp32 masters and moments (a " + job + " job)"
                     : form == Form::Fp32      ? "FP32Optimizer's moments (an fp32 job)"
                                               : "none (a weights-only atomic checkpoint: args.no_save_optim; Megatron-LM loads it, "
                                                 "as its own --no-save-optim saves, with --no-load-optim or --finetune)") +
                    "; no RNG state (args.no_save_rng: Megatron-LM keeps its own); the linears' extra state saved as None");
  return P;
}

void WriteMcoreFile(const reshard::ExportPlan& P, size_t f, reshard::RowSource& rows, const std::string& path) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  dcp::WriteDcpFile(P, f, rows, path);
}

}  // namespace ucp::formats::megatron
