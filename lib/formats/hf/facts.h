// One model fact by Megatron's argument name, from the checkpoint's own args (carried in the atomic
// checkpoint's model-states file) or from --model-config; a value given both ways must agree, a key
// --model-config gives that no class reads is refused (a misspelt key would otherwise be a default).
// Every class of model.h, gpt2.h and mixtral.h reads its facts through this.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/format.h"
#include "formats/hf/model.h"
#include "pt/value.h"

namespace ucp::formats::hf {

// The facts an export reads, by Megatron's argument names, and the JSON type each takes.
enum class Type { Int, Number, Bool, String };
struct Key {
  const char* name;
  Type type;
  const char* meaning;
};
const std::vector<Key>& Keys();
bool OfType(const nlohmann::json& v, Type t);
const char* TypeName(Type t);
// The known key closest to a misspelt one (edit distance at most 3), or "".
std::string Closest(const std::string& key);
// Refuses asking for every fact in `missing` (Megatron's names) at once, with an example of
// --model-config; nothing when it is empty.
void RefuseUnsaid(const std::string& dir, const std::vector<std::string>& missing);

// One model fact by its Megatron name: the checkpoint's args.<key>, or --model-config's; both given
// must agree. nullopt where neither says it.
class Facts {
 public:
  Facts(const ModelView& v, const reshard::ExportOptions& o) : v_(v), o_(o) {
    if (!o.model_config.is_object()) return;
    for (const auto& item : o.model_config.items()) {
      const std::string given = item.key();
      const std::string key = Canonical(given);
      if (key != given && o.model_config.contains(key))
        throw Error(o.model_config_path + ": both " + given + " and " + key + " are given: they name the same fact");
      if (key != given) config_[key] = item.value();
      const nlohmann::json& value = item.value();
      auto k = std::find_if(Keys().begin(), Keys().end(), [&](const Key& x) { return key == x.name; });
      if (k == Keys().end()) {
        const std::string near = Closest(key);
        const std::string known = JoinNames(Keys(), ", ", [](const Key& x) { return std::string(x.name); });
        throw Error(o.model_config_path + ": unknown model fact '" + key + "'" + (near.empty() ? "" : " (did you mean '" + near + "'?)") +
                    "; the facts, by Megatron's argument names (torchtitan's ModelArgs and Hugging Face's config names "
                    "are read too: n_heads, norm_eps, max_seq_len, rms_norm_eps, ...): " + known);
      }
      if (!value.is_null() && !OfType(value, k->type))
        throw Error(o.model_config_path + ": " + key + " is " + value.dump() + ", not " + TypeName(k->type) + " (" + k->meaning + ")");
      Get(k->name);  // a value the checkpoint's args also give must agree: refused now, not after a conversion
    }
  }

  std::optional<nlohmann::json> Get(const char* key) const {
    std::optional<nlohmann::json> from_args;
    if (const pt::Value* v = v_.arg ? v_.arg(key) : nullptr) {
      switch (v->kind) {
        case pt::Value::Kind::Bool: from_args = v->b; break;
        case pt::Value::Kind::Int: from_args = v->i; break;
        case pt::Value::Kind::Float: from_args = v->f; break;
        case pt::Value::Kind::Str: from_args = v->s; break;
        default: break;  // None: not said
      }
    }
    std::optional<nlohmann::json> from_file;
    if (config_.contains(key) && !config_[key].is_null()) from_file = config_[key];
    else if (o_.model_config.is_object() && o_.model_config.contains(key) && !o_.model_config[key].is_null())
      from_file = o_.model_config[key];
    if (from_args && from_file && !Same(*from_args, *from_file))
      throw Error(o_.model_config_path + ": " + key + " is " + from_file->dump() + " but the checkpoint's args say " +
                  from_args->dump() + " (" + v_.args_file + ")");
    return from_args ? from_args : from_file;
  }
  // The facts --model-config gives that the checkpoint's args do not hold ("name value", as given):
  // taken on trust, as nothing in the files records them to compare with. `checked`: facts (by
  // Megatron's names) the caller compared with the weights, not on trust.
  std::vector<std::string> OnTrust(const std::set<std::string>& checked = {}) const {
    std::vector<std::string> trusted;
    if (!o_.model_config.is_object()) return trusted;
    for (const auto& item : o_.model_config.items()) {
      const std::string key = Canonical(item.key());
      const pt::Value* a = v_.arg ? v_.arg(key.c_str()) : nullptr;
      if (!item.value().is_null() && (!a || a->kind == pt::Value::Kind::None) && !checked.count(key))
        trusted.push_back(item.key() + " " + item.value().dump());
    }
    return trusted;
  }
  // Where a fact's value comes from, for messages: the checkpoint's args, or --model-config's file.
  std::string Where(const char* key) const {
    return v_.arg && v_.arg(key) ? v_.args_file + ": args" : o_.model_config_path;
  }
  std::optional<int64_t> Int(const char* key) const {
    auto v = Get(key);
    if (v && !v->is_number_integer()) throw Error(Where(key) + ": " + key + " is " + v->dump() + ", not an integer");
    return v ? std::optional<int64_t>(v->get<int64_t>()) : std::nullopt;
  }
  std::optional<bool> Flag(const char* key) const {
    auto v = Get(key);
    return v && v->is_boolean() ? std::optional<bool>(v->get<bool>()) : std::nullopt;
  }
  std::string Str(const char* key) const {
    auto v = Get(key);
    return v && v->is_string() ? v->get<std::string>() : "";
  }
  double Number(const char* key, double otherwise, std::vector<std::string>& notes, const char* why) const {
    auto v = Get(key);
    if (!v) {
      notes.push_back(std::string(key) + " is not in the checkpoint's args: " + why);
      return otherwise;
    }
    if (!v->is_number()) throw Error(Where(key) + ": " + key + " is " + v->dump() + ", not a number");
    return v->get<double>();
  }

 private:
  static bool Same(const nlohmann::json& a, const nlohmann::json& b) {
    if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
    return a == b;
  }
  // The Megatron name of a fact given by torchtitan's ModelArgs name or Hugging Face's config name;
  // a name of neither is returned as it is.
  static std::string Canonical(const std::string& key) {
    static const std::map<std::string, std::string> aliases = {
        {"dim", "hidden_size"}, {"n_layers", "num_layers"}, {"num_hidden_layers", "num_layers"},
        {"n_heads", "num_attention_heads"}, {"n_kv_heads", "num_key_value_heads"}, {"head_dim", "kv_channels"},
        {"ffn_hidden", "ffn_hidden_size"}, {"intermediate_size", "ffn_hidden_size"},
        {"max_seq_len", "max_position_embeddings"}, {"norm_eps", "layernorm_epsilon"}, {"rms_norm_eps", "layernorm_epsilon"}};
    auto it = aliases.find(key);
    return it == aliases.end() ? key : it->second;
  }
  const ModelView& v_;
  const reshard::ExportOptions& o_;
  nlohmann::json config_ = nlohmann::json::object();  // the facts --model-config gave by another name, under Megatron's
};

}  // namespace ucp::formats::hf
