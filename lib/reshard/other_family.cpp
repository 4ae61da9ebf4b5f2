#include "reshard/other_family.h"

#include <filesystem>

#include "convert/convert.h"
#include "core/error.h"
#include "core/output_lock.h"
#include "layout/reshard_plan.h"
#include "patterns/rules.h"
#include "reshard/claim.h"
#include "reshard/tool_name.h"
#include "shuffle/agree.h"
#include "store/atom_store.h"
#include "store/atomic_store.h"

namespace ucp::reshard {
namespace fs = std::filesystem;
using shuffle::AnyFailed;
using shuffle::Capture;

namespace {

nlohmann::json SourceOf(const std::string& dir) {
  nlohmann::json source;
  Capture([&] {
    if (store::IsAtomicCheckpoint(dir)) source = store::ReadManifest(dir).at("source");
  });
  return source.is_object() ? source : nlohmann::json::object();
}

// The family a global-tensor atomic checkpoint's source was, for messages.
std::string FamilyOf(const nlohmann::json& source) {
  if (source.value("framework", "") == "megatron-lm") return "Megatron-LM (legacy)";
  const nlohmann::json kinds = source.value("file_kinds", nlohmann::json::object());
  return kinds.is_object() && kinds.contains("megatron_common") ? "Megatron-Core" : "PyTorch DCP (torchtitan)";
}

}  // namespace

bool NeedsDeepSpeedNames(const ReshardOptions& o) {
  return o.format == "deepspeed" && GlobalTensorsFramework(SourceOf(o.atomic_dir).value("framework", ""));
}

int ReshardThroughDeepSpeedNames(const ReshardOptions& o, shuffle::Comm& comm, std::ostream& out, std::ostream& err) {
  const bool talk = comm.rank() == 0 && !o.quiet;
  const std::string scratch = o.output + "/" + kScratchAtomic;
  const nlohmann::json source = SourceOf(o.atomic_dir);
  const bool weights_only = source.value("weights_only", false) || o.target.no_optimizer;
  std::string error = Capture([&] {
    if (o.plan_only)
      throw Error(o.atomic_dir + ": a " + FamilyOf(source) + " model, whose DeepSpeed layout is planned from its conversion "
                  "under Megatron-DeepSpeed's names, which --plan-only does not make: ucp-reshard " + o.atomic_dir + " -o OUT with "
                  "this layout writes it (converting into OUT/" + kScratchAtomic + " first)");
    if (o.output.empty()) throw Error("an output folder is required (-o OUT)");
    // What the reshard would refuse of the optimizer flags, refused before the conversion is made for nothing.
    Source probe;
    probe.manifest = {{"source", source}};
    probe.weights_only = source.value("weights_only", false);
    try {
      SettleOptimizer(probe, o.target, o.optimizer_block, o.optimizer_config);
    } catch (const Error& e) {  // (said of "the atomic checkpoint", which has no reader here: named)
      const std::string said = e.what(), generic = "the atomic checkpoint";
      throw Error(said.rfind(generic, 0) == 0 ? o.atomic_dir + said.substr(generic.size()) : said);
    }
  });
  const bool created = error.empty() && !fs::exists(o.output);
  if (comm.rank() == 0 && error.empty()) error = Capture([&] {
    RefuseOutputWithin(o.output, o.atomic_dir, "the atomic checkpoint");
    RefuseClaim(o.output, scratch, o.force);
    RefuseForeignScratch(scratch);
    fs::remove_all(scratch);  // ucp's (just checked): a killed run's, which the conversion would refuse as not its own
    store::CheckAtomsH5Whole(o.atomic_dir);  // before any rank's HDF5 reads a byte of it
  });
  if (AnyFailed(comm, error, err, kTool)) return 1;
  if (talk)
    err << kTool << ": " << o.atomic_dir << " holds a " << FamilyOf(source) << " model: converting it into " << scratch
        << " under Megatron-DeepSpeed's GPTModel names" << (weights_only ? ", the fp32 weights alone" : ", with its Adam moments and step")
        << " (removed when the run ends)\n";
  convert::ConvertOptions c;
  c.source = o.atomic_dir, c.output = scratch, c.force = true, c.removed_on_failure = true, c.as_deepspeed = true;
  // Quiet: the notes of the scratch's patterns are about ucp's own copy, not the user's checkpoint.
  c.patterns_dir = patterns::DefaultPatternsDir(), c.quiet = true, c.progress = o.progress;
  c.weights_only = o.target.no_optimizer;
  c.model_config_path = o.model.model_config_path, c.model_config_text = o.model.model_config_text;
  int code = convert::RunConvert(c, comm, out, err);
  ReshardOptions from = o;
  from.atomic_dir = scratch;
  from.model = {};  // (its facts are in the scratch's model-states file now)
  if (code == 0) code = RunReshard(from, comm, out, err);
  comm.Barrier();  // every rank done reading it
  if (comm.rank() == 0) RemoveScratch(scratch, o.output, created, talk, err);
  return code;
}

}  // namespace ucp::reshard
