// Megatron-LM's side of a model from another family, from its facts (mcore_keys.h's ModelFacts): the args
// common.pt holds (Megatron-LM's argument names), the flags that launch pretrain_gpt.py with the model, and
// the vocabulary divisor that keeps its rows at a TP.
#pragma once

#include <cstdint>
#include <string>

#include "formats/megatron/mcore_keys.h"
#include "pt/value.h"

namespace ucp::formats::megatron {

// The divisor a job pads its `vocab` rows with at TP `tp` and keeps them: `asked` where it keeps them, else
// the largest power of two up to Megatron-LM's default 128 that does; throws ucp::Error where none does
// (naming one that would, where `asked` does not).
int64_t KeptVocabDivisor(int64_t vocab, int64_t tp, int64_t asked);

// A number as a flag's value: the shortest text that reads back as the same double.
std::string FormatNumber(double v);

// What the args say of the run an optimizer's state comes from.
struct RunArgs {
  int64_t consumed_train_samples = 0, consumed_valid_samples = 0;
  bool distributed_optimizer = false;  // use_distributed_optimizer
};

// The args Namespace at TP x PP x DP: every value from the facts, the layout, the dtype and the divisor;
// no RNG state saved (no_save_rng). `run` null: no optimizer state either (no_save_optim), else its run's.
pt::ValuePtr ArgsOf(const ModelFacts& m, int64_t tp, int64_t pp, int64_t dp, const std::string& dtype, int64_t divisor,
                    const RunArgs* run = nullptr);

// pretrain_gpt.py's flags that build the model at TP x PP and load `root` (ArgsOf's values as a user gives
// them: the ones tests/data/real-mcore/cross_family_check.py launched Megatron-LM with).
std::string LaunchFlags(const ModelFacts& m, int64_t tp, int64_t pp, const std::string& dtype, int64_t divisor, const std::string& root);

}  // namespace ucp::formats::megatron
