#include "reshard/job_output.h"

#include <algorithm>
#include <filesystem>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/format.h"
#include "pt/value.h"
#include "source/job_files.h"

namespace ucp::reshard {
namespace fs = std::filesystem;

namespace {

int64_t ConfigInt(const Source& S, const char* key) {
  auto cfg = S.model_states.root ? S.model_states.root->Get("ds_config") : nullptr;
  auto v = cfg && cfg->kind == pt::Value::Kind::Dict ? cfg->Get(key) : nullptr;
  return v && v->kind == pt::Value::Kind::Int ? v->AsInt() : 0;
}

}  // namespace

std::vector<std::string> JobOutput::names() const {
  std::vector<std::string> out;
  for (const auto& [name, from] : files) out.push_back(name);
  return out;
}

JobOutput PlanJobOutput(const Source& S, const TargetLayout& T, const std::string& root, bool in_place) {
  JobOutput J;
  const source::JobFiles job = source::JobFiles::FromJson(S.manifest["source"].value("job", nlohmann::json()));
  if (job.empty()) return J;
  const std::string folder = std::string(source::kJobFolder) + "/";
  const int to_world = T.SeqDp() * T.tp * T.pp;
  if (!in_place)
    for (const auto& n : job.carried)
      if (!source::IsRngFile(n)) J.files.emplace_back(n, folder + n);
  // Converted with --no-strict from a folder that had lost it: said again where the files are written.
  if (job.kind == "hf-trainer" && std::find(job.carried.begin(), job.carried.end(), "trainer_state.json") == job.carried.end())
    J.notes.push_back("no trainer_state.json is written: the source had none (converted with --no-strict), and Trainer "
                      "resumes from it; without it Trainer starts again at step 0");
  if (job.kind == "hf-trainer" && job.rng_world > 0) {
    std::vector<std::string> copied, lacking;
    for (const auto& [to, from] : source::RngFilesFor(job.rng_world, to_world)) {
      std::error_code ec;
      if (in_place && fs::exists(fs::path(root) / to, ec)) continue;
      if (std::find(job.carried.begin(), job.carried.end(), from) == job.carried.end()) {  // converted with --no-strict
        lacking.push_back(to + " (" + from + ")");
        continue;
      }
      J.files.emplace_back(to, folder + from);
      if (to != from) copied.push_back(to + " <- " + from);
    }
    if (!lacking.empty())
      J.notes.push_back("not written, the source lacks the file it takes: " + JoinNames(lacking) +
                        "; Trainer resumes those processes without restoring their RNG state");
    if (!copied.empty())
      J.notes.push_back("Trainer's RNG files for " + std::to_string(to_world) + " process" + (to_world == 1 ? "" : "es") +
                        ": a rank the job of " + std::to_string(job.rng_world) + " had keeps its own, another rank r takes "
                        "rank (r mod " + std::to_string(job.rng_world) + ")'s: " + JoinNames(copied));
  }
  if (!in_place && !job.carried.empty()) {
    std::vector<std::string> rest;
    for (const auto& n : job.carried)
      if (!source::IsRngFile(n)) rest.push_back(n);
    // (a Hugging Face model's config.json goes with its weights: ucp-convert of this root carries it on,
    // and --format hf writes it back)
    const std::string whose = job.kind == "hf-trainer" ? "Trainer's files" : "the model's files";
    const std::string tag = S.manifest["source"].value("tag", std::string());
    J.notes.push_back(whose + " written beside " + (tag.empty() ? std::string("the new tag") : tag) + " as they were: " +
                      JoinNames(rest));
  }
  if (!in_place && !job.weights.empty())
    J.notes.push_back(JoinNames(job.weights) + " not written: a copy of the weights the tag holds (ucp-reshard ATOMIC "
                      "--format hf writes them)");
  // What the job itself must change to read these files: its ds_config's stage, its precision (a
  // model imported has no job yet to change).
  const auto& src = S.manifest["source"];
  if (S.weights_only) return J;
  if (T.zero_stage != src.value("zero_stage", T.zero_stage))
    J.notes.push_back("the files are ZeRO-" + std::to_string(T.zero_stage) + "'s: the job's ds_config must say "
                      "\"zero_optimization\": {\"stage\": " + std::to_string(T.zero_stage) + "} (it said " +
                      std::to_string(src.value("zero_stage", 0)) + ")");
  if (T.dtype != src.value("dtype", T.dtype))
    J.notes.push_back("the files are " + T.dtype + "'s: the job must train in " + T.dtype +
                      (T.dtype == "fp32" ? " (TrainingArguments without bf16 / fp16)" : " (TrainingArguments " + T.dtype + "=True)") +
                      "; it trained in " + src.value("dtype", std::string("?")));
  const int from_world = S.manifest["source"].value("dp", 1) * S.manifest["source"].value("sp", 1) *
                         S.manifest["source"].value("tp", 1) * S.manifest["source"].value("pp", 1);
  if (std::string batch = GlobalBatchNote(S, from_world, to_world); !batch.empty()) J.notes.push_back(batch);
  return J;
}

void WriteJobOutput(const Source& S, const JobOutput& J, const std::string& root) {
  for (const auto& [name, from] : J.files) {
    const std::string bytes = S.reader->ReadCheckedBytes(from);
    AtomicFile out(root + "/" + name, Durability::Batch, Digest::None);
    out.Write(bytes.data(), bytes.size());
    out.Commit();
  }
}

void RefuseMisnamedCheckpoint(const source::JobFiles& job, const std::string& root, bool in_place) {
  fs::path path = fs::path(root).lexically_normal();
  if (path.filename().empty()) path = path.parent_path();
  const std::string name = path.filename().string(), want = "checkpoint-" + std::to_string(job.global_step);
  if (!in_place && job.kind == "hf-trainer" && job.global_step >= 0 && name.rfind("checkpoint-", 0) == 0 && name != want)
    throw Error(root + ": named " + name + " for the checkpoint of step " + std::to_string(job.global_step) + ": Trainer names it " +
                want + " (and ucp-inspect and ucp-convert refuse another checkpoint-N name for it): -o " +
                (path.parent_path() / want).string());
}

std::string GlobalBatchNote(const Source& S, int from_world, int to_world) {
  const int64_t micro = ConfigInt(S, "train_micro_batch_size_per_gpu"), accum = ConfigInt(S, "gradient_accumulation_steps");
  if (from_world == to_world || micro <= 0 || accum <= 0) return "";
  const int64_t before = micro * accum * from_world, after = micro * accum * to_world;
  std::string keep;
  if (before % (accum * to_world) == 0)
    keep = "per_device_train_batch_size " + std::to_string(before / (accum * to_world));
  if (before % (micro * to_world) == 0)
    keep += (keep.empty() ? "" : " or ") + std::string("gradient_accumulation_steps ") + std::to_string(before / (micro * to_world));
  return "the global batch is per-device batch x gradient accumulation x processes (Trainer fills DeepSpeed's "
         "train_batch_size with it, and DeepSpeed checks the product): with this job's " + std::to_string(micro) + " x " +
         std::to_string(accum) + " it is " + std::to_string(after) + " at " + std::to_string(to_world) + " process" +
         (to_world == 1 ? "" : "es") + ", " + std::to_string(before) + " at the checkpoint's " + std::to_string(from_world) +
         (keep.empty() ? "; no per-device batch or accumulation keeps it exactly" : "; " + keep + " keeps it") +
         " (the learning-rate schedule and trainer_state.json go on by steps either way)";
}

}  // namespace ucp::reshard
