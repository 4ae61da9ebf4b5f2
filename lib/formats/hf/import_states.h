// The model-states file an import carries (mp_rank_00_model_states.pt): what a Megatron-DeepSpeed
// save holds around the tensors, for a model that was never trained under it. Megatron's args (an
// argparse.Namespace of the model's sizes, TP = PP = 1, iteration 0), universal_checkpoint_info with
// the patterns a real Megatron-DeepSpeed Llama save records, param_shapes by optimizer group, and
// DeepSpeed's bookkeeping at its start values (no module: the tensors are in the atomic store).
#pragma once

#include <string>
#include <vector>

#include "formats/hf/import_model.h"
#include "pt/value.h"

namespace ucp::formats::hf {

// Megatron pads the vocabulary to a multiple of this (its make_vocab_size_divisible_by default).
inline constexpr int64_t kVocabDivisibleBy = 128;

// The file's root for `c`'s model of parameters `M`, its weights in `dtype` (fp32, bf16, fp16).
pt::ValuePtr ImportModelStates(const HfConfig& c, const ImportModel& M, const std::string& dtype);

}  // namespace ucp::formats::hf
