#include "reshard/in_place.h"

#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "convert/convert.h"
#include "core/atomic_file.h"
#include "core/commit.h"
#include "core/error.h"
#include "core/format.h"
#include "core/names.h"
#include "core/output_lock.h"
#include "formats/registry.h"
#include "reshard/claim.h"
#include "reshard/latest_tag.h"
#include "shuffle/agree.h"
#include "source/source_index.h"
#include "store/atomic_store.h"
#include "store/universal_folder.h"
#include "layout/reshard_plan.h"
#include "reshard/tool_name.h"

namespace ucp::reshard {
namespace {

namespace fs = std::filesystem;
using shuffle::AnyFailed;
using shuffle::Capture;

// Whether `current` has every key given beside --gpus (dp, sp, tp, pp, zero_stage, and the
// precision: dtype, grad_accum_dtype) as `target` names it.
bool KeepsGiven(const TargetLayout& current, const TargetLayout& target, const std::vector<std::string>& given) {
  const std::pair<const char*, bool> same[] = {{"dp", current.dp == target.dp},   {"sp", current.Sp() == target.Sp()},
                                               {"tp", current.tp == target.tp},   {"pp", current.pp == target.pp},
                                               {"zero_stage", current.zero_stage == target.zero_stage},
                                               {"dtype", current.dtype == target.dtype},
                                               {"grad_accum_dtype", current.grad_accum_dtype == target.grad_accum_dtype}};
  for (const auto& [key, equal] : same)
    if (!equal && std::find(given.begin(), given.end(), key) != given.end()) return false;
  return true;
}

// Whether --gpus comes with facts of the job to come (sequence length, micro-batch, recomputation):
// then the layout is planned again even on as many GPUs.
bool AsksActivationFacts(const PlannerRequest& r) { return r.seq_length > 0 || r.micro_batch > 0 || !r.recompute.empty(); }

bool Same(const TargetLayout& current, const TargetLayout& target) {
  return current.dp == target.dp && (target.sp == 0 || target.Sp() == current.Sp()) && current.tp == target.tp &&
         current.pp == target.pp &&
         current.zero_stage == target.zero_stage && current.dtype == target.dtype &&
         (target.model.empty() || target.model == current.model) && (target.ep == 0 || target.ep == std::max(1, current.ep)) &&
         (target.grad_accum_dtype.empty() || target.bf16_optimizer() == current.bf16_optimizer()) &&
         (target.ds_version.empty() || target.ds_version == current.ds_version);
}

// The target the step writes, resolved in one place for the dry run and the step: what the user
// did not give (the Ulysses degree, the model kind, the precision and its gradient accumulation)
// stays the job's, `job` being the source facts of the atomic checkpoint the step reads (its
// manifest's `source`, or before a conversion the same facts from the tag's index, store::JobJson).
struct Target {
  TargetLayout layout;
  std::string naming;  // "pipe" or "plain" (ResolvedModel)
  std::string tag;     // InPlaceTag
};

Target ResolveTarget(TargetLayout t, const nlohmann::json& job, const std::string& source_tag) {
  Target r;
  if (t.sp == 0) t.sp = job.value("sp", 1);  // the job's Ulysses degree unless --sp says (it names the tag)
  r.naming = ResolvedModel(t, WithContext("the atomic checkpoint's source", [&] { return job.at("naming").get<std::string>(); }));
  t.dtype = ResolvedDtype(t, job);                      // the job's precision unless --dtype says (it names the tag)
  t.grad_accum_dtype = ResolvedGradAccumDtype(t, job);  // it names the tag (InPlaceTag)
  r.layout = t;
  r.tag = InPlaceTag(source_tag, t);
  return r;
}

// --gpus: the planner's request, in the precision the step keeps or --dtype asks for.
PlannerRequest PlannerFor(const InPlaceOptions& o, const TargetLayout& target) {
  PlannerRequest r = o.reshard.planner;
  r.base.dtype = target.dtype;
  return r;
}

// What the step does, from metadata alone: the dry run prints it, the step carries it out.
struct StepPlan {
  bool reuse = false;         // ROOT/<current.atomic> is reused, else converted first
  bool latest_universal = false;  // the conversion points ROOT/latest_universal at it (a DeepSpeed tag: store::PointsLatestUniversal)
  bool known = false;         // the target is resolved (with --gpus only from an atomic checkpoint: the planner reads it)
  Target target;
  std::string layout_reason;  // with --gpus: the planner's reason
  std::string layout_job_change;  // with --gpus: what the chosen layout changes in the training job (Ulysses SP), or empty
  bool nothing = false;       // the planner chose the layout `latest` names already
  bool point_back = false;    // the target is the layout of the job's own tag, unchanged: `latest` names it again
};

// Whether `t` is the layout of the native tag a resharded `current` was made from, and that tag is
// unchanged since (its fingerprint now is the one the atomic checkpoint's manifest, `job`, recorded
// when it was converted from it): then `latest` can name that tag again, and nothing is written.
bool ReturnsToSource(const std::string& root, const LatestTag& current, const Target& t, const nlohmann::json& job) {
  const std::string dir = root + "/" + current.source_tag, fingerprint = StringField(job, "fingerprint");
  if (current.kind != "resharded" || StringField(job, "tag") != current.source_tag || fingerprint.empty() ||
      !fs::is_directory(dir) || fs::exists(dir + "/" + source::kReshardMarker) || source::FolderFingerprint(dir) != fingerprint)
    return false;
  const source::SourceIndex L = formats::IndexSource(dir);
  TargetLayout want = t.layout;
  want.model = t.naming;
  return L.errors.empty() && Same(LayoutOf(L), want);
}

StepPlan PlanStep(const InPlaceOptions& o, const std::string& root, const LatestTag& current, TargetLayout target) {
  StepPlan p;
  p.reuse = Reusable(root, current);
  const std::string atomic = root + "/" + current.atomic;
  nlohmann::json job;  // the source facts the target is resolved against
  if (p.reuse) {
    job = store::ReadAtomicManifest(atomic).at("source");
  } else {
    const source::SourceIndex L = formats::IndexSource(current.dir);
    job = store::JobJson(L);
    p.latest_universal = L.format == "deepspeed";
    if (o.reshard.planner.gpus > 0) return p;  // the planner reads the atomic checkpoint: not known yet
  }
  if (o.reshard.planner.gpus > 0) {
    const LayoutChoice choice = ChooseLayoutFor(atomic, PlannerFor(o, target));
    if (choice.chosen < 0) throw Error(choice.reason);
    target = choice.candidates[choice.chosen].layout;
    p.layout_reason = choice.reason, p.layout_job_change = choice.job_change;
  }
  p.target = ResolveTarget(target, job, current.source_tag);
  p.known = true;
  p.nothing = current.layout_known && Same(current.layout, p.target.layout);
  p.point_back = !p.nothing && ReturnsToSource(root, current, p.target, job);
  return p;
}

// --keep: the tags this step wrote beyond the `keep` newest go (never the one `latest` names).
std::vector<std::string> Removable(const std::string& root, const std::string& current, int keep) {
  std::vector<std::pair<std::string, std::string>> tags;  // created, name
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory() || name == current || !fs::exists(e.path() / source::kReshardMarker)) continue;
    tags.push_back({StringField(ReadJsonLeniently((e.path() / source::kReshardMarker).string()), "created"), name});
  }
  std::sort(tags.rbegin(), tags.rend());  // newest first
  std::vector<std::string> out;
  for (size_t k = static_cast<size_t>(std::max(keep - 1, 0)); k < tags.size(); ++k) out.push_back(tags[k].second);
  return out;
}

// The bytes of the regular files under `dir`: what a conversion or a reshard of that checkpoint
// writes, about (the same parameters' fp32 weights, moments and weights; padding aside).
int64_t FolderBytes(const std::string& dir) {
  int64_t n = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
    if (it->is_regular_file(ec)) n += static_cast<int64_t>(it->file_size(ec));
  return n;
}

// What the step would refuse, refused by the dry run in its words: from the atomic checkpoint it
// would reuse, the whole reshard plan (MakePlan validates); before a conversion, the model's names and heads.
void RefuseAsTheStepWould(const InPlaceOptions& o, const std::string& atomic, const LatestTag& current, const StepPlan& p) {
  if (p.reuse && p.known && !p.nothing && !p.point_back) {
    const Source S = LoadSource(atomic);
    MakePlan(S, ResolveModel(S, p.target.layout), 1, 0);
  } else if (!p.reuse) {
    RefuseBeforeConversion(current, p.known ? &p.target.layout : nullptr, o);
  }
}

std::string ActionOf(bool nothing_to_do, const StepPlan& p) {
  if (nothing_to_do || p.nothing) return "nothing";
  if (p.point_back) return "point_back";
  return p.reuse ? "reuse_and_reshard" : "convert_and_reshard";
}

// The dry run's text: what the step would do, from its plan `j`.
void PrintPlanText(const nlohmann::json& j, const std::string& root, const LatestTag& current, const StepPlan& p,
                   const std::string& why, std::ostream& out) {
  const std::string action = j["action"];
  const std::string atomic = root + "/" + current.atomic;
  out << "ucp-reshard --in-place --plan-only: " << root << "/latest names " << Was(current) << "\n";
  if (!current.not_reused.empty() && action == "convert_and_reshard") out << "  note: " << current.not_reused << "\n";
  if (action == "nothing") {
    out << "  would do nothing: it is already the target layout\n";
  } else if (action == "point_back") {
    out << "  would point latest back at " << root << "/" << current.source_tag << ": the target (" << Describe(p.target.layout)
        << ") is its own layout, and it is unchanged since " << atomic << " was converted from it\n";
  } else {
    out << "  would " << (action == "reuse_and_reshard" ? "reuse the atomic checkpoint " : "convert it into ") << atomic << ",\n";
    if (p.known)
      out << "  reshard into " << root << "/" << p.target.tag << " (" << Describe(p.target.layout) << "), and point latest at it\n";
    else
      out << "  then reshard and point latest at the new tag: " << why << "\n";
    out << "  space: about " << HumanBytes(j["bytes_to_write"].get<double>()) << " to write, "
        << (j["bytes_available"] < 0 ? std::string("free space unknown") : HumanBytes(j["bytes_available"].get<double>()) + " free")
        << (j["fits"].get<bool>() ? "" : ": DOES NOT FIT") << "\n";
  }
  out << "  nothing written (--plan-only)\n";
}

// --in-place --plan-only: what the step would do (PlanStep, as the step plans it), from the
// metadata alone; nothing written.
int PrintPlan(const InPlaceOptions& o, const std::string& root, const LatestTag& current, const TargetLayout& target,
              bool nothing_to_do, std::ostream& out, std::ostream& err) {
  nlohmann::json j = {{"root", root}, {"latest", current.tag}, {"kind", current.kind}};
  j["current_layout"] = current.layout_known ? current.layout.ToJson() : nlohmann::json(nullptr);
  const std::string atomic = root + "/" + current.atomic;
  StepPlan p;
  try {
    if (!nothing_to_do) {
      p = PlanStep(o, root, current, target);
      RefuseAsTheStepWould(o, atomic, current, p);
    }
  } catch (const std::exception& e) {
    err << kTool << ": error: " << e.what() << " (--plan-only: the step would refuse this; nothing written)\n";
    return 1;
  }
  const std::string action = ActionOf(nothing_to_do, p);
  nlohmann::json writes = nlohmann::json::array();
  int64_t bytes = 0;
  std::string why;
  if (action == "convert_and_reshard" || action == "reuse_and_reshard") {
    if (!p.reuse) writes.push_back(atomic), bytes += FolderBytes(current.dir);
    if (p.latest_universal) writes.push_back(root + "/latest_universal");
    if (p.known) writes.push_back(root + "/" + p.target.tag);
    else why = "the layout for " + std::to_string(o.reshard.planner.gpus) + " GPUs is chosen after the conversion (the "
               "planner reads the atomic checkpoint)";
    bytes += FolderBytes(current.dir);
    // A Trainer folder gets the RNG files of the new processes it lacks, each from a file it holds
    // (job_output.h's rule).
    std::error_code ec;
    if (p.known && current.layout_known && fs::exists(root + "/trainer_state.json", ec)) {
      const int from = current.layout.SeqDp() * current.layout.tp * current.layout.pp;
      const int to = p.target.layout.SeqDp() * p.target.layout.tp * p.target.layout.pp;
      for (const auto& [name, source] : source::RngFilesFor(from, to))
        if (!fs::exists(root + "/" + name, ec) && fs::exists(root + "/" + source, ec)) writes.push_back(root + "/" + name);
    }
  }
  const bool resolved = p.known && action != "nothing";
  j["target_layout"] = resolved ? p.target.layout.ToJson() : nlohmann::json(nullptr);
  j["target_tag"] = !resolved ? nlohmann::json(nullptr) : nlohmann::json(action == "point_back" ? current.source_tag : p.target.tag);
  std::error_code ec;
  const auto space = fs::space(root, ec);
  const int64_t available = ec ? -1 : static_cast<int64_t>(space.available);
  j["action"] = action;
  j["atomic"] = current.atomic;
  j["writes"] = writes;
  j["bytes_to_write"] = bytes;  // about: the tag folder's size per checkpoint written
  j["bytes_available"] = available;
  j["fits"] = available < 0 || bytes <= available;
  const std::string note = why.empty() ? (action == "convert_and_reshard" ? current.not_reused : "") : why;
  if (!note.empty()) j["note"] = note;
  if (o.json)
    out << j.dump(1) << "\n";
  else
    PrintPlanText(j, root, current, p, why, out);
  return j["fits"].get<bool>() ? 0 : 1;
}

// The atomic checkpoint of the tag `latest` names: ROOT/<current.atomic>, reused when it holds what
// the tag holds now (a lock its converter, killed after its manifest, left there removed), else
// converted into it (refused first when the step after it would refuse the layout `refuse`, where
// not nullptr). Collective; empty when it failed (the lowest failing rank said why).
std::string AtomicOfTag(const InPlaceOptions& o, const std::string& root, const LatestTag& current, const TargetLayout* refuse,
                        shuffle::Comm& comm, std::ostream& out, std::ostream& err) {
  const bool talk = comm.rank() == 0 && !o.reshard.quiet;
  bool reuse = false;
  std::string error = Capture([&] { reuse = Reusable(root, current); });
  if (AnyFailed(comm, error, err, kTool)) return "";
  const std::string atomic = root + "/" + current.atomic;
  if (reuse) {
    std::string note;
    error = comm.rank() == 0 && !current.deepspeed_universal ? Capture([&] { note = OutputLock::RemoveStale(atomic, kTool); }) : "";
    if (AnyFailed(comm, error, err, kTool)) return "";
    if (talk)
      err << kTool << ": " << Was(current) << ": reusing " << (current.deepspeed_universal ? "DeepSpeed's own universal checkpoint " : "the atomic checkpoint ")
          << atomic << (current.deepspeed_universal ? " (read-only)" : "") << "\n";
    if (talk && !note.empty()) err << kTool << ": note: " << atomic << ": " << note << "; its lock removed\n";
    return atomic;
  }
  error = Capture([&] { RefuseBeforeConversion(current, refuse, o); });
  if (AnyFailed(comm, error, err, kTool)) return "";
  if (talk && !current.not_reused.empty()) err << kTool << ": note: " << current.not_reused << "\n";
  if (talk) err << kTool << ": " << Was(current) << ": converting it into " << atomic << "\n";
  const bool existed = fs::exists(atomic);
  if (convert::RunConvert(ConversionInto(atomic, o, current), comm, out, err) != 0) {
    // Refused (the source damaged, a disk full): what this run began inside the training run's folder
    // goes with it; a killed run leaves its journal there, which the next step finishes or replaces.
    std::error_code ec;
    if (comm.rank() == 0 && !existed && !store::IsAtomicCheckpoint(atomic) && fs::remove_all(atomic, ec) > 0 && talk)
      err << kTool << ": removed the unfinished atomic checkpoint " << atomic << " (nothing of this run is left in " << root << ")\n";
    return "";
  }
  return atomic;
}

// `latest` names the job's own tag again (StepPlan::point_back), under the root's lock; nothing
// else is written (the iteration file, where there is one, names the same step).
int PointBack(const InPlaceOptions& o, const std::string& root, const LatestTag& current, const StepPlan& p,
              shuffle::Comm& comm, std::ostream& err) {
  const std::string error = comm.rank() == 0 ? Capture([&] {
    OutputFolder folder(root, kTool, {"latest"});
    folder.Mark({current.source_tag});
  }) : "";
  if (AnyFailed(comm, error, err, kTool)) return 1;
  if (comm.rank() == 0 && !o.reshard.quiet)
    err << kTool << ": " << root << "/latest named " << Was(current) << "; the target (" << Describe(p.target.layout)
        << ") is the layout of " << current.source_tag << ", unchanged since " << root << "/" << current.atomic
        << " was converted from it: latest names " << current.source_tag << " again; nothing else written\n";
  return 0;
}

// The training layout -o OUT is to hold, where its degrees are given (not chosen by --gpus, not a model):
// judged before the conversion, as --in-place judges its target; nullptr otherwise.
const TargetLayout* GivenLayout(const InPlaceOptions& o) {
  return o.reshard.format == "deepspeed" && o.reshard.planner.gpus == 0 ? &o.reshard.target : nullptr;
}

// -o OUT from a training run's root: the scratch atomic checkpoint OUT/.ucp-scratch-atomic made
// for the run, then `reshard` run from it, then the scratch removed whatever the outcome (with OUT
// itself where the run created it and it is left empty). Collective.
int ReshardThroughScratch(const InPlaceOptions& o, const LatestTag& current, ReshardOptions r, shuffle::Comm& comm,
                          std::ostream& out, std::ostream& err) {
  const bool talk = comm.rank() == 0 && !o.reshard.quiet;
  const std::string scratch = r.output + "/" + kScratchAtomic;
  const bool created = !fs::exists(r.output);
  // A target of the weights alone (--format hf, --format mcore --weights-only) reads no moment from the
  // scratch: none is converted (a weights-only atomic checkpoint, never kept: --in-place keeps the whole
  // one for later layouts).
  bool weights_only = false;
  std::string error = Capture([&] {
    RefuseBeforeConversion(current, GivenLayout(o), o);
    weights_only = formats::FindTarget(r.format).weights_only || r.model.weights_only;
  });
  if (comm.rank() == 0 && error.empty()) error = Capture([&] {
    RefuseClaim(r.output, scratch, r.force);
    RefuseForeignScratch(scratch);
  });
  if (AnyFailed(comm, error, err, kTool)) return 1;
  if (talk && !current.not_reused.empty()) err << kTool << ": note: " << current.not_reused << "\n";
  if (talk)
    err << kTool << ": " << Was(current) << ": converting it into " << scratch << (weights_only ? ", the fp32 weights alone" : "")
        << " (-o writes only under " << r.output << "; removed when the run ends; ucp-convert or --in-place keep an atomic "
        << "checkpoint beside the tag)\n";
  r.atomic_dir = scratch;
  convert::ConvertOptions c = ConversionInto(scratch, o, current);
  r.model.job_files_from = c.source;
  c.weights_only = weights_only;
  c.reference = weights_only;  // read once, then removed: the weights may stay where the root keeps them
  int code = convert::RunConvert(c, comm, out, err);
  if (code == 0) code = RunReshard(r, comm, out, err);
  comm.Barrier();  // every rank done reading it
  if (comm.rank() == 0) RemoveScratch(scratch, r.output, created, talk, err);
  return code;
}

// Step 3's reshard: from the atomic checkpoint beside the tag into ROOT/<target tag>, with the
// marker naming where it came from.
ReshardOptions ReshardInPlace(const InPlaceOptions& o, const std::string& root, const LatestTag& current, const Target& target) {
  ReshardOptions r = o.reshard;
  r.atomic_dir = root + "/" + current.atomic, r.output = root, r.in_place = true;
  r.planner = PlannerRequest{};
  r.target = target.layout;
  r.output_tag = target.tag;
  r.marker = {{"tool", kTool}, {"ucp_version", UCP_VERSION}, {"created", OutputTimestamp()},
              {"source_tag", current.source_tag}, {"atomic", current.atomic}, {"layout", target.layout.ToJson()},
              {"naming", target.naming}};
  return r;
}

// Step 5, once `latest` names the new tag: --keep N removes the older tags written in place; then
// how to roll back is said (the tag `latest` named, unless --keep removed it). Collective.
int KeepNewest(const InPlaceOptions& o, const std::string& root, const LatestTag& current, const Target& target,
               shuffle::Comm& comm, std::ostream& err) {
  const bool talk = comm.rank() == 0 && !o.reshard.quiet;
  std::string rollback = current.tag;
  const std::string error = comm.rank() == 0 ? Capture([&] {
    if (o.keep <= 0) return;
    for (const auto& name : Removable(root, target.tag, o.keep)) {
      if (talk) err << kTool << ": --keep " << o.keep << ": `latest` names " << target.tag << " already; removing " << root << "/" << name << "\n";
      fs::remove_all(root + "/" + name);
      if (name == rollback) rollback = current.source_tag;
    }
  }) : "";
  if (AnyFailed(comm, error, err, kTool)) return 1;
  if (talk)
    err << kTool << ": " << root << "/latest now names " << target.tag << " (" << Describe(target.layout) << "); to roll back, "
        << "write " << rollback << " into it\n";
  return 0;
}

}  // namespace

bool IsCheckpointRoot(const std::string& dir) {
  return fs::exists(dir + "/latest") && !fs::exists(dir + "/" + store::kManifestName) && !store::IsDeepSpeedUniversal(dir);
}

int RunFromRoot(const InPlaceOptions& o, shuffle::Comm& comm, std::ostream& out, std::ostream& err) {
  const std::string root = fs::path(o.root).lexically_normal().string();
  LatestTag current;
  bool reusable = false;
  std::string error = Capture([&] {
    current = ReadLatest(root);
    if (!o.plan_only) RefuseOutputWithin(o.reshard.output, current.dir, "the checkpoint folder");
    // -o the root itself (or a folder around it): refused as the input it is, before any claim.
    std::error_code ec;
    const fs::path out = fs::weakly_canonical(o.reshard.output, ec), in = fs::weakly_canonical(root, ec);
    if (!o.plan_only && !out.empty() && !in.empty() && std::mismatch(out.begin(), out.end(), in.begin(), in.end()).first == out.end())
      throw Error(o.reshard.output + ": the output folder " + (out == in ? "is" : "holds") + " the training run's root this run "
                  "reads (" + root + "): choose another -o" +
                  (o.reshard.format.empty() || o.reshard.format == "deepspeed" ? ", or --in-place to write beside its tag" : ""));
    // -o inside the root: a whole checkpoint (or model) written into the one it is made from, which the
    // job's next save, a copy of the folder or a second run would take for part of it.
    if (!o.plan_only)
      RefuseOutputWithin(o.reshard.output, root, "the training run's root",
                         "give -o a folder outside it, or --in-place to write the new layout beside its tag");
    reusable = Reusable(root, current);
  });
  if (AnyFailed(comm, error, err, kTool)) return 1;
  ReshardOptions r = o.reshard;
  if (reusable) {  // read where it is, as it is: -o writes only under OUT
    if (comm.rank() == 0 && !o.reshard.quiet) err << kTool << ": " << Was(current) << ": reading the atomic checkpoint " << root << "/" << current.atomic << "\n";
    r.atomic_dir = root + "/" + current.atomic;
    return RunReshard(r, comm, out, err);
  }
  if (!o.plan_only) return ReshardThroughScratch(o, current, r, comm, out, err);
  // Nothing to plan from before the conversion: what would happen, or its refusal.
  error = Capture([&] { RefuseBeforeConversion(current, GivenLayout(o), o); });
  if (AnyFailed(comm, error, err, kTool)) return 1;
  if (comm.rank() == 0) {
    const std::string scratch = (o.reshard.output.empty() ? std::string("OUT") : o.reshard.output) + "/" + kScratchAtomic;
    const nlohmann::json j = {{"root", root}, {"latest", current.tag}, {"kind", current.kind}, {"atomic", scratch}, {"convert", true}};
    if (o.json)
      out << j.dump(1) << "\n";
    else
      out << root << "/latest names " << current.tag << " (" << current.kind << "): it would be converted into " << scratch
          << " first (removed after), then written from it (run without --plan-only, or ucp-convert it first, "
          << "for the plan of the files)\n";
  }
  return 0;
}

std::string InPlaceTag(const std::string& source_tag, const TargetLayout& t) {
  // bf16 at ZeRO-1 is DeepSpeed's BF16 optimizer with fp32 gradient accumulation, ZeRO's otherwise:
  // two checkpoints of the same degrees, the first named "_gafp32".
  const bool accum = t.zero_stage == 1 && t.bf16_optimizer();
  return source_tag + "_dp" + std::to_string(t.dp) + (t.Sp() > 1 ? "_sp" + std::to_string(t.Sp()) : "") + "_tp" + std::to_string(t.tp) + "_pp" + std::to_string(t.pp) + "_z" +
         std::to_string(t.zero_stage) + (t.ep > 1 ? "_ep" + std::to_string(t.ep) : "") + "_" + t.dtype +
         (accum ? "_gafp32" : "");
}

int RunInPlace(const InPlaceOptions& o, shuffle::Comm& comm, std::ostream& out, std::ostream& err) {
  const bool talk = comm.rank() == 0 && !o.reshard.quiet;
  const std::string root = fs::path(o.root).lexically_normal().string();
  LatestTag current;
  TargetLayout target = o.reshard.target;
  bool nothing_to_do = false;
  std::string error = Capture([&] {
    current = ReadLatest(root);
    if (!current.layout_known) return;
    if (std::find(o.given.begin(), o.given.end(), "dtype") == o.given.end())
      target.dtype = current.layout.dtype;  // the training dtype stays unless --dtype says
    if (o.reshard.planner.gpus > 0)  // the planner is asked only when the GPU count, a key given or a model fact changed
      nothing_to_do = current.layout.SeqDp() * current.layout.tp * current.layout.pp == o.reshard.planner.gpus &&
                      KeepsGiven(current.layout, target, o.given) && !AsksActivationFacts(o.reshard.planner);
    else
      nothing_to_do = Same(current.layout, target);
  });
  if (AnyFailed(comm, error, err, kTool)) return 1;
  if (o.plan_only) {
    int code = 0;
    if (comm.rank() == 0) code = PrintPlan(o, root, current, target, nothing_to_do, out, err);
    return code;
  }
  if (nothing_to_do) {
    if (talk) err << kTool << ": " << root << "/latest names " << Was(current) << ": already the target layout; nothing to do\n";
    return 0;
  }
  StepPlan plan;
  error = Capture([&] { plan = PlanStep(o, root, current, target); });
  if (AnyFailed(comm, error, err, kTool)) return 1;
  const bool reused = plan.reuse;  // an atomic checkpoint an earlier run converted, not this one
  if (!plan.known || !(plan.nothing || plan.point_back)) {
    const std::string atomic = AtomicOfTag(o, root, current, plan.known ? &plan.target.layout : nullptr, comm, out, err);
    if (atomic.empty()) return 1;
    if (!plan.reuse) {  // now from the atomic checkpoint, as the dry run plans from a reused one
      error = Capture([&] {
        plan = PlanStep(o, root, current, target);
        if (!plan.known) throw Error("internal: " + atomic + " is not reusable right after its conversion");
      });
      if (AnyFailed(comm, error, err, kTool)) return 1;
    }
  }
  if (talk && !plan.layout_reason.empty()) err << kTool << ": layout for " << o.reshard.planner.gpus << " GPUs: " << plan.layout_reason << "\n";
  if (talk && !plan.layout_job_change.empty()) err << kTool << ": note: " << plan.layout_job_change << "\n";
  if (plan.nothing) {
    if (talk) err << kTool << ": " << Was(current) << " is already that layout; nothing to do\n";
    return 0;
  }
  if (plan.point_back) return PointBack(o, root, current, plan, comm, err);

  const ReshardOptions r = ReshardInPlace(o, root, current, plan.target);
  if (r.output_tag == current.tag) {
    if (talk) err << kTool << ": error: " << current.tag << " is named after the target layout but is not it\n";
    return 1;
  }
  if (RunReshard(r, comm, out, err) != 0) {
    // A reused atomic checkpoint is reused again by every rerun: say how to make it anew.
    if (reused && talk)
      err << kTool << ": note: " << r.atomic_dir << " was converted by an earlier run and reused (its source fingerprint "
          << "is the tag's); if it is damaged (ucp-inspect --verify " << r.atomic_dir << "), convert the tag again: "
          << "ucp-convert " << current.dir << " -o " << r.atomic_dir << " --force\n";
    return 1;
  }
  return KeepNewest(o, root, current, plan.target, comm, err);
}

}  // namespace ucp::reshard
