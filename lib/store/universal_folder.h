// DeepSpeed's own universal checkpoint folders (ds_to_universal.py's output, universal_checkpoint_version
// 0.2 to 0.4) read as atomic checkpoints of the .pt store, read-only, without a ucp manifest: a user
// who converted with DeepSpeed inspects and reshards that folder without converting again.
//
// Such a folder is the .pt store's layout (zero/<param>/{fp32,exp_avg,exp_avg_sq[,step]}.pt,
// zero/optimizer_state.pt) beside the source's model-states files, which DeepSpeed copied. What ucp's
// manifest would say is derived from them, as ucp-convert derives it from a source:
//   - the layout (dp, tp, pp, ZeRO stage, dtype, iteration, DeepSpeed release) from rank 0's
//     model-states file (Megatron's args, ds_config, dp_world_size, mp_world_size);
//   - each parameter's optimizer group and order from the model-states files' param_shapes (every
//     stage's: a pipeline's tied module sits on its first and last stage), its shape from its fp32.pt;
//   - its pattern by the rules ucp-convert uses (patterns/resolve.h): the checkpoint's own
//     universal_checkpoint_info, filled in by the model family's rules. DeepSpeed's cat_dim keys are
//     not trusted: from a TP=1 source they are 0 for row-parallel weights too (DESIGN.md section 2).
// DeepSpeed wrote no XXH64 of its files: every file is checked by the CRC-32 its zip keeps for each
// record (FileRecord::zip_crc32), where ucp checks a manifest's XXH64.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace ucp::store {

// A folder with zero/optimizer_state.pt, a model-states file and no ucp manifest.
bool IsDeepSpeedUniversal(const std::string& dir);

// The manifest ucp-convert would have written for the folder (schemas/manifest.schema.json, with
// "checksum": "zip-crc32" and "deepspeed_universal": true), from metadata and pickles only. Throws
// ucp::Error naming the file for anything missing, unreadable or inconsistent.
nlohmann::json DescribeDeepSpeedUniversal(const std::string& dir);

// The manifest of an atomic checkpoint folder: ucp's own (ReadManifest), else a DeepSpeed universal
// folder's description; throws as ReadManifest does for a folder that is neither.
nlohmann::json ReadAtomicManifest(const std::string& dir);

}  // namespace ucp::store
