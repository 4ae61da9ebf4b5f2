// The reshard plan (the Universal Checkpointing paper's UcpInfo): from an atomic checkpoint and a
// target layout, the units of work, one per target model-parallel rank (under ZeRO-3 one per
// (model-parallel, DP) rank), each with the TP piece of every atomic tensor its files hold; the
// pipeline stages' layer bounds; which MPI rank writes which unit; and the pieces several units
// need, read once and exchanged. No data is read here beyond the atomic checkpoint's manifest and
// its two small side files (reshard/reshard.cpp writes the plan out).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "patterns/rules.h"
#include "plan/convert_plan.h"
#include "pt/torch_file.h"
#include "layout/naming.h"
#include "layout/planner.h"
#include "layout/target.h"
#include "store/atom_store.h"

namespace ucp::reshard {

// One parameter of the atomic checkpoint, as the manifest describes it.
struct Atom : store::AtomParam {
  patterns::Pattern model_pattern = patterns::Pattern::ShardV;  // `pattern`, parsed
  LayerPlace place;  // its layer spec and key inside the layer; the embedding is tied to the head spec
  // Mixture of Experts: an expert's parameter, under its global id in MoE layer `moe_layer` (the
  // layer's ordinal among the MoE layers, as DeepSpeed numbers its expert files); -1 otherwise.
  int expert = -1, moe_layer = -1;
  // Naming::Module: its place among the keys of the module's state_dict (the carried model-states
  // file's `module`), the order a model's files list its weights in; -1 where the module lacks it.
  int module_order = -1;
  int spec() const { return place.spec; }
  bool tied() const { return place.embedding() && !place.untied; }
};

// The piece of one atomic tensor a unit holds: its TP rank's rows, all of them or one DP rank's slice.
struct UnitParam {
  int atom = -1;
  plan::Copy copy;  // this TP rank's piece: local rows <- joined rows
  std::vector<int64_t> joined_shape;
  int64_t local_numel = 0;
  int64_t begin = 0, end = 0;  // the local elements its unit reads: all, or under ZeRO-3 one DP rank's slice
  int shared = -1;  // index into Plan::shared: a piece other units need too, held in memory
};

// One rank's work: a model-parallel rank's files (every DP rank's), or under ZeRO-3, where nothing
// is written whole, one DP rank's files of it.
struct Unit {
  int pp = 0, tp = 0;
  int dp = -1;  // ZeRO-3: the DP rank; -1: all of them
  std::vector<UnitParam> params;           // in flat-buffer order within each group
  std::vector<std::vector<int>> groups;    // indices into params, per optimizer group
  int64_t bytes = 0;                       // atomic bytes it reads itself (not its shared pieces)
};

// The atomic checkpoint's non-tensor state and its parameters.
struct Source {
  std::unique_ptr<store::AtomReader> reader;  // the tensors, from either store
  nlohmann::json manifest;
  std::vector<Atom> atoms;
  pt::TorchFile model_states;   // carried-over model-states file of rank 0
  std::string model_file;       // its name in the atomic checkpoint
  pt::TorchFile args_file;      // the carried file of Megatron's args DeepSpeed does not load (manifest source.args_file), if any
  std::string args_file_name;
  pt::TorchFile optimizer;      // zero/optimizer_state.pt; of a weights-only source, the fresh optimizer's (FreshOptimizer)
  // A weights-only source (the manifest's source.weights_only): fp32 weights alone. Its Adam moments
  // read as zeros and its groups' steps as 0 (ReadLocal, UnitWeights::GroupStep), its param_groups come
  // from --optimizer-config (FreshOptimizer); or the target has no optimizer files (--no-optimizer).
  bool weights_only = false;
  Naming naming = Naming::Pipe;
  int layers = 0;
  bool untied = false;              // the output layer is its own (Llama-style), not the tied word embedding
  int tp = 1;                       // the source's TP degree
  bool moe = false;                 // Mixture of Experts (the manifest's source.moe)
  int ep = 1;                       // the source's expert-parallel degree
  std::vector<int64_t> num_experts; // per MoE layer ordinal: its experts (the model-states file's num_experts)
  std::vector<bool> expert_group;   // per optimizer group: it holds experts (DeepSpeed's 'moe': True groups)
  int64_t vocab = 0, padded_vocab = 0, divisible_by = 0;  // divisible_by 0: not known from args
  std::vector<std::string> notes;   // facts derived rather than read (printed by rank 0)
};

// A TP piece of an atomic tensor that several units need (a TP-replicated parameter: every TP rank
// of its stages; the tied embedding: its first and last stage). One rank reads it, the other ranks
// that hold it receive it over MPI, and each serves its units from memory: storage is read once.
struct SharedPiece {
  int unit = -1, param = -1;                // a user, whose UnitParam describes the piece
  std::vector<std::pair<int, int>> users;   // (unit, param index in the unit)
  std::vector<int> ranks;                   // the ranks that hold it, ascending
  int reader = 0;
  int64_t begin = 0, numel = 0, bytes = 0;  // its local elements [begin, begin + numel); the atomic bytes its read costs
};

// The plan of one target on a number of MPI ranks.
struct Plan {
  std::vector<Unit> units;
  std::vector<SharedPiece> shared;
  std::vector<int> parts, owner;  // stage bounds over layer specs; unit -> rank
  std::vector<std::string> names;  // per atom: its name in the target's naming
  int64_t padded_vocab = 0, needed_bytes = 0;
  int embedding_stage = 0;
};

// Where a target driver's writer takes a unit's values from: local elements [a, b) of the unit's
// parameter k (an index into Unit::params), state s (plan::State), as float32. ucp-reshard's
// implementation reads the atomic store or copies a piece held for several units.
class SliceSource {
 public:
  virtual ~SliceSource() = default;
  virtual void Read(size_t k, int s, int64_t a, int64_t b, float* dst) = 0;
};

// What a target driver's writer wrote for one unit.
struct UnitFiles {
  int64_t bytes = 0, files = 0;
};

// Reads the atomic checkpoint's manifest, model-states and optimizer-state side files, each checked;
// the atoms as the manifest describes them, unplaced. What every target reads. Throws ucp::Error
// naming the folder or file. `optimizer` false: zero/optimizer_state.pt is not read at all (nor
// hashed: under ZeRO-3 it holds rank 0's flat partitions, over a gigabyte), for a target of the
// weights alone; S.optimizer stays empty and the atoms keep the manifest's groups.
Source LoadAtomic(const std::string& dir, bool optimizer = true);
// LoadAtomic, and the atoms placed in a GPT's layers for a DeepSpeed target: the naming, the layer
// count (checked against args.num_layers), whether the output layer is its own (Llama-style: placed
// at spec L+3, its embedding untied), Mixture-of-Experts facts; AutoEP's fused experts are refused.
// A plain engine around another model (no pipeline files, names not GPTModel's: a Hugging Face
// model under Trainer) is Naming::Module: its names kept, its atoms in the module's order.
Source LoadSource(const std::string& dir);

// Whether an atomic checkpoint converted from `framework` (its manifest's source.framework) holds another
// family's global tensors (Megatron-Core's, torchtitan's), which no DeepSpeed model-states file describes.
inline bool GlobalTensorsFramework(const std::string& framework) { return framework == "torch-dcp" || framework == "megatron-lm"; }

// The step every parameter is at, each one's read (Megatron-Core and torchtitan keep one); nullptr without
// parameters. Throws ucp::Error naming the parameter that has none, or another step, `why` saying why
// one is needed.
pt::ValuePtr CommonStep(const Source& S, const std::string& why);

// A param group's options: its entries but `params` and `step` (what torch's state_dict lists per group).
pt::ValuePtr GroupOptions(const pt::Value& group);

// Whether two param groups hold the same options (pt::SameValue, key by key), the string keys `ignored`
// names left out of both.
bool SameGroupOptions(const pt::Value& a, const pt::Value& b, const std::function<bool(const std::string&)>& ignored);

// Megatron's param groups (those with a wd_mult) each hold a parameter, since Megatron makes a group only
// for a parameter that needs it; one that holds no atom is one whose members Megatron-Core did not save
// and ucp could not rebuild (source/megatron_groups.h): written out, its parameters would train under
// another group's options. Throws ucp::Error naming the group, `remedy` what writes the checkpoint instead.
void RefuseUnknownGroups(const Source& S, const std::string& remedy);

// Megatron's args.<key> from the carried model-states file; nullptr where the checkpoint has no args
// (a plain DeepSpeed engine) or no such key.
const pt::Value* ArgOf(const Source& S, const char* key);

// Megatron's make_vocab_size_divisible_by, when the checkpoint does not say it (no args): Megatron's
// default 128 if the source's padded vocabulary fits it, else the smallest power of two that does;
// 0 when nothing fits or the padded size is unknown.
int64_t DerivedDivisibleBy(const Source& S);

// Why a model whose parameters carry their own names (Naming::Module; `a_name` one of them) cannot
// take layout T: another TP or SP degree than the source's, a pipeline; "" when it can. The one rule,
// for Validate and for --in-place before a conversion.
std::string ModuleLayoutRefusal(const TargetLayout& T, int source_tp, int source_sp, const std::string& a_name);

// ZeRO-3 (stage3.py) pads every parameter to a multiple of DP and cuts it in DP equal pieces.
int64_t Zero3Piece(int64_t numel, int dp);

// The atomic bytes a unit's piece copies: the elements it reads that are not vocabulary padding,
// in each of the `states` it reads (StatesRead).
int64_t AtomicBytes(const UnitParam& u, const Atom& a, int states = plan::kStates);
// The states a reshard reads from the store: fp32 alone from a weights-only source (its moments are
// zeros, read from nowhere), else all three.
inline int StatesRead(const Source& S) { return S.weights_only ? 1 : plan::kStates; }

// The target's model: GPTModel (not a PipelineModule, plain names) or GPTModelPipe, as resolved by
// ResolveModel.
Naming NamingOf(const TargetLayout& T);

// The target's model kind, when not given: ZeRO-3 is never a pipeline, pp > 1 always is, and
// otherwise the source's kind is kept (its naming: GPTModel's names for a model that is not a
// PipelineModule). Its expert-parallel degree, when not given: the source's.
TargetLayout ResolveModel(const Source& S, TargetLayout T);

// The DeepSpeed release that wrote the source (its manifest's ds_version), and the one the target
// is written for (TargetLayout::ds_version): each the other where only one is known, else empty.
std::string SourceRelease(const Source& S, const TargetLayout& T);
std::string TargetRelease(const Source& S, const TargetLayout& T);
// The release a layout is written for where neither says one (a weights-only import, no
// --ds-version): its files record it as their ds_version, which DeepSpeed requires to be non-empty.
inline constexpr const char* kDefaultRelease = "0.14.5";

// Mixture of Experts: how many times the mean gradient an expert's gradient is in a job of `ep`
// expert-parallel ranks at ZeRO stage `zero` under DeepSpeed `release` (see the definition).
int ExpertGradientScale(const std::string& release, int zero, int ep);
// The target job's expert gradient scale over the source job's: the writer scales an expert's
// exp_avg by it and exp_avg_sq by its square, so that the new job continues the old; 1 without experts.
double ExpertMomentRatio(const Source& S, const TargetLayout& T);

// Whether the target job runs bf16 without ZeRO, in a model that is not a pipeline, with DeepSpeed's
// DDP bf16 wrapper (0.17.6 and later, PR 7515; before, the BF16 optimizer): the model's torch
// optimizer inside it, its state with the fp32 masters in the model-states files (under Mixture of
// Experts, in the expp_rank files too), no optimizer file.
bool DdpBf16Wrapper(const Source& S, const TargetLayout& T);
// Whether the target job runs the model's own torch optimizer without ZeRO, its state per position:
// Mixture of Experts (in expp_rank files), or the DDP bf16 wrapper around it.
bool TorchOptimizerTarget(const Source& S, const TargetLayout& T);

// Mixture of Experts: the expert-parallel rank that holds expert parameter `a` in a job of `ep`
// expert-parallel ranks (experts split in ep equal runs of global ids), and its id there.
int EpRankOf(const Source& S, const Atom& a, int ep);
int LocalExpertId(const Source& S, const Atom& a, int ep);

// A weights-only source's optimizer (Source::weights_only), as a DeepSpeed job starting from the
// weights has one (fresh_optimizer.cpp): S.optimizer made the zero/optimizer_state.pt such a source
// lacks, its param_groups as torch's Adam / AdamW state_dict lists them, one per group of the atoms,
// from `block`, the "optimizer" block of a DeepSpeed config ({"type": "Adam" | "AdamW", "params":
// {"lr", "betas", "eps", "weight_decay"}}, torch's defaults for what it omits); a group of 1-D
// parameters alone (biases and norms) without weight decay, as Megatron's. The keys of each group are
// those the torch of DeepSpeed `release`'s job writes (0.19 and later: torch 2.x's `differentiable`
// and `fused` too). A null `block`: no param_groups (--no-optimizer). Throws ucp::Error naming `what`
// (the file) and the key.
void FreshOptimizer(Source& S, const nlohmann::json& block, const std::string& release, const std::string& what);
// The optimizer the target gets (--optimizer-config's `block` from `config_file`, --no-optimizer in
// T.no_optimizer): the source's; a weights-only source's fresh one (FreshOptimizer); or none. Throws
// ucp::Error for a combination that makes no sense (naming the flags): no block nor --no-optimizer for a
// weights-only source, a block for a source with optimizer state, --no-optimizer at ZeRO-3.
void SettleOptimizer(Source& S, const TargetLayout& T, const nlohmann::json& block, const std::string& config_file);
// What the target's optimizer files hold, for a run's account and report: "carried", "fresh" or "none".
std::string OptimizerOf(const Source& S, const TargetLayout& T);
// The "optimizer" block of --optimizer-config's JSON: a DeepSpeed config holding one, or the block
// itself. Throws ucp::Error naming `what` (the file).
nlohmann::json OptimizerBlockOf(const nlohmann::json& config, const std::string& what);

// The plan of `T` (its model resolved) for `ranks` MPI ranks, sharing pieces while each rank holds
// at most `share_budget` bytes of them. Throws ucp::Error for a target DeepSpeed would refuse or
// the source cannot fill.
Plan MakePlan(const Source& S, const TargetLayout& T, int ranks, int64_t share_budget);

// The model's shape facts as its args record them (heads, key-value heads, FFN width, layers) and
// the source's layout: what the planner and Validate judge a layout by.
ModelFacts ModelFactsOf(const Source& S);
// The planner's view of the source: its shape facts and, per candidate layout, what each
// model-parallel rank would hold (MakePlan's units; ZeRO-3's per-DP units counted once, whole).
LayoutChoice ChooseFor(const Source& S, const PlannerRequest& request);

// The plan as --plan-only --json prints it (schemas/reshard-plan.schema.json).
nlohmann::json PlanJson(const Source& S, const TargetLayout& T, const Plan& P, int ranks);

}  // namespace ucp::reshard
