// What a DeepSpeed checkpoint's model-states file says of the whole save: Megatron's args, the
// ds_config (dtype, ZeRO stage, gradient accumulation dtype), the training state, the world sizes
// and from them the degrees; and which variant of save it is, which decides where the index reads
// the parameters' shapes and the optimizer state.
#pragma once

#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "formats/deepspeed/experts.h"

namespace ucp::deepspeed {

// Which variant of DeepSpeed's save a checkpoint is.
struct SaveVariant {
  bool zero3_files = false;     // zero_pp_rank_*_mp_rank_*_model_states.pt: ZeRO-3
  bool expp_optimizer = false;  // Mixture of Experts without ZeRO: the optimizer state in expp_rank files
  bool moe = false;             // Mixture of Experts (not AutoEP)
  bool ddp_wrapper = false;     // DeepSpeed 0.17.6+'s DDP bf16 wrapper: the optimizer state in the model-states files
  bool shapes_from_weights = false;  // DeepSpeed 0.19's BF16 optimizer at ZeRO-0: no param_shapes
  std::vector<AutoEpLayer> autoep;   // DeepSpeed 0.19's AutoEP (none: not AutoEP)
};

// What the file names alone tell: ZeRO-3, experts without ZeRO; and L.naming.
SaveVariant VariantOfFiles(source::SourceIndex& L);

// The model-states files of the save: ZeRO-3's per-rank ones, else mp_rank_*_model_states.pt.
std::vector<source::ShardFile*> ModelStatesFiles(source::SourceIndex& L, bool zero3_files);

// The first model-states file that reads, and what the index takes from it.
struct FirstModelStates {
  std::shared_ptr<pt::TorchFile> file;  // nullptr: none reads (the errors say why)
  pt::ValuePtr args;                    // Megatron's argparse.Namespace
  int mp_world = 1, dp_world = 1;
  int config_stage = -1;  // ds_config.zero_optimization.stage

  const pt::Value& root() const { return *file->root; }
  std::string path() const { return file->archive->path(); }
  // fn(); what it throws an error of the index: "<file>: <what>: <message>".
  template <class Fn>
  void Try(source::SourceIndex& L, const char* what, Fn&& fn) const {
    try {
      fn();
    } catch (const std::exception& e) {
      L.errors.push_back(path() + ": " + what + ": " + e.what());
    }
  }
};
FirstModelStates FirstReadable(const std::vector<source::ShardFile*>& model_files, const ParseFile& parse);

// The save's metadata from its first model-states file (Megatron's args, universal_checkpoint_info,
// ds_config and ds_version, the training state) and the variant it shows (AutoEP, Mixture of
// Experts, the DDP bf16 wrapper). False when the index cannot go on (an error says why).
bool ReadSaveMetadata(source::SourceIndex& L, FirstModelStates& first, const FileNames& names,
                      const ParseFile& parse, SaveVariant& save);

// The degrees: from metadata (Megatron args, else DeepSpeed's world sizes and the layer files); each
// file placed at its (pp, tp). False when they cannot be (an error says why).
bool SetDegrees(source::SourceIndex& L, const FirstModelStates& first, const FileNames& names, const SaveVariant& save);

}  // namespace ucp::deepspeed
