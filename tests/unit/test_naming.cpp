// GPTModelPipe <-> GPTModel names and the rewrite of universal_checkpoint_info rules between them.
#include <catch2/catch.hpp>

#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/names.h"
#include "patterns/rules.h"
#include "layout/naming.h"
#include "store/atomic_store.h"

using namespace ucp;
using namespace ucp::reshard;
using pt::Value;

namespace {

pt::ValuePtr StrList(const std::vector<std::string>& items) {
  auto l = Value::Make(Value::Kind::List);
  for (const auto& s : items) l->items.push_back(Value::Str(s));
  return l;
}
std::vector<std::string> Strs(const Value& list) {
  std::vector<std::string> out;
  for (const auto& v : list.AsSequence()) out.push_back(v->AsStr());
  return out;
}

// The parameters of a 3-layer model: (pipe name, plain name).
std::vector<std::pair<std::string, std::string>> Names() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const char* local : {"word_embeddings.weight", "position_embeddings.weight"})
    out.emplace_back(std::string("tied_modules.embed.") + local, std::string("language_model.embedding.") + local);
  for (int i = 0; i < 3; ++i)
    for (const char* local : {"input_layernorm.weight", "self_attention.dense.weight", "mlp.dense_4h_to_h.bias"})
      out.emplace_back(std::to_string(i + 2) + "." + local, "language_model.encoder.layers." + std::to_string(i) + "." + local);
  out.emplace_back("5.weight", "language_model.encoder.final_layernorm.weight");
  out.emplace_back("5.bias", "language_model.encoder.final_layernorm.bias");
  return out;
}

}  // namespace

TEST_CASE("every parameter has one place, named both ways", "[naming]") {
  for (const auto& [pipe, plain] : Names()) {
    LayerPlace a = PlaceOf(pipe, Naming::Pipe, 3), b = PlaceOf(plain, Naming::Plain, 3);
    CHECK(a.spec == b.spec);
    CHECK(a.local == b.local);
    CHECK(NameAt(a, Naming::Plain, 3) == plain);
    CHECK(NameAt(b, Naming::Pipe, 3) == pipe);
  }
  CHECK(PlaceOf("5.weight", Naming::Pipe, 3).spec == 5);
  CHECK(PlaceOf("tied_modules.embed.word_embeddings.weight", Naming::Pipe, 3).embedding());
  // Names outside the model are refused, naming the parameter.
  for (const char* bad : {"6.weight", "1.weight", "0.x", "lm_head.weight", "2."})
    CHECK_THROWS_WITH(PlaceOf(bad, Naming::Pipe, 3), Catch::Contains(bad) && Catch::Contains("GPTModelPipe"));
  for (const char* bad : {"language_model.encoder.layers.3.x", "language_model.encoder.layers.x.y", "language_model.output.weight"})
    CHECK_THROWS_WITH(PlaceOf(bad, Naming::Plain, 3), Catch::Contains(bad) && Catch::Contains("GPTModel"));
}

TEST_CASE("an output layer of its own (Llama-style): placed after the final norm, the embedding untied", "[naming]") {
  // As Megatron-DeepSpeed names them (the real llama_* cases): 3 layers, final norm spec 5, head spec 6.
  const std::vector<std::pair<std::string, std::string>> untied = {
      {"1.word_embeddings.weight", "language_model.embedding.word_embeddings.weight"},
      {"6.lm_head.weight", "language_model.output_layer.weight"},
      {"2.input_layernorm.weight", "language_model.encoder.layers.0.input_layernorm.weight"}};
  std::vector<std::string> pipes;
  for (const auto& [pipe, plain] : untied) {
    pipes.push_back(pipe);
    LayerPlace a = PlaceOf(pipe, Naming::Pipe, 3), b = PlaceOf(plain, Naming::Plain, 3);
    a.untied = b.untied = true;  // the model's, as LoadSource sets it for every parameter
    CHECK(a.spec == b.spec);
    CHECK(a.local == b.local);
    CHECK(NameAt(a, Naming::Plain, 3) == plain);
    CHECK(NameAt(b, Naming::Pipe, 3) == pipe);
    CHECK(UntiedName(pipe) == (a.spec == 1 || a.spec == 6));
  }
  CHECK(PlaceOf("6.lm_head.weight", Naming::Pipe, 3).spec == 6);
  pipes.push_back("5.weight");  // the final norm: the head's spec 6 is not counted as a layer
  CHECK(LayerCountOf(pipes, Naming::Pipe) == 3);
  CHECK_THROWS(PlaceOf("7.lm_head.weight", Naming::Pipe, 3));  // not right after the final norm
  // Megatron-DeepSpeed's own rules for the two, rewritten both ways.
  auto info = Value::Make(Value::Kind::Dict);
  pt::SetItem(*info, "vocabulary_parameter_patterns", StrList({R"(\d+.word_embeddings.weight)", R"(\d+.lm_head.weight)"}));
  auto plain = RenameRules(*info, untied, Naming::Pipe, Naming::Plain, 3, true);
  CHECK(Strs(plain->At("vocabulary_parameter_patterns")) ==
        std::vector<std::string>{"language_model.embedding.word_embeddings.weight", "language_model.output_layer.weight"});
  std::vector<std::pair<std::string, std::string>> back;
  for (const auto& [pipe, plain_name] : untied) back.emplace_back(plain_name, pipe);
  auto pipe = RenameRules(*plain, back, Naming::Plain, Naming::Pipe, 3, true);
  CHECK(Strs(pipe->At("vocabulary_parameter_patterns")) ==
        std::vector<std::string>{R"(\d+.word_embeddings.weight)", R"(\d+.lm_head.weight)"});
}

TEST_CASE("universal_checkpoint_info rules are rewritten and pick the same parameters", "[naming]") {
  auto info = Value::Make(Value::Kind::Dict);
  pt::SetItem(*info, "universal_checkpoint_version", Value::Float(0.4));
  pt::SetItem(*info, "vocabulary_parameter_patterns", StrList({"tied_modules.embed.word_embeddings.weight"}));
  pt::SetItem(*info, "tp_replicated_parameter_patterns",
              StrList({R"(\d+.input_layernorm.weight)", R"(\d+.weight)", R"(\d+\.bias)", R"(\d+.mlp.dense_4h_to_h.bias)"}));
  // Rules without a rewrite of their own: an alternation over layer indices, and one that picks nothing.
  pt::SetItem(*info, "parameter_with_row_parallelism_patterns", StrList({R"((2|4)\.self_attention\.dense\.weight)", "nothing.here"}));
  auto sub = Value::Make(Value::Kind::Dict);
  pt::SetItem(*sub, "patterns", StrList({R"(\d+.self_attention.dense.weight)"}));
  auto subs = Value::Make(Value::Kind::List);
  subs->items.push_back(sub);
  pt::SetItem(*info, "parameter_with_sub_params", subs);
  auto widths = Value::Make(Value::Kind::Dict);
  pt::SetItem(*widths, R"(\d+.self_attention.dense.weight)", pt::IntList({4, 4}));
  pt::SetItem(*info, "sub_param_shard_widths", widths);

  auto plain = RenameRules(*info, Names(), Naming::Pipe, Naming::Plain, 3);
  CHECK(Strs(plain->At("vocabulary_parameter_patterns")) ==
        std::vector<std::string>{"language_model.embedding.word_embeddings.weight"});
  CHECK(Strs(plain->At("tp_replicated_parameter_patterns")) ==
        std::vector<std::string>{R"(language_model.encoder.layers.\d+.input_layernorm.weight)",
                                 "language_model.encoder.final_layernorm.weight", "language_model.encoder.final_layernorm.bias",
                                 R"(language_model.encoder.layers.\d+.mlp.dense_4h_to_h.bias)"});
  CHECK(Strs(plain->At("parameter_with_row_parallelism_patterns")) ==
        std::vector<std::string>{R"(language_model\.encoder\.layers\.0\.self_attention\.dense\.weight)",
                                 R"(language_model\.encoder\.layers\.2\.self_attention\.dense\.weight)", "nothing.here"});
  CHECK(Strs(plain->At("parameter_with_sub_params").AsSequence()[0]->At("patterns")) ==
        std::vector<std::string>{R"(language_model.encoder.layers.\d+.self_attention.dense.weight)"});
  CHECK(plain->At("sub_param_shard_widths").Get(R"(language_model.encoder.layers.\d+.self_attention.dense.weight)"));
  CHECK(plain->At("universal_checkpoint_version").AsFloat() == 0.4);

  // And back: the same rules as before, where a rewrite exists.
  auto swapped = Names();
  for (auto& [a, b] : swapped) std::swap(a, b);
  auto back = RenameRules(*plain, swapped, Naming::Plain, Naming::Pipe, 3);
  CHECK(Strs(back->At("vocabulary_parameter_patterns")) == Strs(info->At("vocabulary_parameter_patterns")));
  CHECK(Strs(back->At("tp_replicated_parameter_patterns")) ==
        std::vector<std::string>{R"(\d+.input_layernorm.weight)", R"(\d+.weight)", R"(\d+.bias)", R"(\d+.mlp.dense_4h_to_h.bias)"});
  CHECK(Strs(back->At("parameter_with_row_parallelism_patterns")) ==
        std::vector<std::string>{R"(2\.self_attention\.dense\.weight)", R"(4\.self_attention\.dense\.weight)", "nothing.here"});
}

TEST_CASE("a rule that is not a regex is refused with its text", "[naming]") {
  auto info = Value::Make(Value::Kind::Dict);
  pt::SetItem(*info, "tp_replicated_parameter_patterns", StrList({"(unclosed"}));
  CHECK_THROWS_WITH(RenameRules(*info, Names(), Naming::Pipe, Naming::Plain, 3), Catch::Contains("(unclosed"));
}

TEST_CASE("rules that could take exponential time are refused, the rules DeepSpeed writes are not", "[naming]") {
  auto rules = [](const std::string& pattern) {
    return patterns::RuleSet::FromJson({{"tp_replicated_parameter_patterns", {pattern}}}, "rules.json");
  };
  for (const std::string& ok : std::vector<std::string>{
           "\\d+.input_layernorm.weight", "language_model.encoder.layers.\\d+.mlp.dense_h_to_4h.weight",
           "(q_proj|k_proj|v_proj).weight", "model.layers.\\d+.(self_attn|mlp).[a-z_]+.weight", "a{2}b?c*?", "(ab)+"})
    CHECK_NOTHROW(rules(ok));
  const std::vector<std::pair<std::string, std::string>> hazards = {
      {"(a+)+b", "a quantified group holds a quantifier"},
      {"(a|aa)*b", "a quantified group holds a quantifier or an alternation"},
      {"((ab)*c)*", "a quantified group holds"},
      {"language_model***.weight", "a quantifier follows a quantifier"},
      {"a+{2,}", "a quantifier follows a quantifier"},
      {"(a)\\1", "a back-reference"},
      {".*.*.*.*x", "more than 3 unbounded quantifiers"},
      {std::string(1025, 'a'), "longer than 1024 bytes"}};
  for (const auto& [pattern, why] : hazards)
    CHECK_THROWS_WITH(rules(pattern), Catch::Contains("rules.json") && Catch::Contains(why));
  // In a checkpoint's universal_checkpoint_info too (a hostile checkpoint's rules).
  auto info = Value::Make(Value::Kind::Dict);
  pt::SetItem(*info, "tp_replicated_parameter_patterns", StrList({"(\\d+)*x"}));
  CHECK_THROWS_WITH(patterns::RuleSet::FromCheckpointInfo(*info), Catch::Contains("exponential time"));
}

TEST_CASE("names read from files stay inside the folder they are joined to", "[naming]") {
  for (const std::string& good : std::vector<std::string>{"global_step12", "2.mlp.dense_4h_to_h.weight", "a..b", ".hidden", std::string(255, 'x')})
    CHECK(IsPlainName(good));
  for (const std::string& bad : std::vector<std::string>{"", ".", "..", "a/b", "/abs", std::string("a\0b", 3), std::string(256, 'x')})
    CHECK_FALSE(IsPlainName(bad));
  for (const std::string& good : std::vector<std::string>{"zero/x.weight/fp32.pt", "mp_rank_00_model_states.pt", "zero/..x/step.pt"})
    CHECK(IsPlainRelativePath(good));
  for (const std::string& bad : std::vector<std::string>{"", "/etc/passwd", "../x", "zero/../../x", "zero//x", "zero/x/", "zero/./x",
                                std::string("zero/a\0b", 9), std::string(4097, 'x')})
    CHECK_FALSE(IsPlainRelativePath(bad));
  CHECK_THROWS_WITH(RequirePlainName("a/b", "the tag"), "the tag 'a/b' holds a '/': it cannot be a file or folder name");
  CHECK_THROWS_WITH(RequirePlainName(std::string("a\0\x7f", 3), "the tag"), Catch::Contains("'a\\x00\\x7f' holds a NUL byte"));
  CHECK_THROWS_WITH(store::ParamRelDir(".."), Catch::Contains("parameter name '..' is '..'"));
  // A manifest's file list: every path a run copies or verifies is refused before it is used.
  const nlohmann::json record = {{"path", "../../outside.pt"}, {"bytes", 1}, {"xxh64", "00"}};
  CHECK_THROWS_WITH(store::FileRecord::FromJson(record),
                    "file path '../../outside.pt' has a component that is '..': it would name a file outside its folder");
  CHECK(store::FileRecord::FromJson({{"path", "zero/x/fp32.pt"}, {"bytes", 1}, {"xxh64", "ff"}}).xxh64 == 0xff);
}

TEST_CASE("an expert parameter's id is found and replaced; other names are no experts", "[naming]") {
  const std::string name = "language_model.encoder.layers.3.mlp.deepspeed_moe.experts.deepspeed_experts.12.dense_h_to_4h.weight";
  auto e = ExpertOf(name);
  REQUIRE(e);
  CHECK(e->id == 12);
  CHECK(e->prefix == "language_model.encoder.layers.3.mlp.deepspeed_moe.experts.deepspeed_experts.");
  CHECK(e->rest == ".dense_h_to_4h.weight");
  CHECK(e->With(0) == "language_model.encoder.layers.3.mlp.deepspeed_moe.experts.deepspeed_experts.0.dense_h_to_4h.weight");
  CHECK(e->With(12) == name);
  for (const char* other : {"language_model.encoder.layers.3.mlp.deepspeed_moe.gate.wg.weight",
                            "language_model.encoder.layers.3.mlp.dense_h_to_4h.weight",
                            "x.deepspeed_experts.1a.weight", "x.deepspeed_experts..weight", "x.deepspeed_experts.3"})
    CHECK_FALSE(ExpertOf(other));
}

TEST_CASE("DeepSpeed's expert-parallel groups: runs of ep consecutive global ranks, across TP ranks", "[naming]") {
  // The real tp=2 ep=2 dp=2 checkpoint (tests/data/real-moe-tp): global rank = dp_rank * 2 + tp_rank;
  // experts of ep rank 0 at TP rank 0, of ep rank 1 at TP rank 1; each expert group partitioned over
  // the two ranks of the same remainder.
  const ExpertGroups a{2, 2, 2};
  CHECK(a.World() == 4);
  CHECK(a.Partitions() == 2);
  CHECK(a.EpRank(0, 1) == 1);
  CHECK(a.EpRank(1, 0) == 0);
  CHECK(a.Partition(1, 1) == 1);  // global rank 3: ep rank 1, its second partition
  CHECK(a.SaverTp(0) == 0);
  CHECK(a.SaverTp(1) == 1);
  CHECK(a.AtTp(0, 0));
  CHECK_FALSE(a.AtTp(0, 1));
  // ep=4 over tp=2 dp=2: one rank per expert group; ep ranks 0 and 2 at TP rank 0, 1 and 3 at TP rank 1.
  const ExpertGroups b{2, 2, 4};
  CHECK(b.Partitions() == 1);
  CHECK(b.EpRank(1, 0) == 2);
  CHECK(b.Partition(1, 1) == 0);
  CHECK(b.SaverTp(2) == 0);
  CHECK(b.SaverTp(3) == 1);
  CHECK(b.AtTp(0, 2));
  CHECK_FALSE(b.AtTp(0, 3));
  // tp=1: DP rank d is ep rank d % ep, partition d / ep.
  const ExpertGroups c{4, 1, 2};
  CHECK(c.EpRank(3, 0) == 1);
  CHECK(c.Partition(3, 0) == 1);
  CHECK(c.Partitions() == 2);
}
