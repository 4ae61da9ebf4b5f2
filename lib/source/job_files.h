// The files a training framework keeps beside the checkpoint it had DeepSpeed save: Hugging Face
// Trainer's `checkpoint-N/` holds DeepSpeed's tag folder and `latest`, and its own state
// (trainer_state.json, scheduler.pt, training_args.bin, one rng_state_<rank>.pth per process,
// config.json, generation_config.json, the tokenizer's files, zero_to_fp32.py). They belong to the
// checkpoint: ucp-convert carries them into the atomic checkpoint (job/<name>), ucp-reshard writes
// them beside the new layout's tag, each process's RNG file by the rule of RngFilesFor.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace ucp::source {

// Where the atomic checkpoint keeps them: job/<name>.
inline constexpr const char* kJobFolder = "job";

struct JobFiles {
  // "hf-trainer": Trainer's checkpoint-N (trainer_state.json beside `latest`); "hf": a model's
  // config.json beside `latest` only; empty: none (a Megatron-DeepSpeed root).
  std::string kind;
  std::vector<std::string> carried;  // file names in the root, sorted
  // Model weight files beside the tag (model.safetensors, its shards and index, pytorch_model*.bin):
  // a copy of the weights the tag holds, in the model's dtype. Not carried: `--format hf` writes them.
  std::vector<std::string> weights;
  int rng_world = 0;  // the processes the rng_state files are of (0: none); the index sets DeepSpeed's world
  int64_t global_step = -1;  // trainer_state.json's global_step (-1: none)
  bool state_missing = false;  // a Trainer folder (training_args.bin) without trainer_state.json: not recorded
  // ucp-reshard --in-place wrote a tag here (a folder holding its marker): `latest` may name that tag,
  // and RNG files it added for a larger world may outnumber the processes of the tag `latest` names.
  bool resharded_in_place = false;
  // Where they are, when it is not the index's root: the folder around a tag folder given itself.
  // Not recorded (the manifest's source.path is the folder given).
  std::string root;

  bool empty() const { return kind.empty(); }
  nlohmann::json ToJson() const;  // the manifest's source.job
  static JobFiles FromJson(const nlohmann::json& job);  // {} for a manifest without it
};

// The framework's files in `root`, the folder that holds `latest` and the tag folder `tag`; none
// when root is the tag folder itself or holds neither trainer_state.json nor config.json. Throws
// ucp::Error naming trainer_state.json when it is no JSON object.
JobFiles FindJobFiles(const std::string& root, const std::string& tag);

// What disagrees between the framework's files and DeepSpeed's, each a sentence naming the file:
// rng_state files for another number of processes than the checkpoint's `world`, trainer_state.json's
// global_step against the files' global_steps (`iteration`), the tag (`latest`) and the folder's
// name (checkpoint-<global_step>).
std::vector<std::string> JobFileProblems(const JobFiles& job, const std::string& root, const std::string& tag, int world,
                                         int64_t iteration);

// Trainer's RNG file of process `rank` in a job of `world` processes: rng_state_<rank>.pth, or
// rng_state.pth when it runs alone.
std::string RngFileName(int rank, int world);
bool IsRngFile(const std::string& name);

// The new job's RNG files from the old job's: every process of the new job gets a file, its own
// where that rank existed, else the state of rank (r mod old world): (new file, source file).
std::vector<std::pair<std::string, std::string>> RngFilesFor(int from_world, int to_world);

}  // namespace ucp::source
