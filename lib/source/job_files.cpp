#include "source/job_files.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>

#include "core/error.h"
#include "core/format.h"
#include "source/source_index.h"

namespace ucp::source {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

bool IsWeightFile(const std::string& n) {
  static const std::regex weights(R"((model|pytorch_model)(-\d+-of-\d+)?\.(safetensors|bin)(\.index\.json)?)");
  return std::regex_match(n, weights);
}

// DeepSpeed's and ucp's own files in a checkpoint root: not the framework's.
bool IsCheckpointMarker(const std::string& n) {
  return n == "latest" || n == "latest_universal" || n == "latest_checkpointed_iteration.txt" || n.rfind("ucp_", 0) == 0 ||
         n.rfind(".ucp", 0) == 0;
}

int RankOfRngFile(const std::string& n) {
  static const std::regex per_rank(R"(rng_state_(\d{1,6})\.pth)");
  std::smatch m;
  if (n == "rng_state.pth") return -1;
  return std::regex_match(n, m, per_rank) ? std::stoi(m[1].str()) : -2;
}

}  // namespace

json JobFiles::ToJson() const {
  return {{"kind", kind}, {"files", carried}, {"weights_not_carried", weights}, {"rng_world", rng_world},
          {"global_step", global_step}};
}

JobFiles JobFiles::FromJson(const json& j) {
  JobFiles f;
  if (!j.is_object()) return f;
  f.kind = j.value("kind", "");
  f.carried = j.value("files", std::vector<std::string>{});
  f.weights = j.value("weights_not_carried", std::vector<std::string>{});
  f.rng_world = j.value("rng_world", 0);
  f.global_step = j.value("global_step", int64_t{-1});
  return f;
}

bool IsRngFile(const std::string& name) { return RankOfRngFile(name) >= -1; }

std::string RngFileName(int rank, int world) {
  return world == 1 ? "rng_state.pth" : "rng_state_" + std::to_string(rank) + ".pth";
}

std::vector<std::pair<std::string, std::string>> RngFilesFor(int from_world, int to_world) {
  std::vector<std::pair<std::string, std::string>> out;
  for (int r = 0; r < to_world; ++r) out.emplace_back(RngFileName(r, to_world), RngFileName(r % from_world, from_world));
  return out;
}

JobFiles FindJobFiles(const std::string& root, const std::string& tag) {
  JobFiles job;
  std::error_code ec;
  if (tag.empty() || !fs::is_directory(fs::path(root) / tag, ec)) return job;
  const bool state = fs::is_regular_file(fs::path(root) / "trainer_state.json", ec);
  // Trainer writes training_args.bin into every checkpoint-N: one without trainer_state.json beside it
  // lost the file (JobFileProblems says so).
  const bool trainer = state || fs::is_regular_file(fs::path(root) / "training_args.bin", ec);
  if (!trainer && !fs::is_regular_file(fs::path(root) / "config.json", ec)) return job;
  job.kind = trainer ? "hf-trainer" : "hf";
  job.state_missing = trainer && !state;
  std::vector<int> ranks;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    if (e.is_directory(ec) && fs::exists(e.path() / kReshardMarker, ec)) job.resharded_in_place = true;
    if (!e.is_regular_file(ec)) continue;
    const std::string n = e.path().filename().string();
    if (IsCheckpointMarker(n)) continue;
    if (IsWeightFile(n)) {
      job.weights.push_back(n);
      continue;
    }
    job.carried.push_back(n);
    if (const int r = RankOfRngFile(n); r >= -1) ranks.push_back(r);
  }
  std::sort(job.carried.begin(), job.carried.end());
  std::sort(job.weights.begin(), job.weights.end());
  // The processes the RNG files are of: rng_state.pth alone is one; else one more than the highest
  // rank (JobFileProblems names a gap).
  if (!ranks.empty()) job.rng_world = *std::max_element(ranks.begin(), ranks.end()) < 0 ? 1 : *std::max_element(ranks.begin(), ranks.end()) + 1;
  if (state) {
    const std::string path = root + "/trainer_state.json";
    const std::string repair = ": Trainer's record of the step, epoch and data position, which its resume reads; restore the "
                               "file Trainer wrote (from a copy of the folder) and run again";
    std::ifstream in(path);
    json values;
    try {
      values = json::parse(in);
    } catch (const json::exception& e) {
      throw Error(path + ": not JSON (" + e.what() + ")" + repair);
    }
    if (!values.is_object()) throw Error(path + ": not a JSON object, as Trainer writes it" + repair);
    const auto it = values.find("global_step");
    if (it == values.end() || !it->is_number_integer() || it->get<int64_t>() < 0)
      throw Error(path + ": no global_step (a non-negative integer, as Trainer writes it: without it Trainer starts again "
                  "at step 0)" + repair);
    job.global_step = it->get<int64_t>();
  }
  return job;
}

std::vector<std::string> JobFileProblems(const JobFiles& job, const std::string& root, const std::string& tag, int world,
                                         int64_t iteration) {
  std::vector<std::string> problems;
  if (job.kind != "hf-trainer") return problems;
  if (job.state_missing)
    problems.push_back(root + "/trainer_state.json: missing, where Trainer's other files are (training_args.bin): Trainer "
                       "resumes from it (the step, the epoch, the data position) and without it starts again at step 0; "
                       "restore the file Trainer wrote (from a copy of the folder) and run again");
  // One RNG file per process of the job that saved it: Trainer writes rng_state_<rank>.pth on every
  // process (rng_state.pth when it runs alone).
  std::vector<std::string> missing, extra;
  for (int r = 0; r < world; ++r)
    if (std::find(job.carried.begin(), job.carried.end(), RngFileName(r, world)) == job.carried.end())
      missing.push_back(RngFileName(r, world));
  for (const auto& n : job.carried) {
    const int r = RankOfRngFile(n);
    if (((r == -1 && world != 1) || (r >= 0 && (world == 1 || r >= world))) && !job.resharded_in_place) extra.push_back(n);
  }
  if (!missing.empty() || !extra.empty())
    problems.push_back(root + ": Trainer's RNG files are not those of the checkpoint's " + std::to_string(world) +
                       " process" + (world == 1 ? "" : "es") + (missing.empty() ? "" : ": missing " + JoinNames(missing)) +
                       (extra.empty() ? "" : std::string(missing.empty() ? ":" : ";") + " of another job: " + JoinNames(extra)) +
                       (extra.empty() ? " (deleted, or not copied with the folder?)" : " (the folder mixes files of two saves?)"));
  if (job.global_step >= 0) {
    const std::string step = std::to_string(job.global_step);
    if (iteration >= 0 && job.global_step != iteration)
      problems.push_back(root + "/trainer_state.json: global_step is " + step + " but DeepSpeed's files in " + tag +
                         " record global_steps " + std::to_string(iteration) + " (the folder mixes files of two saves?)");
    if (tag != "global_step" + step && !fs::exists(fs::path(root) / tag / kReshardMarker))
      problems.push_back(root + "/latest names " + tag + ", but Trainer saved step " + step + " as global_step" + step +
                         " (trainer_state.json)");
    fs::path path = fs::path(root).lexically_normal();
    if (path.filename().empty()) path = path.parent_path();  // "checkpoint-4/"
    const std::string folder = path.filename().string();
    static const std::regex checkpoint(R"(checkpoint-(\d+))");
    std::smatch m;
    if (std::regex_match(folder, m, checkpoint) && m[1].str() != step)
      problems.push_back(root + ": the folder is named " + folder + " but its trainer_state.json says global_step " + step +
                       " (Trainer names the checkpoint of step " + step + " checkpoint-" + step + ": rename the folder)");
  }
  return problems;
}

}  // namespace ucp::source
