// Pattern rules: which TP pattern each parameter has (DESIGN.md section 2). Rules come in
// DeepSpeed's universal_checkpoint_info keys, from the checkpoint itself or from a model-family
// file in patterns/ (schemas/patterns.schema.json). Matching follows DeepSpeed: Python re.match,
// i.e. anchored at the start of the name only, and the precedence of ds_to_universal.py.
#pragma once

#include <map>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pt/value.h"

namespace ucp::patterns {

enum class Pattern { Unique, Replicate, Partial, ShardV, ShardH, ShardNC };
std::string_view PatternName(Pattern p);  // "Shard-V", ...
// Shard-V, Shard-H, Shard-NC: TP splits the tensor (the others are whole on every rank).
inline bool IsSplit(Pattern p) { return p == Pattern::ShardV || p == Pattern::ShardH || p == Pattern::ShardNC; }

struct Regex {
  std::string text;
  std::regex re;
  bool Matches(const std::string& name) const;  // re.match semantics
};

// A fused tensor split per sub-parameter (DeepSpeed SubparamShape): sizes along partition_dim.
// A size may be symbolic in family files ("q_proj", "kv_proj", "ffn") until resolved from args.
struct SubParamRule {
  std::vector<Regex> patterns;
  std::vector<std::string> sizes;  // decimal numbers or symbols
  int partition_dim = 0;
};

// The pattern-deciding keys, in the precedence ds_to_universal.py applies them.
inline constexpr const char* kReplicateKey = "tp_replicated_parameter_patterns";
inline constexpr const char* kAverageKey = "parameter_to_average_patterns";
inline constexpr const char* kTwoSubParamsKey = "parameter_with_2_sub_params_cat_dim_0";
inline constexpr const char* kSubParamsKey = "parameter_with_sub_params";
inline constexpr const char* kRowParallelKey = "parameter_with_row_parallelism_patterns";
inline constexpr const char* kColumnParallelKey = "ucp_column_parallel_parameter_patterns";  // ucp extension
inline constexpr const char* kVocabKey = "vocabulary_parameter_patterns";
inline constexpr const char* kPipelineReplicatedKey = "pipeline_replicated_parameter_patterns";

struct RuleSet {
  std::string source;  // "checkpoint universal_checkpoint_info" or a file path
  std::string family;  // ucp_family.name of a patterns/ file
  std::string description;
  std::map<std::string, std::vector<Regex>> lists;  // list-valued keys above
  std::vector<SubParamRule> sub_params;
  std::map<std::string, std::vector<std::vector<int64_t>>> shard_widths;  // sub_param_shard_widths
  std::optional<double> version;
  std::optional<int64_t> original_vocab_size, padded_vocab_size;

  static RuleSet FromJson(const nlohmann::json& j, const std::string& source);  // validates
  static RuleSet FromFile(const std::string& path);
  static RuleSet FromCheckpointInfo(const pt::Value& info);  // universal_checkpoint_info
  size_t RuleCount() const;
};

struct Match {
  Pattern pattern = Pattern::ShardV;
  std::string key;       // the rule list that decided it ("" when no rule did)
  std::string rule;      // the regex text
  std::string source;    // RuleSet::source
  const SubParamRule* sub_params = nullptr;
  int n_sub_params = 0;  // 2 for parameter_with_2_sub_params_cat_dim_0
  int cat_dim = 0;
  std::vector<std::string> also_matched;  // other pattern-deciding keys of the same set that match
};

// The first pattern-deciding key of `rules` matching `name`, in DeepSpeed's precedence.
std::optional<Match> Classify(const RuleSet& rules, const std::string& name);
bool IsVocab(const RuleSet& rules, const std::string& name);
bool IsPipelineReplicated(const RuleSet& rules, const std::string& name);

// The rule files in a folder (patterns/), sorted by name. Throws on a malformed file.
std::vector<RuleSet> LoadFamilyFiles(const std::string& dir);
// $UCP_PATTERNS_DIR, else $UCP_DATA_DIR/patterns, else <the executable's folder>/../share/ucp/patterns
// (an installed tool, wherever its prefix is), else the source tree's patterns/ (a tool in its build tree).
std::string DefaultPatternsDir();

}  // namespace ucp::patterns
