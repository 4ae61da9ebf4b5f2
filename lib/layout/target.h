// The layout ucp-reshard writes (DP, TP, PP, ZeRO stage, training dtype, pipeline partitioning),
// and DeepSpeed's own pipeline partitioners, ported so that stages own the layers DeepSpeed
// would give them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ucp::reshard {

struct TargetLayout {
  int dp = 1, tp = 1, pp = 1;
  int zero_stage = 1;                               // 0 (with bf16: the BF16 optimizer), 1, 2, 3
  // DeepSpeed Ulysses sequence parallelism: each of dp replicas runs on sp ranks, each holding s/sp
  // tokens; ZeRO partitions over the dp x sp ranks (SeqDp). 0: the source's (1 where it has none).
  int sp = 0;
  int ep = 0;  // Mixture of Experts: the expert-parallel degree (dividing dp); 0: the source's (1 without experts)
  // fp16, bf16, fp32; empty: the source job's (ResolvedDtype): a precision change is asked for, never a default.
  std::string dtype;
  std::string partition_method = "type:transformer";  // uniform | parameters | type:REGEX | a,b,c boundaries
  int64_t vocab_divisible_by = 0;                   // 0: the source's make_vocab_size_divisible_by
  // "pipe": a DeepSpeed PipelineModule (GPTModelPipe names, layer_* files); "plain": a model that is
  // not one (GPTModel names, weights under `module` of mp_rank_XX_model_states.pt). Empty: the
  // source's, except that pp > 1 is always a pipeline and ZeRO-3 never is.
  std::string model;
  // The dtype gradients accumulate in (DeepSpeed's data_types.grad_accum_dtype): with bf16 it picks
  // the optimizer, the BF16 optimizer at ZeRO-0, and at ZeRO-1 only with "fp32" (otherwise ZeRO's).
  // Empty: the source's (ResolveModel).
  std::string grad_accum_dtype;
  // The DeepSpeed release the resumed job runs ("0.14.5"), where its files do not say so or where it
  // differs from the source's: it decides what changed between releases and no file shows, the scale
  // of an expert's Adam moments and the expp_rank files under ZeRO. Empty: the source's release.
  std::string ds_version;
  // --no-optimizer: the model's files only (model-states, layer and expert files, the weights in the
  // training dtype), no optimizer files; for a job that loads the module alone (DeepSpeed's
  // load_checkpoint(load_optimizer_states=False) or load_module_only=True; Megatron-DeepSpeed's
  // --finetune, whose --no-load-optim does not reach DeepSpeed). Not under
  // ZeRO-3, whose weights live in the optimizer files. Not part of a --layout file.
  bool no_optimizer = false;

  int Sp() const { return sp > 0 ? sp : 1; }
  // The sequence-data-parallel degree, DP x SP: the ranks ZeRO partitions over, numbering the files.
  int SeqDp() const { return dp * Sp(); }
  bool bf16_optimizer() const {
    return dtype == "bf16" && (zero_stage == 0 || (zero_stage == 1 && grad_accum_dtype == "fp32"));
  }
  std::string Degrees() const;   // "dp=4 tp=2 pp=2 ZeRO-1", " sp=2" after dp with SP, " ep=2" with experts (ep=1 too)
  // "dp=4 tp=2 pp=2 ZeRO-1 bf16"; bf16 without ZeRO names DeepSpeed's DDP bf16 wrapper where the
  // target's release runs it (`ddp_bf16_wrapper`, reshard_plan.h's DdpBf16Wrapper), else the BF16 optimizer.
  std::string Describe(bool ddp_bf16_wrapper = false) const;
  nlohmann::json ToJson() const;  // as schemas/layout.schema.json
};

// Whether `v` names a release as DeepSpeed numbers them ("0.14.5", "0.19").
bool IsReleaseVersion(const std::string& v);
// Whether DeepSpeed release `v` is older than major.minor.patch; an unknown release counts as a newer one.
bool ReleaseBefore(const std::string& v, int major, int minor, int patch);

// The gradient-accumulation dtype of a job whose configuration says none (`configured` empty): fp32
// for one the BF16 optimizer saved at ZeRO-1 (which takes fp32 accumulation), else the training
// dtype, DeepSpeed's default under ZeRO.
std::string GradAccumDtypeOf(const std::string& configured, const std::string& optimizer, int zero_stage,
                             const std::string& dtype);
// The target's training dtype: as given, else the source job's (an atomic checkpoint manifest's
// `source.dtype`); throws ucp::Error asking for --dtype when the manifest does not say it.
std::string ResolvedDtype(const TargetLayout& t, const nlohmann::json& source);
// The target's gradient-accumulation dtype: as given, else the source job's (GradAccumDtypeOf of
// an atomic checkpoint manifest's `source`, in the target's training dtype).
std::string ResolvedGradAccumDtype(const TargetLayout& t, const nlohmann::json& source);

// The target's model kind, "pipe" or "plain", when `model` is empty: ZeRO-3 and Ulysses SP (which
// Megatron-DeepSpeed runs without a pipeline) never are a pipeline, pp > 1 always is, and otherwise
// the source's kind (its naming) is kept.
std::string ResolvedModel(const TargetLayout& t, const std::string& source_naming);

// A layout object (schemas/layout.schema.json) over `base`: the keys it has replace base's, and
// are added to `given`. Throws ucp::Error naming `source` and the key for an unknown key or a value
// of the wrong type or range. The flags of ucp-reshard come through here too, as an object.
TargetLayout ApplyLayout(const nlohmann::json& layout, TargetLayout base, const std::string& source,
                         std::vector<std::string>* given);
// The same, from a --layout file.
TargetLayout ReadLayoutFile(const std::string& path, TargetLayout base, std::vector<std::string>* given);
// The keys without a default (dp, tp, pp, zero_stage) that `given` lacks.
std::vector<std::string> MissingLayoutKeys(const std::vector<std::string>& given);

// DeepSpeed's ds_utils.partition_uniform / partition_balanced: part boundaries, size num_parts + 1.
std::vector<int> PartitionUniform(int num_items, int num_parts);
std::vector<int> PartitionBalanced(const std::vector<double>& weights, int num_parts);

}  // namespace ucp::reshard
