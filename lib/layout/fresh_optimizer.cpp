// A weights-only atomic checkpoint's optimizer, made as a DeepSpeed job starting from the weights
// has it: the zero/optimizer_state.pt such a checkpoint lacks, with the param_groups torch's Adam /
// AdamW state_dict lists (from --optimizer-config). The moments (zeros) and the steps (0) are the
// writer's reads (reshard.cpp's ReadLocal, UnitWeights::GroupStep); this file holds the groups.
// The key sets are those of the real cases' files, in the order torch's state_dict has them: the
// DeepSpeed 0.14.5 cases' (../shared/real-deepspeed) and the 0.19.5 cases' (tests/data/real-ds0195,
// torch 2.6), which add `differentiable` and `fused`.
#include <algorithm>
#include <cctype>
#include <set>

#include "core/error.h"
#include "layout/reshard_plan.h"
#include "pt/value.h"

namespace ucp::reshard {
using nlohmann::json;
using pt::SetItem;
using pt::Value;
using pt::ValuePtr;

namespace {

// torch's Adam / AdamW hyper-parameters, from the block's params: torch's defaults for what it
// omits; a key neither torch nor DeepSpeed's Adam takes, or AMSGrad (a state the weights lack), refused.
struct AdamParams {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
};

AdamParams ParamsOf(const json& block, const std::string& what) {
  std::string type = block.value("type", "");
  std::transform(type.begin(), type.end(), type.begin(), [](unsigned char c) { return std::tolower(c); });
  if (type != "adam" && type != "adamw")
    throw Error(what + ": optimizer type '" + block.value("type", "") + "': a fresh optimizer is Adam or AdamW "
                "(whose state the target's files hold: exp_avg, exp_avg_sq, step)");
  AdamParams a;
  if (type == "adamw") a.weight_decay = 1e-2;  // torch.optim.AdamW's default
  const json params = block.value("params", json::object());
  if (!params.is_object()) throw Error(what + ": optimizer.params is not an object");
  // DeepSpeed's own Adam flags choose its implementation, not the state: accepted, not written.
  static const std::set<std::string> ignored = {"torch_adam", "adam_w_mode", "bias_correction", "fused", "foreach"};
  for (const auto& item : params.items()) {
    const std::string& key = item.key();  // (not a structured binding: clang 14 cannot capture one)
    const json& v = item.value();
    auto number = [&]() {
      if (!v.is_number()) throw Error(what + ": optimizer.params." + key + " is not a number");
      return v.get<double>();
    };
    if (key == "lr") a.lr = number();
    else if (key == "eps") a.eps = number();
    else if (key == "weight_decay") a.weight_decay = number();
    else if (key == "betas") {
      if (!v.is_array() || v.size() != 2 || !v[0].is_number() || !v[1].is_number())
        throw Error(what + ": optimizer.params.betas is not a pair of numbers");
      a.beta1 = v[0].get<double>(), a.beta2 = v[1].get<double>();
    } else if (key == "amsgrad") {
      if (!v.is_boolean() || v.get<bool>())
        throw Error(what + ": optimizer.params.amsgrad: AMSGrad keeps max_exp_avg_sq, which a fresh optimizer from "
                    "the weights does not have; give false or leave it out");
    } else if (!ignored.count(key)) {
      throw Error(what + ": optimizer.params." + key + ": not a hyper-parameter of torch's Adam / AdamW (lr, betas, eps, "
                  "weight_decay, amsgrad)");
    }
  }
  return a;
}

ValuePtr GroupOf(const AdamParams& a, double weight_decay, bool torch2_keys, int64_t index) {
  auto g = Value::Make(Value::Kind::Dict);
  SetItem(*g, "weight_decay", Value::Float(weight_decay));
  SetItem(*g, "lr", Value::Float(a.lr));
  auto betas = Value::Make(Value::Kind::Tuple);
  betas->items = {Value::Float(a.beta1), Value::Float(a.beta2)};
  SetItem(*g, "betas", betas);
  SetItem(*g, "eps", Value::Float(a.eps));
  SetItem(*g, "amsgrad", Value::Bool(false));
  SetItem(*g, "foreach", Value::None());
  SetItem(*g, "maximize", Value::Bool(false));
  SetItem(*g, "capturable", Value::Bool(false));
  if (torch2_keys) {
    SetItem(*g, "differentiable", Value::Bool(false));
    SetItem(*g, "fused", Value::None());
  }
  SetItem(*g, "params", pt::IntList({index}));
  return g;
}

}  // namespace

json OptimizerBlockOf(const json& config, const std::string& what) {
  if (!config.is_object()) throw Error(what + ": not a JSON object");
  if (config.contains("optimizer")) {
    const json& block = config.at("optimizer");
    if (!block.is_object()) throw Error(what + ": \"optimizer\" is not an object");
    return block;
  }
  if (config.contains("type")) return config;
  throw Error(what + ": neither a DeepSpeed config with an \"optimizer\" block nor that block ({\"type\": \"AdamW\", "
              "\"params\": {\"lr\": ..., \"betas\": [...], \"eps\": ..., \"weight_decay\": ...}})");
}

void SettleOptimizer(Source& S, const TargetLayout& T, const json& block, const std::string& config_file) {
  const std::string dir = S.reader ? S.reader->dir() : "the atomic checkpoint";
  if (T.no_optimizer && T.zero_stage == 3)
    throw Error("--no-optimizer with ZeRO-3: ZeRO-3 keeps the weights in the optimizer files (its model-states files "
                "hold placeholders, and DeepSpeed's load_checkpoint reads the weights there even with "
                "load_optimizer_states=False); choose --zero-stage 0, 1 or 2, or a fresh optimizer (--optimizer-config)");
  if (!block.is_null() && !S.weights_only)
    throw Error("--optimizer-config " + config_file + ": " + dir + " holds its optimizer's state, which the target "
                "carries; --optimizer-config makes the optimizer of a weights-only atomic checkpoint");
  if (!S.weights_only) return;
  if (!T.no_optimizer && block.is_null())
    throw Error(dir + ": a weights-only atomic checkpoint (no Adam moments, no step): give --optimizer-config FILE "
                "for a fresh optimizer (moments zero, step 0, the file's lr, betas, eps, weight_decay) or "
                "--no-optimizer for the model's files alone");
  // The release the target's files are for, as the writer decides it (DsVersion: else kDefaultRelease).
  const std::string release = T.ds_version.empty() ? S.manifest["source"].value("ds_version", "") : T.ds_version;
  FreshOptimizer(S, T.no_optimizer ? json() : block, release.empty() ? kDefaultRelease : release, config_file);
}

std::string OptimizerOf(const Source& S, const TargetLayout& T) {
  return T.no_optimizer ? "none" : S.weights_only ? "fresh" : "carried";
}

void FreshOptimizer(Source& S, const json& block, const std::string& release, const std::string& what) {
  auto root = Value::Make(Value::Kind::Dict);
  if (!block.is_null()) {
    const AdamParams a = ParamsOf(block, what);
    int groups = 0;
    for (const Atom& atom : S.atoms) groups = std::max(groups, atom.group + 1);
    std::vector<bool> matrices(static_cast<size_t>(groups), false);  // the group holds a >= 2-D parameter
    for (const Atom& atom : S.atoms) matrices[static_cast<size_t>(atom.group)] = matrices[static_cast<size_t>(atom.group)] || atom.shape.size() >= 2;
    auto list = Value::Make(Value::Kind::List);
    const bool torch2_keys = !release.empty() && !ReleaseBefore(release, 0, 19, 0);
    for (int g = 0; g < groups; ++g) {
      list->items.push_back(GroupOf(a, matrices[static_cast<size_t>(g)] ? a.weight_decay : 0.0, torch2_keys, g));
      // DeepSpeed's expert groups (split_params_into_different_moe_groups_for_optimizer): 'moe' and the
      // expert-parallel group's name, which the writer sets to the target's 'ep_size_<ep>'.
      if (S.moe && static_cast<size_t>(g) < S.expert_group.size() && S.expert_group[static_cast<size_t>(g)]) {
        SetItem(*list->items.back(), "name", Value::Str("ep_size_" + std::to_string(S.ep)));
        SetItem(*list->items.back(), "moe", Value::Bool(true));
      }
    }
    SetItem(*root, "param_groups", list);
  }
  S.optimizer = pt::TorchFile{nullptr, "", root};
}

}  // namespace ucp::reshard
