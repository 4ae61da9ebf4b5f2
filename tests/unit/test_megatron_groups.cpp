// Megatron-Core's param groups, rebuilt as its default rule builds them (source/megatron_groups.h).
#include <catch2/catch.hpp>

#include <string>
#include <utility>
#include <vector>

#include "source/megatron_groups.h"

using namespace ucp;
using pt::Value;

namespace {

// A param group's options as Megatron-Core 0.17.1 saves them (no `params`).
pt::ValuePtr Group(double wd_mult, double lr_mult = 1, bool expert = false, bool decoupled = false, double max_lr = 3e-4) {
  auto g = Value::Make(Value::Kind::Dict);
  pt::SetItem(*g, "wd_mult", Value::Float(wd_mult));
  pt::SetItem(*g, "lr_mult", Value::Float(lr_mult));
  pt::SetItem(*g, "is_expert_parallel", Value::Bool(expert));
  pt::SetItem(*g, "is_decoupled_lr", Value::Bool(decoupled));
  pt::SetItem(*g, "weight_decay", Value::Float(0.01));
  pt::SetItem(*g, "max_lr", Value::Float(max_lr));
  pt::SetItem(*g, "min_lr", Value::Float(3e-5));
  return g;
}

pt::ValuePtr Groups(std::vector<pt::ValuePtr> groups) {
  auto list = Value::Make(Value::Kind::List);
  list->items = std::move(groups);
  return list;
}

const std::vector<std::pair<std::string, std::vector<int64_t>>> kGpt = {
    {"embedding.word_embeddings.weight", {128, 64}},
    {"decoder.layers.self_attention.linear_qkv.weight", {4, 192, 64}},  // stacked: 2-D a layer
    {"decoder.layers.self_attention.linear_qkv.bias", {4, 192}},        // a bias
    {"decoder.layers.self_attention.linear_qkv.layer_norm_weight", {4, 64}},  // 1-D a layer
    {"decoder.layers.self_attention.q_layernorm.weight", {4, 16}},  // a q/k norm: 1-D a layer
    {"decoder.final_layernorm.weight", {64}},
    {"output_layer.weight", {128, 64}},
};

// Megatron-LM's saved args (an argparse.Namespace, read as a dict of its attributes).
pt::ValuePtr Args(std::vector<std::pair<const char*, pt::ValuePtr>> set) {
  auto a = Value::Make(Value::Kind::Dict);
  pt::SetItem(*a, "optimizer", Value::Str("adam"));
  pt::SetItem(*a, "apply_wd_to_qk_layernorm", Value::Bool(false));
  for (auto& [k, v] : set) pt::SetItem(*a, k, v);
  return a;
}

}  // namespace

TEST_CASE("the default pair: biases and one-dimensional parameters in the group of wd_mult 0", "[megatron_groups]") {
  for (bool kept_first : {false, true}) {
    const auto groups = kept_first ? Groups({Group(0), Group(1)}) : Groups({Group(1), Group(0)});
    const auto args = Args({});
    const auto got = source::MegatronGroupsOf(groups.get(), kept_first ? args.get() : nullptr, kGpt);
    const int kept = kept_first ? 0 : 1, decayed = 1 - kept;
    CHECK(got.group_of.at("embedding.word_embeddings.weight") == decayed);
    CHECK(got.group_of.at("decoder.layers.self_attention.linear_qkv.weight") == decayed);
    CHECK(got.group_of.at("decoder.layers.self_attention.linear_qkv.bias") == kept);
    CHECK(got.group_of.at("decoder.layers.self_attention.linear_qkv.layer_norm_weight") == kept);
    CHECK(got.group_of.at("decoder.layers.self_attention.q_layernorm.weight") == kept);
    CHECK(got.group_of.at("decoder.final_layernorm.weight") == kept);
    CHECK(got.group_of.at("output_layer.weight") == decayed);
    CHECK(got.note.find("(4 of 7) in group " + std::to_string(kept)) != std::string::npos);
  }
}

TEST_CASE("apply_wd_to_qk_layernorm: the q and k layernorms decayed, the other norms and biases not", "[megatron_groups]") {
  const auto groups = Groups({Group(1), Group(0)});
  const auto args = Args({{"apply_wd_to_qk_layernorm", Value::Bool(true)}});
  const auto got = source::MegatronGroupsOf(groups.get(), args.get(), kGpt);
  CHECK(got.group_of.at("decoder.layers.self_attention.q_layernorm.weight") == 0);
  CHECK(got.group_of.at("decoder.layers.self_attention.linear_qkv.layer_norm_weight") == 1);
  CHECK(got.group_of.at("decoder.layers.self_attention.linear_qkv.bias") == 1);
  CHECK(got.group_of.at("decoder.final_layernorm.weight") == 1);
  CHECK(got.note.find("apply_wd_to_qk_layernorm") != std::string::npos);
  CHECK(got.note.find("(3 of 7) in group 1") != std::string::npos);
}

TEST_CASE("groups the default rule does not describe: nothing assigned, said", "[megatron_groups]") {
  const std::vector<pt::ValuePtr> cases[] = {
      {Group(1), Group(0), Group(1, 1, true), Group(0, 1, true)},  // Mixture of Experts: expert-parallel groups
      {Group(1), Group(0, 1, false, true)},                        // a decoupled learning rate
      {Group(1), Group(0, 2)},                                     // a scaled learning rate
      {Group(1), Group(1)},                                        // no group of wd_mult 0
      {Group(1), Group(0, 1, false, false, 1e-3)},                 // a learning rate of its own (max_lr)
  };
  for (const auto& c : cases) {
    const auto got = source::MegatronGroupsOf(Groups(c).get(), nullptr, kGpt);
    CHECK(got.group_of.empty());
    CHECK(got.note.find("group 0") != std::string::npos);
    CHECK(got.note.find("refuses") != std::string::npos);
  }
  // The default pair, built by a rule the args name: MuP, Muon, a weight-decay condition not known.
  for (const auto& args : {Args({{"use_mup", Value::Bool(true)}}), Args({{"optimizer", Value::Str("muon")}}),
                           Args({{"no_weight_decay_cond_type", Value::Str("qwen3_next")}})}) {
    const auto got = source::MegatronGroupsOf(Groups({Group(1), Group(0)}).get(), args.get(), kGpt);
    CHECK(got.group_of.empty());
    CHECK(got.note.find("the job's") != std::string::npos);
  }
  CHECK(source::MegatronGroupsOf(Groups({Group(1)}).get(), nullptr, kGpt).group_of.empty());  // one group: all in it
  CHECK(source::MegatronGroupsOf(Groups({Group(1)}).get(), nullptr, kGpt).note.empty());
  CHECK(source::MegatronGroupsOf(nullptr, nullptr, kGpt).group_of.empty());
}
