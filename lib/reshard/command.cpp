#include "reshard/command.h"

#include <algorithm>

#include "core/atomic_file.h"
#include "core/error.h"
#include "formats/registry.h"
#include "patterns/rules.h"
#include "layout/planner.h"
#include "layout/reshard_plan.h"
#include "layout/target.h"
#include "reshard/other_family.h"

namespace ucp::reshard {
namespace {

constexpr int kCommandLineError = 2;  // every command-line error's, as apps/common/command_line.h says

int Refuse(std::ostream& err, const std::string& why, int status = kCommandLineError) {
  err << "ucp-reshard: error: " << why << "\n";
  return status;
}

// "grad-accum-dtype" for the layout key "grad_accum_dtype": the flag that gives it, without its "--".
std::string FlagOf(std::string key) {
  std::replace(key.begin(), key.end(), '_', '-');
  return key;
}

// The target layout: the --layout file's (a file that is not a layout: refused as input, exit 1),
// then the flags' over it (flags that name a layout wrongly: a command-line error). The keys either
// gives go to c.in_place.given.
std::optional<int> ReadLayout(ReshardCommand& c, std::ostream& err) {
  TargetLayout& t = c.options.target;
  std::vector<std::string>& given = c.in_place.given;
  try {
    if (!c.layout_file.empty()) t = ReadLayoutFile(c.layout_file, t, &given);
  } catch (const Error& e) {
    return Refuse(err, e.what(), 1);
  }
  try {
    t = ApplyLayout(c.layout_flags, t, "the command line", &given);
  } catch (const Error& e) {
    return Refuse(err, e.what());
  }
  return std::nullopt;
}

// --model-config FILE: a JSON object, kept as parsed and as written (a model's own config.json is
// written unchanged).
std::optional<int> ReadModelConfig(ExportOptions& m, const std::string& path, std::ostream& err) {
  try {
    const std::optional<std::string> text = ReadWholeFile(path);
    if (!text) throw Error("cannot be read");
    m.model_config = nlohmann::json::parse(*text);
    m.model_config_text = *text;
    if (!m.model_config.is_object()) throw Error("not a JSON object");
    m.model_config_path = path;
  } catch (const std::exception& e) {
    return Refuse(err, path + ": not a JSON object of model facts: " + e.what(), 1);
  }
  return std::nullopt;
}

// --no-optimizer and --optimizer-config: the target's optimizer files, none or a fresh optimizer's
// (its "optimizer" block read here: a file that holds none, refused as input, exit 1). Only for a
// new training layout: a model export has no optimizer, and --in-place keeps the run's own.
std::optional<int> SettleOptimizerFlags(ReshardCommand& c, std::ostream& err) {
  ReshardOptions& o = c.options;
  const bool config = !o.optimizer_config.empty();
  if (!c.no_optimizer && !config) return std::nullopt;
  const std::string flag = c.no_optimizer ? "--no-optimizer" : "--optimizer-config";
  if (c.no_optimizer && config) return Refuse(err, "--no-optimizer writes no optimizer files: no --optimizer-config");
  if (o.format == "hf") return Refuse(err, flag + ": --format hf writes a model, which has no optimizer");
  if (o.format == "dcp" || o.format == "mcore")
    return Refuse(err, flag + ": --format " + o.format + " writes the optimizer state the atomic checkpoint holds (none of a weights-only one)" +
                           (o.format == "mcore" ? "; --weights-only writes the model alone" : ""));
  if (c.in_place_mode)
    return Refuse(err, flag + ": --in-place continues the training run as it is, its optimizer too: reshard into -o OUT");
  const auto& given = c.in_place.given;
  if (c.no_optimizer && o.target.zero_stage == 3 && std::find(given.begin(), given.end(), "zero_stage") != given.end())
    return Refuse(err, "--no-optimizer with --zero-stage 3: ZeRO-3 keeps the weights in the optimizer files");
  o.target.no_optimizer = c.no_optimizer;
  if (!config) return std::nullopt;
  try {
    const std::optional<std::string> text = ReadWholeFile(o.optimizer_config);
    if (!text) throw Error(o.optimizer_config + ": cannot be read");
    nlohmann::json parsed;
    try {
      parsed = nlohmann::json::parse(*text);
    } catch (const std::exception& e) {
      throw Error(o.optimizer_config + ": not JSON: " + e.what());
    }
    o.optimizer_block = OptimizerBlockOf(parsed, o.optimizer_config);
  } catch (const Error& e) {
    return Refuse(err, std::string("--optimizer-config: ") + e.what(), 1);
  }
  return std::nullopt;
}

// --format hf, dcp and mcore: a model has no DeepSpeed layout, only the precision is the user's to
// choose (and DCP's mesh, Megatron-LM's TP, PP and DP).
std::optional<int> SettleModelExport(ReshardCommand& c, std::ostream& err) {
  ReshardOptions& o = c.options;
  const bool dcp = o.format == "dcp", mcore = o.format == "mcore";
  const std::string no_layout = "--format " + o.format +
      (dcp ? " writes torchtitan's sharding of whole tensors (--mesh): no " : mcore ? " writes Megatron-LM's TP x PP x DP layout: no "
                                                                            : " writes a model of whole tensors: no ");
  const std::string only = dcp     ? " (only --mesh, --dtype fp32, --model-config)"
                           : mcore ? " (only --tp, --pp, --dp, --ep, --make-vocab-size-divisible-by, --weights-only, --use-distributed-optimizer, --model-config)"
                                   : " (only --dtype, --max-shard-size, --model-config)";
  if (!c.layout_only_given.empty()) return Refuse(err, no_layout + c.layout_only_given.front() + only);
  for (const auto& key : c.in_place.given)
    if (key != "dtype" && !(mcore && (key == "tp" || key == "pp" || key == "dp" || key == "ep" || key == "make_vocab_size_divisible_by")))
      return Refuse(err, no_layout + "--" + FlagOf(key) + only);
  if (mcore) {
    for (const std::string& flag : c.hf_only_given)
      if (flag != "--model-config") return Refuse(err, flag + " goes with --format hf");
    if (!c.dcp_only_given.empty()) return Refuse(err, c.dcp_only_given.front() + " goes with --format dcp");
    auto given = [&](const char* key) { return std::find(c.in_place.given.begin(), c.in_place.given.end(), key) != c.in_place.given.end(); };
    if (c.in_place_mode || o.planner.gpus > 0)
      return Refuse(err, "--format mcore writes into -o OUT the layout --tp T --pp P [--dp D] gives: no " + std::string(c.in_place_mode ? "--in-place" : "--gpus"));
    if (!given("tp") || !given("pp")) return Refuse(err, "--format mcore: give the layout to write, --tp T --pp P (and --dp D, else 1)");
    o.model.tp = o.target.tp, o.model.pp = o.target.pp, o.model.dp = given("dp") ? o.target.dp : 1, o.model.dp_given = given("dp");
    o.model.ep = given("ep") ? o.target.ep : 0;
    o.model.vocab_divisible_by = o.target.vocab_divisible_by;
  }
  if (c.in_place_mode || o.planner.gpus > 0)
    return Refuse(err, "--format " + o.format + " writes into -o OUT: no " + (c.in_place_mode ? "--in-place" : "--gpus"));
  for (const std::string& flag : c.hf_only_given)
    if (dcp && flag != "--model-config") return Refuse(err, flag + " goes with --format hf");
  if (!dcp && !c.dcp_only_given.empty()) return Refuse(err, c.dcp_only_given.front() + " goes with --format dcp");
  if (!mcore && !c.mcore_only_given.empty()) return Refuse(err, c.mcore_only_given.front() + " goes with --format mcore");
  o.model.dtype = o.target.dtype;
  o.model.output = o.output;
  if (const auto check = formats::FindTarget(o.format).check_options) try {
      check(o.model);
    } catch (const Error& e) {
      return Refuse(err, e.what());
    }
  if (!c.model_config.empty())
    if (auto status = ReadModelConfig(o.model, c.model_config, err)) return status;
  if (!o.plan_only && o.output.empty()) return Refuse(err, "an output folder is required (-o OUT), or --plan-only");
  if (o.json && !o.plan_only) return Refuse(err, "--json goes with --plan-only");
  return std::nullopt;
}

// A training layout (DeepSpeed's files): every degree given, or --gpus to choose them (the degrees
// given then stay fixed).
std::optional<int> SettleTrainingLayout(ReshardCommand& c, std::ostream& err) {
  ReshardOptions& o = c.options;
  for (const std::string& flag : c.hf_only_given)  // --model-config: another family's model's facts (reshard/other_family.h)
    if (flag != "--model-config") return Refuse(err, flag + " goes with --format hf");
  if (!c.model_config.empty())
    if (auto status = ReadModelConfig(o.model, c.model_config, err)) return status;
  if (!c.dcp_only_given.empty()) return Refuse(err, c.dcp_only_given.front() + " goes with --format dcp");
  if (!c.mcore_only_given.empty()) return Refuse(err, c.mcore_only_given.front() + " goes with --format mcore");
  const std::vector<std::string>& given = c.in_place.given;
  if (o.planner.gpus > 0) {
    o.planner.base = o.target;
    for (const char* key : {"dp", "sp", "tp", "pp", "zero_stage"})
      if (std::find(given.begin(), given.end(), key) != given.end()) o.planner.fixed.push_back(key);
    if (const std::string why = FixedDegreesRefusal(o.planner); !why.empty())
      return Refuse(err, "--gpus " + std::to_string(o.planner.gpus) + ": " + why + " (the degrees given stay fixed)");
  } else if (auto missing = MissingLayoutKeys(given); !missing.empty()) {
    const std::string& key = missing.front();
    return Refuse(err, "no " + key + ": give --" + FlagOf(key) + " or \"" + key + "\" in a --layout file, or --gpus N to "
                  "choose the layout, for a DeepSpeed job; for Megatron-LM's torch_dist give --format mcore --tp T --pp P [--dp D] "
                  "[--ep E] (torchtitan: --format dcp; Hugging Face: --format hf)");
  }
  if (o.json && !o.plan_only)
    return Refuse(err, "--json goes with --plan-only (a run prints its summary as text; --report FILE writes it as JSON)");
  if (c.in_place_mode) {
    if (!o.output.empty() || o.force) return Refuse(err, "--in-place writes beside the checkpoint it reads: no -o or --force");
    return std::nullopt;
  }
  if (c.in_place.keep > 0) return Refuse(err, "--keep only applies with --in-place");
  if (!o.plan_only && o.output.empty()) return Refuse(err, "an output folder is required (-o OUT), or --plan-only");
  return std::nullopt;
}

// --in-place, or a run from a training run's root: the options of either.
InPlaceOptions FromRoot(const ReshardCommand& c) {
  InPlaceOptions ip = c.in_place;
  const ReshardOptions& o = c.options;
  ip.root = o.atomic_dir, ip.strict = !c.no_strict, ip.reshard = o, ip.plan_only = o.plan_only, ip.json = o.json;
  ip.patterns_dir = patterns::DefaultPatternsDir(), ip.progress = o.progress;
  return ip;
}

}  // namespace

std::optional<int> SettleCommand(ReshardCommand& c, std::ostream& err) {
  if (auto status = ReadLayout(c, err)) return status;
  if (auto status = SettleOptimizerFlags(c, err)) return status;
  const bool model = c.options.format == "hf" || c.options.format == "dcp" || c.options.format == "mcore";
  return model ? SettleModelExport(c, err) : SettleTrainingLayout(c, err);
}

int RunCommand(const ReshardCommand& c, shuffle::Comm& comm, std::ostream& out, std::ostream& err) {
  // --model-config with a DeepSpeed layout: another family's model's facts, for no other source.
  const bool other_family = NeedsDeepSpeedNames(c.options);
  if (c.options.format == "deepspeed" && !c.options.model.model_config_path.empty() && (!other_family || c.in_place_mode)) {
    if (comm.rank() == 0)
      err << kTool << ": error: --model-config " << c.options.model.model_config_path << ": with a DeepSpeed layout, the facts of "
          << "another family's model (an atomic checkpoint of Megatron-Core or torchtitan), which " << c.options.atomic_dir
          << " is not: its model-states file holds its model's\n";
    return 1;
  }
  if (c.in_place_mode) return RunInPlace(FromRoot(c), comm, out, err);
  // A training run's root (a Trainer checkpoint-N): its atomic checkpoint found or made first.
  if (IsCheckpointRoot(c.options.atomic_dir)) return RunFromRoot(FromRoot(c), comm, out, err);
  // Another family's atomic checkpoint to a DeepSpeed layout: under Megatron-DeepSpeed's names first.
  if (other_family) return ReshardThroughDeepSpeedNames(c.options, comm, out, err);
  return RunReshard(c.options, comm, out, err);
}

}  // namespace ucp::reshard
