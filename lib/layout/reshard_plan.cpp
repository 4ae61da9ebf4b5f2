// The reshard plan (reshard_plan.h): the target's pipeline stages, each unit's TP pieces of the atoms, the
// checks of a target layout against the model, the pieces several units share, and the plan as JSON.
#include "layout/reshard_plan.h"

#include <algorithm>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <tuple>

#include "core/error.h"
#include "core/names.h"
#include "pt/value.h"

namespace ucp::reshard {
using nlohmann::json;
using patterns::Pattern;
using pt::Value;

namespace {

// GPTModelPipe's specs: 0 a cast, 1 the embedding, 2..L+1 the transformer layers, L+2 the final
// norm, L+3 the tied head (an untied model's LMHeadPipe), then a cast back (not with fp32).
std::vector<std::string> SpecNames(int layers, const std::string& dtype, bool untied) {
  std::vector<std::string> names = {"_to_float16", "EmbeddingPipe"};
  for (int i = 0; i < layers; ++i) names.push_back("ParallelTransformerLayerPipe");
  names.push_back("MixedFusedRMSNorm LayerNorm");
  names.push_back(untied ? "LMHeadPipe" : "EmbeddingPipe");
  if (dtype != "fp32") names.push_back("float16_to_fp32");
  return names;
}

std::vector<int> StageBounds(const Source& S, const TargetLayout& T, const std::vector<int64_t>& spec_numel) {
  auto names = SpecNames(S.layers, T.dtype, S.untied);
  const int n = static_cast<int>(names.size());
  std::string method = T.partition_method;
  std::vector<int> parts;
  if (method == "uniform") {
    parts = PartitionUniform(n, T.pp);
  } else if (method == "parameters") {
    parts = PartitionBalanced(std::vector<double>(spec_numel.begin(), spec_numel.end()), T.pp);
  } else if (method.rfind("type:", 0) == 0) {
    std::regex re(method.substr(5), std::regex::icase);
    std::vector<double> w(n, 0);
    bool any = false;
    for (int k = 0; k < n; ++k)
      if (std::regex_search(names[k], re)) w[k] = 1, any = true;
    if (!any) throw Error("partition method '" + method + "' matches no layer type of GPTModelPipe");
    parts = PartitionBalanced(w, T.pp);
  } else {
    std::stringstream ss(method);
    std::string item;
    while (std::getline(ss, item, ',')) parts.push_back(std::stoi(item));
    if (static_cast<int>(parts.size()) != T.pp + 1 || parts.front() != 0 || parts.back() != n ||
        !std::is_sorted(parts.begin(), parts.end()))
      throw Error("partition boundaries '" + method + "' must be " + std::to_string(T.pp + 1) +
                  " increasing numbers from 0 to " + std::to_string(n) + " (the layer specs)");
  }
  return parts;
}

// The target's padded vocabulary rows: the multiple of make_vocab_size_divisible_by x TP, as
// Megatron pads it. The multiple comes from --make-vocab-size-divisible-by, else the source's args,
// else the source's own padding at an unchanged TP, else DerivedDivisibleBy.
int64_t PaddedVocab(const Source& S, const TargetLayout& T, int64_t rows) {
  int64_t div = T.vocab_divisible_by > 0 ? T.vocab_divisible_by : S.divisible_by;
  if (div <= 0 && T.tp == S.tp && S.padded_vocab >= rows) return S.padded_vocab;
  if (div <= 0) div = DerivedDivisibleBy(S);
  if (div <= 0)
    throw Error("the vocabulary padding of the target is unknown: the checkpoint has no args.make_vocab_size_divisible_by "
                "and its padded_vocab_size does not tell it; give --make-vocab-size-divisible-by (Megatron's default: 128)");
  const int64_t m = div * T.tp;
  return (rows + m - 1) / m * m;
}

// This TP rank's piece of an atom in the target: the inverse of the atom's pattern.
UnitParam PieceOf(const Source& S, const TargetLayout& T, int index, int t) {
  const Atom& a = S.atoms[index];
  UnitParam u;
  u.atom = index;
  u.joined_shape = a.shape;
  if (a.vocab && S.naming != Naming::Module) u.joined_shape[0] = PaddedVocab(S, T, a.shape[0]);
  plan::Copy& c = u.copy;
  c.pp = 0, c.tp = t;
  c.shape = u.joined_shape;
  // (an expert is whole at every TP rank: DeepSpeed's experts without expert tensor parallelism)
  const bool split = T.tp > 1 && a.expert < 0 && patterns::IsSplit(a.model_pattern);
  if (split) {
    if (!a.split_dim_known)
      throw Error("parameter '" + a.name + "': no rule says which dimension TP splits (row- or column-parallel); "
                  "refusing to guess for TP=" + std::to_string(T.tp) + " (give model rules with --patterns when converting)");
    const int d = a.split_dim;
    if (d < 0 || d >= static_cast<int>(a.shape.size())) throw Error("parameter '" + a.name + "': bad split dimension");
    c.split_dim = d;
    if (a.model_pattern == Pattern::ShardNC) {
      int64_t local = 0, joined = 0;
      for (size_t i = 0; i < a.sub_param_sizes.size(); ++i) {
        if (a.sub_param_sizes[i] % T.tp)
          throw Error("parameter '" + a.name + "': sub-parameter " + std::to_string(i) + " of " +
                      std::to_string(a.sub_param_sizes[i]) + " rows does not split over TP=" + std::to_string(T.tp));
        int64_t w = a.sub_param_sizes[i] / T.tp;
        c.blocks.push_back({local, w, joined + t * w});
        local += w, joined += a.sub_param_sizes[i];
      }
      if (joined != u.joined_shape[d]) throw Error("parameter '" + a.name + "': sub-parameter sizes do not add up");
      c.shape[d] = local;
    } else {
      if (u.joined_shape[d] % T.tp)
        throw Error("parameter '" + a.name + "': dimension " + std::to_string(d) + " of " +
                    pt::ShapeString(u.joined_shape) + " does not split over TP=" + std::to_string(T.tp));
      c.shape[d] = u.joined_shape[d] / T.tp;
      c.blocks.push_back({0, c.shape[d], t * c.shape[d]});
    }
  }
  c.numel = pt::Numel(c.shape);
  u.local_numel = c.numel;
  return u;
}

void Validate(const Source& S, const TargetLayout& T) {
  auto no = [](const std::string& why) { throw Error("target " + why); };
  if (T.dp < 1 || T.tp < 1 || T.pp < 1) no("degrees must be at least 1");
  if (T.dtype != "fp16" && T.dtype != "bf16" && T.dtype != "fp32") no("dtype must be fp16, bf16 or fp32");
  if (T.zero_stage < 0 || T.zero_stage > 3) no("ZeRO stage must be 0, 1, 2 or 3");
  if (T.zero_stage == 3 && T.pp > 1) no("ZeRO-3 with pipeline parallelism: DeepSpeed refuses it; use pp=1");
  if (T.zero_stage == 0 && T.dtype != "bf16" && !S.moe)
    no("ZeRO stage 0 is DeepSpeed's BF16 optimizer: it needs --dtype bf16");
  if (T.zero_stage == 2 && T.pp > 1) no("ZeRO-2 with pipeline parallelism: DeepSpeed refuses it; use stage 1");
  if (S.naming == Naming::Module) {
    if (const std::string why = ModuleLayoutRefusal(T, S.tp, S.manifest["source"].value("sp", 1), S.atoms.front().name); !why.empty())
      no(why);
    return;
  }
  const ModelFacts facts = ModelFactsOf(S);
  if (const std::string why = ModelTpRefusal(facts, T.tp); !why.empty()) no(why);
  if (const std::string why = UlyssesRefusal(facts, T.tp, T.Sp(), T.pp, NamingOf(T) != Naming::Plain, S.moe); !why.empty()) no(why);
  if (T.model == "plain" && T.pp > 1) no("model 'plain' with pp=" + std::to_string(T.pp) + ": only a PipelineModule runs a pipeline");
  if (T.model == "pipe" && T.zero_stage == 3) no("model 'pipe' with ZeRO-3: DeepSpeed refuses a PipelineModule under ZeRO-3");
  if (T.pp > S.layers)
    no("pp=" + std::to_string(T.pp) + " exceeds the " + std::to_string(S.layers) + " transformer layers");
  if (!S.moe) {
    if (T.ep > 1) no("ep=" + std::to_string(T.ep) + ": the checkpoint has no Mixture-of-Experts layer");
    return;
  }
  const std::string moe = "Mixture of Experts with ";
  if (T.pp > 1)
    no(moe + "pp=" + std::to_string(T.pp) + ": DeepSpeed's MoE layers run in a model that is not a pipeline");
  if (T.zero_stage == 3)
    no(moe + "ZeRO-3: ucp-reshard writes MoE layouts under ZeRO-0, 1 and 2 (ZeRO-3 partitions experts differently)");
  // Without ZeRO: the model's own torch optimizer, its state per position in expp_rank files; in
  // bf16 inside DeepSpeed's DDP bf16 wrapper (0.17.6 and later; before, the BF16 optimizer).
  if (T.zero_stage == 0 && T.dtype == "fp16")
    no(moe + "fp16 without ZeRO: DeepSpeed's FP16 optimizer around the experts is not written yet; use ZeRO-1 or "
       "ZeRO-2, or bf16 / fp32");
  if (T.zero_stage == 0 && T.dtype == "bf16" && !DdpBf16Wrapper(S, T))
    no(moe + "bf16 without ZeRO for DeepSpeed " + TargetRelease(S, T) + ": before 0.17.6 DeepSpeed runs it with its "
       "BF16 optimizer, which ucp-reshard does not write for MoE; use ZeRO-1 or ZeRO-2, fp32, or --ds-version of a "
       "later release");
  if (NamingOf(T) != Naming::Plain)
    no(moe + "model 'pipe': DeepSpeed's MoE layers run in a model that is not a PipelineModule");
  if (T.ep < 1 || (T.dp * T.tp) % T.ep != 0)
    no("ep=" + std::to_string(T.ep) + " must divide dp x tp=" + std::to_string(T.dp * T.tp) +
       " (DeepSpeed's expert-parallel groups are runs of ep consecutive global ranks)");
  if (T.tp > T.ep)
    no(moe + "tp=" + std::to_string(T.tp) + " > ep=" + std::to_string(T.ep) + ": DeepSpeed saves TP rank t's model-states "
       "file from global rank t only if that rank also saves experts (its expert-data-parallel rank is 0, so t < ep); "
       "its own checkpoint of this layout lacks files. Use ep >= tp");
  for (size_t l = 0; l < S.num_experts.size(); ++l)
    if (S.num_experts[l] % T.ep != 0)
      no("ep=" + std::to_string(T.ep) + " must divide the " + std::to_string(S.num_experts[l]) + " experts of MoE layer " +
         std::to_string(l));
}

// Picks the shared pieces: by bytes saved, as long as every rank that holds one stays within
// `budget` bytes of held pieces; the reader of each is the holder with the fewest shared bytes read.
void ShareRepeatedPieces(Plan& P, int ranks, int64_t budget) {
  // (atom, tp or -1, first element, end) -> users
  std::map<std::tuple<int, int, int64_t, int64_t>, std::vector<std::pair<int, int>>> users;
  for (size_t u = 0; u < P.units.size(); ++u)
    for (size_t k = 0; k < P.units[u].params.size(); ++k) {
      const UnitParam& up = P.units[u].params[k];
      if (up.begin == up.end) continue;
      users[{up.atom, up.copy.split_dim >= 0 ? P.units[u].tp : -1, up.begin, up.end}].push_back({static_cast<int>(u), static_cast<int>(k)});
    }
  std::vector<SharedPiece> candidates;
  for (auto& [key, list] : users) {
    if (list.size() < 2) continue;
    SharedPiece sp;
    sp.unit = list[0].first, sp.param = list[0].second, sp.users = list;
    const UnitParam& up = P.units[sp.unit].params[sp.param];
    sp.begin = up.begin, sp.numel = up.end - up.begin;
    for (const auto& [u, k] : list) sp.ranks.push_back(P.owner[u]);
    std::sort(sp.ranks.begin(), sp.ranks.end());
    sp.ranks.erase(std::unique(sp.ranks.begin(), sp.ranks.end()), sp.ranks.end());
    candidates.push_back(std::move(sp));
  }
  std::stable_sort(candidates.begin(), candidates.end(), [](const SharedPiece& a, const SharedPiece& b) {
    return a.numel * static_cast<int64_t>(a.users.size() - 1) > b.numel * static_cast<int64_t>(b.users.size() - 1);
  });
  std::vector<int64_t> held(ranks, 0), reads(ranks, 0);
  for (auto& sp : candidates) {
    const int64_t hold = 4 * plan::kStates * sp.numel;
    if (std::any_of(sp.ranks.begin(), sp.ranks.end(), [&](int r) { return held[r] + hold > budget; })) continue;
    sp.reader = *std::min_element(sp.ranks.begin(), sp.ranks.end(), [&](int a, int b) { return reads[a] < reads[b]; });
    const int index = static_cast<int>(P.shared.size());
    for (const auto& [u, k] : sp.users) {
      UnitParam& up = P.units[u].params[k];
      up.shared = index;
    }
    for (int r : sp.ranks) held[r] += hold;
    P.shared.push_back(std::move(sp));
  }
}

}  // namespace

std::string ModuleLayoutRefusal(const TargetLayout& T, int source_tp, int source_sp, const std::string& a_name) {
  // No layer structure is known: what needs one (a TP split, pipeline stages, sequence shards)
  // stays as the source had it.
  const std::string model = "the model (its parameters carry their own names, " + a_name +
                            ", ...: a plain DeepSpeed engine around a model that is no Megatron GPT) ";
  if (T.tp != source_tp)
    return "tp=" + std::to_string(T.tp) + ": " + model + "trained at tp=" + std::to_string(source_tp) + "; ucp-reshard "
           "changes its DP degree and ZeRO stage, not how its layers split over TP (DeepSpeed's AutoTP is not written)";
  if (T.pp != 1) return "pp=" + std::to_string(T.pp) + ": " + model + "is not a PipelineModule; only pp=1 runs it";
  if (T.model == "pipe") return "model 'pipe': " + model + "is not a PipelineModule";
  if (T.sp > 0 && T.Sp() != source_sp)
    return "sp=" + std::to_string(T.Sp()) + ": " + model + "keeps its sequence-parallel degree (" + std::to_string(source_sp) + ")";
  return "";
}

int64_t Zero3Piece(int64_t numel, int dp) { return (numel + dp - 1) / dp; }

int64_t AtomicBytes(const UnitParam& u, const Atom& a, int states) {
  const int64_t full = pt::Numel(a.shape);
  int64_t have = 0;
  plan::ForEachJoinedRun(u.copy, u.joined_shape, u.begin, u.end,
                         [&](int64_t, int64_t joined, int64_t n) { have += std::clamp<int64_t>(full - joined, 0, n); });
  return 4 * states * have;
}

std::string SourceRelease(const Source& S, const TargetLayout& T) {
  const std::string v = S.manifest["source"].value("ds_version", "");
  return v.empty() ? T.ds_version : v;
}
std::string TargetRelease(const Source& S, const TargetLayout& T) {
  // Neither saying one (an import, another family's checkpoint): the release the files record (kDefaultRelease).
  const std::string r = T.ds_version.empty() ? SourceRelease(S, T) : T.ds_version;
  return r.empty() ? kDefaultRelease : r;
}

// How many times the mean gradient an expert's gradient is, and so the square root of how many
// times the mean's Adam moments its moments are, in a job of `ep` expert-parallel ranks at ZeRO
// stage `zero` under DeepSpeed `release`: ep where DeepSpeed averages it over the expert-data-
// parallel group (dp / ep ranks) after the all-to-all has summed the tokens of ep ranks, which it
// did on every path before 0.14.1 (PR 5259, "moe EP grad_scale fix") and in the ZeRO-1/2 optimizer
// before 0.15.4 (PR 6546, "Fix expert grad scaling problem with ZeRO optimizer"); else 1.
int ExpertGradientScale(const std::string& release, int zero, int ep) {
  const bool scaled = ReleaseBefore(release, 0, 14, 1) || ((zero == 1 || zero == 2) && ReleaseBefore(release, 0, 15, 4));
  return scaled ? ep : 1;
}

double ExpertMomentRatio(const Source& S, const TargetLayout& T) {
  if (!S.moe) return 1.0;
  return static_cast<double>(ExpertGradientScale(TargetRelease(S, T), T.zero_stage, std::max(1, T.ep))) /
         ExpertGradientScale(SourceRelease(S, T), S.manifest["source"].value("zero_stage", 1), S.ep);
}

Naming NamingOf(const TargetLayout& T) { return T.model == "plain" ? Naming::Plain : Naming::Pipe; }

bool DdpBf16Wrapper(const Source& S, const TargetLayout& T) {
  return T.zero_stage == 0 && T.dtype == "bf16" && NamingOf(T) == Naming::Plain &&
         !ReleaseBefore(TargetRelease(S, T), 0, 17, 6);
}

bool TorchOptimizerTarget(const Source& S, const TargetLayout& T) {
  return T.zero_stage == 0 && (S.moe || DdpBf16Wrapper(S, T));
}

TargetLayout ResolveModel(const Source& S, TargetLayout T) {
  if (T.sp == 0) T.sp = S.manifest["source"].value("sp", 1);  // the source's Ulysses degree
  // (a module that is no GPT is a plain engine's: never a pipeline)
  T.model = ResolvedModel(T, NamingName(S.naming == Naming::Module ? Naming::Plain : S.naming));
  if (T.ep == 0 && S.moe) T.ep = S.ep;  // (without experts it stays unsaid: 1)
  T.dtype = ResolvedDtype(T, S.manifest["source"]);                      // given, else the source job's
  T.grad_accum_dtype = ResolvedGradAccumDtype(T, S.manifest["source"]);  // given, else the source job's
  return T;
}

Plan MakePlan(const Source& S, const TargetLayout& T, int ranks, int64_t share_budget) {
  Validate(S, T);
  Plan P;
  const int head = S.layers + 3;
  std::vector<int64_t> spec_numel(SpecNames(S.layers, T.dtype, S.untied).size(), 0);
  for (size_t k = 0; k < S.atoms.size(); ++k) {
    int64_t n = PieceOf(S, T, static_cast<int>(k), 0).local_numel;
    spec_numel.at(S.atoms[k].spec()) += n;
    if (S.atoms[k].tied()) spec_numel.at(head) += n;
    P.needed_bytes += 4 * StatesRead(S) * pt::Numel(S.atoms[k].shape);
  }
  // A module's parameters have no layer specs: one stage holds them all, under their own names.
  const bool module = S.naming == Naming::Module;
  P.parts = module ? std::vector<int>{0, 1} : StageBounds(S, T, spec_numel);
  for (const auto& a : S.atoms) P.names.push_back(NameAt(a.place, module ? Naming::Module : NamingOf(T), S.layers));
  auto stage_of = [&](int spec) {
    for (int s = 0; s < T.pp; ++s)
      if (spec >= P.parts[s] && spec < P.parts[s + 1]) return s;
    return -1;
  };
  P.embedding_stage = stage_of(1);
  int groups = 0;
  for (const auto& a : S.atoms) groups = std::max(groups, a.group + 1);
  if (auto pg = S.optimizer.root ? S.optimizer.root->Get("param_groups") : nullptr) groups = std::max<int>(groups, static_cast<int>(pg->AsSequence().size()));
  for (int s = 0; s < T.pp; ++s) {
    bool any = false;
    for (int t = 0; t < T.tp; ++t) {
      Unit u;
      u.pp = s, u.tp = t;
      u.groups.assign(groups, {});
      for (size_t k = 0; k < S.atoms.size(); ++k) {
        const Atom& a = S.atoms[k];
        if (stage_of(a.spec()) != s && !(a.tied() && stage_of(head) == s)) continue;
        // An expert is held by the TP ranks of its expert-parallel group's global ranks.
        if (a.expert >= 0 && !ExpertGroups{T.dp, T.tp, T.ep}.AtTp(t, EpRankOf(S, a, T.ep))) continue;
        u.groups[a.group].push_back(static_cast<int>(u.params.size()));
        u.params.push_back(PieceOf(S, T, static_cast<int>(k), t));
        u.params.back().end = u.params.back().local_numel;
      }
      any |= !u.params.empty();
      for (int d = 0; d < (T.zero_stage == 3 ? T.SeqDp() : 1); ++d) {
        Unit part = u;
        if (T.zero_stage == 3) {
          part.dp = d;
          for (auto& up : part.params) {
            const int64_t piece = Zero3Piece(up.local_numel, T.SeqDp());
            up.begin = std::min(up.local_numel, d * piece), up.end = std::min(up.local_numel, up.begin + piece);
          }
        }
        for (const auto& up : part.params) part.bytes += AtomicBytes(up, S.atoms[up.atom], StatesRead(S));
        P.units.push_back(std::move(part));
      }
    }
    if (!any)
      throw Error("target pipeline stage " + std::to_string(s) + " would hold no parameter (layer specs [" +
                  std::to_string(P.parts[s]) + ", " + std::to_string(P.parts[s + 1]) + "))");
  }
  for (const auto& a : S.atoms)
    if (a.vocab) P.padded_vocab = PieceOf(S, T, static_cast<int>(&a - S.atoms.data()), 0).joined_shape[0];
  std::vector<int64_t> weights;
  for (const auto& u : P.units) weights.push_back(u.bytes);
  P.owner = plan::AssignLpt(weights, ranks);
  ShareRepeatedPieces(P, ranks, share_budget);
  for (auto& sp : P.shared) {
    const UnitParam& up = P.units[sp.unit].params[sp.param];
    sp.bytes = AtomicBytes(up, S.atoms[up.atom], StatesRead(S));
    for (const auto& [u, k] : sp.users) P.units[u].bytes -= sp.bytes;
  }
  return P;
}

ModelFacts ModelFactsOf(const Source& S) {
  ModelFacts m = ShapeFactsOf([&](const char* key) -> int64_t {
    const Value* v = ArgOf(S, key);
    return v && v->is(Value::Kind::Int) ? v->AsInt() : 0;
  });
  m.layers = S.layers;
  m.fixed_model_parallel = S.naming == Naming::Module;
  // Megatron: --recompute-granularity full (recompute_granularity), earlier --checkpoint-activations.
  const Value* granularity = ArgOf(S, "recompute_granularity");
  const Value* checkpointing = ArgOf(S, "checkpoint_activations");
  m.full_recompute = (granularity && granularity->is(Value::Kind::Str) && granularity->s == "full") ||
                     (checkpointing && checkpointing->is(Value::Kind::Bool) && checkpointing->b);
  const json& src = S.manifest["source"];
  m.source.dp = src.value("dp", 1), m.source.sp = src.value("sp", 1), m.source.tp = src.value("tp", 1), m.source.pp = src.value("pp", 1);
  m.source.zero_stage = src.value("zero_stage", 1), m.source.dtype = ResolvedDtype({}, src);
  return m;
}

LayoutChoice ChooseFor(const Source& S, const PlannerRequest& request) {
  return ChooseLayout(ModelFactsOf(S), request, [&](const TargetLayout& layout) {
    const TargetLayout T = ResolveModel(S, layout);
    const Plan P = MakePlan(S, T, 1, 0);
    std::vector<std::vector<int64_t>> loads;
    for (const Unit& u : P.units) {
      if (u.dp > 0) continue;
      loads.emplace_back();
      for (const UnitParam& up : u.params) loads.back().push_back(up.local_numel);
    }
    return loads;
  });
}

// The optimizer files a unit writes: its DP rank's under ZeRO-3; without ZeRO, where the model's torch
// optimizer runs, one expp_rank file per expert-parallel rank (Mixture of Experts) or none (the DDP
// bf16 wrapper's state is in the model-states file); else one per DP rank.
namespace {
int OptimizerFilesOf(const Source& S, const TargetLayout& T, const Unit& u) {
  if (T.no_optimizer) return 0;
  if (u.dp >= 0) return 1;
  if (TorchOptimizerTarget(S, T) && !S.moe) return 0;
  if (TorchOptimizerTarget(S, T)) {  // the expp_rank files this TP rank saves (ExpertGroups)
    const ExpertGroups eg{T.dp, T.tp, std::max(1, T.ep)};
    int n = 0;
    for (int r = 0; r < eg.ep; ++r) n += eg.SaverTp(r) == u.tp;
    return n;
  }
  return T.SeqDp();
}
}  // namespace

json PlanJson(const Source& S, const TargetLayout& T, const Plan& P, int ranks) {
  json units = json::array();
  int64_t planned = 0;
  for (size_t k = 0; k < P.units.size(); ++k) {
    const Unit& u = P.units[k];
    planned += u.bytes;
    json params = json::array();
    for (const auto& up : u.params) params.push_back({{"name", S.atoms[up.atom].name}, {"shape", up.copy.shape}});
    units.push_back({{"pp", u.pp}, {"tp", u.tp}, {"dp", u.dp}, {"rank", P.owner[k]}, {"bytes_read", u.bytes},
                     {"optimizer_files", OptimizerFilesOf(S, T, u)}, {"params", params}});
  }
  json shared = json::array();
  for (const auto& sp : P.shared) {
    const UnitParam& up = P.units[sp.unit].params[sp.param];
    planned += sp.bytes;
    shared.push_back({{"name", S.atoms[up.atom].name}, {"shape", up.copy.shape}, {"elements", sp.numel}, {"units", sp.users.size()},
                      {"reader", sp.reader}, {"ranks", sp.ranks}, {"bytes_read", sp.bytes}});
  }
  json target = T.ToJson();
  target["padded_vocab_size"] = P.padded_vocab;
  return {{"target", target}, {"naming", NamingName(NamingOf(T))}, {"stage_bounds", P.parts}, {"ranks", ranks},
          {"units", units}, {"shared", shared}, {"bytes_read", planned}, {"atomic_bytes", P.needed_bytes},
          {"read_ratio", P.needed_bytes ? static_cast<double>(planned) / static_cast<double>(P.needed_bytes) : 1.0}};
}

}  // namespace ucp::reshard
