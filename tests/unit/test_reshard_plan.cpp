// The reshard plan (reshard/reshard_plan.h) on atomic checkpoints converted from generator fixtures,
// checked against what the generator recorded (fixture.json: every parameter's full shape, the
// vocabulary and its padding), for targets of other degrees and ZeRO stages: each atomic tensor's
// TP pieces tile it, ZeRO-3 slices tile each piece, each parameter sits on its stage (the tied
// embedding on the first and the last), every atomic byte is read exactly once, and the units are
// spread over the ranks within one unit of an even load.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "layout/reshard_plan.h"
#include "test_support.h"

using namespace ucp;
using namespace ucp::reshard;

namespace {

std::filesystem::path Atomic(const std::string& fixture) {
  return test::WorkDir() / "atomic" / (fixture + "-np2") / "universal";
}

nlohmann::json FixtureOf(const std::string& fixture) {
  return nlohmann::json::parse(test::ReadText(test::WorkDir() / "fixtures" / fixture / "fixture.json"));
}

TargetLayout Layout(int dp, int tp, int pp, int zero, const std::string& dtype) {
  TargetLayout t;
  t.dp = dp, t.tp = tp, t.pp = pp, t.zero_stage = zero, t.dtype = dtype;
  return t;
}

int64_t Numel(const std::vector<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}

// Every property the header promises, for one target on `ranks` ranks.
void CheckPlan(const Source& S, const nlohmann::json& fixture, const TargetLayout& layout, int ranks) {
  const TargetLayout T = ResolveModel(S, layout);
  INFO("target " << T.Describe() << " on " << ranks << " ranks");
  const Plan P = MakePlan(S, T, ranks, int64_t{256} << 20);

  // Every atomic byte read once: the units' own reads and the shared pieces' add up to 3 fp32
  // states of every parameter the generator made, at its full (unpadded) shape.
  int64_t truth = 0;
  for (const auto& [name, p] : fixture["params"].items()) truth += 12 * Numel(p["shape"].get<std::vector<int64_t>>());
  int64_t planned = 0;
  for (const Unit& u : P.units) planned += u.bytes;
  for (const SharedPiece& sp : P.shared) planned += sp.bytes;
  CHECK(P.needed_bytes == truth);
  CHECK(planned == truth);

  // The vocabulary padded as Megatron pads it for the target's TP: a multiple of TP, at least the
  // vocabulary, and the generator's own padding when TP is the source's.
  const int64_t vocab = fixture["original_vocab_size"], padded = fixture["padded_vocab_size"];
  CHECK(P.padded_vocab >= vocab);
  CHECK(P.padded_vocab % T.tp == 0);
  if (T.tp == fixture["tp"].get<int>()) CHECK(P.padded_vocab == padded);

  // Stages: bounds over the layer specs, increasing, every stage holding a unit.
  REQUIRE(P.parts.size() == static_cast<size_t>(T.pp + 1));
  CHECK(std::is_sorted(P.parts.begin(), P.parts.end()));

  // Per atom: the stages holding it, and per (stage, TP rank) its piece(s).
  std::map<int, std::set<int>> stages_of;  // atom -> stages
  std::map<std::tuple<int, int, int>, std::vector<const UnitParam*>> pieces;  // (atom, pp, tp) -> pieces over DP units
  for (const Unit& u : P.units) {
    CHECK(u.pp >= 0);
    CHECK(u.pp < T.pp);
    CHECK(u.tp >= 0);
    CHECK(u.tp < T.tp);
    CHECK((T.zero_stage == 3 ? u.dp >= 0 && u.dp < T.dp : u.dp == -1));
    for (const UnitParam& up : u.params) {
      stages_of[up.atom].insert(u.pp);
      pieces[{up.atom, u.pp, u.tp}].push_back(&up);
    }
  }
  REQUIRE(stages_of.size() == S.atoms.size());
  for (size_t a = 0; a < S.atoms.size(); ++a) {
    const Atom& atom = S.atoms[a];
    INFO("parameter " << atom.name);
    const auto& truth_shape = fixture["params"].at(atom.name)["shape"].get<std::vector<int64_t>>();
    CHECK(atom.shape == truth_shape);
    if (atom.tied() && T.pp > 1) CHECK(stages_of[a] == std::set<int>{0, T.pp - 1});
    else CHECK(stages_of[a].size() == 1);
    for (int s : stages_of[a]) {
      if (!(atom.tied() && s == T.pp - 1 && T.pp > 1)) {  // on the stage whose layer specs hold its own
        CHECK(P.parts[s] <= atom.spec());
        CHECK(atom.spec() < P.parts[s + 1]);
      }
      // The TP pieces tile the joined tensor along the split dimension; an unsplit piece is whole.
      std::vector<int> hits;
      int64_t local_total = 0;
      std::vector<int64_t> joined;
      for (int t = 0; t < T.tp; ++t) {
        const auto& list = pieces[{static_cast<int>(a), s, t}];
        REQUIRE(list.size() == static_cast<size_t>(T.zero_stage == 3 ? T.dp : 1));
        const UnitParam& up = *list.front();
        joined = up.joined_shape;
        CHECK(up.local_numel == Numel(up.copy.shape));
        local_total += up.local_numel;
        if (up.copy.split_dim < 0) {
          CHECK(up.copy.shape == up.joined_shape);
          continue;
        }
        const int d = up.copy.split_dim;
        hits.resize(static_cast<size_t>(joined[d]), 0);
        int64_t local = 0;
        for (const auto& b : up.copy.blocks) {
          CHECK(b.local_start == local);
          local += b.length;
          for (int64_t r = b.joined_start; r < b.joined_start + b.length; ++r) ++hits.at(static_cast<size_t>(r));
        }
        CHECK(local == up.copy.shape[d]);
        // ZeRO-3: the DP slices of the piece tile its local elements, in order, none larger than DeepSpeed's.
        if (T.zero_stage == 3) {
          int64_t at = 0;
          for (const UnitParam* slice : list) {
            CHECK(slice->begin == std::min(at, slice->local_numel));
            CHECK(slice->end - slice->begin <= Zero3Piece(slice->local_numel, T.dp));
            at = slice->end;
          }
          CHECK(at == up.local_numel);
        }
      }
      if (!hits.empty()) {
        CHECK(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
        CHECK(local_total == Numel(joined));
      }
      // Only the vocabulary is padded, and to the plan's padded size.
      std::vector<int64_t> want_joined = truth_shape;
      if (atom.vocab) want_joined[0] = P.padded_vocab;
      CHECK(joined == want_joined);
    }
  }

  // Owners: every unit on a rank, the busiest within one unit of an even share (greedy LPT). The
  // balance is of each unit's bytes before sharing took the shared pieces off them.
  REQUIRE(P.owner.size() == P.units.size());
  std::vector<int64_t> weight(P.units.size()), load(ranks, 0);
  for (size_t k = 0; k < P.units.size(); ++k) weight[k] = P.units[k].bytes;
  for (const SharedPiece& sp : P.shared)
    for (const auto& user : sp.users) weight[user.first] += sp.bytes;
  for (size_t k = 0; k < P.units.size(); ++k) {
    REQUIRE(P.owner[k] >= 0);
    REQUIRE(P.owner[k] < ranks);
    load[P.owner[k]] += weight[k];
  }
  const int64_t all = std::accumulate(weight.begin(), weight.end(), int64_t{0});
  CHECK(*std::max_element(load.begin(), load.end()) <= all / ranks + *std::max_element(weight.begin(), weight.end()));

  // Shared pieces: held by two or more units, read by one of the ranks that hold them.
  for (const SharedPiece& sp : P.shared) {
    CHECK(sp.users.size() >= 2);
    CHECK(std::find(sp.ranks.begin(), sp.ranks.end(), sp.reader) != sp.ranks.end());
  }
}

}  // namespace

TEST_CASE("reshard plan: pieces tile every tensor, each byte is read once, for targets of every kind", "[reshard_plan]") {
  for (const std::string fixture : {"tp2_pp2_dp2_bf16", "gptq_tp2_pp2_dp2", "zero3_tp2_dp2_gpt"}) {
    INFO("source " << fixture);
    const Source S = LoadSource(Atomic(fixture).string());
    const auto truth = FixtureOf(fixture);
    REQUIRE(S.atoms.size() == truth["params"].size());
    for (const auto& t : {Layout(1, 1, 1, 1, "bf16"), Layout(2, 2, 2, 1, "bf16"), Layout(3, 2, 1, 3, "fp16"),
                          Layout(4, 1, 2, 0, "bf16"), Layout(2, 1, 1, 2, "fp32"), Layout(1, 2, 1, 3, "bf16")})
      for (int ranks : {1, 3})
        CheckPlan(S, truth, t, ranks);
  }
}

TEST_CASE("reshard plan: targets DeepSpeed refuses are refused by name", "[reshard_plan]") {
  const Source S = LoadSource(Atomic("tp2_pp2_dp2_bf16").string());
  CHECK_THROWS_WITH(MakePlan(S, ResolveModel(S, Layout(2, 1, 2, 3, "bf16")), 1, 0), Catch::Contains("ZeRO-3 with pipeline"));
  CHECK_THROWS_WITH(MakePlan(S, ResolveModel(S, Layout(2, 1, 1, 0, "fp16")), 1, 0), Catch::Contains("needs --dtype bf16"));
  CHECK_THROWS_WITH(MakePlan(S, ResolveModel(S, Layout(1, 1, 99, 1, "bf16")), 1, 0), Catch::Contains("exceeds the"));
  CHECK_THROWS_WITH(LoadSource((test::WorkDir() / "no-such-atomic").string()), Catch::Contains("no-such-atomic"));
}

TEST_CASE("reshard plan: the gradient-accumulation dtype picks the bf16 ZeRO-1 optimizer as DeepSpeed does",
          "[reshard_plan]") {
  // The generator's bf16 ZeRO-1 source: the BF16 optimizer, its ds_config saying fp32 accumulation.
  Source S = LoadSource(Atomic("tp2_pp2_dp2_bf16").string());
  CHECK(S.manifest["source"].value("grad_accum_dtype", "") == "fp32");
  TargetLayout T = ResolveModel(S, Layout(2, 1, 1, 1, "bf16"));
  CHECK(T.grad_accum_dtype == "fp32");
  CHECK(T.bf16_optimizer());
  // Said by the target job: bf16 accumulation at ZeRO-1 is ZeRO's optimizer; ZeRO-0 is the BF16
  // optimizer whatever it accumulates in.
  TargetLayout given = Layout(2, 1, 1, 1, "bf16");
  given.grad_accum_dtype = "bf16";
  CHECK(!ResolveModel(S, given).bf16_optimizer());
  given.zero_stage = 0;
  CHECK(ResolveModel(S, given).bf16_optimizer());
  // A source that says nothing: fp32 after the BF16 optimizer at ZeRO-1, else the training dtype.
  S.manifest["source"].erase("grad_accum_dtype");
  CHECK(ResolveModel(S, Layout(2, 1, 1, 1, "bf16")).grad_accum_dtype == "fp32");
  S.manifest["source"]["optimizer"] = "zero";
  T = ResolveModel(S, Layout(2, 1, 1, 1, "bf16"));
  CHECK(T.grad_accum_dtype == "bf16");
  CHECK(!T.bf16_optimizer());
  CHECK(ResolveModel(S, Layout(2, 1, 1, 2, "fp16")).grad_accum_dtype == "fp16");
}
