#include "patterns/rules.h"

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"

namespace ucp::patterns {
namespace {

const std::vector<std::string>& ListKeys() {
  static const std::vector<std::string> keys = {kReplicateKey, kAverageKey,    kTwoSubParamsKey, kRowParallelKey,
                                                kColumnParallelKey, kVocabKey, kPipelineReplicatedKey};
  return keys;
}

// Why `text` could make std::regex (a backtracking matcher) take exponential or runaway time on a
// parameter name, or "" when it cannot. Rules come from files and from checkpoints (a hostile
// checkpoint's universal_checkpoint_info among them); the rules DeepSpeed and Megatron-DeepSpeed
// write are literal names with a \d+ or two. Refused: more than 1024 bytes; a quantifier on a
// quantifier (a lazy '?' aside); a quantified group holding a quantifier or an alternation (star
// height 2, the classic catastrophic case); back-references; more than 3 unbounded quantifiers.
std::string RegexHazard(const std::string& text) {
  if (text.size() > 1024) return "longer than 1024 bytes";
  struct Group {
    bool inner = false;  // holds a quantifier or an alternation
  };
  std::vector<Group> groups(1);
  enum class Last { None, Atom, Group, Quantifier, Lazy } last = Last::None;
  bool last_group_inner = false;
  int unbounded = 0;
  auto quantify = [&](bool is_unbounded) -> std::string {
    if (last == Last::Quantifier || last == Last::Lazy) return "a quantifier follows a quantifier";
    if (last == Last::Group && last_group_inner) return "a quantified group holds a quantifier or an alternation";
    if (is_unbounded && ++unbounded > 3) return "more than 3 unbounded quantifiers (*, +, {n,})";
    groups.back().inner = true;
    last = Last::Quantifier;
    return "";
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    std::string why;
    if (c == '\\') {
      if (i + 1 < text.size() && text[i + 1] >= '1' && text[i + 1] <= '9') return "a back-reference";
      ++i;
      last = Last::Atom;
    } else if (c == '[') {
      size_t j = i + 1;
      if (j < text.size() && text[j] == '^') ++j;
      if (j < text.size() && text[j] == ']') ++j;
      while (j < text.size() && text[j] != ']') j += text[j] == '\\' ? 2 : 1;
      i = j;
      last = Last::Atom;
    } else if (c == '(') {
      groups.push_back({});
      if (i + 1 < text.size() && text[i + 1] == '?') ++i;  // (?: (?= (?!
      last = Last::None;
    } else if (c == ')') {
      if (groups.size() > 1) {
        last_group_inner = groups.back().inner;
        groups.pop_back();
        groups.back().inner = groups.back().inner || last_group_inner;
      }
      last = Last::Group;
    } else if (c == '|') {
      groups.back().inner = true;
      last = Last::None;
    } else if (c == '*' || c == '+') {
      why = quantify(true);
    } else if (c == '?') {
      if (last == Last::Quantifier) last = Last::Lazy;
      else why = quantify(false);
    } else if (c == '{' && i + 1 < text.size() && std::isdigit(static_cast<unsigned char>(text[i + 1]))) {
      const size_t close = text.find('}', i);
      if (close == std::string::npos) {
        last = Last::Atom;
        continue;
      }
      const std::string body = text.substr(i + 1, close - i - 1);
      why = quantify(!body.empty() && body.back() == ',');
      i = close;
    } else {
      last = Last::Atom;
    }
    if (!why.empty()) return why;
  }
  return "";
}

Regex Compile(const std::string& text, const std::string& where) {
  if (auto hazard = RegexHazard(text); !hazard.empty())
    throw Error(where + ": regular expression '" + text.substr(0, 200) + (text.size() > 200 ? "..." : "") +
                "' refused: " + hazard + " (it could take exponential time on a parameter name)");
  try {
    return Regex{text, std::regex(text, std::regex::ECMAScript)};
  } catch (const std::regex_error& e) {
    throw Error(where + ": invalid regular expression '" + text + "': " + e.what());
  }
}

std::vector<Regex> StringList(const nlohmann::json& v, const std::string& where) {
  if (!v.is_array()) throw Error(where + ": expected an array of strings, found " + std::string(v.type_name()));
  std::vector<Regex> out;
  for (size_t k = 0; k < v.size(); ++k) {
    if (!v[k].is_string())
      throw Error(where + "[" + std::to_string(k) + "]: expected a string, found " + v[k].type_name());
    out.push_back(Compile(v[k].get<std::string>(), where + "[" + std::to_string(k) + "]"));
  }
  return out;
}

std::string SizeText(const nlohmann::json& v, const std::string& where) {
  if (v.is_number_integer() && v.get<int64_t>() > 0) return std::to_string(v.get<int64_t>());
  if (v.is_string()) {
    static const std::set<std::string> symbols = {"q_proj", "kv_proj", "ffn"};
    if (!symbols.count(v.get<std::string>()))
      throw Error(where + ": unknown size symbol '" + v.get<std::string>() + "' (known: q_proj, kv_proj, ffn)");
    return v.get<std::string>();
  }
  throw Error(where + ": expected a positive integer or a size symbol, found " + v.dump());
}

// A pt::Value (the checkpoint's pickled info) as JSON, for one validation path.
nlohmann::json ToJson(const pt::Value& v, const std::string& where) {
  using K = pt::Value::Kind;
  switch (v.kind) {
    case K::None: return nullptr;
    case K::Bool: return v.b;
    case K::Int: return v.i;
    case K::Float: return v.f;
    case K::Str: return v.s;
    case K::List:
    case K::Tuple: {
      auto a = nlohmann::json::array();
      for (const auto& e : v.items) a.push_back(ToJson(*e, where));
      return a;
    }
    case K::Dict: {
      auto o = nlohmann::json::object();
      for (const auto& it : v.dict.items()) {
        if (it.key->kind != K::Str) throw Error(where + ": non-string key of type " + it.key->TypeName());
        o[it.key->s] = ToJson(*it.value, where + "." + it.key->s);
      }
      return o;
    }
    case K::Object:  // SubparamShape and similar dataclasses: their fields
      if (v.state && v.state->kind == K::Dict) return ToJson(*v.state, where);
      [[fallthrough]];
    default: throw Error(where + ": unexpected " + v.TypeName());
  }
}

}  // namespace

std::string_view PatternName(Pattern p) {
  switch (p) {
    case Pattern::Unique: return "Unique";
    case Pattern::Replicate: return "Replicate";
    case Pattern::Partial: return "Partial";
    case Pattern::ShardV: return "Shard-V";
    case Pattern::ShardH: return "Shard-H";
    case Pattern::ShardNC: return "Shard-NC";
  }
  return "?";
}

bool Regex::Matches(const std::string& name) const {
  return std::regex_search(name, re, std::regex_constants::match_continuous);
}

RuleSet RuleSet::FromJson(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) throw Error(source + ": expected a JSON object of rule lists");
  RuleSet r;
  r.source = source;
  for (const auto& [key, value] : j.items()) {
    std::string where = source + ": '" + key + "'";
    if (key == "$schema") continue;
    if (std::find(ListKeys().begin(), ListKeys().end(), key) != ListKeys().end()) {
      r.lists[key] = StringList(value, where);
    } else if (key == kSubParamsKey) {
      if (!value.is_array()) throw Error(where + ": expected an array of {patterns, shape, partition_dim}");
      for (size_t k = 0; k < value.size(); ++k) {
        std::string w = where + "[" + std::to_string(k) + "]";
        const auto& e = value[k];
        if (!e.is_object() || !e.contains("patterns") || !e.contains("shape") || !e.contains("partition_dim"))
          throw Error(w + ": expected an object with 'patterns', 'shape' and 'partition_dim'");
        SubParamRule rule;
        rule.patterns = StringList(e["patterns"], w + ".patterns");
        if (!e["partition_dim"].is_number_integer()) throw Error(w + ".partition_dim: expected an integer");
        rule.partition_dim = e["partition_dim"].get<int>();
        const auto& shape = e["shape"];
        if (!shape.is_array() || rule.partition_dim < 0 || rule.partition_dim >= static_cast<int>(shape.size()))
          throw Error(w + ".shape: expected an array with an entry at partition_dim " +
                      std::to_string(rule.partition_dim));
        const auto& sizes = shape[rule.partition_dim];
        if (sizes.is_array()) {
          for (size_t s = 0; s < sizes.size(); ++s)
            rule.sizes.push_back(SizeText(sizes[s], w + ".shape[" + std::to_string(rule.partition_dim) + "]"));
        } else {
          // Before universal-checkpoint 0.4 a scalar here is accepted (one or N equal sub-params).
          rule.sizes.push_back(SizeText(sizes, w + ".shape"));
        }
        r.sub_params.push_back(std::move(rule));
      }
    } else if (key == "sub_param_shard_widths") {
      if (!value.is_object()) throw Error(where + ": expected an object pattern -> [[width per TP rank]]");
      for (const auto& [pattern, widths] : value.items()) {
        // Each element checked before it is read: nlohmann converts 1e300 to an integer with undefined behaviour.
        const std::string bad = where + "['" + pattern + "']: expected a list (per sub-parameter) of lists of integers";
        if (!widths.is_array()) throw Error(bad);
        auto& list = r.shard_widths[pattern];
        for (const auto& per_sub : widths) {
          if (!per_sub.is_array()) throw Error(bad);
          std::vector<int64_t>& row = list.emplace_back();
          for (const auto& w : per_sub) {
            if (!w.is_number_integer()) throw Error(bad);
            row.push_back(w.get<int64_t>());
          }
        }
      }
    } else if (key == "universal_checkpoint_version") {
      if (!value.is_number()) throw Error(where + ": expected a number");
      r.version = value.get<double>();
    } else if (key == "original_vocab_size" || key == "padded_vocab_size") {
      if (!value.is_number_integer()) throw Error(where + ": expected an integer");
      (key == "original_vocab_size" ? r.original_vocab_size : r.padded_vocab_size) = value.get<int64_t>();
    } else if (key == "ucp_family") {
      if (!value.is_object() || !value.contains("name") || !value["name"].is_string())
        throw Error(where + ": expected an object with a string 'name'");
      r.family = value["name"].get<std::string>();
      r.description = value.value("description", "");
    } else {
      throw Error(where + ": unknown key (see schemas/patterns.schema.json)");
    }
  }
  return r;
}

RuleSet RuleSet::FromFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open pattern file");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw Error(path + ": not valid JSON: " + e.what());
  }
  return FromJson(j, path);
}

RuleSet RuleSet::FromCheckpointInfo(const pt::Value& info) {
  const std::string source = "checkpoint universal_checkpoint_info";
  nlohmann::json j = ToJson(info, source);
  // Keys DeepSpeed versions add that carry no pattern (AutoTP metadata and the like) are kept out.
  nlohmann::json known = nlohmann::json::object();
  for (const auto& [key, value] : j.items()) {
    bool listed = std::find(ListKeys().begin(), ListKeys().end(), key) != ListKeys().end();
    if (listed || key == kSubParamsKey || key == "sub_param_shard_widths" || key == "universal_checkpoint_version" ||
        key == "original_vocab_size" || key == "padded_vocab_size")
      known[key] = value;
  }
  return FromJson(known, source);
}

size_t RuleSet::RuleCount() const {
  size_t n = sub_params.size();
  for (const auto& [k, v] : lists) n += v.size();
  return n;
}

namespace {
const Regex* FirstMatch(const RuleSet& rules, const char* key, const std::string& name) {
  auto it = rules.lists.find(key);
  if (it == rules.lists.end()) return nullptr;
  for (const auto& re : it->second)
    if (re.Matches(name)) return &re;
  return nullptr;
}
}  // namespace

std::optional<Match> Classify(const RuleSet& rules, const std::string& name) {
  std::optional<Match> found;
  auto consider = [&](const char* key, Pattern p, const std::string& rule, int cat_dim) {
    if (found) {
      found->also_matched.push_back(key);
      return;
    }
    found = Match{p, key, rule, rules.source, nullptr, 0, 0, {}};
    found->cat_dim = cat_dim;
  };
  if (auto* re = FirstMatch(rules, kReplicateKey, name)) consider(kReplicateKey, Pattern::Replicate, re->text, 0);
  if (auto* re = FirstMatch(rules, kAverageKey, name)) consider(kAverageKey, Pattern::Partial, re->text, 0);
  if (auto* re = FirstMatch(rules, kTwoSubParamsKey, name)) {
    bool first = !found;
    consider(kTwoSubParamsKey, Pattern::ShardNC, re->text, 0);
    if (first) found->n_sub_params = 2;
  }
  for (const auto& rule : rules.sub_params) {
    for (const auto& re : rule.patterns) {
      if (!re.Matches(name)) continue;
      bool first = !found;
      consider(kSubParamsKey, Pattern::ShardNC, re.text, rule.partition_dim);
      if (first) {
        found->sub_params = &rule;
        found->n_sub_params = static_cast<int>(rule.sizes.size());
      }
      break;
    }
  }
  if (auto* re = FirstMatch(rules, kRowParallelKey, name)) consider(kRowParallelKey, Pattern::ShardH, re->text, 1);
  if (auto* re = FirstMatch(rules, kColumnParallelKey, name)) consider(kColumnParallelKey, Pattern::ShardV, re->text, 0);
  return found;
}

bool IsVocab(const RuleSet& rules, const std::string& name) { return FirstMatch(rules, kVocabKey, name) != nullptr; }
bool IsPipelineReplicated(const RuleSet& rules, const std::string& name) {
  return FirstMatch(rules, kPipelineReplicatedKey, name) != nullptr;
}

std::vector<RuleSet> LoadFamilyFiles(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> paths;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".json") paths.push_back(e.path().string());
  if (ec) throw Error(dir + ": cannot list pattern files: " + ec.message());
  std::sort(paths.begin(), paths.end());
  std::vector<RuleSet> out;
  for (const auto& p : paths) out.push_back(RuleSet::FromFile(p));
  return out;
}

std::string DefaultPatternsDir() {
  if (const char* env = std::getenv("UCP_PATTERNS_DIR")) return env;
  if (const char* data = std::getenv("UCP_DATA_DIR")) return std::string(data) + "/patterns";
  namespace fs = std::filesystem;
  // Beside the executable, as `cmake --install` (and the Debian package) lays it out: <prefix>/bin/ucp-*,
  // <prefix>/share/ucp/patterns; wherever the prefix is moved.
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  const fs::path installed = ec ? fs::path() : exe.parent_path().parent_path() / "share" / "ucp" / "patterns";
  if (!installed.empty() && fs::is_directory(installed, ec)) return installed.string();
  // A tool run from its build tree reads the source tree's files.
  const std::string source = std::string(UCP_SOURCE_DIR) + "/patterns";
  return fs::is_directory(source, ec) || installed.empty() ? source : installed.string();
}

}  // namespace ucp::patterns
