// Step 4 of a conversion, the commit (core/commit.h, step 4; rank 0): every rank's files gathered,
// the optimizer state and model-states files among them, the manifest written last as the commit
// point, then latest_universal where DeepSpeed's universal load follows it.
#include <filesystem>

#include "convert/steps.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "store/universal_folder.h"

namespace ucp::convert {
namespace fs = std::filesystem;
using plan::State;

std::vector<std::string> GatherRecords(shuffle::Comm& comm, const std::vector<store::FileRecord>& records) {
  nlohmann::json mine = nlohmann::json::array();
  for (const auto& r : records) mine.push_back(r.ToJson());
  return comm.GatherToRoot(mine.dump());
}

void AddGathered(const std::vector<std::string>& gathered, std::map<std::string, store::FileRecord>& files) {
  for (const auto& g : gathered)
    for (const auto& r : nlohmann::json::parse(g)) files[r.at("path").get<std::string>()] = store::FileRecord::FromJson(r);
}

namespace {

// Every file of the conversion by path: the journal's (verified when resuming), every rank's, the
// store's own. Items skipped on resume must all be in the journal; anything else is an internal error.
std::map<std::string, store::FileRecord> AllFiles(const Planned& x, const OutputClaim& claim, const RankOutput& out,
                                                  const std::vector<std::string>& gathered) {
  std::map<std::string, store::FileRecord> files;
  for (const auto& [path, r] : claim.journaled) files[path] = r;
  AddGathered(gathered, files);
  for (const auto& r : out.committed.files) files[r.path] = r;
  for (const auto& P : x.plan.params)
    for (int s = 0; s < x.plan.states && x.kind == store::StoreKind::Pt; ++s)
      if (!files.count(store::StateRelPath(P.name, static_cast<State>(s))))
        throw Error("internal: no file recorded for " + store::StateRelPath(P.name, static_cast<State>(s)));
  return files;
}

}  // namespace

nlohmann::json ParamEntries(const Planned& x, const nlohmann::json& storage) {
  std::map<std::string, const patterns::ParamPattern*> pattern_of;
  for (const auto& p : x.M.params) pattern_of[p.name] = &p;
  nlohmann::json params = nlohmann::json::array();
  for (const auto& P : x.plan.params) {
    auto p = store::ParamMetaJson(x.L, *pattern_of.at(P.name), P);
    p.update(storage.at(P.name));
    params.push_back(p);
  }
  return params;
}

Committed CommitManifest(const ConvertOptions& o, const Planned& x, OutputClaim& claim, const RankOutput& out,
                         const std::vector<std::string>& gathered) {
  const auto files = AllFiles(x, claim, out, gathered);
  nlohmann::json source = store::SourceJson(x.L, x.M);
  if (o.weights_only) source["weights_only"] = true, source["optimizer"] = "none";  // as an import's (schemas/manifest.schema.json)
  auto manifest = store::AssembleManifest(std::string(store::StoreName(x.kind)), source, store::FamilyJson(x.M),
                                          ParamEntries(x, out.committed.storage), files);
  // latest_universal, which DeepSpeed's universal load follows: the .pt store of a checkpoint it resumes,
  // in its tag's checkpoint root.
  Committed done;
  done.points_latest = store::PointsLatestUniversal(o.output, manifest);
  auto latest = done.points_latest ? store::StageLatestUniversal(o.output) : nullptr;
  if (latest) done.previous_latest = ReadWholeFile(latest->path()).value_or("");
  claim.folder->Mark({manifest.dump(1) + "\n"});  // the commit point (step 4)
  if (latest) latest->Commit();
  store::Journal::Remove(o.output);
  return done;
}

// DeepSpeed's load_universal follows latest_universal: moving it is said (it may have named
// DeepSpeed's own universal folder).
void SayLatestMoved(const std::string& output, const Committed& committed, std::ostream& err) {
  if (!committed.points_latest) return;
  const std::string named = fs::path(output).lexically_normal().filename().string();
  if (!committed.previous_latest.empty() && committed.previous_latest != named && !named.empty())
    err << "ucp-convert: note: " << fs::path(output).lexically_normal().parent_path().string()
        << "/latest_universal named " << committed.previous_latest << "; it now names " << named << "\n";
}

}  // namespace ucp::convert
