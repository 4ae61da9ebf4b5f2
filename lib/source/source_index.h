// What a source driver (formats/) finds in a checkpoint folder, in terms no stage after it needs a
// format to read: the layout's degrees, the shard files at their (pp, tp, dp) coordinates, every
// parameter with its per-TP-rank shape, every piece of every parameter as a run of elements inside
// a file's flat optimizer groups (located by byte offsets), the model facts and the checkpoint's
// own pattern rules, and diagnostics. Map, union, plan and store read only this.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "pt/value.h"
#include "source/job_files.h"

namespace ucp::source {

// A contiguous run of little-endian float32 inside a file: bytes [offset, offset + 4 * numel) of
// the file that lists it, or of SourceIndex::files[file] when that is set (an optimizer without
// master weights of its own, whose fp32 values are the model's weights in another file).
struct Extent {
  uint64_t offset = 0;
  int64_t numel = 0;
  int file = -1;
};

// A byte range of a file that its container checksums: a zip record's payload and the CRC-32 the
// central directory keeps for it. Every tensor byte a mapper reads lies in one and is checked
// against it before it is used.
struct ChecksummedRange {
  std::string name;  // the record's name inside the file
  uint64_t offset = 0, size = 0;
  uint32_t crc32 = 0;
};

struct ShardFile {
  std::string name;
  std::string kind;        // the driver's word for it ("optimizer_states", "model_states", ...)
  bool data = false;       // holds flat optimizer groups (fragments point into it)
  bool carried = false;    // copied as it is into the atomic checkpoint (what its loader reads besides the tensors)
  bool per_dp = false;     // one per DP rank (its dp coordinate means something)
  int pp = 0, tp = 0, dp = 0;
  int layer = -1;          // a layer's file: its layer spec; an expert's file: its MoE layer's ordinal
  int expert = -1;         // an expert's file: the global expert id
  // data files: per slot, where its fp32 master weights, exp_avg and exp_avg_sq lie. A slot is a
  // param group's flat partition (ZeRO), or one parameter's tensors (a torch optimizer's state by
  // position, without ZeRO).
  std::vector<std::array<Extent, 3>> groups;
  std::vector<ChecksummedRange> checksummed;  // by offset: where its tensor bytes lie and their checksums
};

struct ParamRecord {
  std::string name;
  int group = -1;                                // optimizer param group
  std::map<int, std::vector<int64_t>> tp_shape;  // TP rank -> this rank's shape
  std::set<int> stages;                          // PP stages that hold it
  // Mixture of Experts: an expert's parameter, under its global expert id, held whole by one
  // expert-parallel rank (the Expert pattern: EP is the expert axis); -1 for every other parameter.
  // An expert is not split over TP: its tp_shape has tp 0 only, and its fragments, in files at any
  // TP rank (an expert-parallel group spans TP ranks), are pieces of that one tensor.
  int expert = -1, ep_rank = -1;
  // DeepSpeed 0.19's AutoEP: one fused tensor of every expert of an MoE layer, [experts, ...], each
  // expert-parallel rank holding a run of experts along dim 0 (its [local experts, ...]): the number
  // of experts; 0 for every other parameter. Whole like an expert: tp_shape at tp 0, the full shape;
  // a fragment's elements are those of the full tensor (the EP rank's run offset included).
  int64_t fused_experts = 0;
  bool WholeOverTp() const { return expert >= 0 || fused_experts > 0; }
};

// A run of one parameter's elements inside one data file's flat partition of a param group:
// flat[src_start, src_start + numel) holds elements [dst_start, dst_start + numel) of the
// parameter's TP-local tensor (flattened) at this file's (pp, tp).
struct Fragment {
  int file = -1;  // index into SourceIndex::files
  int group = 0;  // the slot of the file that holds it (ShardFile::groups)
  int param = -1;  // index into SourceIndex::params
  int64_t src_start = 0, numel = 0, dst_start = 0;
};

// A parameter's weight as the model keeps it besides the optimizer's fp32 master (DeepSpeed's module
// in a model-states or layer file, in the training dtype): its TP-local tensor at (pp, tp), contiguous
// at byte `offset` of files[file]. The two are one value stored twice: the master rounded to the
// copy's dtype must give the copy (map/weight_copies.h checks it).
struct WeightCopy {
  int param = -1;  // index into SourceIndex::params
  int pp = 0, tp = 0;
  int file = -1;   // index into SourceIndex::files, or past its end into SourceIndex::copy_files
  uint64_t offset = 0;
  int64_t numel = 0;
  pt::DType dtype = pt::DType::F32;  // F32, BF16 or F16
  // Off a grid (a DCP, whose fragments place global tensors): the copy holds elements
  // [slot_start, slot_start + numel) of slot `slot_group` of data file `slot_file`, in the slot's own
  // order, rather than a TP-local tensor; -1: on the grid, as above.
  int slot_file = -1, slot_group = -1;
  int64_t slot_start = 0;
};

struct SourceIndex {
  std::string format;  // the source driver that read it (formats/registry.h)
  std::string root;    // the folder named by the user
  std::string dir;     // the folder holding the shard files (root/<tag> when root has `latest`)
  std::string tag;
  std::string framework;  // the driver's variant: "megatron-deepspeed", "deepspeed"
  std::string optimizer;  // the optimizer that wrote the states: "zero", "bf16_optimizer", "zero3", "torch" (no ZeRO)
  bool state_in_buckets = false;  // off a grid: the state saved as Megatron's distributed optimizer's gradient buckets, not per parameter
  int zero_stage = 0;
  std::string dtype;  // training dtype: fp16, bf16, fp32
  // dp counts the ranks ZeRO partitions over and the files are numbered by: DP x SP under DeepSpeed
  // Ulysses sequence parallelism (DeepSpeed's dp_world_size, the sequence-data-parallel group).
  int dp = 1, tp = 1, pp = 1;
  // Whether the files sit on that (pp, tp, dp) grid; false: each file holds chunks of global tensors
  // (a PyTorch Distributed Checkpoint), the degrees 1 and meaningless.
  bool on_grid = true;
  // Off a grid: the ranks that wrote the data files, as their names show (1 + the highest rank of the
  // __<rank>_<n>.distcp files a DCP's .metadata places chunks in; a lower bound of the saving job's world,
  // ranks with nothing to save write none); 0 unknown.
  int files_world = 0;
  int sp = 1;                // Ulysses sequence-parallel degree, dividing dp; 1 where the files do not say
  bool sp_recorded = false;  // whether the files say it (Megatron args' ds_sequence_parallel_size)
  int DataParallel() const { return dp / sp; }  // DP alone, without SP
  bool moe = false;  // Mixture of Experts: expert parameters, each under its global expert id
  int ep = 1;        // expert parallelism: experts split over ep ranks, each replicated dp / ep times
  int64_t iteration = 0;
  std::string ds_version;  // the writer's version, as the files record it
  std::string grad_accum_dtype;  // the configured gradient-accumulation dtype; empty: the checkpoint does not say
  std::string naming;      // "pipe" (layer files; GPTModelPipe names) or "plain"
  JobFiles job;            // the training framework's files beside the tag (Hugging Face Trainer's), carried
  std::vector<ShardFile> files;
  std::vector<ParamRecord> params;  // in first-seen order: stage, group, position
  std::vector<Fragment> fragments;  // every data file's pieces of every parameter
  std::vector<WeightCopy> weight_copies;  // the weights stored besides their fp32 masters, where the format keeps them
  // Files outside the shard folder that hold only weight copies (a Trainer folder's model.safetensors,
  // gathered at a ZeRO-3 save), by path: a WeightCopy whose file is files.size() + i is in copy_files[i].
  std::vector<std::string> copy_files;
  std::map<std::tuple<int, int, int>, pt::ValuePtr> steps;  // (pp, tp, group) -> step, from dp rank 0
  // The checkpoint's own pattern rules, in the universal_checkpoint_info form the atomic checkpoint
  // keeps (patterns/rules.h reads it), or nullptr.
  pt::ValuePtr universal_checkpoint_info;
  std::map<std::string, int64_t> model_facts;  // integer model hyper-parameters (hidden_size, ...)
  pt::ValuePtr args;                           // Megatron's args (an argparse.Namespace), or nullptr
  std::string args_file;                       // a carried file holding them that DeepSpeed does not load (Megatron-Core's common.pt), or empty
  // The file args_file names, where ucp-convert writes it rather than carrying a file of the source
  // (Megatron-LM's legacy rank files hold the model's tensors too): {args, iteration, ...}; or nullptr.
  pt::ValuePtr args_state;
  // The non-sharded optimizer state (zero/optimizer_state.pt: param_groups, ...) where the driver
  // reads it itself; nullptr: taken from the optimizer file at (pp=0, tp=0, dp=0), as DeepSpeed's is.
  pt::ValuePtr optimizer_state;
  pt::ValuePtr model_states;                   // a model source's (Hugging Face's) synthesized rank-0 model-states file, carried
  std::shared_ptr<const void> keep_alive;      // what the values above point into
  int64_t zero_padding_elements = 0;           // alignment padding over all data files
  std::vector<std::string> errors;    // unreadable, malformed or unsupported input: always fatal
  std::vector<std::string> problems;  // inconsistencies: fatal under --strict
  std::vector<std::string> notes;     // what was found that the user may want to know

  const ParamRecord* Find(const std::string& name) const;
  // The TP rank of the copy a fragment is a piece of: its file's, or 0 for a parameter whole over TP
  // (an expert, fused experts: ParamRecord::WholeOverTp).
  int CopyTp(const Fragment& fr) const { return params[fr.param].WholeOverTp() ? 0 : files[fr.file].tp; }
  int64_t Fact(const std::string& key) const;  // -1 when unknown
};

// The Megatron args' model facts (num_layers, hidden_size, seq_length, ...) and Ulysses degree
// (ds_sequence_parallel_size, which must divide the dp already read) into `L`; a degree that does
// not divide is a problem. Without it (no args, or args of a job without SP) SP stays 1,
// unrecorded, and where dp > 1 a note says that dp counts DP x SP ranks.
void TakeMegatronArgs(const pt::Value* args, SourceIndex& L);
// The layout Megatron-LM's args say the job ran ("TP=2, PP=1, DP=2 (its args)", with EP and CP where
// above 1; "DP >= 4" and said so where the args record no DP), or "" without args: what a source off a
// grid (Megatron-Core's global tensors) tells of the job.
// `files_world`: the ranks the files show (SourceIndex::files_world), 0 unknown.
std::string MegatronLayout(const pt::Value* args, int files_world = 0);
// The same degrees by name (tp, pp, dp, ep, cp), each where the args give it: DP as data_parallel_size,
// or, in args no launch validated, world_size / (TP x PP x CP) where EP divides it, world_size is not
// parse_args' default 1 and the files show no more ranks than it. "dp_recorded" 1 then; 0 where the
// args record no DP, `dp` then the least the files show (files_world / (TP x PP x CP), rounded up), or
// absent where they show none.
std::map<std::string, int64_t> MegatronDegrees(const pt::Value* args, int files_world = 0);
// The Megatron-LM args a source carries (Megatron-Core's common.pt, a legacy rank file's), or null.
const pt::Value* MegatronArgsOf(const SourceIndex& L);
// Megatron-LM's saved args (an argparse.Namespace; null: none saved), read one way everywhere: an
// integer arg (`otherwise` where it is absent or None), and whether an arg is set (ArgIsSet: present
// and not its off value None, False, 0 or 0.0).
int64_t ArgInt(const pt::Value* args, const char* key, int64_t otherwise);
bool ArgSet(const pt::Value* args, const char* key);
bool ArgIsSet(const pt::Value* value);
// How inspect and convert say the data-parallel degrees: "dp=2 sp=2" where SP is recorded, else "dp=4".
std::string DataParallelDegrees(const SourceIndex& L);
// The layout in words, as ucp-convert's banner and ucp-inspect say it: the (dp, sp, tp, pp, ep) grid
// with ZeRO stage, optimizer and dtype, or, off a grid, the chunked global tensors.
std::string LayoutWords(const SourceIndex& L);
// A shard file's place in the grid, as errors say it: "(pp=0, tp=1, dp=2)".
std::string Coord(const ShardFile& f);
// A shard file as errors name it: its path and its place, "DIR/NAME (pp=0, tp=1, dp=2)" (off a grid:
// its path alone).
std::string FileWhere(const SourceIndex& L, int file);

struct IndexOptions {
  bool verify_storage_crc = false;  // read every tensor byte and check the container's checksums
  // Facts of the model the checkpoint does not hold (ucp-reshard's --model-config, for a source that
  // describes its model through them: another family's atomic checkpoint): the file and its bytes.
  std::string model_config_path, model_config_text;
  bool weights_only = false;  // the fp32 weights alone are asked for: no optimizer state read or checked
};

// The file ucp-reshard --in-place leaves in a checkpoint folder it wrote (the source tag, the atomic
// checkpoint and the layout): not part of the checkpoint.
inline constexpr const char* kReshardMarker = "ucp_reshard.json";

// A fingerprint of a checkpoint folder's files, to tell whether an atomic checkpoint was converted
// from what the folder holds now: XXH64 over the sorted regular files (their names, sizes and the
// XXH64 of their last 64 KiB, where a zip keeps its central directory with every entry's CRC-32),
// ucp's own marker files left out. Same bytes, same fingerprint, wherever the folder was copied.
std::string FolderFingerprint(const std::string& dir);

// The tag root/latest names (trimmed, a plain name), as a framework's --load reads it. Throws
// ucp::Error naming the file when it is missing, unreadable or not a plain name.
std::string ReadLatestTag(const std::string& root);

// A folder without `latest` whose sub-folders hold DeepSpeed's shard files (*model_states.pt,
// *optim_states.pt): a checkpoint root whose `latest` is gone (deleted, not copied), which nothing may
// read as another format. Those sub-folders' names, sorted; empty where `latest` exists or none does.
std::vector<std::string> TagFoldersWithoutLatest(const std::string& root);
// The refusal of such a root: the tags named, and how to say which one to read.
std::string TagWithoutLatestError(const std::string& root, const std::vector<std::string>& tags);

}  // namespace ucp::source
