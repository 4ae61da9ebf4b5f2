#include "reshard/in_place.h"

#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "convert/convert.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/format.h"
#include "core/names.h"
#include "core/output_lock.h"
#include "core/xxhash64.h"
#include "formats/registry.h"
#include "shuffle/agree.h"
#include "source/source_index.h"
#include "store/atomic_store.h"
#include "store/universal_folder.h"
#include "target/reshard_plan.h"

namespace ucp::reshard {
namespace {

namespace fs = std::filesystem;
using shuffle::AnyFailed;
using shuffle::Capture;
constexpr const char* kTool = "ucp-reshard";

nlohmann::json ReadJsonFile(const std::string& path) {
  const std::optional<std::string> text = ReadWholeFile(path);
  if (!text) throw Error(path + ": cannot read");
  const nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw Error(path + ": not a JSON object");
  return j;
}

// A JSON object file read leniently, for what decides only whether to reuse or remove: a file that
// is missing or malformed reads as an empty object.
nlohmann::json ReadJsonLeniently(const std::string& path) {
  nlohmann::json j = nlohmann::json::parse(ReadWholeFile(path).value_or(""), nullptr, false);
  return j.is_object() ? j : nlohmann::json::object();
}

// A string field, or "" when it is absent or not a string.
std::string StringField(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

// What `latest` names, as far as the in-place step needs it.
struct Current {
  std::string tag, dir;
  std::string kind;            // "native", "resharded" (a tag this step wrote) or "atomic"
  bool layout_known = false;   // not for an atomic checkpoint
  TargetLayout layout;         // dp, tp, pp, zero_stage, dtype, model (naming)
  std::string source_tag;      // the tag new folders are named after
  std::string atomic;          // the atomic checkpoint that may serve (folder name in the root)
  bool deepspeed_universal = false;  // `atomic` is DeepSpeed's own universal folder of this tag: reused, read-only
};

// Whether the DeepSpeed universal folder `universal` was made from the checkpoint folder `tag_dir`:
// each model-states file DeepSpeed copied into it is the tag's, byte for byte.
bool ModelStatesOf(const std::string& universal, const std::string& tag_dir) {
  int compared = 0;
  for (const auto& e : fs::directory_iterator(universal)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file() || !name.ends_with("model_states.pt")) continue;
    uint64_t a = 0, b = 0;
    if (!fs::exists(tag_dir + "/" + name) || XxHash64File(e.path().string(), &a) != XxHash64File(tag_dir + "/" + name, &b) || a != b)
      return false;
    ++compared;
  }
  return compared > 0;
}

Current ReadCurrent(const std::string& root) {
  Current c;
  const std::string latest = root + "/latest";
  if (!fs::exists(latest)) throw Error(root + ": no `latest` file: --in-place takes the checkpoint root a training run saves into");
  c.tag = source::ReadLatestTag(root);
  c.dir = root + "/" + c.tag;
  if (!fs::is_directory(c.dir)) throw Error(latest + " names '" + c.tag + "', which is not a folder of " + root);
  if (fs::exists(c.dir + "/" + store::kManifestName)) {
    const nlohmann::json m = ReadJsonFile(c.dir + "/" + store::kManifestName);
    c.kind = "atomic", c.atomic = c.tag;
    c.source_tag = WithContext(c.dir + "/" + store::kManifestName, [&] { return m.at("source").at("tag").get<std::string>(); });
    RequirePlainName(c.source_tag, c.dir + "/" + store::kManifestName + ": source.tag");
    return c;
  }
  c.layout_known = true;
  if (fs::exists(c.dir + "/" + source::kReshardMarker)) {
    const std::string path = c.dir + "/" + source::kReshardMarker;
    const nlohmann::json m = ReadJsonFile(path);
    WithContext(path, [&] {
      c.kind = "resharded";
      c.source_tag = m.at("source_tag").get<std::string>();
      c.atomic = m.at("atomic").get<std::string>();
      std::vector<std::string> given;
      c.layout = ApplyLayout(m.at("layout"), TargetLayout{}, path, &given);
      c.layout.model = m.at("naming").get<std::string>();
    });
    RequirePlainName(c.source_tag, path + ": source_tag");
    RequirePlainName(c.atomic, path + ": atomic");
    // written from DeepSpeed's own universal folder, which it reused as it is: reused again
    c.deepspeed_universal = store::IsDeepSpeedUniversal(root + "/" + c.atomic);
    return c;
  }
  const source::SourceIndex L = formats::IndexSource(c.dir);
  if (!L.errors.empty()) throw Error(L.errors.front());
  c.kind = "native", c.source_tag = c.tag, c.atomic = c.tag + "_universal";
  // ROOT/<tag>_universal that ucp did not write is the user's: never converted into, never replaced.
  // DeepSpeed's own (ds_to_universal.py) made from this tag is read as it is (its model-states files
  // are the tag's, byte for byte, as DeepSpeed copies them); anything else leaves it and converts beside it.
  const std::string theirs = root + "/" + c.atomic;
  // ucp's: its manifest, its journal, or its lock (a conversion killed before its journal), or empty.
  const bool ucps = fs::exists(theirs + "/" + store::kManifestName) || fs::exists(theirs + "/" + store::kJournalDir) ||
                    fs::exists(theirs + "/" + OutputLock::kFileName) || (fs::is_directory(theirs) && fs::is_empty(theirs));
  if (fs::exists(theirs) && !ucps) {
    if (store::IsDeepSpeedUniversal(theirs) && ModelStatesOf(theirs, c.dir))
      c.deepspeed_universal = true;
    else
      c.atomic = c.tag + "_ucp_universal";
  }
  c.layout.dp = L.DataParallel(), c.layout.sp = L.sp, c.layout.tp = L.tp, c.layout.pp = L.pp, c.layout.zero_stage = L.zero_stage;
  c.layout.dtype = L.dtype, c.layout.model = L.naming;
  c.layout.grad_accum_dtype = GradAccumDtypeOf(L.grad_accum_dtype, L.optimizer, L.zero_stage, L.dtype);
  if (L.moe) c.layout.ep = L.ep;
  c.layout.ds_version = L.ds_version;
  return c;
}

std::string Describe(const TargetLayout& t) { return t.Degrees() + " " + t.dtype; }

// Whether `current` has every degree given beside --gpus (dp, sp, tp, pp, zero_stage) as `target` names it.
bool KeepsGivenDegrees(const TargetLayout& current, const TargetLayout& target, const std::vector<std::string>& given) {
  const std::pair<const char*, bool> same[] = {{"dp", current.dp == target.dp},   {"sp", current.Sp() == target.Sp()},
                                               {"tp", current.tp == target.tp},   {"pp", current.pp == target.pp},
                                               {"zero_stage", current.zero_stage == target.zero_stage}};
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

// Whether the atomic checkpoint ROOT/<name> is complete and was converted from `current`'s files.
bool Reusable(const std::string& root, const Current& current) {
  const std::string dir = root + "/" + current.atomic;
  const std::string manifest = dir + "/" + store::kManifestName;
  if (current.deepspeed_universal) return true;  // DeepSpeed's own, made from this tag (ReadCurrent)
  if (!fs::exists(manifest) || fs::exists(dir + "/" + store::kJournalDir)) return false;
  if (current.kind != "native") return true;  // the atomic checkpoint a resharded tag was written from
  const nlohmann::json m = ReadJsonLeniently(manifest);
  const auto src = m.find("source");
  if (src == m.end() || !src->is_object()) return false;
  const std::string fingerprint = StringField(*src, "fingerprint");
  return !fingerprint.empty() && fingerprint == source::FolderFingerprint(current.dir);
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

// What the reshard after a conversion would refuse, refused before the conversion is done for
// nothing: a model the target format refuses; of the `target` layout (nullptr: not known yet), a TP
// degree the model's heads or FFN width do not divide and an SP layout UlyssesRefusal refuses.
// Throws ucp::Error in the reshard's words.
void RefuseBeforeConversion(const Current& current, const TargetLayout* target, const InPlaceOptions& o) {
  const source::SourceIndex L = formats::IndexSource(current.dir);
  // A target that judges the model itself (a model export) says now what it would refuse after.
  if (const formats::TargetDriver& d = formats::FindTarget(o.reshard.format); d.check_source) d.check_source(L, o.reshard.model);
  if (!target) return;
  ModelFacts facts;
  facts.heads = std::max<int64_t>(0, L.Fact("num_attention_heads"));
  facts.kv_heads = std::max<int64_t>(0, L.Fact("num_key_value_heads"));
  facts.ffn = std::max<int64_t>(0, L.Fact("ffn_hidden_size"));
  facts.seq_length = std::max<int64_t>(0, L.Fact("seq_length"));
  if (const std::string why = ModelTpRefusal(facts, target->tp); !why.empty()) throw Error("target " + why);
  // The Ulysses rules Validate applies after the conversion (the source's SP unless --sp).
  const int sp = target->sp > 0 ? target->sp : L.sp;
  if (const std::string why = UlyssesRefusal(facts, target->tp, sp, target->pp, target->model == "pipe", L.moe); !why.empty())
    throw Error("target " + why);
}

// --in-place --plan-only: what the step would do, from the metadata alone; nothing written.
int PrintPlan(const InPlaceOptions& o, const std::string& root, const Current& current, TargetLayout target,
              bool nothing_to_do, std::ostream& out, std::ostream& err) {
  nlohmann::json j = {{"root", root}, {"latest", current.tag}, {"kind", current.kind}};
  j["current_layout"] = current.layout_known ? current.layout.ToJson() : nlohmann::json(nullptr);
  const std::string atomic = root + "/" + current.atomic;
  std::string action = "nothing";
  nlohmann::json writes = nlohmann::json::array();
  int64_t bytes = 0;
  std::string why;
  try {
    if (!nothing_to_do) {
      const bool reuse = Reusable(root, current);
      action = reuse ? "reuse_and_reshard" : "convert_and_reshard";
      if (!reuse) {
        writes.push_back(atomic);
        bytes += FolderBytes(current.dir);
      }
      if (o.reshard.planner.gpus > 0 && reuse) {
        LayoutChoice choice = ChooseLayoutFor(atomic, o.reshard.planner);
        if (choice.chosen < 0) throw Error(choice.reason);
        target = choice.candidates[choice.chosen].layout;
      }
      const bool known = o.reshard.planner.gpus == 0 || reuse;  // the planner reads the atomic checkpoint
      if (known && target.dtype.empty() && reuse)  // an atomic checkpoint `latest` names: its job's precision
        target.dtype = ResolvedDtype(target, store::ReadAtomicManifest(atomic).at("source"));
      // What the real step would refuse, refused here in its words: from the atomic checkpoint it would
      // reuse, the whole plan (MakePlan validates); before a conversion, the model's names and heads.
      if (reuse && known) {
        const Source S = LoadSource(atomic);
        MakePlan(S, ResolveModel(S, target), 1, 0);
      } else if (!reuse) {
        RefuseBeforeConversion(current, known ? &target : nullptr, o);
      }
      if (known) {
        if (target.grad_accum_dtype.empty() && current.layout_known) target.grad_accum_dtype = current.layout.grad_accum_dtype;
        if (target.sp == 0 && current.layout_known) target.sp = current.layout.Sp();  // the job's Ulysses degree
        const std::string tag = InPlaceTag(current.source_tag, target);
        j["target_layout"] = target.ToJson();
        j["target_tag"] = tag;
        writes.push_back(root + "/" + tag);
      } else {
        j["target_layout"] = nullptr;
        j["target_tag"] = nullptr;
        why = "the layout for " + std::to_string(o.reshard.planner.gpus) + " GPUs is chosen after the conversion (the "
              "planner reads the atomic checkpoint)";
      }
      bytes += FolderBytes(current.dir);
    }
  } catch (const std::exception& e) {
    err << kTool << ": error: " << e.what() << " (--plan-only: the step would refuse this; nothing written)\n";
    return 1;
  }
  std::error_code ec;
  const auto space = fs::space(root, ec);
  const int64_t available = ec ? -1 : static_cast<int64_t>(space.available);
  j["action"] = action;
  j["atomic"] = current.atomic;
  j["writes"] = writes;
  j["bytes_to_write"] = bytes;  // about: the tag folder's size per checkpoint written
  j["bytes_available"] = available;
  j["fits"] = available < 0 || bytes <= available;
  if (!why.empty()) j["note"] = why;
  if (o.json) {
    out << j.dump(1) << "\n";
    return 0;
  }
  const std::string was = current.tag + " (" + (current.layout_known ? Describe(current.layout) + ", " : "") + current.kind + ")";
  out << "ucp-reshard --in-place --plan-only: " << root << "/latest names " << was << "\n";
  if (action == "nothing") {
    out << "  would do nothing: it is already the target layout\n";
  } else {
    out << "  would " << (action == "reuse_and_reshard" ? "reuse the atomic checkpoint " : "convert it into ") << atomic << ",\n";
    if (j["target_tag"].is_string())
      out << "  reshard into " << root << "/" << j["target_tag"].get<std::string>() << " (" << Describe(target)
          << "), and point latest at it\n";
    else
      out << "  then reshard and point latest at the new tag: " << why << "\n";
    out << "  space: about " << HumanBytes(static_cast<double>(bytes)) << " to write, "
        << (available < 0 ? std::string("free space unknown") : HumanBytes(static_cast<double>(available)) + " free")
        << (j["fits"].get<bool>() ? "" : ": DOES NOT FIT") << "\n";
  }
  out << "  nothing written (--plan-only)\n";
  return j["fits"].get<bool>() ? 0 : 1;
}

// The atomic checkpoint of the tag `latest` names: ROOT/<current.atomic>, reused when it holds what
// the tag holds now (or is DeepSpeed's own universal folder made from it), else converted into it
// (refused first when the step after it would refuse the layout `refuse`, where not nullptr). Collective; empty
// when it failed (the lowest failing rank said why).
std::string AtomicOfTag(const InPlaceOptions& o, const std::string& root, const Current& current, const TargetLayout* refuse,
                        shuffle::Comm& comm, std::ostream& out, std::ostream& err) {
  const bool talk = comm.rank() == 0 && !o.reshard.quiet;
  const std::string was = current.tag + " (" + (current.layout_known ? Describe(current.layout) + ", " : "") + current.kind + ")";
  bool reuse = false;
  std::string error = Capture([&] { reuse = Reusable(root, current); });
  if (AnyFailed(comm, error, err, kTool)) return "";
  const std::string atomic = root + "/" + current.atomic;
  if (reuse) {
    if (talk)
      err << kTool << ": " << was << ": reusing " << (current.deepspeed_universal ? "DeepSpeed's own universal checkpoint " : "the atomic checkpoint ")
          << atomic << (current.deepspeed_universal ? " (read-only)" : "") << "\n";
    return atomic;
  }
  error = Capture([&] { RefuseBeforeConversion(current, refuse, o); });
  if (AnyFailed(comm, error, err, kTool)) return "";
  if (talk) err << kTool << ": " << was << ": converting it into " << atomic << "\n";
  convert::ConvertOptions c;
  c.source = current.dir, c.output = atomic, c.force = true;
  c.patterns_dir = o.patterns_dir, c.quiet = o.reshard.quiet, c.progress = o.progress;
  if (convert::RunConvert(c, comm, out, err) != 0) return "";
  return atomic;
}

}  // namespace

bool IsCheckpointRoot(const std::string& dir) {
  return fs::exists(dir + "/latest") && !fs::exists(dir + "/" + store::kManifestName) && !store::IsDeepSpeedUniversal(dir);
}

int RunFromRoot(const InPlaceOptions& o, shuffle::Comm& comm, std::ostream& out, std::ostream& err) {
  const std::string root = fs::path(o.root).lexically_normal().string();
  Current current;
  bool reusable = false;
  std::string error = Capture([&] {
    current = ReadCurrent(root);
    if (!o.plan_only) RefuseOutputWithin(o.reshard.output, current.dir, "the checkpoint folder");
    reusable = Reusable(root, current);
  });
  if (AnyFailed(comm, error, err, kTool)) return 1;
  ReshardOptions r = o.reshard;
  if (o.plan_only && !reusable) {  // nothing to plan from before the conversion: what would happen, or its refusal
    error = Capture([&] { RefuseBeforeConversion(current, nullptr, o); });
    if (AnyFailed(comm, error, err, kTool)) return 1;
    if (comm.rank() == 0) {
      const nlohmann::json j = {{"root", root}, {"latest", current.tag}, {"kind", current.kind},
                                {"atomic", root + "/" + current.atomic}, {"convert", true}};
      if (o.json)
        out << j.dump(1) << "\n";
      else
        out << root << "/latest names " << current.tag << " (" << current.kind << "): it would be converted into " << root
            << "/" << current.atomic << " first, then written from it (run without --plan-only, or ucp-convert it first, "
            << "for the plan of the files)\n";
    }
    return 0;
  }
  r.atomic_dir = AtomicOfTag(o, root, current, nullptr, comm, out, err);
  if (r.atomic_dir.empty()) return 1;
  return RunReshard(r, comm, out, err);
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
  Current current;
  TargetLayout target = o.reshard.target;
  bool nothing_to_do = false;
  std::string error = Capture([&] {
    current = ReadCurrent(root);
    if (!current.layout_known) return;
    if (std::find(o.given.begin(), o.given.end(), "dtype") == o.given.end())
      target.dtype = current.layout.dtype;  // the training dtype stays unless --dtype says
    if (o.reshard.planner.gpus > 0)  // the planner is asked only when the GPU count, a degree given or a model fact changed
      nothing_to_do = current.layout.SeqDp() * current.layout.tp * current.layout.pp == o.reshard.planner.gpus &&
                      KeepsGivenDegrees(current.layout, target, o.given) && !AsksActivationFacts(o.reshard.planner);
    else
      nothing_to_do = Same(current.layout, target);
  });
  if (AnyFailed(comm, error, err, kTool)) return 1;
  const std::string was = current.tag + " (" + (current.layout_known ? Describe(current.layout) + ", " : "") + current.kind + ")";
  if (o.plan_only) {
    int code = 0;
    if (comm.rank() == 0) code = PrintPlan(o, root, current, target, nothing_to_do, out, err);
    return code;
  }
  if (nothing_to_do) {
    if (talk) err << kTool << ": " << root << "/latest names " << was << ": already the target layout; nothing to do\n";
    return 0;
  }

  const std::string atomic = AtomicOfTag(o, root, current, o.reshard.planner.gpus > 0 ? nullptr : &target, comm, out, err);
  if (atomic.empty()) return 1;

  ReshardOptions r = o.reshard;
  r.atomic_dir = atomic, r.output = root, r.in_place = true;
  r.planner.base.dtype = target.dtype;
  if (r.planner.gpus > 0) {
    LayoutChoice choice;
    error = Capture([&] {
      choice = ChooseLayoutFor(atomic, r.planner);
      if (choice.chosen < 0) throw Error(choice.reason);
    });
    if (AnyFailed(comm, error, err, kTool)) return 1;
    target = choice.candidates[choice.chosen].layout;
    if (talk) err << kTool << ": layout for " << r.planner.gpus << " GPUs: " << choice.reason << "\n";
    if (talk && !choice.job_change.empty()) err << kTool << ": note: " << choice.job_change << "\n";
    r.planner = PlannerRequest{};
    if (current.layout_known && Same(current.layout, target)) {
      if (talk) err << kTool << ": " << was << " is already that layout; nothing to do\n";
      return 0;
    }
  }
  std::string naming;
  error = Capture([&] {
    const nlohmann::json m = store::ReadAtomicManifest(atomic);  // ucp's, or DeepSpeed's universal folder described
    if (target.sp == 0) target.sp = m.at("source").value("sp", 1);  // the job's Ulysses degree unless --sp says (it names the tag)
    naming = ResolvedModel(target, WithContext(atomic + "/" + store::kManifestName,
                                               [&] { return m.at("source").at("naming").get<std::string>(); }));
    target.dtype = ResolvedDtype(target, m.at("source"));  // the job's precision unless --dtype says (it names the tag)
    target.grad_accum_dtype = ResolvedGradAccumDtype(target, m.at("source"));  // it names the tag (InPlaceTag)
  });
  if (AnyFailed(comm, error, err, kTool)) return 1;
  r.target = target;
  r.output_tag = InPlaceTag(current.source_tag, target);
  r.marker = {{"tool", kTool}, {"ucp_version", UCP_VERSION}, {"created", OutputTimestamp()},
              {"source_tag", current.source_tag}, {"atomic", current.atomic}, {"layout", target.ToJson()},
              {"naming", naming}};
  if (r.output_tag == current.tag) {
    if (talk) err << kTool << ": error: " << current.tag << " is named after the target layout but is not it\n";
    return 1;
  }
  if (RunReshard(r, comm, out, err) != 0) return 1;
  std::string rollback = current.tag;  // the tag `latest` named, unless --keep removed it
  error = comm.rank() == 0 ? Capture([&] {
    if (o.keep <= 0) return;
    for (const auto& name : Removable(root, r.output_tag, o.keep)) {
      if (talk) err << kTool << ": --keep " << o.keep << ": `latest` names " << r.output_tag << " already; removing " << root << "/" << name << "\n";
      fs::remove_all(root + "/" + name);
      if (name == rollback) rollback = current.source_tag;
    }
  }) : "";
  if (AnyFailed(comm, error, err, kTool)) return 1;
  if (talk)
    err << kTool << ": " << root << "/latest now names " << r.output_tag << " (" << Describe(target) << "); to roll back, "
        << "write " << rollback << " into it\n";
  return 0;
}

}  // namespace ucp::reshard
