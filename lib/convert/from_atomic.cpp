// ucp-convert --from-atomic: an atomic checkpoint of one store to another (DESIGN.md section 4),
// without the source checkpoint. Every rank reads the manifest and tells the writer of every
// parameter; parameters are spread over the ranks by bytes (largest first, to the least loaded);
// each rank reads its parameters' tensors whole from the source store and writes them to the
// target store; rank 0 copies the non-tensor files and commits the manifest last.
#include <array>
#include <chrono>
#include <map>
#include <set>
#include <filesystem>

#include "convert/convert.h"
#include "convert/steps.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/format.h"
#include "core/commit.h"
#include "core/output_lock.h"
#include "core/xxhash64.h"
#include "plan/convert_plan.h"
#include "shuffle/agree.h"
#include "store/atom_store.h"
#include "store/universal_folder.h"

namespace ucp::convert {
namespace fs = std::filesystem;
using shuffle::AnyFailed;
using shuffle::Capture;

namespace {

// The source's files that are no tensor of its store: zero/optimizer_state.pt, model-states files.
std::vector<store::FileRecord> NonTensorFiles(const store::AtomReader& reader) {
  std::set<std::string> tensors = {store::kAtomsH5};
  for (const auto& p : reader.manifest().at("params"))
    if (p.contains("files"))
      for (const auto& [state, path] : p.at("files").items()) tensors.insert(path.get<std::string>());
  std::vector<store::FileRecord> out;
  for (const auto& f : reader.manifest().at("files")) {
    auto r = store::FileRecord::FromJson(f);
    if (!tensors.count(r.path)) out.push_back(r);
  }
  return out;
}

// DeepSpeed's own universal folder has no ucp manifest to copy from: said as what it is, with the
// tools that read it, rather than as a folder missing its manifest.
void RefuseDeepSpeedUniversal(const std::string& dir) {
  if (!store::IsDeepSpeedUniversal(dir)) return;
  throw Error(dir + ": DeepSpeed's own universal checkpoint (written by ds_to_universal.py), which has no " +
              store::kManifestName + ", so --from-atomic cannot copy it: ucp-reshard " + dir +
              " -o OUT ... reads it directly; to get a ucp atomic checkpoint, ucp-convert the tag it came from");
}

// Step 1: the source's manifest, keys and steps, and the writer's list of every parameter.
std::unique_ptr<store::AtomReader> OpenSource(const ConvertOptions& o, std::vector<store::AtomSpec>& specs) {
  if (o.output.empty()) throw Error("an output folder is required (-o OUT)");
  RefuseOutputWithin(o.output, o.from_atomic, "the --from-atomic folder");
  auto reader = store::AtomReader::Open(o.from_atomic);
  for (const auto& p : reader->params()) {
    specs.push_back({p.name, p.shape, p.meta, reader->ReadUniversalKeys(p.name), reader->ReadStep(p.name), p.split_dim});
    reader->Forget(p.name);
  }
  return reader;
}

// Step 2 (rank 0): the output folder, by the rules of a conversion from a source; locked first.
std::unique_ptr<OutputFolder> ClaimAtomicFolder(const ConvertOptions& o, std::string* lock_note) {
  auto folder = std::make_unique<OutputFolder>(o.output, "ucp-convert", store::AtomicFolderMarkers(), lock_note);
  RefuseForeignForce(o, *folder);
  folder->RequireEmpty(o.force, store::AtomicFolderContents());
  CreateSpreadFolder(o.output + "/zero");  // a folder per parameter
  return folder;
}

}  // namespace

bool ClaimAndOpenWriter(const ConvertOptions& o, store::StoreKind kind, const std::vector<store::AtomSpec>& specs, shuffle::Comm& comm,
                        std::ostream& err, std::unique_ptr<OutputFolder>& folder, std::unique_ptr<store::AtomWriter>& writer) {
  std::string lock_note;
  std::string error = comm.rank() == 0 ? Capture([&] { folder = ClaimAtomicFolder(o, &lock_note); }) : "";
  if (AnyFailed(comm, error, err, "ucp-convert")) return false;
  if (comm.rank() == 0 && !o.quiet && !lock_note.empty()) err << "ucp-convert: note: " << lock_note << "\n";
  error = Capture([&] { writer = store::AtomWriter::Create(kind, o.output, specs, comm); });
  return !AnyFailed(comm, error, err, "ucp-convert");
}

namespace {

// The files a parameter's manifest entry lists, each as the manifest's file list says.
void VerifyFilesOf(const ConvertOptions& o, const std::map<std::string, store::FileRecord>& listed, const nlohmann::json& entry) {
  if (!entry.contains("files")) return;
  for (const auto& [key, rel] : entry.at("files").items()) {
    auto it = listed.find(rel.get<std::string>());
    std::string why = "not in the manifest's file list";
    if (it == listed.end() || !store::Verify(o.from_atomic, it->second, &why))
      throw Error(o.from_atomic + "/" + rel.get<std::string>() + ": " + why);
  }
}

// A state read from atoms.h5, against the XXH64 its manifest entry gives.
void CheckHdf5Digest(const ConvertOptions& o, const nlohmann::json& entry, const std::string& param, plan::State state,
                     const float* data, int64_t numel) {
  if (!entry.contains("hdf5")) return;
  std::string name(plan::StateName(state));
  std::string got = HexDigest(XxHash64::Of(data, 4 * static_cast<size_t>(numel)));
  std::string want = entry.at("hdf5").at("xxh64").at(name).get<std::string>();
  if (got != want)
    throw Error(o.from_atomic + "/" + store::kAtomsH5 + ": /" + param + "/" + name + ": xxh64 " + got + ", the manifest says " + want);
}

// Step 3: this rank's parameters (`owner`), one whole tensor at a time, checked against the
// source's checksums before it is written anywhere. Returns the tensor bytes written.
int64_t CopyOwned(const ConvertOptions& o, store::AtomReader& reader, store::AtomWriter& writer, const std::vector<int>& owner,
                  int rank, std::vector<store::FileRecord>& records) {
  std::map<std::string, store::FileRecord> listed;
  for (const auto& f : reader.manifest().at("files")) listed[f.at("path").get<std::string>()] = store::FileRecord::FromJson(f);
  int64_t written = 0;
  std::vector<float> buf;
  for (size_t k = 0; k < reader.params().size(); ++k) {
    if (owner[k] != rank) continue;
    const auto& p = reader.params()[k];
    const auto& entry = reader.manifest().at("params").at(k);
    VerifyFilesOf(o, listed, entry);
    buf.resize(static_cast<size_t>(std::max<int64_t>(p.numel, 1)));
    for (int s = 0; s < plan::kStates; ++s) {
      auto state = static_cast<plan::State>(s);
      reader.ReadAll(p.name, state, buf.data());
      CheckHdf5Digest(o, entry, p.name, state, buf.data(), p.numel);
      for (auto& r : writer.Write(p.name, state, buf.data())) records.push_back(r);
      written += 4 * p.numel;
    }
    reader.Forget(p.name);
  }
  return written;
}

// Step 4 (rank 0): the non-tensor files copied, the manifest last, latest_universal for the .pt store.
void CommitCopy(const ConvertOptions& o, store::StoreKind kind, const store::AtomReader& reader, const store::StoreCommit& committed,
                const std::vector<std::string>& gathered, OutputFolder& folder) {
  std::map<std::string, store::FileRecord> files;
  AddGathered(gathered, files);
  for (const auto& r : committed.files) files[r.path] = r;
  for (const auto& f : NonTensorFiles(reader)) {
    std::string why;
    if (!store::Verify(o.from_atomic, f, &why)) throw Error(o.from_atomic + "/" + f.path + ": " + why);
    fs::create_directories(fs::path(o.output + "/" + f.path).parent_path());
    files[f.path] = store::CopyFileAtomically(o.from_atomic + "/" + f.path, o.output, f.path);
  }
  nlohmann::json params = nlohmann::json::array();
  for (const auto& p : reader.params()) {
    nlohmann::json e = p.meta;
    e.update(committed.storage.at(p.name));
    params.push_back(e);
  }
  const auto& m = reader.manifest();
  auto manifest = store::AssembleManifest(std::string(store::StoreName(kind)), m.at("source"), m.at("family"), params, files);
  // latest_universal where DeepSpeed's universal load reads it: the .pt store of a checkpoint it resumes, in
  // its tag's checkpoint root.
  auto latest = store::PointsLatestUniversal(o.output, manifest) ? store::StageLatestUniversal(o.output) : nullptr;
  folder.Mark({manifest.dump(1) + "\n"});  // the commit point (core/commit.h, step 4)
  if (latest) latest->Commit();
}

}  // namespace

int RunConvertFromAtomic(const ConvertOptions& o, shuffle::Comm& comm, std::ostream& out, std::ostream& err) {
  const int rank = comm.rank(), ranks = comm.size();
  const bool talk = rank == 0 && !o.quiet;
  const auto t0 = std::chrono::steady_clock::now();

  // 0. Rank 0 checks atoms.h5 whole before any rank opens it: HDF5 trusts what it reads from a file.
  std::string error = rank == 0 ? Capture([&] {
    RefuseDeepSpeedUniversal(o.from_atomic);
    store::CheckAtomsH5Whole(o.from_atomic);
  })
                                : "";
  if (AnyFailed(comm, error, err, "ucp-convert")) return 1;

  // 1. Every rank: the source's manifest, keys and steps; the writer's list of every parameter.
  std::unique_ptr<store::AtomReader> reader;
  store::StoreKind kind = store::StoreKind::Pt;
  std::vector<store::AtomSpec> specs;
  error = Capture([&] {
    kind = store::WritableStoreFromName(o.format);
    reader = OpenSource(o, specs);
  });
  if (AnyFailed(comm, error, err, "ucp-convert")) return 1;
  if (talk)
    err << "ucp-convert: " << o.from_atomic << ": " << store::StoreName(reader->store()) << " store, "
        << reader->params().size() << " parameters -> " << o.output << " (" << o.format << "); " << comm.name() << "\n";

  // 2-3. Rank 0: the output folder; the writer (collective); then each rank's parameters, one whole
  // tensor at a time.
  std::unique_ptr<OutputFolder> folder;
  std::unique_ptr<store::AtomWriter> writer;
  if (!ClaimAndOpenWriter(o, kind, specs, comm, err, folder, writer)) return 1;
  // Which rank writes each parameter: by bytes, longest first, the same answer on every rank.
  std::vector<int64_t> weights;
  for (const auto& p : reader->params()) weights.push_back(p.numel + 1);
  const auto owner = plan::AssignLpt(weights, ranks);
  std::vector<store::FileRecord> records;
  int64_t written = 0;
  error = Capture([&] { written = CopyOwned(o, *reader, *writer, owner, rank, records); });
  if (AnyFailed(comm, error, err, "ucp-convert")) return 1;
  store::StoreCommit committed;
  error = Capture([&] { committed = writer->Commit(); });
  if (AnyFailed(comm, error, err, "ucp-convert")) return 1;

  // 4. Rank 0: the non-tensor files, the manifest last, latest_universal for the .pt store.
  auto gathered = GatherRecords(comm, records);
  std::array<int64_t, 2> totals = {static_cast<int64_t>(reader->bytes_read()), written};
  comm.AllreduceSum(totals);
  error = rank == 0 ? Capture([&] { CommitCopy(o, kind, *reader, committed, gathered, *folder); }) : "";
  if (AnyFailed(comm, error, err, "ucp-convert")) return 1;
  if (talk) {
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    char buf[256];
    std::snprintf(buf, sizeof buf, "ucp-convert: wrote %s (%s store): %zu parameters, %s of tensors read, %s written in %.2fs\n",
                  o.output.c_str(), o.format.c_str(), reader->params().size(), HumanBytes(double(totals[0])).c_str(),
                  HumanBytes(double(totals[1])).c_str(), secs);
    err << buf;
  }
  (void)out;
  return 0;
}

}  // namespace ucp::convert
