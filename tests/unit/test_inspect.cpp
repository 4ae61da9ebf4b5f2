// ucp-inspect against the fixture checkpoints: the report must say what the generator wrote
// (fixture.json, made by scripts/make_fixture.py from its own knowledge of the layout).
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "inspect/inspect.h"
#include "patterns/rules.h"
#include "test_support.h"

using namespace ucp;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {
inspect::InspectOptions Options() {
  inspect::InspectOptions o;
  o.patterns_dir = patterns::DefaultPatternsDir();
  return o;
}
}  // namespace

TEST_CASE("inspect: every fixture layout is reported as generated", "[inspect]") {
  fs::path dir = test::WorkDir() / "fixtures";
  REQUIRE(fs::exists(dir));
  int checked = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (!fs::exists(entry.path() / "fixture.json")) continue;
    INFO("fixture " << entry.path().filename());
    json truth = json::parse(test::ReadText(entry.path() / "fixture.json"));
    json r = inspect::InspectReport(entry.path(), Options());
    CHECK(r["errors"] == json::array());
    CHECK(r["problems"] == json::array());
    CHECK(r["ok"] == true);
    CHECK(r["framework"] == truth["framework"]);
    CHECK(r["degrees"]["dp"] == truth["dp"]);
    CHECK(r["degrees"]["tp"] == truth["tp"]);
    CHECK(r["degrees"]["pp"] == truth["pp"]);
    CHECK(r["zero_stage"] == truth["zero_stage"]);
    CHECK(r["dtype"] == truth["dtype"]);
    CHECK(r["optimizer"] == truth["optimizer"]);
    CHECK(r["iteration"] == truth["iteration"]);
    CHECK(r["tag"] == truth["tag"]);
    CHECK(r["naming"] == truth["naming"]);
    CHECK(r["universal_checkpoint_info"]["version"] == truth["universal_checkpoint_version"]);
    std::vector<std::string> files;
    for (const auto& f : r["files"]) files.push_back(f["name"]);
    std::sort(files.begin(), files.end());
    CHECK(json(files) == truth["files"]);
    // Parameters: names, full unpadded shapes and model patterns.
    CHECK(r["params"].size() == truth["params"].size());
    int64_t vocab_rows = 0;
    for (const auto& p : r["params"]) {
      std::string name = p["name"];
      INFO("parameter " << name);
      REQUIRE(truth["params"].contains(name));
      CHECK(p["shape"] == truth["params"][name]["shape"]);
      CHECK(p["model_pattern"] == truth["params"][name]["pattern"]);
      if (truth["tp"] == 1) CHECK((p["pattern"] == "Unique" || p["pattern"] == "Replicate"));
      else CHECK(p["pattern"] == p["model_pattern"]);
      vocab_rows += p["vocab_padding_rows"].get<int64_t>();
    }
    CHECK(vocab_rows == truth["padded_vocab_size"].get<int64_t>() - truth["original_vocab_size"].get<int64_t>());
    ++checked;
  }
  CHECK(checked >= 6);
}

TEST_CASE("inspect: a TP=1 checkpoint gets row-parallel patterns from the model family", "[inspect]") {
  json r = inspect::InspectReport(test::WorkDir() / "fixtures" / "zero1_dp4", Options());
  REQUIRE(r["ok"] == true);
  bool seen = false;
  for (const auto& p : r["params"])
    if (p["name"] == "2.self_attention.dense.weight") {
      CHECK(p["pattern"] == "Unique");
      CHECK(p["model_pattern"] == "Shard-H");
      seen = true;
    }
  CHECK(seen);
}

TEST_CASE("inspect: --params filters, the totals do not", "[inspect]") {
  auto o = Options();
  o.params_regex = "layernorm";
  json r = inspect::InspectReport(test::WorkDir() / "fixtures" / "tp2_dp2", o);
  CHECK(r["params"].size() == 4);
  CHECK(r["totals"]["params"] == 14);
}

TEST_CASE("inspect: pattern files are validated with clear errors", "[inspect]") {
  fs::path bad = test::WorkDir() / "bad_patterns.json";
  std::ofstream(bad) << R"({"tp_replicated_parameter_patterns": ["ok", 3]})";
  CHECK_THROWS_WITH(patterns::RuleSet::FromFile(bad.string()),
                    Catch::Contains("tp_replicated_parameter_patterns") && Catch::Contains("[1]: expected a string"));
  std::ofstream(bad) << R"({"tp_replicated_patterns": []})";
  CHECK_THROWS_WITH(patterns::RuleSet::FromFile(bad.string()), Catch::Contains("unknown key"));
  std::ofstream(bad) << R"({"parameter_with_row_parallelism_patterns": ["(unclosed"]})";
  CHECK_THROWS_WITH(patterns::RuleSet::FromFile(bad.string()), Catch::Contains("invalid regular expression"));
}
