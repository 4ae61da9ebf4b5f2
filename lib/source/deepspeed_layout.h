// Index of a DeepSpeed / Megatron-DeepSpeed checkpoint folder: which shard files exist at which
// (pp, tp, dp) coordinates, the layout they were written with (from metadata, cross-checked with
// the files present), and every parameter's per-TP-rank shape. Reads pickles only; tensor bytes
// stay unread in the mapped files.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "pt/torch_file.h"
#include "source/deepspeed_names.h"

namespace ucp::source {

struct ShardFile {
  std::string name;
  FileKind kind;
  int pp = 0, tp = 0, dp = 0, mp = 0;  // mp = pp * TP + tp, as DeepSpeed names files
  int layer = -1;                      // layer files
  // mp_rank_XX_model_states.pt or zero_pp_rank_X_mp_rank_XX_model_states.pt: what DeepSpeed's
  // universal loader reads besides the atomic tensors (ucp-convert carries them over).
  bool model_states() const { return kind == FileKind::ModelStates || kind == FileKind::Zero3ModelStates; }
};

struct ParamRecord {
  std::string name;
  int group = -1;                                // optimizer param group
  std::map<int, std::vector<int64_t>> tp_shape;  // TP rank -> this rank's shape
  std::set<int> stages;                          // PP stages that hold it
};

// A run of one parameter's elements inside one optimizer file's flat partition of a param group:
// flat[src_start, src_start + numel) holds elements [dst_start, dst_start + numel) of the
// parameter's TP-local tensor (flattened) at this file's (pp, tp).
struct Fragment {
  int file = -1;  // index into SourceLayout::files
  int group = 0;
  int param = -1;  // index into SourceLayout::params
  int64_t src_start = 0, numel = 0, dst_start = 0;
};

// The flat fp32 tensors of one param group in an optimizer file: the master weights and Adam's
// moments, all with the same element layout, plus the group's step.
struct FlatGroup {
  pt::TensorView fp32, exp_avg, exp_avg_sq;
  pt::ValuePtr step;  // 0-dim tensor or number; nullptr when absent
};
// Where ZeRO-1/2 (single_partition_of_fp32_groups + base_optimizer_state) or ZeRO-3
// (fp32_flat_groups + optimizer_state_dict) keep them. Throws ucp::Error naming the missing key.
std::vector<FlatGroup> FlatGroupsOf(const pt::Value& file_root, int zero_stage);

struct SourceLayout {
  std::string root;  // the folder named by the user
  std::string dir;   // the folder holding the shard files (root/<tag> when root has `latest`)
  std::string tag;
  std::string framework;  // "megatron-deepspeed" (has Megatron args) or "deepspeed"
  std::string optimizer;  // "zero" (DeepSpeedZeroOptimizer), "bf16_optimizer", "zero3"
  int zero_stage = 0;
  std::string dtype;  // training dtype: fp16, bf16, fp32
  int dp = 1, tp = 1, pp = 1;
  int64_t iteration = 0;
  std::string ds_version;
  std::string naming;  // "pipe" (layer files; GPTModelPipe names) or "plain"
  std::vector<ShardFile> files;
  std::vector<ParamRecord> params;  // in first-seen order: stage, group, position
  std::vector<Fragment> fragments;  // every optimizer file's pieces of every parameter
  std::map<std::tuple<int, int, int>, pt::ValuePtr> steps;  // (pp, tp, group) -> step, from dp rank 0
  std::shared_ptr<pt::TorchFile> first_model_file;  // keeps universal_checkpoint_info and args alive
  pt::ValuePtr universal_checkpoint_info;           // or nullptr
  pt::ValuePtr args;                                // Megatron args Namespace, or nullptr
  int64_t zero_padding_elements = 0;                // ZeRO alignment padding over all files
  std::vector<std::string> errors;    // unreadable or malformed files: always fatal
  std::vector<std::string> problems;  // inconsistencies: fatal under --strict
  std::vector<std::string> notes;     // what was found that the user may want to know

  const ParamRecord* Find(const std::string& name) const;
};

struct IndexOptions {
  bool verify_storage_crc = false;  // read every tensor byte and check the zip CRC32
};

// Throws ucp::Error when `dir` is not a DeepSpeed checkpoint at all; everything else is recorded in
// errors / problems so that one run reports all of it.
SourceLayout IndexDeepSpeedCheckpoint(const std::string& dir, const IndexOptions& options = {});

// The file ucp-reshard --in-place leaves in a checkpoint folder it wrote (the source tag, the atomic
// checkpoint and the layout): not part of the checkpoint.
inline constexpr const char* kReshardMarker = "ucp_reshard.json";

// A fingerprint of a checkpoint folder's files, to tell whether an atomic checkpoint was converted
// from what the folder holds now: XXH64 over the sorted regular files (their names, sizes and the
// XXH64 of their last 64 KiB, where a zip keeps its central directory with every entry's CRC-32),
// ucp's own marker files left out. Same bytes, same fingerprint, wherever the folder was copied.
std::string FolderFingerprint(const std::string& dir);

// The tag root/latest names (trimmed, a plain name), as DeepSpeed's --load reads it. Throws
// ucp::Error naming the file when it is missing, unreadable or not a plain name.
std::string ReadLatestTag(const std::string& root);

// Is `dir` (or dir/<latest>) a DeepSpeed checkpoint folder?
bool LooksLikeDeepSpeedCheckpoint(const std::string& dir);

}  // namespace ucp::source
