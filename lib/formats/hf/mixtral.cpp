#include "formats/hf/mixtral.h"

#include <map>
#include <regex>
#include <set>

#include "core/error.h"

namespace ucp::formats::hf {

namespace {

// Per layer (GPTModel's or GPTModelPipe's index): whether it has a gate, a dense MLP, and its experts.
struct LayerMlp {
  bool gate = false, dense = false;
  std::set<int64_t> experts;
  int64_t gate_rows = 0;
};
std::map<int64_t, LayerMlp> MlpsOf(const ModelView& v) {
  static const std::regex layer(R"(^(?:language_model\.encoder\.layers\.|)(\d+)\.(.+)$)"),
      expert(R"(^mlp\.deepspeed_moe\.experts\.deepspeed_experts\.(\d+)\..+$)");
  std::map<int64_t, LayerMlp> out;
  std::smatch m, e;
  for (const auto& [name, shape] : v.params) {
    if (!std::regex_match(name, m, layer) || m[1].length() > 8) continue;
    const std::string key = m[2];
    LayerMlp& l = out[std::stoll(m[1])];
    if (key == "mlp.deepspeed_moe.gate.wg.weight") l.gate = true, l.gate_rows = shape.empty() ? 0 : shape[0];
    else if (key.starts_with("mlp.dense_h_to_4h.") || key.starts_with("mlp.dense_4h_to_h.")) l.dense = true;
    else if (std::regex_match(key, e, expert) && e[1].length() < 9) l.experts.insert(std::stoll(e[1]));
  }
  for (auto it = out.begin(); it != out.end();)  // keys of no layer's MLP (the pipe's embedding, norm, head)
    it = it->second.gate || it->second.dense || !it->second.experts.empty() ? std::next(it) : out.erase(it);
  return out;
}

}  // namespace

void MixtralDifferences(const ModelView& v, const Facts& f, std::vector<std::string>& differs, std::vector<std::string>& missing) {
  std::string dense;
  for (const auto& [i, l] : MlpsOf(v))
    if (l.dense || !l.gate) dense += (dense.empty() ? "" : ", ") + std::to_string(i);
  if (!dense.empty())
    differs.push_back("dense MLP layers between the Mixture-of-Experts ones (layer index " + dense +
                      "; MixtralForCausalLM's every layer is a sparse MoE block)");
  if (auto k = f.Int("topk")) {
    if (*k == 1)
      differs.push_back("top-1 gating, topk 1 (DeepSpeed weighs the one expert by its softmax probability; Mixtral "
                        "renormalises the chosen experts' weights to sum to 1)");
    else if (*k != 2)
      differs.push_back("topk " + std::to_string(*k) + " (written for DeepSpeed's top-2 gate, which computes Mixtral's router)");
  } else {
    missing.push_back("topk");
  }
  if (auto drop = f.Flag("moe_token_dropping"); !drop) missing.push_back("moe_token_dropping");
  else if (*drop)
    differs.push_back("moe_token_dropping (DeepSpeed drops the tokens past an expert's capacity; Mixtral sends every token "
                      "to its experts): trained with --disable-moe-token-dropping it is Mixtral's router");
  if (auto sampled = f.Flag("moe_top2_2nd_expert_sampling"); !sampled) missing.push_back("moe_top2_2nd_expert_sampling");
  else if (*sampled)
    differs.push_back("moe_top2_2nd_expert_sampling (DeepSpeed picks the second expert with Gumbel noise, in evaluation "
                      "too; Mixtral takes the two largest): --disable-moe-top2-2nd-expert-sampling");
  static const std::regex bias(R"(.*(query_key_value|self_attention\.dense|dense_h_to_4h|dense_4h_to_h)\.bias$)");
  for (const auto& p : v.params)
    if (std::regex_match(p.first, bias)) {
      differs.push_back("biases on linear layers, '" + p.first + "' (MixtralForCausalLM has none)");
      break;
    }
  if (f.Str("mlp_type") == "residual") differs.push_back("mlp_type 'residual' (PR-MoE: a dense MLP beside the experts)");
  if (const pt::Value* a = v.arg ? v.arg("enable_expert_tensor_parallelism") : nullptr; a && a->kind == pt::Value::Kind::Bool && a->b)
    differs.push_back("enable_expert_tensor_parallelism (experts split by TP: the rows of their fused [gate; up] are not "
                      "recorded in the checkpoint)");
  if (f.Flag("use_tutel").value_or(false)) differs.push_back("use_tutel (Tutel's MoE kernels)");
}

void MoeSizesOf(const ModelView& v, const Facts& f, LlamaFacts& m) {
  std::set<int64_t> counts;
  for (const auto& [i, l] : MlpsOf(v)) counts.insert(l.gate_rows);
  if (counts.size() != 1 || *counts.begin() <= 0)
    throw Error(v.dir + ": the MoE layers' gates (mlp.deepspeed_moe.gate.wg.weight) do not agree on one expert count");
  m.experts = *counts.begin();
  m.experts_per_token = f.Int("topk").value_or(2);
}

}  // namespace ucp::formats::hf
