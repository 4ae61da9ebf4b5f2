#include "reshard/atomic_input.h"

#include <filesystem>

#include "core/error.h"
#include "formats/registry.h"
#include "store/atomic_store.h"
#include "store/universal_folder.h"

namespace ucp::reshard {

void RefuseNonAtomicInput(const std::string& dir) {
  if (store::IsUnfinishedConversion(dir))
    throw Error(dir + ": an unfinished ucp-convert run (a journal but no " + store::kManifestName +
                "): finish it with ucp-convert SOURCE -o " + dir + " --resume, then reshard it");
  std::error_code ec;
  if (std::filesystem::exists(dir + "/" + store::kManifestName, ec) || store::IsDeepSpeedUniversal(dir)) return;
  if (const auto tags = source::TagFoldersWithoutLatest(dir); !tags.empty()) throw Error(source::TagWithoutLatestError(dir, tags));
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().filename().string().ends_with("model_states.pt"))
      throw Error(dir + ": a checkpoint folder, not its root: give the folder holding `latest` (" +
                  std::filesystem::path(dir).lexically_normal().parent_path().string() + "), whose atomic checkpoint is "
                  "then found beside the tag or made (with -o in OUT/.ucp-scratch-atomic, with --in-place beside the tag), "
                  "or ucp-convert it first");
  if (const formats::SourceDriver* d = formats::ProbeSource(dir); d && std::string(d->name) != "deepspeed")
    throw Error(dir + ": a " + d->name + " checkpoint, not an atomic one: convert it first (mpirun -np N ucp-convert " + dir +
                " -o ATOMIC), then ucp-reshard ATOMIC");
  if (const std::string iteration = formats::TrackedIteration(dir); !iteration.empty())
    throw Error(dir + ": a Megatron-LM checkpoint root (its latest_checkpointed_iteration.txt names " + iteration +
                "), not an atomic checkpoint: convert it first (mpirun -np N ucp-convert " + dir + " -o ATOMIC), then ucp-reshard ATOMIC");
  // A folder above the checkpoint (a Trainer output_dir): the one below it that is meant.
  if (const std::string below = formats::CheckpointBelow(dir); !below.empty())
    throw Error(dir + ": no checkpoint: " + below);
}

}  // namespace ucp::reshard
