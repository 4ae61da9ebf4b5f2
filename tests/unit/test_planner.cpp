// The layout planner of ucp-reshard --gpus (reshard/planner.h), over a synthetic model: which
// layouts it considers valid, the memory it estimates, the preference, and its refusals.
// tests/python/planner.py checks the estimates against the files ucp-reshard writes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "target/planner.h"

using namespace ucp;
using namespace ucp::reshard;

namespace {

// 8 layers, 8 heads, 2 key-value heads, FFN 48; 1.2 M elements cut evenly over tp x pp, in 3 parameters.
ModelFacts Model() {
  ModelFacts m;
  m.layers = 8, m.heads = 8, m.kv_heads = 2, m.ffn = 48;
  m.source.dp = 4, m.source.tp = 2, m.source.pp = 2, m.source.zero_stage = 1, m.source.dtype = "bf16";
  return m;
}

std::vector<std::vector<int64_t>> Even(const TargetLayout& t) {
  const int64_t per = 1200000 / (t.tp * t.pp);
  return std::vector<std::vector<int64_t>>(t.tp * t.pp, {per / 2, per / 3, per - per / 2 - per / 3});
}

}  // namespace

TEST_CASE("planner: the memory of a rank per ZeRO stage", "[planner]") {
  TargetLayout t;
  t.dp = 4, t.dtype = "bf16";
  const std::vector<int64_t> n = {10, 7};  // 17 elements; ZeRO partition ceil(17/4) = 5; slices 3 + 2
  t.zero_stage = 1, t.grad_accum_dtype = "fp32";  // BF16 optimizer: fp32 gradients for every element
  auto m = EstimateMemory(t, n, 100);
  CHECK(m.weights == 34);
  CHECK(m.gradients == 68);
  CHECK(m.optimizer == 60);
  CHECK(m.total() == 34 + 68 + 60 + 100);
  t.grad_accum_dtype = "bf16";  // ZeRO-1's optimizer: bf16 gradients for every element
  m = EstimateMemory(t, n, 100);
  CHECK((m.weights == 34 && m.gradients == 34 && m.optimizer == 60));
  t.zero_stage = 2;
  m = EstimateMemory(t, n, 0);
  CHECK((m.weights == 34 && m.gradients == 10 && m.optimizer == 60));
  t.zero_stage = 3;
  m = EstimateMemory(t, n, 0);
  CHECK((m.weights == 10 && m.gradients == 10 && m.optimizer == 60));
  t.zero_stage = 1, t.dtype = "fp16";
  m = EstimateMemory(t, n, 0);
  CHECK((m.weights == 34 && m.gradients == 34 && m.optimizer == 60));
  t.dtype = "fp32";
  m = EstimateMemory(t, n, 0);
  CHECK((m.weights == 68 && m.gradients == 68 && m.optimizer == 60));
}

TEST_CASE("planner: 1 to 64 GPUs give valid layouts that fit, preferring the source's model parallelism", "[planner]") {
  const ModelFacts model = Model();
  PlannerRequest r;
  r.gpu_memory = 32 << 20, r.activation_memory = 0, r.gpus_per_node = 8;
  for (int gpus = 1; gpus <= 64; ++gpus) {
    r.gpus = gpus;
    LayoutChoice c = ChooseLayout(model, r, Even);
    INFO("gpus " << gpus << ": " << c.reason);
    for (const auto& cand : c.candidates) {
      const TargetLayout& t = cand.layout;
      CHECK(t.dp * t.tp * t.pp == gpus);
      if (!cand.refused.empty()) continue;
      CHECK((model.kv_heads % t.tp == 0 && model.heads % t.tp == 0 && model.ffn % t.tp == 0));
      CHECK(t.pp <= model.layers);
      CHECK((t.zero_stage <= 1 || t.pp == 1));
    }
    REQUIRE(c.chosen == 0);
    const Candidate& chosen = c.candidates[0];
    CHECK(chosen.fits);
    CHECK(chosen.memory.total() <= r.gpu_memory);
    // The source's tp=2 pp=2 whenever 4 divides the GPUs and it fits; else the fewest stages.
    const auto same = std::find_if(c.candidates.begin(), c.candidates.end(), [](const Candidate& x) {
      return x.layout.tp == 2 && x.layout.pp == 2 && x.fits;
    });
    if (same != c.candidates.end()) {
      CHECK((chosen.layout.tp == 2 && chosen.layout.pp == 2 && chosen.layout.zero_stage == 1));
      CHECK_THAT(c.reason, Catch::Contains("keeps the source's tp=2 pp=2"));
    } else {
      for (const auto& x : c.candidates)
        if (x.fits) CHECK(x.layout.pp >= chosen.layout.pp);
    }
  }
  // 3 GPUs: tp=3 does not divide 8 heads (nor the node), so tp=1; ZeRO-1 (bf16, 1.2 M elements fit).
  r.gpus = 3;
  LayoutChoice three = ChooseLayout(model, r, Even);
  CHECK((three.candidates[0].layout.tp == 1 && three.candidates[0].layout.pp == 1 && three.candidates[0].layout.dp == 3));
  CHECK(std::any_of(three.candidates.begin(), three.candidates.end(), [](const Candidate& x) {
    return x.refused.find("does not divide") != std::string::npos;
  }));
}

TEST_CASE("planner: memory decides, fixed degrees stay, and a model that fits nowhere is refused", "[planner]") {
  const ModelFacts model = Model();
  PlannerRequest r;
  r.gpus = 8, r.activation_memory = 0;
  // 1.2 M elements: on one stage and rank, ZeRO-1 over dp=8 holds 2.4 MB weights + 4.8 MB fp32 gradients
  // + 1.8 MB optimizer; ZeRO-3 over dp=8 0.3 + 0.3 + 1.8 MB. 3 MB fits ZeRO-3 only, or model parallelism.
  r.gpu_memory = 3000000;
  LayoutChoice c = ChooseLayout(model, r, Even);
  REQUIRE(c.chosen == 0);
  CHECK(c.candidates[0].memory.total() <= 3000000);
  // Fixed tp=1 pp=1: only ZeRO-3 fits.
  r.fixed = {"tp", "pp"};
  r.base.tp = 1, r.base.pp = 1;
  c = ChooseLayout(model, r, Even);
  REQUIRE(c.chosen == 0);
  CHECK((c.candidates[0].layout.zero_stage == 3 && c.candidates[0].layout.dp == 8));
  for (const auto& x : c.candidates) CHECK((x.layout.tp == 1 && x.layout.pp == 1));
  // Nothing fits 1 MB: refused with the smallest layout's needs.
  r.gpu_memory = 1000000;
  c = ChooseLayout(model, r, Even);
  CHECK(c.chosen == -1);
  CHECK_THAT(c.reason, Catch::Contains("no layout fits 8 GPUs") && Catch::Contains("ZeRO-3"));
  // A layout the model's parameters cannot take (the load throws) is refused with that reason.
  r = PlannerRequest{};
  r.gpus = 2;
  c = ChooseLayout(model, r, [](const TargetLayout& t) -> std::vector<std::vector<int64_t>> {
    if (t.tp == 2) throw Error("parameter 'w': dimension 0 of [3, 4] does not split over TP=2");
    return Even(t);
  });
  REQUIRE(c.chosen == 0);
  CHECK(c.candidates[0].layout.tp == 1);
  CHECK(std::any_of(c.candidates.begin(), c.candidates.end(), [](const Candidate& x) {
    return x.refused.find("does not split over TP=2") != std::string::npos;
  }));
  CHECK_THAT(c.reason, Catch::Contains("the source's tp=2 pp=2"));
  CHECK_THROWS_AS(ChooseLayout(model, PlannerRequest{}, Even), Error);  // no --gpus
}
