// Indexing a DeepSpeed checkpoint, step by step: its files found and placed on the (pp, tp, dp) grid
// (shard_files.h), the model-states file's metadata and degrees (model_states.h), the parameters and
// their shapes (params.h), the optimizer files' fragments (zero_partitions.h; without ZeRO,
// torch_optimizer.h), experts (experts.h), the fragments checked as a whole (coverage.h), what the
// files repeat (redundancy.h), and a training framework's files beside the tag.
#include "formats/deepspeed/index.h"

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "core/format.h"
#include "formats/deepspeed/coverage.h"
#include "formats/deepspeed/experts.h"
#include "formats/deepspeed/model_states.h"
#include "formats/deepspeed/params.h"
#include "formats/deepspeed/redundancy.h"
#include "formats/deepspeed/shard_files.h"
#include "formats/deepspeed/zero_partitions.h"
#include "source/job_files.h"

namespace ucp::deepspeed {
namespace fs = std::filesystem;
using source::ShardFile;
using source::SourceIndex;

namespace {

// The zip CRC-32 of every record a mapper may read, or a copy passes on, of every file read; a file
// the conversion carries over is read as well: checked as it is copied.
void RecordChecksums(SourceIndex& L, ShardReader& reader) {
  for (const auto& f : L.files)
    if (f.carried) reader(f);
  for (auto& f : L.files)
    if (auto it = reader.read().find(f.name); it != reader.read().end() && it->second)
      for (const auto& [name, e] : it->second->archive->entries())
        f.checksummed.push_back({name, e.data_offset, e.size, e.crc32});
  for (auto& f : L.files)
    std::sort(f.checksummed.begin(), f.checksummed.end(),
              [](const source::ChecksummedRange& a, const source::ChecksummedRange& b) { return a.offset < b.offset; });
}

// A missing file first: most of what else is wrong follows from it (one fault, one error: the tools
// that stop at the first problem name it).
void PutMissingFilesFirst(SourceIndex& L) {
  std::stable_partition(L.problems.begin(), L.problems.end(), [](const std::string& p) { return p.rfind("missing rank file", 0) == 0; });
}

// The framework's files beside the tag (source/job_files.h: Hugging Face Trainer's checkpoint-N),
// checked against DeepSpeed's files and carried by the conversion.
void TakeJobFiles(SourceIndex& L) {
  // The tag folder itself given: its root is the folder around it when that one's `latest` names it
  // (a Trainer checkpoint-N's global_stepN), whose files belong to it just the same.
  std::string root = L.root;
  if (L.dir == L.root) {
    const fs::path parent = fs::path(L.dir).lexically_normal().parent_path();
    std::error_code ec;
    std::string named;
    try {
      if (fs::exists(parent / "latest", ec)) named = source::ReadLatestTag(parent.string());
    } catch (const Error&) {
    }
    if (named.empty() || named != fs::path(L.dir).lexically_normal().filename().string()) return;
    root = parent.string();
  }
  L.job = source::FindJobFiles(root, L.tag);
  if (L.job.empty()) return;
  if (root != L.root) L.job.root = root;
  // A Hugging Face job runs no Megatron: the notes on Megatron's args and Ulysses degree say nothing of it.
  std::erase_if(L.notes, [](const std::string& n) { return n.rfind("no Megatron args", 0) == 0 || n.rfind("DP x SP = ", 0) == 0; });
  const int world = L.dp * L.tp * L.pp;
  for (auto& p : source::JobFileProblems(L.job, root, L.tag, world, L.iteration)) L.problems.push_back(std::move(p));
  // The RNG files are of the processes DeepSpeed's files describe: a missing one stays missing (said
  // where a reshard would take it), others an in-place step added are not this tag's.
  if (L.job.rng_world > 0) L.job.rng_world = world;
  const std::string weights = JoinNames(L.job.weights);
  L.notes.push_back(std::string(L.job.kind == "hf-trainer" ? "a Hugging Face Trainer checkpoint" : "a Hugging Face model's checkpoint") +
                    (root != L.root ? " (" + root + ", whose latest names this folder)" : "") + ": its " +
                    std::to_string(L.job.carried.size()) + " files beside " + L.tag + " are carried (job/)" +
                    (weights.empty() ? "" : "; " + weights + " not: a copy of the weights " + L.tag + " holds (--format hf writes it)"));
}

}  // namespace

bool LooksLikeCheckpoint(const std::string& dir) {
  if (!source::TagFoldersWithoutLatest(dir).empty()) return true;  // a root whose `latest` is gone: indexing it says so
  try {
    std::string tag;
    ResolveShardDir(dir, &tag);
    return true;
  } catch (const Error&) {
    return false;
  }
}

SourceIndex IndexCheckpoint(const std::string& dir, const source::IndexOptions& options) {
  SourceIndex L;
  L.format = "deepspeed";
  L.root = dir;
  L.dir = ResolveShardDir(dir, &L.tag);
  const FileNames names = FindShardFiles(L);
  SaveVariant save = VariantOfFiles(L);
  ShardReader reader(L, options);
  const ParseFile parse = [&reader](const ShardFile& f) { return reader(f); };

  const std::vector<ShardFile*> model_files = ModelStatesFiles(L, save.zero3_files);
  FirstModelStates first = FirstReadable(model_files, parse);
  if (!first.file) return L;  // nothing readable: the errors say why
  L.keep_alive = first.file;
  if (!ReadSaveMetadata(L, first, names, parse, save)) return L;
  if (!SetDegrees(L, first, names, save)) return L;
  if (!CheckFileGrid(L, names, save.zero3_files, !save.expp_optimizer && !save.ddp_wrapper)) return L;  // nothing to index the weights by

  ParamIndex index;
  GroupParams group_params;
  MoeShapes moe_shapes;
  if (!ReadParameters(L, first, model_files, parse, save, index, group_params, moe_shapes)) return L;
  const ZeroPartitions zero = IndexZeroFiles(L, save, index, group_params, moe_shapes, parse);
  if (save.moe && save.expp_optimizer) {
    L.optimizer = "torch";
    IndexMoeWithoutZero(L, moe_shapes, index, parse);
  }
  for (const auto& f : L.files)
    if (KindOf(f) == FileKind::LayerStates) reader(f);  // integrity: every layer file must read
  SettleZeroStage(L, zero, first.config_stage, save.zero3_files);

  L.moe = save.moe;
  if (save.moe) FinishMoe(L, moe_shapes, group_params, first.root());
  if (save.shapes_from_weights || save.ddp_wrapper) PlaceByFragments(L, group_params);
  if (!save.autoep.empty()) FinishAutoEp(L, save.autoep, zero.expert_groups, group_params);
  CheckCoverage(L, group_params, zero.partitions);
  if (save.zero3_files != (L.zero_stage == 3))
    L.problems.push_back("ZeRO-3 model files present but optimizer files say stage " + std::to_string(L.zero_stage));

  RecordChecksums(L, reader);
  PutMissingFilesFirst(L);
  CheckFilesAgree(L, parse);  // what every file repeats: a file of another save or run differs
  RecordWeightCopies(L, parse);  // what the module keeps besides the masters, compared as it is read
  TakeJobFiles(L);
  RecordGatheredWeights(L);  // ZeRO-3's second copy, where the Trainer gathered one beside the tag
  return L;
}

}  // namespace ucp::deepspeed
