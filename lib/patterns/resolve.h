// Every parameter's pattern for one checkpoint: the checkpoint's own rules merged with the rules of
// its model family (patterns/), because patterns belong to the model and a TP=1 checkpoint's own
// info does not say which weights are row-parallel (DESIGN.md section 2). Also the full shape each
// parameter has once its TP pieces are joined and the vocabulary padding stripped.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "patterns/rules.h"
#include "source/source_index.h"

namespace ucp::patterns {

struct ParamPattern {
  std::string name;
  Pattern model_pattern = Pattern::ShardV;  // what it is under TP > 1
  Pattern here = Pattern::Unique;           // what it is in this checkpoint's layout
  std::optional<Match> match;               // the deciding rule; empty: no rule, default Shard-V
  // The checkpoint's own rule for it (what DeepSpeed's converter obeys); `match` is this one when
  // present, else the family's. `checkpoint_has_rules`: the checkpoint carries rules at all.
  std::optional<Match> own;
  bool checkpoint_has_rules = false;
  bool vocab = false;
  bool pp_replicated = false;
  std::vector<int64_t> sub_param_sizes;  // Shard-NC: sizes along the split dim, resolved
  std::vector<int64_t> full_shape;       // joined over TP, vocabulary padding stripped
  int64_t vocab_padding_rows = 0;        // rows of padding in the joined tensor
  int64_t fused_experts = 0;             // AutoEP's fused experts: their number (ParamRecord)

  // The dimension TP splits under the model pattern (the deciding rule's cat_dim: 1 for
  // row-parallel, the partition_dim of sub-parameters); -1 for Replicate and Partial.
  int split_dim() const { return IsSplit(model_pattern) ? (match ? match->cat_dim : 0) : -1; }
};

struct ModelPatterns {
  std::optional<RuleSet> checkpoint_rules;
  std::optional<RuleSet> family;  // auto-detected or given with --patterns
  bool family_explicit = false;
  std::vector<ParamPattern> params;    // in the layout's order
  std::vector<std::string> problems;   // fatal under --strict
  std::vector<std::string> notes;
};

struct ResolveOptions {
  std::vector<std::string> pattern_files;  // --patterns: used instead of auto-detection
  std::string patterns_dir;                // family files to detect from
};

ModelPatterns ResolvePatterns(const source::SourceIndex& layout, const ResolveOptions& options);

}  // namespace ucp::patterns
