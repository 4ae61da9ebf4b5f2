#include "layout/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <tuple>

#include "core/error.h"
#include "core/format.h"

namespace ucp::reshard {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

int DtypeBytes(const std::string& dtype) { return dtype == "fp32" ? 4 : 2; }

bool Fixed(const PlannerRequest& r, const char* key) {
  return std::find(r.fixed.begin(), r.fixed.end(), key) != r.fixed.end();
}

// 0: an all-reduce as plain DP (stages 0 and 1), 1: ZeRO-2's reduce-scatter, 2: ZeRO-3's gathers.
int ZeroCommunication(int stage) { return stage <= 1 ? 0 : stage - 1; }

// Why the model cannot take `tp` by its shape facts, or "".
std::string TpRefusal(const ModelFacts& m, const PlannerRequest& r, int tp) {
  if (tp > r.gpus_per_node || r.gpus_per_node % tp)
    return "tp=" + std::to_string(tp) + " does not divide the " + std::to_string(r.gpus_per_node) + " GPUs of a node";
  return ModelTpRefusal(m, tp);
}

// Why the chosen layout `t` (not given an SP degree) runs Ulysses sp > 1, from the candidates of its
// tp and pp with less SP: some take the GPUs but do not fit (the sequence's activations), all are
// refused (the first refusal), or none exists: the degrees given leave only this SP to fill the GPUs.
std::string WhySp(const std::vector<Candidate>& candidates, const PlannerRequest& r, const TargetLayout& t) {
  const std::string sp = "sp=" + std::to_string(t.Sp());
  const Candidate* refused = nullptr;
  for (const Candidate& c : candidates) {
    if (c.layout.tp != t.tp || c.layout.pp != t.pp || c.layout.Sp() >= t.Sp()) continue;
    if (c.refused.empty()) return "the smallest SP that fits (" + sp + ": the sequence's activations do not fit with less)";
    if (!refused) refused = &c;
  }
  if (refused) return sp + " (with less SP, " + refused->layout.Degrees() + " is refused: " + refused->refused + ")";
  std::string given;
  const std::pair<const char*, int> degrees[] = {{"dp", t.dp}, {"tp", t.tp}, {"pp", t.pp}};
  for (const auto& [key, value] : degrees)
    if (Fixed(r, key)) given += (given.empty() ? "" : " ") + std::string(key) + "=" + std::to_string(value);
  return sp + ": the degrees given (" + given + "), at pp=" + std::to_string(t.pp) + ", leave only " + sp + " to fill " +
         std::to_string(r.gpus) + " GPUs (not the sequence's activations)";
}

}  // namespace

std::string FixedDegreesRefusal(const PlannerRequest& r) {
  std::string named;
  int64_t product = 1;
  const std::pair<const char*, int> degrees[] = {{"dp", r.base.dp}, {"sp", r.base.Sp()}, {"tp", r.base.tp}, {"pp", r.base.pp}};
  for (const auto& [key, value] : degrees)
    if (Fixed(r, key)) named += (named.empty() ? "" : " x ") + std::string(key), product *= value;
  if (named.empty() || r.gpus % product == 0) return "";
  return named + " = " + std::to_string(product) + " does not divide " + std::to_string(r.gpus) + " GPUs";
}

std::string ModelTpRefusal(const ModelFacts& m, int tp) {
  const std::pair<const char*, int64_t> facts[] = {{"attention heads", m.heads}, {"key-value heads", m.kv_heads}, {"FFN width", m.ffn}};
  for (const auto& [what, n] : facts)
    if (n > 0 && n % tp) return "tp=" + std::to_string(tp) + " does not divide the " + std::to_string(n) + " " + what;
  return "";
}

std::string ModelSpRefusal(const ModelFacts& m, int tp, int sp) {
  if (sp <= 1) return "";
  if (m.heads > 0 && m.heads % tp == 0 && (m.heads / tp) % sp)  // (a TP not dividing them: ModelTpRefusal's)
    return "sp=" + std::to_string(sp) + " does not divide the " + std::to_string(m.heads) + " query heads" +
           (tp > 1 ? " per TP rank (" + std::to_string(m.heads / tp) + " at tp=" + std::to_string(tp) + ")" : "") +
           ": Ulysses gives each SP rank whole heads";
  if (m.seq_length > 0 && m.seq_length % sp)
    return "sp=" + std::to_string(sp) + " does not divide the sequence length " + std::to_string(m.seq_length) +
           ": Ulysses gives each SP rank s/sp tokens";
  return "";
}

std::string UlyssesRefusal(const ModelFacts& m, int tp, int sp, int pp, bool pipeline_module, bool moe) {
  if (sp <= 1) return "";
  const std::string with = "sp=" + std::to_string(sp) + " with ";
  if (pp > 1) return with + "pp=" + std::to_string(pp) + ": Megatron-DeepSpeed runs Ulysses SP without a pipeline; use pp=1";
  if (pipeline_module) return with + "model 'pipe': Ulysses SP runs in a model that is not a PipelineModule";
  if (moe) return with + "Mixture of Experts: no real checkpoint of that combination has been read; not written";
  return ModelSpRefusal(m, tp, sp);
}

ModelFacts ShapeFactsOf(const std::function<int64_t(const char*)>& arg) {
  ModelFacts m;
  m.heads = arg("num_attention_heads"), m.kv_heads = arg("num_key_value_heads"), m.ffn = arg("ffn_hidden_size");
  m.hidden = arg("hidden_size"), m.seq_length = arg("seq_length"), m.micro_batch = arg("micro_batch_size");
  if (m.kv_heads == 0) m.kv_heads = m.heads;
  return m;
}

nlohmann::json ActivationModel::ToJson() const {
  return {{"seq_length", seq_length}, {"micro_batch_size", micro_batch}, {"hidden_size", hidden}, {"num_attention_heads", heads},
          {"num_layers", layers}, {"recompute", full_recompute ? "full" : "none"},
          {"formula", full_recompute ? "L * 2*s*b*h / (tp*sp)" : "L * s*b*h * (34 + 5*a*s/h) / (tp*sp)"}};
}

ActivationModel ActivationModelOf(const ModelFacts& m, const PlannerRequest& r) {
  ActivationModel a;
  a.seq_length = r.seq_length > 0 ? r.seq_length : m.seq_length;
  a.micro_batch = r.micro_batch > 0 ? r.micro_batch : m.micro_batch;
  a.hidden = m.hidden, a.heads = m.heads, a.layers = m.layers;
  a.full_recompute = r.recompute.empty() ? m.full_recompute : r.recompute == "full";
  return a;
}

int64_t ActivationBytes(const ActivationModel& a, int tp, int sp, int dtype_bytes) {
  // In long double: s*s*a*b for a 128k-token sequence is near 2^60 before the division.
  const long double s = a.seq_length, b = a.micro_batch, h = a.hidden, heads = a.heads, L = a.layers;
  const long double per_layer = a.full_recompute ? 2 * s * b * h : s * b * h * (34 + 5 * heads * s / h);
  return static_cast<int64_t>(std::llroundl(L * per_layer / (static_cast<long double>(tp) * sp) * dtype_bytes / 2));
}

nlohmann::json MemoryEstimate::ToJson() const {
  return {{"weights", weights}, {"gradients", gradients}, {"optimizer", optimizer}, {"activations", activations}, {"total", total()}};
}

MemoryEstimate EstimateMemory(const TargetLayout& t, const std::vector<int64_t>& numels, int64_t activations) {
  const int64_t b = DtypeBytes(t.dtype);
  int64_t all = 0, sliced = 0;  // sum n; sum ceil(n / dp)
  for (int64_t n : numels) all += n, sliced += CeilDiv(n, t.SeqDp());  // ZeRO partitions over DP x SP
  const int64_t partition = CeilDiv(all, t.SeqDp());
  MemoryEstimate m;
  m.activations = activations;
  if (t.zero_stage == 3) {
    m.weights = b * sliced, m.gradients = b * sliced, m.optimizer = 12 * sliced;
    return m;
  }
  m.weights = b * all;
  m.gradients = t.zero_stage == 2 ? b * partition : t.bf16_optimizer() ? 4 * all : b * all;
  m.optimizer = 12 * partition;
  return m;
}

namespace {

// Whether the activations are estimated from the model (its facts known, no --activation-memory
// given), else the allowance stands for them.
bool EstimatesActivations(const ActivationModel& a, const PlannerRequest& r) { return a.known() && r.activation_memory < 0; }

// The degrees of one layout: dp x sp x tp x pp = the GPUs.
struct Degrees {
  int dp, sp, tp, pp;
};

// Every way to cut the GPUs into degrees the degrees given allow, TP outermost, then SP, then PP.
std::vector<Degrees> DegreesFor(const PlannerRequest& r) {
  std::vector<Degrees> all;
  for (int tp = 1; tp <= r.gpus; ++tp) {
    if (r.gpus % tp || (Fixed(r, "tp") && tp != r.base.tp)) continue;
    for (int sp = 1; sp <= r.gpus / tp; ++sp) {
      if ((r.gpus / tp) % sp || (Fixed(r, "sp") && sp != r.base.Sp())) continue;
      for (int pp = 1; pp <= r.gpus / tp / sp; ++pp) {
        if ((r.gpus / tp / sp) % pp || (Fixed(r, "pp") && pp != r.base.pp)) continue;
        const int dp = r.gpus / tp / sp / pp;
        if (Fixed(r, "dp") && dp != r.base.dp) continue;
        all.push_back({dp, sp, tp, pp});
      }
    }
  }
  return all;
}

TargetLayout LayoutAt(const PlannerRequest& r, const Degrees& d) {
  TargetLayout t = r.base;
  t.dp = d.dp, t.sp = d.sp, t.tp = d.tp, t.pp = d.pp;
  return t;
}

// A model whose layers ucp does not know keeps the source's TP, PP and SP: other degrees, refused
// with the reason (the ones the user gave named).
Candidate KeptModelParallel(const ModelFacts& model, const PlannerRequest& r, const Degrees& d) {
  Candidate c;
  c.layout = LayoutAt(r, d);
  std::string given;
  for (const auto& [key, value, source] : {std::tuple{"tp", d.tp, model.source.tp}, std::tuple{"pp", d.pp, model.source.pp},
                                           std::tuple{"sp", d.sp, model.source.Sp()}})
    if (value != source && Fixed(r, key)) given += (given.empty() ? "" : " ") + std::string(key) + "=" + std::to_string(value);
  c.refused = (given.empty() ? std::string() : given + " as given: ") +
              "the model's layers are not known to ucp (its parameters keep their own names: a plain DeepSpeed "
              "engine around a model that is no Megatron GPT): TP, PP and SP stay the source's (tp=" +
              std::to_string(model.source.tp) + " pp=" + std::to_string(model.source.pp) + " sp=" +
              std::to_string(model.source.Sp()) + ")";
  return c;
}

// What the candidates are weighed with: the model, its facts at the planned sequence length, the
// activation model, and the per-rank loads of a layout.
struct Weighing {
  const ModelFacts& model;
  ModelFacts facts;  // the model's, at the sequence length the activations are estimated for
  const PlannerRequest& r;
  const ActivationModel& activation;
  const LoadOf& load;
};

// The memory per GPU of layout c (its most loaded rank) and whether it fits; or why the model
// cannot take it (the load throws the plan's refusal).
void Weigh(Candidate& c, const Weighing& w) {
  const int64_t activations = EstimatesActivations(w.activation, w.r)
                                  ? ActivationBytes(w.activation, c.layout.tp, c.layout.Sp(), DtypeBytes(c.layout.dtype))
                                  : w.r.activations();
  try {
    for (const auto& unit : w.load(c.layout)) {
      MemoryEstimate m = EstimateMemory(c.layout, unit, activations);
      if (m.total() > c.memory.total()) c.memory = m;
    }
    c.fits = c.memory.total() <= w.r.gpu_memory;
  } catch (const Error& e) {
    c.refused = e.what();
  }
}

// The layouts of degrees `d`, one per ZeRO stage DeepSpeed runs there, each weighed or refused.
void AddCandidates(const Degrees& d, const Weighing& w, std::vector<Candidate>& valid, std::vector<Candidate>& refused) {
  const ModelFacts& model = w.model;
  const PlannerRequest& r = w.r;
  if (model.fixed_model_parallel && (d.tp != model.source.tp || d.sp != model.source.Sp() || d.pp != model.source.pp)) {
    if (Fixed(r, "tp") || Fixed(r, "pp") || Fixed(r, "sp")) refused.push_back(KeptModelParallel(model, r, d));  // asked for: said why not
    return;
  }
  const std::string tp_no = TpRefusal(model, r, d.tp);
  const std::string sp_no = UlyssesRefusal(w.facts, d.tp, d.sp, d.pp, r.base.model == "pipe", false);
  for (int z = 0; z <= 3; ++z) {
    if (Fixed(r, "zero_stage") && z != r.base.zero_stage) continue;
    if ((z == 0 && r.base.dtype != "bf16") || (z >= 2 && d.pp > 1)) continue;  // DeepSpeed runs none of these
    Candidate c;
    c.layout = LayoutAt(r, d);
    c.layout.zero_stage = z;
    if (!tp_no.empty())
      c.refused = tp_no;
    else if (!sp_no.empty())
      c.refused = sp_no;
    else if (d.pp > model.layers && !model.fixed_model_parallel)
      c.refused = "pp=" + std::to_string(d.pp) + " exceeds the " + std::to_string(model.layers) + " layers";
    else
      Weigh(c, w);
    (c.refused.empty() ? valid : refused).push_back(std::move(c));
  }
}

// The valid layouts by preference: fitting first, the source's TP and PP, the fewest stages, the
// smallest SP, the least ZeRO communication, the smallest TP, the least memory.
void RankCandidates(std::vector<Candidate>& valid, const ModelFacts& model) {
  const TargetLayout& s = model.source;
  auto key = [&](const Candidate& c) {
    const TargetLayout& t = c.layout;
    // A model whose layers ucp does not know runs a job whose own configuration names its ZeRO
    // stage (Trainer's ds_config): the source's stage first, a change only where it does not fit.
    const bool other_stage = t.zero_stage != s.zero_stage;
    return std::make_tuple(!c.fits, !(t.tp == s.tp && t.pp == s.pp), t.pp, t.Sp(), model.fixed_model_parallel && other_stage,
                           ZeroCommunication(t.zero_stage), other_stage, t.tp, c.memory.total());
  };
  std::stable_sort(valid.begin(), valid.end(), [&](const Candidate& a, const Candidate& b) { return key(a) < key(b); });
}

std::string Gpus(int n) { return std::to_string(n) + " GPU" + (n > 1 ? "s" : ""); }

// Why no layout fits: the smallest, and what it needs.
std::string NoneFits(const std::vector<Candidate>& valid, const PlannerRequest& r, bool estimated, const std::string& budget) {
  auto least = std::min_element(valid.begin(), valid.end(), [](const Candidate& a, const Candidate& b) {
    return a.memory.total() < b.memory.total();
  });
  const MemoryEstimate& m = least->memory;
  return "no layout fits " + Gpus(r.gpus) + " of " + budget + ": the smallest, " + least->layout.Degrees() + ", needs " +
         HumanBytes(double(m.total())) + " per GPU (weights " + HumanBytes(double(m.weights)) + ", gradients " +
         HumanBytes(double(m.gradients)) + ", optimizer " + HumanBytes(double(m.optimizer)) +
         (estimated ? ", activations " : ", activation allowance ") + HumanBytes(double(m.activations)) + ")";
}

// Why the chosen layout's TP and PP: the source's, else why not the source's.
std::string WhyTpPp(const LayoutChoice& choice, const TargetLayout& t, const TargetLayout& s, const PlannerRequest& r) {
  if (t.tp == s.tp && t.pp == s.pp) return "keeps the source's tp=" + std::to_string(s.tp) + " pp=" + std::to_string(s.pp);
  auto same = std::find_if(choice.candidates.begin(), choice.candidates.end(),
                           [&](const Candidate& o) { return o.layout.tp == s.tp && o.layout.pp == s.pp; });
  return "the source's tp=" + std::to_string(s.tp) + " pp=" + std::to_string(s.pp) +
         (same == choice.candidates.end() && (Fixed(r, "tp") || Fixed(r, "pp")) ? " is not among the degrees given"
          : same == choice.candidates.end() ? " cannot take " + Gpus(r.gpus)
          : !same->refused.empty()        ? " is refused: " + same->refused
                                          : " does not fit (" + HumanBytes(double(same->memory.total())) + " per GPU at best)") +
         "; then the fewest pipeline stages (pp=" + std::to_string(t.pp) + ")";
}

// Where the memory the choice weighed came from: the card's (--gpu-memory, 80G unless given) and the
// activations' (estimated from the model, or an allowance).
std::string MemoryAssumed(const LayoutChoice& choice, const PlannerRequest& r) {
  const bool default_card = r.gpu_memory == PlannerRequest{}.gpu_memory;
  return std::string(" (") + (default_card ? "--gpu-memory's default, an 80 GB card: give yours" : "--gpu-memory") + "; activations " +
         (EstimatesActivations(choice.activation, r)
              ? "estimated from the model's sequence length and micro-batch"
              : HumanBytes(double(r.activations())) + " set aside, --activation-memory" +
                    (r.activation_memory < 0 ? "'s default, a quarter of the card" : "")) + ")";
}

// Why the chosen layout, the first candidate: its TP and PP, its SP, its ZeRO stage, its TP size.
std::string WhyChosen(const LayoutChoice& choice, const ModelFacts& model, const PlannerRequest& r, const std::string& budget) {
  const Candidate& c = choice.candidates[0];
  const TargetLayout& t = c.layout;
  const TargetLayout& s = model.source;
  std::string why = WhyTpPp(choice, t, s, r);
  if (Fixed(r, "sp"))
    why += ", sp=" + std::to_string(t.Sp()) + " as given";
  else if (t.Sp() > 1)
    why += ", " + WhySp(choice.candidates, r, t);
  else if (s.Sp() > 1)
    why += ", no SP (the source ran sp=" + std::to_string(s.Sp()) + "; its sequence fits without: --sp " +
           std::to_string(s.Sp()) + " keeps it)";
  // The stage: as given; else the job's own where its configuration names it (a model whose layers
  // ucp does not know keeps it); else the least communication that fits.
  const std::string stage = "ZeRO-" + std::to_string(t.zero_stage);
  why += Fixed(r, "zero_stage")          ? ", " + stage + " as given"
         : model.fixed_model_parallel && t.zero_stage == s.zero_stage ? ", the job's own " + stage
                                        : ", the least ZeRO communication (" + stage + (t.zero_stage == s.zero_stage ? ", as the source" : "") + ")";
  why += ", the smallest TP (tp=" + std::to_string(t.tp) + "): " + HumanBytes(double(c.memory.total())) + " of " + budget + " per GPU" +
         MemoryAssumed(choice, r);
  return why;
}

// What a chosen Ulysses degree changes in the training job itself, or "".
std::string JobChange(const TargetLayout& t, const TargetLayout& s) {
  if (t.Sp() <= 1 || t.Sp() == s.Sp()) return "";
  return "Ulysses sp=" + std::to_string(t.Sp()) + " changes the training job, not only its files: it must run "
         "with DeepSpeed Ulysses sequence parallelism of degree " + std::to_string(t.Sp()) + " (the source ran " +
         (s.Sp() > 1 ? "sp=" + std::to_string(s.Sp()) : "none") + "); give --sp " + std::to_string(std::max(1, s.Sp())) +
         " to keep it" + (s.Sp() > 1 ? "" : " out");
}

}  // namespace

LayoutChoice ChooseLayout(const ModelFacts& model, const PlannerRequest& request, const LoadOf& load) {
  PlannerRequest r = request;
  if (r.base.dtype.empty()) r.base.dtype = model.source.dtype;  // every candidate in the job's precision unless --dtype says
  if (r.gpus < 1) throw Error("--gpus must be at least 1");
  if (r.gpus_per_node < 1) throw Error("--gpus-per-node must be at least 1");
  LayoutChoice choice;
  choice.activation = ActivationModelOf(model, r);
  Weighing w{model, model, r, choice.activation, load};
  w.facts.seq_length = choice.activation.seq_length;
  std::vector<Candidate> valid, refused;
  for (const Degrees& d : DegreesFor(r)) AddCandidates(d, w, valid, refused);
  RankCandidates(valid, model);
  choice.candidates = valid;
  choice.candidates.insert(choice.candidates.end(), refused.begin(), refused.end());

  const std::string budget = HumanBytes(static_cast<double>(r.gpu_memory));
  if (valid.empty()) {
    const std::string fixed = FixedDegreesRefusal(r);
    choice.reason = "no layout of this model takes " + Gpus(r.gpus) +
                    (refused.empty() ? " with the degrees given" + (fixed.empty() ? std::string() : " (" + fixed + ")") : ": " + refused.front().refused);
    return choice;
  }
  if (!valid.front().fits) {
    choice.reason = NoneFits(valid, r, EstimatesActivations(choice.activation, r), budget);
    return choice;
  }
  choice.chosen = 0;
  choice.reason = WhyChosen(choice, model, r, budget);
  choice.job_change = JobChange(choice.candidates[0].layout, model.source);
  return choice;
}

nlohmann::json LayoutChoice::ToJson(const PlannerRequest& r) const {
  const bool estimated = EstimatesActivations(activation, r);
  nlohmann::json list = nlohmann::json::array(), no = nlohmann::json::array();
  for (const auto& c : candidates) {
    if (c.refused.empty())
      list.push_back({{"layout", c.layout.ToJson()}, {"memory_per_gpu", c.memory.ToJson()}, {"fits", c.fits}});
    else
      no.push_back({{"layout", c.layout.ToJson()}, {"refused", c.refused}});
  }
  return {{"gpus", r.gpus},
          {"gpus_per_node", r.gpus_per_node},
          {"gpu_memory", r.gpu_memory},
          {"activation_memory", estimated ? nlohmann::json(nullptr) : nlohmann::json(r.activations())},
          {"activation_model", estimated ? activation.ToJson() : nlohmann::json(nullptr)},
          {"chosen", chosen >= 0 ? candidates[chosen].layout.ToJson() : nlohmann::json(nullptr)},
          {"reason", reason},
          {"job_change", job_change.empty() ? nlohmann::json(nullptr) : nlohmann::json(job_change)},
          {"candidates", list},
          {"refused", no}};
}

void LayoutChoice::Print(std::ostream& out, const PlannerRequest& r, size_t shown) const {
  const bool estimated = EstimatesActivations(activation, r);
  const ActivationModel& a = activation;
  out << "layouts for " << r.gpus << " GPU" << (r.gpus > 1 ? "s" : "") << " (" << r.gpus_per_node << " per node, "
      << HumanBytes(double(r.gpu_memory)) << " each; activations "
      << (estimated ? "estimated for s=" + std::to_string(a.seq_length) + " b=" + std::to_string(a.micro_batch) + " h=" +
                          std::to_string(a.hidden) + " a=" + std::to_string(a.heads) + " L=" + std::to_string(a.layers) +
                          (a.full_recompute ? ", full recomputation: L*2sbh/(tp*sp)" : ", no recomputation: L*sbh(34+5as/h)/(tp*sp)")
                    : "allowance " + HumanBytes(double(r.activations())))
      << "), memory per GPU of the most loaded rank, by preference:\n";
  char line[320];
  std::snprintf(line, sizeof line, "  %-30s %10s %10s %10s %11s %10s  %s\n", "layout", "weights", "gradients", "optimizer",
                "activations", "total", "");
  out << line;
  size_t n = 0, valid = 0, refused = 0;
  for (const auto& c : candidates) {
    if (!c.refused.empty()) {
      ++refused;
      continue;
    }
    ++valid;
    if (n++ >= shown) continue;
    std::snprintf(line, sizeof line, "%s %-30s %10s %10s %10s %11s %10s  %s\n", &c == &candidates[std::max(chosen, 0)] && chosen >= 0 ? "*" : " ",
                  c.layout.Degrees().c_str(), HumanBytes(double(c.memory.weights)).c_str(),
                  HumanBytes(double(c.memory.gradients)).c_str(), HumanBytes(double(c.memory.optimizer)).c_str(),
                  HumanBytes(double(c.memory.activations)).c_str(), HumanBytes(double(c.memory.total())).c_str(),
                  c.fits ? "fits" : "too big");
    out << line;
  }
  if (valid > shown) out << "  ... " << valid - shown << " more (--json lists all)\n";
  if (refused) out << "  " << refused << " layout" << (refused > 1 ? "s" : "") << " the model cannot take (--json says why)\n";
  out << (chosen >= 0 ? "chosen: " + candidates[chosen].layout.Degrees() + ": " : "none chosen: ") << reason << "\n";
  if (!job_change.empty()) out << "note: " << job_change << "\n";
}

}  // namespace ucp::reshard
