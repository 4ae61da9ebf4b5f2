#include "reshard/other_family.h"

#include <filesystem>

#include "convert/convert.h"
#include "core/error.h"
#include "core/output_lock.h"
#include "patterns/rules.h"
#include "reshard/claim.h"
#include "reshard/tool_name.h"
#include "shuffle/agree.h"
#include "store/atomic_store.h"

namespace ucp::reshard {
namespace fs = std::filesystem;
using shuffle::AnyFailed;
using shuffle::Capture;

namespace {

std::string FrameworkOf(const std::string& dir) {
  std::string framework;
  Capture([&] {
    if (store::IsAtomicCheckpoint(dir)) framework = store::ReadManifest(dir).at("source").value("framework", "");
  });
  return framework;
}

}  // namespace

bool NeedsDeepSpeedNames(const ReshardOptions& o) {
  if (o.format != "deepspeed") return false;
  const std::string framework = FrameworkOf(o.atomic_dir);
  return framework == "torch-dcp" || framework == "megatron-lm";
}

int ReshardThroughDeepSpeedNames(const ReshardOptions& o, shuffle::Comm& comm, std::ostream& out, std::ostream& err) {
  const bool talk = comm.rank() == 0 && !o.quiet;
  const std::string scratch = o.output + "/" + kScratchAtomic;
  std::string error = Capture([&] {
    if (o.plan_only)
      throw Error(o.atomic_dir + ": a " + FrameworkOf(o.atomic_dir) + " model, whose DeepSpeed layout is planned from its conversion "
                  "under Megatron-DeepSpeed's names, which --plan-only does not make: ucp-reshard " + o.atomic_dir + " -o OUT with "
                  "this layout writes it (converting into OUT/" + kScratchAtomic + " first)");
    if (o.output.empty()) throw Error("an output folder is required (-o OUT)");
  });
  const bool created = error.empty() && !fs::exists(o.output);
  if (comm.rank() == 0 && error.empty()) error = Capture([&] {
    RefuseOutputWithin(o.output, o.atomic_dir, "the atomic checkpoint");
    RefuseClaim(o.output, scratch, o.force);
    RefuseForeignScratch(scratch);
  });
  if (AnyFailed(comm, error, err, kTool)) return 1;
  if (talk)
    err << kTool << ": " << o.atomic_dir << " holds a " << FrameworkOf(o.atomic_dir) << " model: converting it into " << scratch
        << " under Megatron-DeepSpeed's GPTModel names" << (o.target.no_optimizer ? ", the fp32 weights alone" : ", with its Adam moments and step")
        << " (removed when the run ends)\n";
  convert::ConvertOptions c;
  c.source = o.atomic_dir, c.output = scratch, c.force = true, c.removed_on_failure = true, c.as_deepspeed = true;
  c.patterns_dir = patterns::DefaultPatternsDir(), c.quiet = o.quiet, c.progress = o.progress;
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
