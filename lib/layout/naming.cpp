#include "layout/naming.h"

#include <algorithm>
#include <cctype>
#include <regex>

#include "core/error.h"
#include "patterns/rules.h"

namespace ucp::reshard {
using pt::Value;
using pt::ValuePtr;

namespace {

constexpr const char* kPipeEmbedding = "tied_modules.embed.";
constexpr const char* kPlainEmbedding = "language_model.embedding.";
constexpr const char* kPlainLayers = "language_model.encoder.layers.";
constexpr const char* kPlainNorm = "language_model.encoder.final_layernorm.";
constexpr const char* kPlainOutput = "language_model.output_layer.";
constexpr const char* kHead = "lm_head.";          // the output layer's keys inside its spec
constexpr const char* kWordEmbeddings = "word_embeddings.";

bool StartsWith(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// "12.rest" -> (12, "rest"); -1 when `s` does not start with digits and a dot.
int LeadingNumber(const std::string& s, std::string* rest) {
  size_t k = 0;
  while (k < s.size() && k < 9 && std::isdigit(static_cast<unsigned char>(s[k]))) ++k;
  if (k == 0 || k >= s.size() || s[k] != '.') return -1;
  *rest = s.substr(k + 1);
  return std::stoi(s.substr(0, k));
}

std::string Escaped(const std::string& name) {
  std::string out;
  for (char c : name) {
    if (std::string_view(".^$|?*+()[]{}\\").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

// The same rule over the other naming, for the forms Megatron-DeepSpeed writes (a layer wildcard
// "\d+.", the embedding prefix, the final norm as "\d+.weight"); anything else is kept as it is.
std::string RewriteRule(const std::string& rule, Naming to, int layers, bool untied) {
  const std::string any = "\\d+.", any_escaped = "\\d+\\.";
  std::string rest;
  if (to == Naming::Plain) {
    if (StartsWith(rule, kPipeEmbedding)) return kPlainEmbedding + rule.substr(std::string(kPipeEmbedding).size());
    for (const std::string& wild : {any, any_escaped})
      if (StartsWith(rule, wild)) {
        rest = rule.substr(wild.size());
        // An untied model's embedding and output layer, as Megatron-DeepSpeed writes their rules.
        if (StartsWith(rest, kWordEmbeddings)) return kPlainEmbedding + rest;
        if (StartsWith(rest, kHead)) return kPlainOutput + rest.substr(std::string(kHead).size());
        // "\d+.weight": only the final norm has a parameter directly under its spec index.
        return (rest.find('.') == std::string::npos ? kPlainNorm : kPlainLayers + any) + rest;
      }
    if (int spec = LeadingNumber(rule, &rest); spec >= 0) {
      if (spec == layers + 2) return kPlainNorm + rest;
      if (spec >= 2 && spec < layers + 2) return kPlainLayers + std::to_string(spec - 2) + "." + rest;
    }
    return rule;
  }
  if (StartsWith(rule, kPlainEmbedding))
    return (untied ? any : std::string(kPipeEmbedding)) + rule.substr(std::string(kPlainEmbedding).size());
  if (StartsWith(rule, kPlainOutput)) return any + kHead + rule.substr(std::string(kPlainOutput).size());
  if (StartsWith(rule, kPlainNorm)) return any + rule.substr(std::string(kPlainNorm).size());
  if (StartsWith(rule, kPlainLayers)) {
    std::string tail = rule.substr(std::string(kPlainLayers).size());
    for (const std::string& wild : {any, any_escaped})
      if (StartsWith(tail, wild)) return any + tail.substr(wild.size());
    if (int i = LeadingNumber(tail, &rest); i >= 0) return std::to_string(i + 2) + "." + rest;
  }
  return rule;
}

patterns::Regex Compile(const std::string& text) {
  try {
    return {text, std::regex(text)};
  } catch (const std::regex_error& e) {
    throw Error("universal_checkpoint_info rule '" + text + "' is not a valid regex: " + e.what());
  }
}

class Renamer {
 public:
  Renamer(const std::vector<std::pair<std::string, std::string>>& names, Naming to, int layers, bool untied)
      : names_(names), to_(to), layers_(layers), untied_(untied) {}

  // The rules that replace `rule`: its rewrite, or the escaped names it matched.
  std::vector<std::string> Rename(const std::string& rule) const {
    const patterns::Regex before = Compile(rule);
    const std::string rewritten = RewriteRule(rule, to_, layers_, untied_);
    const patterns::Regex after = Compile(rewritten);
    bool same = true;
    std::vector<std::string> matched;
    for (const auto& [from, to] : names_) {
      const bool m = before.Matches(from);
      if (m) matched.push_back(Escaped(to));
      same = same && m == after.Matches(to);
    }
    // A rule that picked nothing says nothing of this model (GPTModel writes GPTModelPipe's
    // rules, for one): its rewrite stands.
    if (same || matched.empty()) return {rewritten};
    return matched;
  }

  ValuePtr RenameList(const Value& list) const {
    auto out = Value::Make(list.kind);
    for (const auto& item : list.AsSequence())
      for (auto& r : Rename(item->AsStr())) out->items.push_back(Value::Str(r));
    return out;
  }

 private:
  const std::vector<std::pair<std::string, std::string>>& names_;
  Naming to_;
  int layers_;
  bool untied_;
};

bool IsRuleList(const std::string& key) {
  return key.size() > 9 && (key.compare(key.size() - 9, 9, "_patterns") == 0 || StartsWith(key, "parameter_with_2_sub_params"));
}

}  // namespace

const char* NamingName(Naming n) { return n == Naming::Pipe ? "pipe" : n == Naming::Plain ? "plain" : "module"; }

bool GptModelNames(const std::vector<std::string>& names) {
  return std::any_of(names.begin(), names.end(), [](const std::string& n) { return StartsWith(n, "language_model."); });
}

LayerPlace PlaceOf(const std::string& name, Naming n, int layers) {
  LayerPlace p;
  std::string rest;
  if (n == Naming::Module) {  // no layers known: the name is the place
    p.spec = 0, p.local = name;
    return p;
  }
  if (n == Naming::Pipe) {
    if (StartsWith(name, kPipeEmbedding)) {
      p.spec = 1, p.local = name.substr(std::string(kPipeEmbedding).size());
    } else if (int spec = LeadingNumber(name, &rest); spec >= 2 && spec <= layers + 2) {
      p.spec = spec, p.local = rest;
    } else if (spec == 1 && StartsWith(rest, kWordEmbeddings)) {
      p.spec = 1, p.local = rest, p.untied = true;
    } else if (spec == layers + 3 && StartsWith(rest, kHead)) {
      p.spec = spec, p.local = rest, p.untied = true;
    }
  } else {
    if (StartsWith(name, kPlainEmbedding)) {
      p.spec = 1, p.local = name.substr(std::string(kPlainEmbedding).size());
    } else if (StartsWith(name, kPlainOutput)) {
      p.spec = layers + 3, p.local = kHead + name.substr(std::string(kPlainOutput).size()), p.untied = true;
    } else if (StartsWith(name, kPlainNorm)) {
      p.spec = layers + 2, p.local = name.substr(std::string(kPlainNorm).size());
    } else if (StartsWith(name, kPlainLayers)) {
      if (int i = LeadingNumber(name.substr(std::string(kPlainLayers).size()), &rest); i >= 0 && i < layers)
        p.spec = i + 2, p.local = rest;
    }
  }
  if (p.spec < 0 || p.local.empty())
    throw Error("parameter '" + name + "' is not named as " + (n == Naming::Pipe ? "GPTModelPipe" : "GPTModel") +
                " names the parameters of a " + std::to_string(layers) + "-layer GPT");
  return p;
}

std::string NameAt(const LayerPlace& p, Naming n, int layers) {
  if (n == Naming::Module) return p.local;
  if (n == Naming::Pipe) return (p.embedding() && !p.untied ? std::string(kPipeEmbedding) : std::to_string(p.spec) + ".") + p.local;
  if (p.embedding()) return kPlainEmbedding + p.local;
  if (p.spec == layers + 3) return kPlainOutput + p.local.substr(std::string(kHead).size());
  if (p.spec == layers + 2) return kPlainNorm + p.local;
  return kPlainLayers + std::to_string(p.spec - 2) + "." + p.local;
}

ValuePtr RenameRules(const Value& info, const std::vector<std::pair<std::string, std::string>>& names, Naming from,
                     Naming to, int layers, bool untied) {
  auto out = std::make_shared<Value>(info);
  if (from == to || info.kind != Value::Kind::Dict) return out;
  const Renamer renamer(names, to, layers, untied);
  out->dict = pt::Dict();
  for (const auto& item : info.dict.items()) {
    const std::string key = item.key->kind == Value::Kind::Str ? item.key->s : "";
    const Value& v = *item.value;
    ValuePtr nv = item.value;
    if (IsRuleList(key) && v.IsSequence()) {
      nv = renamer.RenameList(v);
    } else if (key == patterns::kSubParamsKey && v.IsSequence()) {
      nv = Value::Make(v.kind);
      for (const auto& e : v.AsSequence()) {
        auto ne = std::make_shared<Value>(*e);
        if (e->kind == Value::Kind::Dict && e->Get("patterns")) pt::SetItem(*ne, "patterns", renamer.RenameList(*e->Get("patterns")));
        nv->items.push_back(ne);
      }
    } else if (key == "sub_param_shard_widths" && v.kind == Value::Kind::Dict) {
      nv = std::make_shared<Value>(v);
      nv->dict = pt::Dict();
      for (const auto& w : v.dict.items())
        for (auto& r : renamer.Rename(w.key->AsStr())) nv->dict.Set(Value::Str(r), w.value);
    }
    out->dict.Set(item.key, nv);
  }
  return out;
}

std::optional<ExpertName> ExpertOf(const std::string& name) {
  static const std::string tag = ".deepspeed_experts.";
  const size_t at = name.find(tag);
  if (at == std::string::npos) return std::nullopt;
  const size_t b = at + tag.size(), e = name.find('.', b);
  if (e == std::string::npos || e == b || e - b > 6) return std::nullopt;
  for (size_t k = b; k < e; ++k)
    if (!std::isdigit(static_cast<unsigned char>(name[k]))) return std::nullopt;
  return ExpertName{name.substr(0, b), std::stoi(name.substr(b, e - b)), name.substr(e)};
}

bool UntiedName(const std::string& name) {
  static const std::regex untied(R"(^(language_model\.output_layer\.|\d+\.lm_head\.|1\.word_embeddings\.).*)");
  return std::regex_match(name, untied);
}

int LayerCountOf(const std::vector<std::string>& names, Naming n) {
  if (n == Naming::Module) return 0;
  const std::regex plain(R"(language_model\.encoder\.layers\.(\d+)\..+)"), pipe(R"((\d+)\..+)");
  int highest = -1;
  for (const auto& name : names) {
    std::smatch m;
    if (n == Naming::Pipe && UntiedName(name)) continue;  // the untied head's spec is past the final norm
    if (std::regex_match(name, m, n == Naming::Plain ? plain : pipe)) highest = std::max(highest, std::stoi(m[1].str()));
  }
  if (n == Naming::Plain) return highest + 1;
  if (highest < 3)
    throw Error("the parameter names hold no GPTModelPipe transformer layer (<spec>.<name> with spec 2 or more, and "
                "the final norm after them)");
  return highest - 2;
}

}  // namespace ucp::reshard
