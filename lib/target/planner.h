// The layout planner of ucp-reshard --gpus: every layout a model can take on N GPUs, the memory per
// GPU each needs, and the one to choose, with the reason.
//
// A layout is valid when dp x tp x pp = N; TP divides the attention heads, the key-value heads and
// the FFN width (where the checkpoint's args say them; the split dimensions of the parameters are
// checked by the caller's `LoadOf` in any case) and stays within a node (divides --gpus-per-node);
// PP is at most the layer count; the ZeRO stage is one DeepSpeed runs with that PP and dtype.
//
// Memory per GPU, for the most loaded model-parallel rank, n its parameters' local element counts,
// b the dtype's bytes (2 for fp16/bf16, 4 for fp32), P = ceil(sum n / dp) its ZeRO partition:
//   weights      b * sum n                (ZeRO-3: b * sum ceil(n / dp))
//   gradients    b * sum n  ZeRO 0/1;  4 * sum n  with the BF16 optimizer (fp32 accumulation);
//                b * P  ZeRO-2;  b * sum ceil(n / dp)  ZeRO-3
//   optimizer    12 * P: fp32 master weights, Adam exp_avg and exp_avg_sq (ZeRO-3: 12 * sum ceil(n / dp))
//   activations  the stated allowance (--activation-memory; no model of activations is attempted)
// The weights and optimizer terms are what the shard files of that layout hold per rank (checked
// by tests/python/planner.py against the files ucp-reshard writes); buffers, fragmentation and
// communication buckets are for the allowance to cover.
//
// Preference among the layouts that fit, in order (each a tie-breaker for the one before):
//   1. the source's TP and PP (a change of model parallelism changes the numerics least when none);
//   2. the fewest pipeline stages (bubbles);
//   3. the least ZeRO communication: stage 0/1 (an all-reduce, as plain DP), then 2, then 3; the
//      source's stage first among equals;
//   4. the smallest TP (less communication per layer);
//   5. the smallest memory per GPU.
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "target/target.h"

namespace ucp::reshard {

struct ModelFacts {
  int layers = 0;
  int64_t heads = 0, kv_heads = 0, ffn = 0;  // 0: the checkpoint does not say
  TargetLayout source;                       // the source's degrees, ZeRO stage and dtype
};

struct PlannerRequest {
  int gpus = 0;
  int gpus_per_node = 8;
  int64_t gpu_memory = int64_t{80} << 30;
  int64_t activation_memory = -1;  // -1: a quarter of gpu_memory
  TargetLayout base;                // dtype, partition method, model: kept in every candidate
  std::vector<std::string> fixed;   // layout keys the user gave (dp, tp, pp, zero_stage): not varied
  int64_t activations() const { return activation_memory >= 0 ? activation_memory : gpu_memory / 4; }
};

struct MemoryEstimate {
  int64_t weights = 0, gradients = 0, optimizer = 0, activations = 0;
  int64_t total() const { return weights + gradients + optimizer + activations; }
  nlohmann::json ToJson() const;
};

// The memory of one model-parallel rank holding parameters of these local element counts.
MemoryEstimate EstimateMemory(const TargetLayout& layout, const std::vector<int64_t>& numels, int64_t activations);

// Per model-parallel rank (pp stage, tp rank) of `layout`: its parameters' local element counts.
// Throws ucp::Error when the model cannot take the layout (a split dimension TP does not divide).
using LoadOf = std::function<std::vector<std::vector<int64_t>>(const TargetLayout&)>;

struct Candidate {
  TargetLayout layout;
  MemoryEstimate memory;  // of the most loaded model-parallel rank
  bool fits = false;
  std::string refused;    // why the model cannot take it (then memory is unset)
};

struct LayoutChoice {
  std::vector<Candidate> candidates;  // valid ones ranked by preference (fitting first), then refused ones
  int chosen = -1;                    // index into candidates; -1: none fits
  std::string reason;                 // why that one, or why none
  nlohmann::json ToJson(const PlannerRequest& request) const;
  void Print(std::ostream& out, const PlannerRequest& request, size_t shown = 12) const;
};

// Why the model cannot run at this TP degree (a degree that does not divide its attention heads,
// key-value heads or FFN width; a fact the model does not record is no reason), or "". The one rule
// for a TP degree whichever way the layout was named: the planner's candidates, explicit flags,
// --layout files and --in-place alike (Validate).
std::string ModelTpRefusal(const ModelFacts& m, int tp);

LayoutChoice ChooseLayout(const ModelFacts& model, const PlannerRequest& request, const LoadOf& load);

}  // namespace ucp::reshard
