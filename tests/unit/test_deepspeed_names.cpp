// DeepSpeed's file names (source/deepspeed_names.h), both ways, against the names real DeepSpeed
// wrote: every shard file of the real cases (UCP_REAL_DEEPSPEED, ../shared/real-deepspeed/cases)
// parses, and formatting what it says gives the name back.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>

#include "formats/deepspeed/names.h"

using namespace ucp::deepspeed;
namespace fs = std::filesystem;

TEST_CASE("deepspeed names: every shard file real DeepSpeed wrote parses and formats back", "[deepspeed_names]") {
  const char* cases = std::getenv("UCP_REAL_DEEPSPEED");
  REQUIRE(cases);
  REQUIRE(fs::is_directory(cases));
  std::set<FileKind> kinds;
  std::set<std::string> prefixes;
  int files = 0;
  for (const auto& c : fs::directory_iterator(cases)) {
    if (!fs::is_directory(c.path() / "ckpt")) continue;
    for (const auto& step : fs::directory_iterator(c.path() / "ckpt")) {
      const std::string tag = step.path().filename().string();
      if (!step.is_directory() || tag.find("universal") != std::string::npos) continue;
      for (const auto& f : fs::directory_iterator(step.path())) {
        const std::string name = f.path().filename().string();
        INFO(f.path().string());
        const auto parsed = ParseFileName(name);
        REQUIRE(parsed);
        CHECK(FormatFileName(*parsed) == name);
        CHECK(IsMoeFileName(name) == (parsed->kind == FileKind::ExpertStates || parsed->kind == FileKind::ExpertOptimizer));
        kinds.insert(parsed->kind), prefixes.insert(parsed->prefix), ++files;
      }
    }
  }
  CHECK(files > 0);
  // The real cases hold every kind (layer files of PP=2, ZeRO-3's per-DP model states) and both
  // optimizer prefixes (the BF16 optimizer's and none).
  for (FileKind k : {FileKind::ModelStates, FileKind::LayerStates, FileKind::ZeroOptimizer, FileKind::Zero3ModelStates})
    CHECK(kinds.count(k) == 1);
  CHECK(prefixes.count("") == 1);
  CHECK(prefixes.count("bf16_") == 1);
}

TEST_CASE("deepspeed names: the numbers in a name, and names that are not a dense engine's", "[deepspeed_names]") {
  auto f = ParseFileName("bf16_zero_pp_rank_3_mp_rank_07_optim_states.pt");
  REQUIRE(f);
  CHECK(f->kind == FileKind::ZeroOptimizer);
  CHECK(f->prefix == "bf16_");
  CHECK(f->dp == 3);
  CHECK(f->mp == 7);
  f = ParseFileName("layer_12-model_01-model_states.pt");
  REQUIRE(f);
  CHECK(f->kind == FileKind::LayerStates);
  CHECK(f->layer == 12);
  CHECK(f->tp == 1);
  f = ParseFileName("layer_04-model_states.pt");
  REQUIRE(f);
  CHECK(!f->tp_known);
  CHECK(FormatFileName(*f) == "layer_04-model_states.pt");
  f = ParseFileName("zero_pp_rank_10_mp_rank_02_model_states.pt");
  REQUIRE(f);
  CHECK(f->kind == FileKind::Zero3ModelStates);
  CHECK(f->dp == 10);
  CHECK(f->mp == 2);
  CHECK(ModelStatesFileName(0) == "mp_rank_00_model_states.pt");
  CHECK(ModelStatesFileName(123) == "mp_rank_123_model_states.pt");
  CHECK(OptimStatesFileName("", 0, 1) == "zero_pp_rank_0_mp_rank_01_optim_states.pt");
  for (const std::string moe : {"layer_3_expert_5_mp_rank_00_model_states.pt", "expp_rank_1_mp_rank_02_optim_states.pt"}) {
    CHECK(IsMoeFileName(moe));
    f = ParseFileName(moe);
    REQUIRE(f);
    CHECK(FormatFileName(*f) == moe);
  }
  f = ParseFileName("layer_3_expert_5_mp_rank_01_model_states.pt");
  REQUIRE(f);
  CHECK((f->kind == FileKind::ExpertStates && f->layer == 3 && f->expert == 5 && f->mp == 1));
  f = ParseFileName("expp_rank_1_mp_rank_02_optim_states.pt");
  REQUIRE(f);
  CHECK((f->kind == FileKind::ExpertOptimizer && f->dp == 1 && f->mp == 2));
  CHECK(!ParseFileName("mp_rank_00_model_states.pt.tmp"));
  CHECK(!ParseFileName("optimizer_state.pt"));
}
