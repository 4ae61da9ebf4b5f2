// The layout planner of ucp-reshard --gpus: every layout a model can take on N GPUs, the memory per
// GPU each needs, and the one to choose, with the reason.
//
// A layout is valid when dp x sp x tp x pp = N; SP > 1 only without a pipeline, dividing the query
// heads per TP rank and the sequence length (ModelSpRefusal); TP divides the attention heads, the key-value heads and
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
//   activations  where the model's sequence length, micro-batch, hidden size, heads and layers are
//                known (args, or --seq-length / --micro-batch-size): Korthikanti et al., "Reducing
//                Activation Recomputation in Large Transformer Models" (MLSys 2023), for the first
//                pipeline stage (1F1B: pp micro-batches of L/pp layers, so L layers' worth), s, b, h, a
//                the sequence, micro-batch, hidden size and heads, with TP's sequence parallelism and
//                Ulysses dividing the sequence over SP:
//                  without recomputation   L * s*b*h * (34 + 5*a*s/h) / (tp * sp)   (Table 2)
//                  full recomputation      L * 2*s*b*h / (tp * sp)                  (section 4.3)
//                in 16-bit activations as the paper counts them, twice that in fp32; else the stated
//                allowance (--activation-memory, default a quarter of --gpu-memory). --activation-memory
//                given replaces the estimate.
// The weights and optimizer terms are what the shard files of that layout hold per rank (checked
// by tests/python/planner.py against the files ucp-reshard writes); buffers, fragmentation and
// communication buckets are for the allowance to cover.
//
// Preference among the layouts that fit, in order (each a tie-breaker for the one before):
//   1. the source's TP and PP (a change of model parallelism changes the numerics least when none);
//   2. the fewest pipeline stages (bubbles);
//   2b. the smallest Ulysses SP (its all-to-alls per layer): SP is chosen when the sequence's
//      activations do not fit otherwise;
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

#include "layout/target.h"

namespace ucp::reshard {

struct ModelFacts {
  int layers = 0;
  int64_t heads = 0, kv_heads = 0, ffn = 0;  // 0: the checkpoint does not say
  int64_t hidden = 0, seq_length = 0, micro_batch = 0;  // 0: the checkpoint does not say
  bool full_recompute = false;              // the job recomputes every layer's activations (its args say so)
  // A model whose layers ucp does not know (a plain DeepSpeed engine around a Hugging Face model:
  // Naming::Module): its TP, PP and SP degrees stay the source's; only DP and the ZeRO stage vary.
  bool fixed_model_parallel = false;
  TargetLayout source;                       // the source's degrees, ZeRO stage and dtype
};

// A model's shape facts (heads, key-value heads, FFN width, hidden size, sequence length,
// micro-batch) by Megatron's argument names, `arg` giving 0 for one the checkpoint does not say;
// the key-value heads are the heads where it does not say (no grouped-query attention). The one
// builder of them, whether the args come from an atomic checkpoint or from a source's index.
ModelFacts ShapeFactsOf(const std::function<int64_t(const char*)>& arg);

struct PlannerRequest {
  int gpus = 0;
  int gpus_per_node = 8;
  int64_t gpu_memory = int64_t{80} << 30;
  int64_t activation_memory = -1;  // -1: the estimate where the model is known, else a quarter of gpu_memory
  int64_t seq_length = 0, micro_batch = 0;  // 0: the model's (its args)
  std::string recompute;            // "full" or "none"; empty: the model's
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

// What the activation estimate needs, from the model's facts with the request's overrides.
struct ActivationModel {
  int64_t seq_length = 0, micro_batch = 0, hidden = 0, heads = 0;
  int layers = 0;
  bool full_recompute = false;
  bool known() const { return seq_length > 0 && micro_batch > 0 && hidden > 0 && heads > 0 && layers > 0; }
  nlohmann::json ToJson() const;
};
ActivationModel ActivationModelOf(const ModelFacts& m, const PlannerRequest& r);
// Activation bytes per GPU by the formula above, for a training dtype of `dtype_bytes` (2 or 4).
int64_t ActivationBytes(const ActivationModel& a, int tp, int sp, int dtype_bytes);

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
  std::string job_change;             // what the chosen layout changes in the training job itself (Ulysses SP), or ""
  ActivationModel activation;         // what the activation estimate used (unknown: the allowance)
  nlohmann::json ToJson(const PlannerRequest& request) const;
  void Print(std::ostream& out, const PlannerRequest& request, size_t shown = 12) const;
};

// Why the model cannot run at this TP degree (a degree that does not divide its attention heads,
// key-value heads or FFN width; a fact the model does not record is no reason), or "". The one rule
// for a TP degree whichever way the layout was named: the planner's candidates, explicit flags,
// --layout files and --in-place alike (Validate).
std::string ModelTpRefusal(const ModelFacts& m, int tp);
// Why the model cannot run Ulysses SP at this degree beside `tp`: the query heads per TP rank or the
// sequence length SP does not divide (facts the model does not record are no reason), or "". The
// one SP rule, as ModelTpRefusal is for TP.
std::string ModelSpRefusal(const ModelFacts& m, int tp, int sp);
// Every reason a layout cannot run Ulysses SP: a pipeline (pp > 1, or a PipelineModule), Mixture of
// Experts, or ModelSpRefusal; "" for sp <= 1 or none. The one rule for an SP layout however named:
// Validate, the planner, and --in-place before a conversion.
std::string UlyssesRefusal(const ModelFacts& m, int tp, int sp, int pp, bool pipeline_module, bool moe);

// "dp x sp = 6 does not divide 4 GPUs": the degrees the user fixed (request.fixed), where their
// product alone rules out every layout for request.gpus; "" where it does not. Checked on the command
// line, before anything is converted, and said again by the planner's refusal.
std::string FixedDegreesRefusal(const PlannerRequest& request);
LayoutChoice ChooseLayout(const ModelFacts& model, const PlannerRequest& request, const LoadOf& load);

}  // namespace ucp::reshard
