#include "patterns/resolve.h"

#include <map>

#include "core/error.h"

namespace ucp::patterns {
namespace {

// q_proj / kv_proj / ffn from the Megatron args; -1 when unknown.
int64_t ResolveSize(const std::string& size, const source::SourceIndex& L) {
  if (!size.empty() && std::isdigit(static_cast<unsigned char>(size[0]))) return std::stoll(size);
  int64_t heads = L.Fact("num_attention_heads"), kv_heads = L.Fact("num_key_value_heads");
  int64_t kv_channels = L.Fact("kv_channels"), hidden = L.Fact("hidden_size");
  if (kv_channels < 0 && hidden > 0 && heads > 0) kv_channels = hidden / heads;
  if (kv_heads < 0) kv_heads = heads;
  if (size == "q_proj" && heads > 0 && kv_channels > 0) return heads * kv_channels;
  if (size == "kv_proj" && kv_heads > 0 && kv_channels > 0) return kv_heads * kv_channels;
  if (size == "ffn") return L.Fact("ffn_hidden_size");
  return -1;
}

size_t CountMatched(const RuleSet& rules, const source::SourceIndex& L, size_t* unmatched_rules) {
  size_t matched = 0;
  std::set<std::string> used;
  for (const auto& p : L.params) {
    bool any = false;
    if (auto m = Classify(rules, p.name)) any = true, used.insert(m->key + "\n" + m->rule);
    for (const char* key : {kVocabKey, kPipelineReplicatedKey}) {
      auto it = rules.lists.find(key);
      if (it == rules.lists.end()) continue;
      for (const auto& re : it->second)
        if (re.Matches(p.name)) any = true, used.insert(std::string(key) + "\n" + re.text);
    }
    matched += any;
  }
  *unmatched_rules = 0;
  for (const auto& [key, list] : rules.lists)
    for (const auto& re : list) *unmatched_rules += !used.count(key + "\n" + re.text);
  for (const auto& sp : rules.sub_params)
    for (const auto& re : sp.patterns) *unmatched_rules += !used.count(std::string(kSubParamsKey) + "\n" + re.text);
  return matched;
}

// Rules of `rules` that match no parameter.
std::vector<std::string> UnmatchedRules(const RuleSet& rules, const source::SourceIndex& L) {
  std::vector<std::string> out;
  auto any = [&](const Regex& re) {
    for (const auto& p : L.params)
      if (re.Matches(p.name)) return true;
    return false;
  };
  for (const auto& [key, list] : rules.lists)
    for (const auto& re : list)
      if (!any(re)) out.push_back(key + " '" + re.text + "'");
  for (const auto& sp : rules.sub_params)
    for (const auto& re : sp.patterns)
      if (!any(re)) out.push_back(std::string(kSubParamsKey) + " '" + re.text + "'");
  return out;
}

// The checkpoint's own rules (universal_checkpoint_info), or a problem when they are malformed.
void ReadCheckpointRules(const source::SourceIndex& L, ModelPatterns& M) {
  if (!L.universal_checkpoint_info) return;
  try {
    M.checkpoint_rules = RuleSet::FromCheckpointInfo(*L.universal_checkpoint_info);
  } catch (const std::exception& e) {
    M.problems.push_back(std::string("universal_checkpoint_info is malformed: ") + e.what());
  }
}

// Several files given: their rules are used together, first file first.
RuleSet MergedPatternFiles(const std::vector<std::string>& files) {
  RuleSet merged = RuleSet::FromFile(files[0]);
  for (size_t k = 1; k < files.size(); ++k) {
    RuleSet more = RuleSet::FromFile(files[k]);
    for (auto& [key, list] : more.lists) merged.lists[key].insert(merged.lists[key].end(), list.begin(), list.end());
    merged.sub_params.insert(merged.sub_params.end(), more.sub_params.begin(), more.sub_params.end());
    merged.source += ", " + more.source;
  }
  return merged;
}

// The family whose rules classify the most parameters; fewer rules left unused breaks ties. None
// when it classifies fewer than half of them: not this model.
void DetectFamily(const source::SourceIndex& L, const std::string& patterns_dir, ModelPatterns& M) {
  size_t best_matched = 0, best_unused = SIZE_MAX;
  for (auto& rules : LoadFamilyFiles(patterns_dir)) {
    size_t unused = 0, matched = CountMatched(rules, L, &unused);
    if (matched > best_matched || (matched == best_matched && matched > 0 && unused < best_unused)) {
      best_matched = matched, best_unused = unused;
      M.family = std::move(rules);
    }
  }
  if (M.family && best_matched * 2 < L.params.size()) M.family.reset();
  if (M.family)
    M.notes.push_back("model family '" + M.family->family + "' (" + M.family->source + ") classifies " +
                      std::to_string(best_matched) + " of " + std::to_string(L.params.size()) + " parameters");
  else if (L.on_grid)
    M.notes.push_back("no model family in " + patterns_dir + " fits these parameter names");
}

// Rules that match no parameter: a problem in files the user gave, and in the checkpoint's rules when
// none of them matches (rules of another model, or of another naming); a note in an auto-detected
// family, and in the checkpoint's rules when others of them match: a rule for a variant this model
// lacks (Megatron-DeepSpeed names the dense MLP's [gate; up] rule in a model whose every MLP is a
// Mixture of Experts). Also the widths that DeepSpeed >= 0.4 requires for sub-parameter rules.
void ReportUnusedRules(const source::SourceIndex& L, ModelPatterns& M) {
  if (M.checkpoint_rules) {
    size_t unmatched = 0;
    const size_t matched = CountMatched(*M.checkpoint_rules, L, &unmatched);
    for (const auto& r : UnmatchedRules(*M.checkpoint_rules, L)) {
      if (matched == 0) M.problems.push_back("checkpoint rule " + r + " matches no parameter (nor does any other of its rules)");
      else M.notes.push_back("checkpoint rule " + r + " matches no parameter (its other rules match " +
                             std::to_string(matched) + "): a variant this model lacks");
    }
  }
  if (M.family) {
    for (const auto& r : UnmatchedRules(*M.family, L)) {
      if (M.family_explicit) M.problems.push_back("rule " + r + " of " + M.family->source + " matches no parameter");
      else M.notes.push_back("family rule " + r + " matches no parameter (optional in this model)");
    }
  }
  if (M.checkpoint_rules && M.checkpoint_rules->version && *M.checkpoint_rules->version >= 0.4)
    for (const auto& sp : M.checkpoint_rules->sub_params)
      for (const auto& re : sp.patterns)
        if (!M.checkpoint_rules->shard_widths.count(re.text))
          M.problems.push_back("universal_checkpoint_version " + std::to_string(*M.checkpoint_rules->version) +
                               " requires sub_param_shard_widths for '" + re.text + "', which is absent");
}

// What many parameters may share, said once after them all.
struct SharedNotes {
  struct Disagreement {
    size_t count = 0;
    std::string text;
  };
  std::map<std::string, Disagreement> disagreements;  // per pair of rules, in a stable order
  std::vector<std::string> unsplit_unknown;           // at tp=1: no rule, so no TP split known (a note)

  void AddTo(ModelPatterns& M) const {
    if (!unsplit_unknown.empty())
      M.notes.push_back(std::to_string(unsplit_unknown.size()) + " parameter(s) match no rule, e.g. '" + unsplit_unknown[0] +
                        "': at tp=1 nothing is split, so they convert exactly, but their TP split is unknown: ucp-reshard "
                        "refuses them at TP > 1 (give model rules with --patterns)");
    for (const auto& [pair, d] : disagreements)
      M.notes.push_back(d.text + (d.count > 1 ? " and " + std::to_string(d.count - 1) + " more" : ""));
  }
};

// The rules that decide `p`: the checkpoint's own and the family's, the checkpoint's winning where
// they disagree (the family file only fills what the checkpoint does not say); its pattern here.
ParamPattern Classified(const source::ParamRecord& p, const source::SourceIndex& L, ModelPatterns& M, SharedNotes& shared) {
  ParamPattern r;
  r.name = p.name;
  std::optional<Match> own = M.checkpoint_rules ? Classify(*M.checkpoint_rules, p.name) : std::nullopt;
  std::optional<Match> fam = M.family ? Classify(*M.family, p.name) : std::nullopt;
  for (const auto* m : {&own, &fam})
    if (*m && !(*m)->also_matched.empty())
      M.problems.push_back("parameter '" + p.name + "' is matched by two rules of " + (*m)->source + ": " + (*m)->key +
                           " and " + (*m)->also_matched[0]);
  if (own && fam && (own->pattern != fam->pattern || own->cat_dim != fam->cat_dim)) {
    auto& d = shared.disagreements[own->key + " '" + own->rule + "' vs " + fam->key + " '" + fam->rule + "'"];
    if (d.count++ == 0)
      d.text = "the checkpoint says " + std::string(PatternName(own->pattern)) + " (" + own->key + " '" + own->rule +
               "') where " + fam->source + " says " + std::string(PatternName(fam->pattern)) + " (" + fam->key + " '" +
               fam->rule + "'); the checkpoint's rule is used, e.g. for '" + p.name + "'";
  }
  r.own = own;
  r.checkpoint_has_rules = M.checkpoint_rules.has_value();
  r.match = own ? own : fam;
  for (const RuleSet* rs : {M.checkpoint_rules ? &*M.checkpoint_rules : nullptr, M.family ? &*M.family : nullptr}) {
    if (!rs) continue;
    r.vocab |= IsVocab(*rs, p.name);
    r.pp_replicated |= IsPipelineReplicated(*rs, p.name);
  }
  if (r.match) {
    r.model_pattern = r.match->pattern;
  } else if (!r.vocab && L.tp > 1 && !p.WholeOverTp()) {
    M.problems.push_back("parameter '" + p.name + "' matches no rule: its TP split is unknown (taken as Shard-V)");
  } else if (!r.vocab && !p.WholeOverTp()) {
    shared.unsplit_unknown.push_back(p.name);
  }
  r.fused_experts = p.fused_experts;
  const int tp = p.WholeOverTp() ? 1 : L.tp;  // an expert is not split over TP (ParamRecord)
  if (tp > 1) r.here = r.model_pattern;
  else r.here = (r.pp_replicated && p.stages.size() > 1) ? Pattern::Replicate : Pattern::Unique;
  return r;
}

// The shape of `p` with its `tp` pieces joined on the split dimension; none (and a problem) when a
// piece's shape is missing or the split dimension is not in it.
std::optional<std::vector<int64_t>> JoinedShape(const source::ParamRecord& p, const ParamPattern& r, int tp,
                                                std::vector<std::string>& problems) {
  bool complete = true;
  for (int t = 0; t < tp; ++t)
    if (!p.tp_shape.count(t)) {
      problems.push_back("parameter '" + p.name + "' has no shape at tp=" + std::to_string(t));
      complete = false;
    }
  if (!complete) return std::nullopt;
  std::vector<int64_t> full = p.tp_shape.at(0);
  const int dim = r.split_dim();
  if (tp > 1 && (r.model_pattern == Pattern::Replicate || r.model_pattern == Pattern::Partial)) {
    for (int t = 1; t < tp; ++t)
      if (p.tp_shape.at(t) != full)
        problems.push_back("parameter '" + p.name + "' is " + std::string(PatternName(r.model_pattern)) +
                           " but its shape differs across TP ranks");
  } else if (tp > 1) {
    if (dim >= static_cast<int>(full.size())) {
      problems.push_back("parameter '" + p.name + "' of shape " + pt::ShapeString(full) + " cannot be split on dim " +
                         std::to_string(dim));
      return std::nullopt;
    }
    for (int t = 1; t < tp; ++t) full[dim] += p.tp_shape.at(t)[dim];
  }
  return full;
}

// A vocabulary tensor's rows beyond original_vocab_size are padding: counted, and cut from `full`.
void StripVocabPadding(const ModelPatterns& M, ParamPattern& r, std::vector<int64_t>& full, std::vector<std::string>& notes) {
  if (!r.vocab || full.empty()) return;
  auto original = M.checkpoint_rules ? M.checkpoint_rules->original_vocab_size : std::nullopt;
  if (original && *original <= full[0]) {
    r.vocab_padding_rows = full[0] - *original;
    full[0] = *original;
  } else if (!original) {
    notes.push_back("parameter '" + r.name + "' is a vocabulary tensor but original_vocab_size is unknown: "
                    "its padding cannot be stripped");
  }
}

// Shard-NC's sizes along the split dimension, resolved from the model's facts; a problem when they
// do not add up to the full shape.
void ResolveSubParamSizes(const source::SourceIndex& L, ParamPattern& r, std::vector<std::string>& problems) {
  const std::vector<int64_t>& full = r.full_shape;
  if (r.match && r.match->sub_params) {
    int64_t sum = 0;
    for (const auto& s : r.match->sub_params->sizes) {
      int64_t v = ResolveSize(s, L);
      r.sub_param_sizes.push_back(v);
      sum += v;
    }
    int pd = r.match->sub_params->partition_dim;
    if (r.sub_param_sizes.size() == 1 && r.sub_param_sizes[0] > 0 && pd < (int)full.size() &&
        r.sub_param_sizes[0] != full[pd]) {
      // Pre-0.4 scalar: N equal sub-parameters.
      int64_t n = r.sub_param_sizes[0];
      r.sub_param_sizes.assign(n, full[pd] / n);
      sum = full[pd];
    }
    if (pd >= (int)full.size() || sum != full[pd])
      problems.push_back("parameter '" + r.name + "': sub-parameter sizes do not add up to its dim " + std::to_string(pd) +
                         " of " + pt::ShapeString(full));
  } else if (r.match && r.match->n_sub_params == 2 && !full.empty()) {
    r.sub_param_sizes = {full[0] / 2, full[0] / 2};
  }
}

}  // namespace

ModelPatterns ResolvePatterns(const source::SourceIndex& L, const ResolveOptions& options) {
  ModelPatterns M;
  ReadCheckpointRules(L, M);
  if (!options.pattern_files.empty()) {
    M.family = MergedPatternFiles(options.pattern_files);
    M.family_explicit = true;
  } else if (!options.patterns_dir.empty()) {
    DetectFamily(L, options.patterns_dir, M);
  }
  // A Hugging Face job's plain engine (Trainer, Accelerate) at tp=1: no rule has anything to say of its
  // model, whose TP and PP ucp-reshard keeps (no layer structure is known): one note, true for it.
  const bool own_names = !L.job.empty() && !M.family && !M.checkpoint_rules && L.tp == 1 && L.pp == 1;
  if (own_names) {
    std::erase_if(M.notes, [](const std::string& n) { return n.rfind("no model family in ", 0) == 0; });
    M.notes.push_back("Hugging Face's own parameter names (a plain DeepSpeed engine): converted exactly; ucp-reshard "
                      "changes its DP degree and ZeRO stage, not its TP or PP");
  }
  ReportUnusedRules(L, M);
  SharedNotes shared;
  for (const auto& p : L.params) {
    ParamPattern r = Classified(p, L, M, shared);
    auto full = JoinedShape(p, r, p.WholeOverTp() ? 1 : L.tp, M.problems);
    if (!full) continue;
    StripVocabPadding(M, r, *full, M.notes);
    r.full_shape = std::move(*full);
    ResolveSubParamSizes(L, r, M.problems);
    M.params.push_back(std::move(r));
  }
  if (own_names) shared.unsplit_unknown.clear();
  if (!L.on_grid && !shared.unsplit_unknown.empty()) {  // global tensors: their atomic checkpoint needs no TP rule
    shared.unsplit_unknown.clear();
    M.notes.push_back("the parameters are whole global tensors: the atomic checkpoint needs no model rules (which say how "
                      "TP splits each tensor for a DeepSpeed target; from this source ucp-reshard writes --format hf, --format mcore, and --format dcp of a Llama-shaped model)");
  }
  shared.AddTo(M);
  return M;
}

}  // namespace ucp::patterns
