// The atomic checkpoint on disk (DESIGN.md section 4): DeepSpeed's universal layout
// zero/<param>/{fp32,exp_avg,exp_avg_sq,step}.pt plus zero/optimizer_state.pt and the carried-over
// model-states files, committed by ucp_manifest.json (schemas/manifest.schema.json), which lists
// every file with its size and XXH64 and is written last. A run in progress keeps a journal of the
// files it has committed, so that --resume can skip what is verified done.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/file_descriptor.h"
#include "patterns/resolve.h"
#include "plan/convert_plan.h"
#include "pt/value.h"

namespace ucp::store {

inline constexpr const char* kManifestName = "ucp_manifest.json";
inline constexpr const char* kJournalDir = ".ucp-journal";
inline constexpr int kFormatVersion = 1;

struct FilePart {
  uint64_t offset = 0, bytes = 0, xxh64 = 0;
};

struct FileRecord {
  std::string path;  // relative to the atomic folder
  uint64_t bytes = 0, xxh64 = 0;
  // A file of a DeepSpeed universal folder (no ucp manifest, universal_folder.h): checked by the
  // CRC-32 of every record of its zip instead of an XXH64 it never had.
  bool zip_crc32 = false;
  // A file several ranks wrote in parts (a split item's state file): the XXH64 of each part, the
  // parts tiling the file in order, so that no rank reads the whole file back to hash it; such a
  // record has no whole-file `xxh64` (the bytes do not depend on the rank count; the parts do).
  std::vector<FilePart> parts = {};
  // Why `file` (the whole file's bytes) is not what this record says; "" when it is.
  std::string Mismatch(std::span<const uint8_t> file) const;
  nlohmann::json ToJson() const;
  static FileRecord FromJson(const nlohmann::json& j);  // throws ucp::Error (parts that do not tile the file)
};


// "zero/<name>"; throws ucp::Error for a name that could leave zero/ or is not a plain file name.
std::string ParamRelDir(const std::string& name);
std::string StateRelPath(const std::string& name, plan::State state);  // zero/<name>/<state>.pt
std::string StepRelPath(const std::string& name);                      // zero/<name>/step.pt

// A contiguous float32 tensor over memory the Value keeps alive.
pt::ValuePtr FloatTensor(std::shared_ptr<float[]> data, const std::vector<int64_t>& shape);

// The keys DeepSpeed's universal loader reads beside 'param' in zero/<name>/<state>.pt, as data:
// 'cat_dim', 'param_n_sub_params', 'sub_param_shape' (SubparamShape(patterns, shape,
// partition_dim)) and 'vocab_tensor', as ds_to_universal.py writes them for the parameter's model
// pattern. The .pt store writes them into every state file, the HDF5 store keeps them as
// attributes, so that either store gives back the other's files byte for byte.
struct UniversalKeys {
  struct SubParamShape {
    std::vector<std::string> patterns;
    std::vector<int64_t> sizes;  // along partition_dim; the other dims are the full shape's
    int64_t partition_dim = 0;
    bool operator==(const SubParamShape&) const = default;
  };
  std::optional<int64_t> cat_dim, param_n_sub_params;
  std::optional<SubParamShape> sub_param_shape;
  bool vocab_tensor = false;
  // DeepSpeed's ZeRO-3 form: no dict, the state file is the bare 1-D tensor of this many elements,
  // the parameter as the source held it (the vocabulary padding rows, zeros here, at its end), which
  // is what DeepSpeed's ZeRO-3 universal loader reads (torch.load(...).view(-1)).
  std::optional<int64_t> bare_numel;
  // AutoEP's fused experts (DeepSpeed's autoep_universal): 'param' first, then cat_dim 0,
  // is_expert_param True and ep_num_experts, this many.
  std::optional<int64_t> ep_num_experts;
  bool operator==(const UniversalKeys&) const = default;
};
// The keys of a parameter: ds_to_universal.py's dict for ZeRO 0-2 sources (`zero_stage` < 3), its
// bare ZeRO-3 form of `source_numel` elements for ZeRO-3 sources.
UniversalKeys UniversalKeysOf(const patterns::ParamPattern& pattern);
UniversalKeys UniversalKeysOf(const patterns::ParamPattern& pattern, int zero_stage, int64_t source_numel);

// The value of zero/<name>/<state>.pt: the dict of the keys above, 'param' last; in the ZeRO-3 form
// the tensor itself, 1-D, zeros after the parameter's elements.
pt::ValuePtr StateFileValue(const UniversalKeys& keys, const std::vector<int64_t>& full_shape, pt::ValuePtr tensor);
pt::ValuePtr StateFileValue(const patterns::ParamPattern& pattern, pt::ValuePtr tensor);
// The keys of a state file's dict; throws ucp::Error unless StateFileValue gives back exactly that
// dict (same keys, order and values), which is what makes a store conversion lossless.
UniversalKeys UniversalKeysOfStateFile(const pt::Value& root, const std::vector<int64_t>& full_shape);

// The non-sharded optimizer state (zero/optimizer_state.pt) from the (pp=0, tp=0, dp=0) optimizer
// file's root, as ds_to_universal.py derives it.
pt::ValuePtr OptimizerStateValue(const pt::Value& optimizer_file_root, int zero_stage);

// DeepSpeed's load_universal finds the atomic checkpoint `dir` through <parent>/latest_universal,
// which names it; written atomically, after the manifest. Staged: opened and written under a
// temporary name before the manifest (a parent folder that takes no file fails the run before its
// commit point, leaving no manifest), renamed by its Commit() after it.
std::unique_ptr<AtomicFile> StageLatestUniversal(const std::string& dir);
void WriteLatestUniversal(const std::string& dir);

// A byte-for-byte copy of a file, written atomically; a reflink where the file system has them
// (AtomicFile::Clone), the bytes then read only to be checked and hashed. `records` (by offset, as ShardFile::checksummed): the zip records
// whose CRC-32 the bytes are checked against as they are read; one that differs, or that the file
// ends inside, throws naming the file and the record, and nothing is left under `rel`; so does a
// file that changes while it is copied (its size, times or inode).
FileRecord CopyFileAtomically(const std::string& from, const std::string& to_dir, const std::string& rel,
                              Durability durability = Durability::Now,
                              const std::vector<source::ChecksummedRange>& records = {});

// Resume journal: <out>/.ucp-journal/{run.json, rank-<r>.jsonl}.
class Journal {
 public:
  // Starts a fresh journal recording `fingerprint` (rank 0, before any data is written).
  static void Start(const std::string& out_dir, const std::string& fingerprint);
  // The files committed by an interrupted run with the same fingerprint; throws ucp::Error when the
  // journal is absent or belongs to another source or plan.
  static std::map<std::string, FileRecord> Load(const std::string& out_dir, const std::string& fingerprint);
  static void Remove(const std::string& out_dir);

  Journal(const std::string& out_dir, int rank);
  void Append(const FileRecord& record);  // thread-safe

 private:
  Fd fd_;
  std::mutex mu_;
};

// Whether `record` is on disk with its size and checksum (its XXH64, or every zip record's CRC-32).
bool Verify(const std::string& dir, const FileRecord& record, std::string* why = nullptr);

// What identifies a conversion: the source files (names, sizes, mtimes), the resolved patterns and
// the format version. A resume must see the same.
std::string Fingerprint(const source::SourceIndex& layout, const patterns::ModelPatterns& patterns);

// The manifest, in parts. "source" and "family" of a conversion; each parameter's metadata (every
// field of its "params" entry but where its tensors are: "files" in the .pt store, "hdf5" in the
// HDF5 store).
nlohmann::json SourceJson(const source::SourceIndex& layout, const patterns::ModelPatterns& patterns);
// The facts of the job SourceJson records (tag, layout, precision, optimizer, naming), without the
// fingerprint and paths: what a target is resolved against before the conversion that will record them.
nlohmann::json JobJson(const source::SourceIndex& layout);
nlohmann::json FamilyJson(const patterns::ModelPatterns& patterns);
nlohmann::json ParamMetaJson(const source::SourceIndex& layout, const patterns::ParamPattern& pattern,
                             const plan::ParamPlan& param);
// The whole manifest: `store` is "pt" or "hdf5"; `params` the entries in order (metadata plus
// storage); `files` maps relative path -> record, for every file of the atomic folder.
nlohmann::json AssembleManifest(const std::string& store, const nlohmann::json& source, const nlohmann::json& family,
                                const nlohmann::json& params, const std::map<std::string, FileRecord>& files);
nlohmann::json ReadManifest(const std::string& dir);  // throws ucp::Error
bool IsAtomicCheckpoint(const std::string& dir);       // has a manifest
// A folder ucp-convert was writing when it stopped (killed, or refused its source): a journal and no
// manifest. Its ranks may have written model-states files and zero/ already; it is no checkpoint.
bool IsUnfinishedConversion(const std::string& dir);

// The model-states file of rank 0 that a conversion carried over (its path in the folder), or ""
// when the source had none (a PyTorch Distributed Checkpoint). The manifest's source.model_states;
// in manifests of earlier builds, the first top-level *model_states.pt of its files by name
// (mp_rank_00_model_states.pt, or under ZeRO-3 zero_pp_rank_0_mp_rank_00_model_states.pt).
std::string CarriedModelStates(const nlohmann::json& manifest);

}  // namespace ucp::store
