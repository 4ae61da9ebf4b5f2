// The DeepSpeed format's rows of the registry (formats/registry.h): its source driver (index.h)
// and its target driver (writer.h).
#include "formats/driver.h"
#include "formats/deepspeed/index.h"
#include "formats/deepspeed/writer.h"

namespace ucp::formats {

const SourceDriver& DeepSpeedSource() {
  static constexpr SourceDriver driver = {"deepspeed",
     "DeepSpeed and Megatron-DeepSpeed native checkpoints: ZeRO stages 0-3, the BF16 optimizer, TP, PP and DP "
     "(DeepSpeed 0.12 and later); the pipeline's layer files or a plain module; Mixture of Experts with expert "
     "parallelism under ZeRO-1/2 (each expert under its global id)",
     "mp_rank_XX_model_states.pt, [bf16_]zero_pp_rank_D_mp_rank_XX_optim_states.pt, "
     "zero_pp_rank_D_mp_rank_XX_model_states.pt, layer_LL-model_TT-model_states.pt, "
     "layer_L_expert_E_mp_rank_XX_model_states.pt, expp_rank_R_mp_rank_XX_optim_states.pt",
     deepspeed::LooksLikeCheckpoint, deepspeed::IndexCheckpoint, nullptr, nullptr};
  return driver;
}

const TargetDriver& DeepSpeedTarget() {
  static constexpr TargetDriver driver = {"deepspeed",
     "DeepSpeed / Megatron-DeepSpeed native checkpoints for a new layout (ucp-reshard): ZeRO-1/2 flat partitions "
     "with DeepSpeed's alignment padding, the BF16 optimizer (ZeRO-0/1 bf16), ZeRO-3 per-rank files; a "
     "PipelineModule's layer files or a plain module; Mixture of Experts at any expert-parallel degree under "
     "ZeRO-1/2 (expert files, expert groups per expert-parallel rank); loaded by the job's ordinary --load",
     "mp_rank_XX_model_states.pt, [bf16_]zero_pp_rank_D_mp_rank_XX_optim_states.pt, "
     "zero_pp_rank_D_mp_rank_XX_model_states.pt, layer_LL-model_TT-model_states.pt, "
     "layer_L_expert_E_mp_rank_XX_model_states.pt, expp_rank_R_mp_rank_XX_optim_states.pt, latest",
     deepspeed::WriteUnit, nullptr, nullptr, nullptr, false};
  return driver;
}

}  // namespace ucp::formats
