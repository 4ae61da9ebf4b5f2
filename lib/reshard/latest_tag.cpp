#include "reshard/latest_tag.h"

#include <algorithm>
#include <filesystem>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/names.h"
#include "core/output_lock.h"
#include "formats/registry.h"
#include "reshard/job_output.h"
#include "store/atomic_store.h"
#include "store/universal_folder.h"
#include "layout/planner.h"
#include "layout/reshard_plan.h"

namespace ucp::reshard {

namespace fs = std::filesystem;

namespace {

nlohmann::json ReadJsonFile(const std::string& path) {
  const std::optional<std::string> text = ReadWholeFile(path);
  if (!text) throw Error(path + ": cannot read");
  const nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw Error(path + ": not a JSON object");
  return j;
}

}  // namespace

nlohmann::json ReadJsonLeniently(const std::string& path) {
  nlohmann::json j = nlohmann::json::parse(ReadWholeFile(path).value_or(""), nullptr, false);
  return j.is_object() ? j : nlohmann::json::object();
}

std::string StringField(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

TargetLayout LayoutOf(const source::SourceIndex& L) {
  TargetLayout t;
  t.dp = L.DataParallel(), t.sp = L.sp, t.tp = L.tp, t.pp = L.pp, t.zero_stage = L.zero_stage;
  t.dtype = L.dtype, t.model = L.naming;
  t.grad_accum_dtype = GradAccumDtypeOf(L.grad_accum_dtype, L.optimizer, L.zero_stage, L.dtype);
  if (L.moe) t.ep = L.ep;
  t.ds_version = L.ds_version;
  return t;
}

namespace {

// The plain folder name ROOT/latest_universal holds, or "" (none, unreadable, or not a plain name).
std::string ReadLatestUniversal(const std::string& root) {
  const std::optional<std::string> text = ReadWholeFile(root + "/latest_universal");
  if (!text) return "";
  const size_t b = text->find_first_not_of(" \t\r\n"), e = text->find_last_not_of(" \t\r\n");
  const std::string name = b == std::string::npos ? "" : text->substr(b, e - b + 1);
  try {
    RequirePlainName(name, "latest_universal");
  } catch (const Error&) {
    return "";
  }
  return name;
}

}  // namespace

LatestTag ReadLatest(const std::string& root) {
  LatestTag c;
  const std::string latest = root + "/latest";
  if (!fs::exists(root)) throw Error(root + ": does not exist");
  if (!fs::exists(latest)) {
    if (const auto tags = source::TagFoldersWithoutLatest(root); !tags.empty()) throw Error(source::TagWithoutLatestError(root, tags));
    if (const formats::SourceDriver* d = formats::ProbeSource(root); d && std::string(d->name) != "deepspeed")
      throw Error(root + ": a " + d->name + " checkpoint: --in-place writes a DeepSpeed layout beside a DeepSpeed run's tags; convert it "
                  "(mpirun -np N ucp-convert " + root + " -o ATOMIC), then ucp-reshard ATOMIC -o OUT with the target it has (--format hf)");
    const std::string below = formats::CheckpointBelow(root);
    fs::path self = fs::path(root).lexically_normal();
    if (!self.has_filename()) self = self.parent_path();  // "global_step4/"
    const fs::path parent = self.parent_path();
    const bool tag = formats::ProbeSource(root) && fs::exists(parent / "latest");  // global_stepN given itself
    throw Error(root + ": no `latest` file here: --in-place takes the folder that holds a training run's `latest` (a Trainer's "
                "checkpoint-N, a Megatron-DeepSpeed run's save folder)" +
                (tag ? "; this is a tag folder: give the folder holding its `latest`, " + parent.string()
                     : below.empty() ? std::string() : "; " + below));
  }
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
  // ROOT/<tag>_universal that ucp did not write is the user's: never converted into, never replaced,
  // never reused: DeepSpeed's own (ds_to_universal.py) records nothing of the files it read, so
  // whether it holds the tag's values now (not those of a save since) cannot be shown. ucp converts
  // beside it, into an atomic checkpoint whose manifest records the tag's fingerprint.
  const std::string theirs = root + "/" + c.atomic;
  // ucp's: its manifest, its journal, or its lock (a conversion killed before its journal), or empty.
  const bool ucps = fs::exists(theirs + "/" + store::kManifestName) || fs::exists(theirs + "/" + store::kJournalDir) ||
                    fs::exists(theirs + "/" + OutputLock::kFileName) || (fs::is_directory(theirs) && fs::is_empty(theirs));
  if (fs::exists(theirs) && !ucps) {
    c.atomic = c.tag + "_ucp_universal";
    c.not_reused = theirs + (store::IsDeepSpeedUniversal(theirs)
                                 ? " is DeepSpeed's universal checkpoint, which records nothing of the files it was made "
                                   "from (" + c.tag + " may have been saved again since): not reused, left as it is"
                                 : " is not ucp's: left as it is");
  }
  c.layout = LayoutOf(L);
  // ucp-convert ROOT -o ROOT/NAME names its output in ROOT/latest_universal: read where it is when it
  // is of this tag's files as they are now (else the conversion goes where it would have).
  if (const auto named = ReadLatestUniversal(root); !named.empty() && named != c.atomic) {
    LatestTag other = c;
    other.atomic = named;
    if (Reusable(root, other)) c.atomic = named, c.not_reused.clear();
  }
  return c;
}

std::string Describe(const TargetLayout& t) { return t.Degrees() + " " + t.dtype; }

std::string Was(const LatestTag& c) {
  return c.tag + " (" + (c.layout_known ? Describe(c.layout) + ", " : "") + c.kind + ")";
}

bool Reusable(const std::string& root, const LatestTag& current) {
  const std::string dir = root + "/" + current.atomic;
  const std::string manifest = dir + "/" + store::kManifestName;
  if (current.deepspeed_universal) return true;  // what the resharded tag was written from (ReadLatest)
  if (!fs::exists(manifest) || fs::exists(dir + "/" + store::kJournalDir)) return false;
  if (current.kind != "native") return true;  // the atomic checkpoint a resharded tag was written from
  const nlohmann::json m = ReadJsonLeniently(manifest);
  const auto src = m.find("source");
  if (src == m.end() || !src->is_object()) return false;
  const std::string fingerprint = StringField(*src, "fingerprint");
  return !fingerprint.empty() && fingerprint == source::FolderFingerprint(current.dir);
}

void RefuseBeforeConversion(const LatestTag& current, const TargetLayout* target, const InPlaceOptions& o) {
  const source::SourceIndex L = formats::IndexSource(current.dir);
  if (o.reshard.format == "deepspeed") RefuseMisnamedCheckpoint(L.job, o.reshard.output, o.reshard.in_place);
  // A target that judges the model itself (a model export) says now what it would refuse after.
  if (const formats::TargetDriver& d = formats::FindTarget(o.reshard.format); d.check_source) d.check_source(L, o.reshard.model);
  if (!target) return;
  std::vector<std::string> names;
  for (const auto& p : L.params) names.push_back(p.name);
  if (L.naming == "plain" && !names.empty() && !GptModelNames(names)) {  // a plain engine around another model
    if (const std::string why = ModuleLayoutRefusal(*target, L.tp, L.sp, names.front()); !why.empty()) throw Error("target " + why);
    return;
  }
  const ModelFacts facts = ShapeFactsOf([&L](const char* key) { return std::max<int64_t>(0, L.Fact(key)); });
  if (const std::string why = ModelTpRefusal(facts, target->tp); !why.empty()) throw Error("target " + why);
  // The Ulysses rules Validate applies after the conversion (the source's SP unless --sp).
  const int sp = target->sp > 0 ? target->sp : L.sp;
  if (const std::string why = UlyssesRefusal(facts, target->tp, sp, target->pp, target->model == "pipe", L.moe); !why.empty())
    throw Error("target " + why);
}

convert::ConvertOptions ConversionInto(const std::string& output, const InPlaceOptions& o, const LatestTag& current) {
  convert::ConvertOptions c;
  // From the root, whose `latest` names it: the framework's files beside the tag (Trainer's) travel too.
  c.source = fs::path(current.dir).parent_path().string(), c.output = output, c.force = true;
  c.removed_on_failure = true;  // the scratch folder always, the folder beside the tag where this run made it
  c.patterns_dir = o.patterns_dir, c.quiet = o.reshard.quiet, c.progress = o.progress, c.strict = o.strict;
  return c;
}

}  // namespace ucp::reshard
