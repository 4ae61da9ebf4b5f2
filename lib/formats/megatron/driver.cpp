// The Megatron-LM legacy format's row of the registry (formats/registry.h): its source driver
// (legacy_index.h).
#include "formats/driver.h"
#include "formats/megatron/legacy_folder.h"
#include "formats/megatron/legacy_index.h"

namespace ucp::formats {

const SourceDriver& MegatronSource() {
  static constexpr SourceDriver driver = {"megatron",
     "Megatron-LM's legacy checkpoints (--ckpt-format torch) of Megatron-Core GPT / Llama models: each TP / PP rank's "
     "model_optim_rng.pt (the model's tensors, one per layer; FP32Optimizer's or Float16OptimizerWithFloat16Params' state), "
     "and the distributed optimizer's distrib_optim.pt beside it, or the weights alone (--no-save-optim); every tensor placed as Megatron-Core's torch_dist format "
     "places it (layers stacked), fp32 masters with Adam's exp_avg / exp_avg_sq and step",
     "latest_checkpointed_iteration.txt, iter_NNNNNNN/mp_rank_TT[_PPP]/model_optim_rng.pt (and distrib_optim.pt)",
     megatron::LooksLikeLegacy, megatron::IndexLegacy, megatron::ReadLegacyParam, megatron::LegacyWeightsOnly};
  return driver;
}

}  // namespace ucp::formats
