#include "formats/registry.h"

#include <algorithm>
#include <filesystem>
#include <span>

#include "core/error.h"
#include "core/atomic_file.h"
#include "core/format.h"
#include "source/megatron_tracker.h"
#include "store/atom_store.h"
#include "store/atomic_store.h"
#include "store/universal_folder.h"

namespace ucp::formats {
namespace {

// The tables: one row per format folder, each defined there (formats/<name>/driver.cpp). A source's
// place is the order probes are tried in, the most specific names first: a DCP folder may hold .pt
// files too (Megatron-Core's common.pt), which DeepSpeed's probe accepts. The last, the broadest,
// indexes a folder no probe accepts, so that its error says what is missing. Megatron-LM's legacy
// rank folders hold .pt files DeepSpeed's probe would take too. A Hugging Face model
// folder (config.json and safetensors, no `latest`) comes before DeepSpeed's, whose Trainer
// checkpoint-N holds those files beside `latest`.
std::span<const SourceDriver* const> Sources() {
  static const SourceDriver* const table[] = {&DcpSource(), &MegatronSource(), &HuggingFaceSource(), &DeepSpeedSource()};
  return table;
}
std::span<const TargetDriver* const> Targets() {
  static const TargetDriver* const table[] = {&DeepSpeedTarget(), &HuggingFaceTarget(), &DcpTarget(), &McoreTarget()};
  return table;
}

}  // namespace

std::vector<std::string> TargetNames() {
  std::vector<std::string> names;
  for (const TargetDriver* d : Targets()) names.emplace_back(d->name);
  return names;
}

const TargetDriver& FindTarget(std::string_view name) {
  for (const TargetDriver* d : Targets())
    if (name == d->name) return *d;
  throw Error("unknown target format '" + std::string(name) + "' (known: " + JoinNames(TargetNames()) + ")");
}

namespace {

// How new a checkpoint folder is, to choose among several: Trainer's trainer_state.json global_step,
// else the last number in the folder's name (checkpoint-500, global_step500, iter_0000500), else -1.
int64_t Newness(const std::filesystem::path& dir) {
  try {
    if (const auto text = ReadWholeFile((dir / "trainer_state.json").string())) {
      const auto state = nlohmann::json::parse(*text);
      if (state.is_object() && state.contains("global_step") && state["global_step"].is_number_integer())
        return state["global_step"].get<int64_t>();
    }
  } catch (const std::exception&) {  // a damaged state: its name still counts
  }
  const std::string name = dir.filename().string();
  const size_t end = name.find_last_of("0123456789");
  if (end == std::string::npos) return -1;
  const size_t begin = name.find_last_not_of("0123456789", end) + 1;
  return end - begin < 15 ? std::stoll(name.substr(begin, end - begin + 1)) : -1;
}

// Megatron-LM's own folders no driver takes: one rank's folder of a legacy checkpoint
// (mp_rank_TT[_PPP]/model_optim_rng.pt: the megatron driver reads the iteration folder above it), and a
// torch_dist root, whose latest_checkpointed_iteration.txt names the iteration Megatron-LM would load
// (its iter_NNNNNNN folder, whatever newer ones lie beside it). Empty for any other folder.
std::string MegatronFolder(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path d(fs::path(dir).lexically_normal());
  if (fs::exists(d / "model_optim_rng.pt", ec))
    return d.string() + " is one rank's folder of Megatron-LM's legacy --ckpt-format torch checkpoint: give its iteration folder " +
           d.parent_path().string() + " (or the root above it), which holds every rank's";
  const source::MegatronTracker tracker = source::ReadMegatronTracker(d.string());
  if (!tracker.present) return "";
  const std::string& it = tracker.text;
  if (tracker.folder.empty()) return (d / source::kMegatronTracker).string() + " holds '" + it + "', not an iteration";
  const fs::path iter = d / tracker.folder;
  if (!fs::is_directory(iter, ec))
    return "latest_checkpointed_iteration.txt names iteration " + it + ", but " + iter.string() + " is not there";
  for (const auto& child : fs::directory_iterator(iter, ec))  // a legacy root, read as it is: its errors say what is wrong
    if (fs::exists(child.path() / "model_optim_rng.pt", ec)) return "";
  return "a Megatron-LM checkpoint root: latest_checkpointed_iteration.txt names iteration " + it + ", the one Megatron-LM "
         "loads: give " + iter.string();
}

// For a folder that is no checkpoint: the folder below it that is one (the one the user meant), else
// with `formats` the files each format looks for; empty for a path that is no folder.
std::string WhatWasMeant(const std::string& dir, bool formats) {
  std::error_code ec;
  if (!std::filesystem::exists(dir, ec)) return "";  // nothing there: nothing else was meant
  if (std::string megatron = MegatronFolder(dir); !megatron.empty()) return megatron;
  if (std::string below = CheckpointBelow(dir); !below.empty()) return below;
  if (!formats) return "";
  return "the formats ucp reads, by their files: " +
         JoinNames(Sources(), "; ", [](const SourceDriver* d) { return std::string(d->name) + ": " + d->files; });
}

// What was meant by a folder a probe took for its format but that format's index refused: Megatron-LM's
// legacy files (which hold .pt files), or a checkpoint in a folder below (a case folder holding a stray
// .pt file beside its checkpoint/).
std::string ProbedWrongly(const std::string& dir) {
  if (std::string megatron = MegatronFolder(dir); !megatron.empty()) return megatron;
  return CheckpointBelow(dir);
}

}  // namespace

std::string CheckpointBelow(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  // A root with `latest` is the checkpoint meant: its error says what is wrong with it.
  if (!fs::is_directory(dir, ec) || fs::exists(fs::path(dir) / "latest", ec)) return "";
  // A Megatron-LM legacy folder is the checkpoint itself: its rank folders hold .pt files DeepSpeed's probe takes.
  if (MegatronSource().probe(dir)) return "";
  std::vector<std::pair<fs::path, const SourceDriver*>> found;
  for (const auto& child : fs::directory_iterator(dir, ec))
    // not one ucp-convert refuses as converted already (DeepSpeed's universal folder, an atomic checkpoint)
    if (child.is_directory(ec) && !store::IsDeepSpeedUniversal(child.path().string()) &&
        !fs::exists(child.path() / store::kManifestName, ec))
      for (const SourceDriver* d : Sources())
        if (d->probe(child.path().string())) {
          // DeepSpeed's probe takes any folder of .pt files: a folder with checkpoints of its own below it and no
          // `latest` (a case folder beside its checkpoint/ and reference.pt) is not the one meant
          if (d == &DeepSpeedSource() && !CheckpointBelow(child.path().string()).empty()) break;
          found.emplace_back(child.path(), d);
          break;
        }
  if (found.empty()) return "";
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    const int64_t na = Newness(a.first), nb = Newness(b.first);
    return na != nb ? na < nb : a.first < b.first;
  });
  const auto& [newest, driver] = found.back();
  return newest.string() + " is a " + driver->name + " checkpoint" +
         (found.size() > 1 ? " (the newest of " + std::to_string(found.size()) + " here)" : "") + ": give that folder";
}

std::string TrackedIteration(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path d(fs::path(dir).lexically_normal());
  if (DcpSource().probe(d.string()) || MegatronSource().probe(d.string())) return "";  // the folder itself is a checkpoint
  const source::MegatronTracker tracker = source::ReadMegatronTracker(d.string());
  if (tracker.folder.empty()) return "";
  const fs::path iter = d / tracker.folder;
  return fs::is_directory(iter, ec) && DcpSource().probe(iter.string()) ? iter.string() : "";
}

const SourceDriver* ProbeSource(const std::string& dir) {
  for (const SourceDriver* d : Sources())
    if (d->probe(dir)) return d;
  return nullptr;
}

source::SourceIndex IndexSource(const std::string& dir, const source::IndexOptions& options) {
  // The driver whose names the folder has, else the last, which says why in its terms; for a folder
  // that is no checkpoint, what was meant is added.
  const SourceDriver* probed = ProbeSource(dir);
  const SourceDriver* driver = probed ? probed : Sources().back();
  try {
    source::SourceIndex L = driver->index(dir, options);
    // A folder some format took for its own is that checkpoint: a folder below it is no better guess.
    // Megatron-LM's legacy files hold .pt files a probe may take: said whichever driver refused them.
    if (!L.errors.empty() && L.params.empty())
      if (std::string meant = probed ? ProbedWrongly(dir) : WhatWasMeant(dir, false); !meant.empty()) L.errors.push_back(dir + ": " + meant);
    return L;
  } catch (const Error& e) {
    const std::string meant = probed ? ProbedWrongly(dir) : WhatWasMeant(dir, true);
    throw Error(std::string(e.what()) + (meant.empty() ? "" : "; " + meant));
  }
}

nlohmann::json FormatsJson() {
  nlohmann::json sources = nlohmann::json::array();
  for (const SourceDriver* d : Sources()) sources.push_back({{"name", d->name}, {"description", d->description}, {"files", d->files}});
  nlohmann::json targets = nlohmann::json::array();
  for (const TargetDriver* d : Targets()) targets.push_back({{"name", d->name}, {"description", d->description}, {"files", d->files}});
  nlohmann::json atomic = nlohmann::json::array();
  for (const auto& [name, description] : store::StoreDescriptions())
    atomic.push_back({{"name", name}, {"description", description}});
  return {{"sources", sources}, {"targets", targets}, {"atomic_stores", atomic}};
}

void PrintFormats(std::ostream& out) {
  out << "sources (ucp-convert, ucp-inspect):\n";
  for (const SourceDriver* d : Sources()) out << "  " << d->name << "\n    " << d->description << "\n    files: " << d->files << "\n";
  out << "atomic checkpoint stores (ucp-convert --format; read by ucp-reshard and ucp-inspect):\n";
  for (const auto& [name, description] : store::StoreDescriptions()) out << "  " << name << "\n    " << description << "\n";
  out << "targets (ucp-reshard):\n";
  for (const TargetDriver* d : Targets()) out << "  " << d->name << "\n    " << d->description << "\n    files: " << d->files << "\n";
}

}  // namespace ucp::formats
