// The layout planner of ucp-reshard --gpus (reshard/planner.h), over a synthetic model: which
// layouts it considers valid, the memory it estimates, the preference, and its refusals.
// tests/python/planner.py checks the estimates against the files ucp-reshard writes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "layout/planner.h"

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
      CHECK(t.dp * t.Sp() * t.tp * t.pp == gpus);
      if (!cand.refused.empty()) continue;
      CHECK((t.Sp() == 1 || t.pp == 1));  // Ulysses without a pipeline: listed as refused
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

// A Llama-2-70B shape: 80 layers, hidden 8192, 64 query heads, 8 key-value heads, FFN 28672, 32000 tokens.
namespace {
ModelFacts Llama70B() {
  ModelFacts m;
  m.layers = 80, m.heads = 64, m.kv_heads = 8, m.ffn = 28672, m.hidden = 8192;
  m.seq_length = 131072, m.micro_batch = 1, m.full_recompute = true;
  m.source.dp = 8, m.source.tp = 8, m.source.pp = 1, m.source.zero_stage = 1, m.source.dtype = "bf16";
  return m;
}

// Its parameters cut over tp x pp: per layer q, k, v, o and the SwiGLU's three matrices over TP, the two
// norms whole; the embedding and output layer over TP on the first and last stage.
std::vector<std::vector<int64_t>> Llama70BLoad(const TargetLayout& t) {
  const int64_t h = 8192, kv = 8 * 128, ffn = 28672, vocab = 32000;
  const int64_t per_layer = (h * h + 2 * h * kv + h * h + 3 * h * ffn) / t.tp + 2 * h;
  std::vector<std::vector<int64_t>> ranks;
  for (int s = 0; s < t.pp; ++s)
    for (int r = 0; r < t.tp; ++r) {
      ranks.push_back(std::vector<int64_t>(80 / t.pp, per_layer));
      if (s == 0) ranks.back().push_back(vocab * h / t.tp);
      if (s == t.pp - 1) ranks.back().push_back(vocab * h / t.tp + h);
    }
  return ranks;
}
}  // namespace

TEST_CASE("planner: the activation estimate is Korthikanti et al.'s, over TP x SP", "[planner]") {
  ActivationModel a;
  a.seq_length = 131072, a.micro_batch = 1, a.hidden = 8192, a.heads = 64, a.layers = 80;
  // Full recomputation: only each layer's input, 2*s*b*h bytes in 16 bits, L of them, over tp*sp.
  a.full_recompute = true;
  const int64_t s = a.seq_length, b = a.micro_batch, h = a.hidden, heads = a.heads, L = a.layers;
  for (int tp : {1, 2, 8})
    for (int sp : {1, 4, 8}) {
      CHECK(ActivationBytes(a, tp, sp, 2) == L * 2 * s * b * h / (tp * sp));
      CHECK(ActivationBytes(a, tp, sp, 4) == 2 * (L * 2 * s * b * h / (tp * sp)));  // fp32 activations
    }
  CHECK(ActivationBytes(a, 8, 8, 2) == 2684354560);  // 2.5 GiB: 2 * 2^17 * 2^13 * 80 / 64
  // Without: s*b*h*(34 + 5*a*s/h) per layer (Table 2, tensor and sequence parallelism), the attention
  // scores' 5*a*s^2*b term dominating at 128k tokens.
  a.full_recompute = false;
  for (int tp : {1, 8})
    for (int sp : {1, 8}) CHECK(ActivationBytes(a, tp, sp, 2) == L * s * b * h * (34 + 5 * heads * s / h) / (tp * sp));
  // A small model where 5as/h is not whole: the estimate rounds the exact value, never truncates a term.
  ActivationModel small{.seq_length = 32, .micro_batch = 6, .hidden = 64, .heads = 4, .layers = 4, .full_recompute = false};
  CHECK(ActivationBytes(small, 1, 2, 4) == 4 * 32 * 6 * 64 * (34 * 64 + 5 * 4 * 32) / 64 / 2 * 4 / 2);
}

TEST_CASE("planner: a 128k-token 70B-shaped model gets SP where its sequence does not fit otherwise", "[planner]") {
  PlannerRequest r;
  r.gpus = 64, r.gpus_per_node = 4, r.gpu_memory = int64_t{80} << 30;  // GH200-like nodes of 4 GPUs
  r.micro_batch = 2;
  const ModelFacts model = Llama70B();
  LayoutChoice c = ChooseLayout(model, r, Llama70BLoad);
  std::ostringstream table;
  c.Print(table, r, 16);
  std::cout << table.str();  // the planner's table, as --plan-only prints it
  REQUIRE(c.chosen == 0);
  const ActivationModel used = ActivationModelOf(model, r);
  CHECK((used.known() && used.micro_batch == 2 && used.full_recompute));
  for (const auto& x : c.candidates) {
    const TargetLayout& t = x.layout;
    CHECK(t.dp * t.Sp() * t.tp * t.pp == 64);
    if (!x.refused.empty()) continue;
    CHECK(x.memory.activations == ActivationBytes(used, t.tp, t.Sp(), 2));
    CHECK(64 / t.tp % t.Sp() == 0);
  }
  const TargetLayout& chosen = c.candidates[0].layout;
  CHECK(chosen.Sp() > 1);
  CHECK_THAT(c.reason, Catch::Contains("the smallest SP that fits"));
  for (const auto& x : c.candidates)  // nothing with less SP fits
    if (x.refused.empty() && x.layout.Sp() < chosen.Sp() && x.layout.tp == chosen.tp && x.layout.pp == chosen.pp)
      CHECK_FALSE(x.fits);
  CHECK_THAT(table.str(), Catch::Contains("full recomputation"));
  // One micro-batch of the same sequence fits without SP: SP is not chosen for nothing.
  r.micro_batch = 1;
  c = ChooseLayout(model, r, Llama70BLoad);
  REQUIRE(c.chosen == 0);
  CHECK(c.candidates[0].layout.Sp() == 1);
  // SP that does not divide the query heads per TP rank, or the sequence, is refused by name.
  ModelFacts odd = model;
  odd.seq_length = 131071;
  CHECK_THAT(ModelSpRefusal(odd, 8, 2), Catch::Contains("does not divide the sequence length 131071"));
  CHECK_THAT(ModelSpRefusal(model, 8, 16), Catch::Contains("sp=16 does not divide the 64 query heads per TP rank (8 at tp=8)"));
  CHECK(ModelSpRefusal(model, 8, 8).empty());
}
