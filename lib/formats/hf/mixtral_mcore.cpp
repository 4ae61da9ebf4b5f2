#include "formats/hf/mixtral_mcore.h"

#include "core/error.h"
#include "source/source_index.h"

namespace ucp::formats::hf {

namespace {

constexpr const char* kRouter = "decoder.layers.mlp.router.weight";

const std::vector<int64_t>* RouterShape(const ModelView& v) {
  for (const auto& [name, shape] : v.params)
    if (name == kRouter) return &shape;
  return nullptr;
}

}  // namespace

bool McoreMoe(const ModelView& v) { return RouterShape(v) != nullptr; }

void McoreMixtralDifferences(const ModelView& v, std::vector<std::string>& differs) {
  auto arg = [&](const char* key) { return v.arg ? v.arg(key) : nullptr; };
  const std::vector<int64_t>& router = *RouterShape(v);
  if (router.size() != 3) {
    differs.push_back(std::string(kRouter) + " of shape " + pt::ShapeString(router) + " (Megatron-Core stacks [layers, experts, hidden])");
    return;
  }
  if (const pt::Value* n = arg("num_layers"); n && n->kind == pt::Value::Kind::Int && n->i != router[0])
    differs.push_back("a router in " + std::to_string(router[0]) + " of the " + std::to_string(n->i) + " layers (dense MLP layers between "
                      "the Mixture-of-Experts ones; MixtralForCausalLM's every layer is a sparse MoE block)");
  if (const pt::Value* f = arg("moe_layer_freq"); f && !(f->kind == pt::Value::Kind::Int && f->i == 1))
    differs.push_back("moe_layer_freq other than 1 (dense MLP layers between the Mixture-of-Experts ones)");
  if (const pt::Value* s = arg("moe_router_score_function"); s && !(s->kind == pt::Value::Kind::Str && s->s == "softmax"))
    differs.push_back("moe_router_score_function '" + (s->kind == pt::Value::Kind::Str ? s->s : s->TypeName()) +
                      "' (Mixtral's router scores with softmax)");
  static const std::pair<const char*, const char*> kRouting[] = {
      {"moe_router_pre_softmax", "softmax over every expert before the top k, not renormalised (Mixtral renormalises over the chosen)"},
      {"moe_router_topk_scaling_factor", "the chosen experts' weights scaled"},
      {"moe_expert_capacity_factor", "expert capacity: tokens past it dropped (Mixtral sends every token to its experts)"},
      {"moe_router_enable_expert_bias", "a per-expert bias in the top-k choice"},
      {"moe_router_num_groups", "group-limited routing"},
      {"moe_router_group_topk", "group-limited routing"},
      {"moe_shared_expert_intermediate_size", "shared experts beside the routed ones"},
      {"moe_use_upcycling", "upcycled experts"},
      {"moe_grouped_gemm", "grouped-GEMM experts (their weights' layout is not read here)"},
  };
  for (const auto& [key, meaning] : kRouting)
    if (source::ArgIsSet(arg(key))) differs.push_back(std::string(key) + " set in the checkpoint's args (" + meaning + ")");
  if (const pt::Value* n = arg("num_experts"); n && n->kind == pt::Value::Kind::Int && n->i != router[1])
    differs.push_back("num_experts " + std::to_string(n->i) + " in the args, the router has " + std::to_string(router[1]) + " rows");
}

void McoreMoeSizesOf(const ModelView& v, LlamaFacts& m) {
  const std::vector<int64_t>& router = *RouterShape(v);
  if (router.size() != 3 || router[1] < 1) throw Error(v.dir + ": " + kRouter + " of shape " + pt::ShapeString(router));
  m.experts = router[1];
  const pt::Value* k = v.arg ? v.arg("moe_router_topk") : nullptr;
  if (!k || k->kind != pt::Value::Kind::Int || k->i < 1 || k->i > m.experts)
    throw Error(v.dir + ": the args (" + v.args_file + ") say no moe_router_topk between 1 and the " + std::to_string(m.experts) +
                " experts: how many experts each token goes to is not known");
  m.experts_per_token = k->i;
  if (const pt::Value* f = v.arg ? v.arg("moe_ffn_hidden_size") : nullptr; f && f->kind == pt::Value::Kind::Int && f->i > 0) m.ffn = f->i;
}

}  // namespace ucp::formats::hf
