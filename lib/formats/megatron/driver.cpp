// Megatron-LM's rows of the registry (formats/registry.h): the legacy format's source driver
// (legacy_index.h), and the torch_dist target (mcore_target.h).
#include "formats/driver.h"
#include "formats/megatron/legacy_folder.h"
#include "formats/megatron/legacy_index.h"
#include "formats/megatron/mcore_target.h"

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

const TargetDriver& McoreTarget() {
  static constexpr TargetDriver driver = {"mcore",
     "Megatron-LM's torch_dist checkpoint of a Megatron-Core GPT / Llama model, dense or MoE (ucp-reshard --format mcore --tp T "
     "--pp P [--dp D] [--ep E]): the files save_checkpoint writes at that layout, which the job's --load resumes: layers stacked, "
     "each layer and TP piece a chunk (each expert's on its EP rank), the model in the job's dtype, the optimizer's state in "
     "the form its optimizer loads at any TP / PP (the distributed optimizer's fully_reshardable, the mixed-precision "
     "optimizer's, FP32Optimizer's; at EP > 1 Megatron-LM's chain of a dense and an expert optimizer), common.pt with the "
     "args at the new layout, iteration and scheduler; from Megatron-Core and Megatron-LM sources",
     "iter_NNNNNNN/ (__R_0.distcp, common.pt, metadata.json, .metadata), latest_checkpointed_iteration.txt (written last)",
     nullptr, megatron::PlanMcore, megatron::WriteMcoreFile, megatron::CheckMcoreSource, false};
  return driver;
}

}  // namespace ucp::formats
