// A weights-only conversion that copies no tensor (ConvertOptions::reference, ucp-reshard's scratch
// for a target of the weights alone): where every parameter is one copy placed as it is (TP = 1, no
// copy compared, summed or tied across stages), its atomic tensor is a run of the source's flat
// partitions, vocabulary padding rows left at the end. The scratch then holds the side files and a
// manifest of the partitions store (store/atom_store_partitions.cpp): each parameter's runs as byte
// ranges of the optimizer files, with the zip records they lie in; the export reads the weights
// there, each record checked against its CRC-32 as the conversion's mapper checks it. Nothing is
// written that the export would read back, and no moment is read.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

#include "convert/steps.h"
#include "core/error.h"
#include "core/format.h"
#include "core/task_pool.h"
#include "shuffle/agree.h"
#include "store/universal_folder.h"

namespace ucp::convert {
namespace fs = std::filesystem;
using shuffle::AnyFailed;
using shuffle::Capture;

namespace {

// Whether the atomic tensor is the copy's leading elements: one copy, placed as it is, whole, its
// shape the atomic one but for padding rows at the end of dimension 0.
bool PlacedWhole(const plan::ParamPlan& P) {
  if (P.copies.size() != 1 || P.averaged) return false;
  const plan::Copy& c = P.copies[0];
  if (c.mode != plan::CopyMode::Place || c.stream_start != 0 || c.shape != P.joined_shape) return false;
  const auto& j = P.joined_shape;
  const auto& f = P.full_shape;
  if (j.size() != f.size()) return false;
  if (j.empty()) return true;
  return f[0] <= j[0] && std::equal(f.begin() + 1, f.end(), j.begin() + 1);
}

// The manifest's partition_files and each parameter's runs.
struct Partitions {
  nlohmann::json files = nlohmann::json::array();
  std::map<std::string, nlohmann::json> runs;  // parameter -> its "partitions"
};

Partitions PartitionsOf(const Planned& x) {
  const source::SourceIndex& L = x.L;
  std::map<int, int> slot;                 // holder file -> index in `files`
  std::map<int, std::set<size_t>> used;    // holder file -> its records the runs touch
  Partitions out;
  for (const plan::ParamPlan& P : x.plan.params) {
    nlohmann::json runs = nlohmann::json::array();
    for (const plan::Piece& pc : P.pieces) {
      const int64_t at = pc.stream_start, numel = std::min(pc.numel, P.full_numel - at);
      if (numel <= 0) continue;  // vocabulary padding rows
      const source::ShardFile& f = L.files.at(static_cast<size_t>(pc.file));
      const source::Extent& m = f.groups.at(static_cast<size_t>(pc.group))[0];
      if (pc.src_start + numel > m.numel)
        throw Error(source::FileWhere(L, pc.file) + ": parameter '" + P.name + "' lies outside its flat fp32 partition");
      const int holder = m.file >= 0 ? m.file : pc.file;
      auto [it, added] = slot.emplace(holder, static_cast<int>(slot.size()));
      if (added) out.files.push_back({{"path", fs::absolute(L.dir + "/" + L.files.at(static_cast<size_t>(holder)).name).lexically_normal().string()}});
      const uint64_t offset = m.offset + 4 * static_cast<uint64_t>(pc.src_start), end = offset + 4 * static_cast<uint64_t>(numel);
      const auto& records = L.files.at(static_cast<size_t>(holder)).checksummed;
      for (size_t r = 0; r < records.size(); ++r)
        if (records[r].offset < end && records[r].offset + records[r].size > offset) used[holder].insert(r);
      runs.push_back({{"file", it->second}, {"at", at}, {"numel", numel}, {"offset", offset}});
    }
    out.runs[P.name] = std::move(runs);
  }
  for (const auto& [holder, k] : slot) {
    nlohmann::json records = nlohmann::json::array();
    for (size_t r : used[holder]) {
      const auto& c = L.files.at(static_cast<size_t>(holder)).checksummed[r];
      records.push_back({{"name", c.name}, {"offset", c.offset}, {"size", c.size}, {"crc32", c.crc32}});
    }
    out.files[static_cast<size_t>(k)]["records"] = std::move(records);
  }
  return out;
}

}  // namespace

bool ReadsAsIs(const Planned& x) {
  return std::all_of(x.plan.params.begin(), x.plan.params.end(), PlacedWhole);
}

int RunReference(const ConvertOptions& o, Planned& x, shuffle::Comm& comm, std::ostream& err) {
  const int rank = comm.rank();
  const auto t0 = std::chrono::steady_clock::now();
  x.kind = store::StoreKind::Partitions;
  OutputClaim claim;
  if (auto status = ClaimOutput(o, x, comm, err, claim)) return *status;
  // The side files (the carried model-states files, the job's files), as a conversion writes them.
  RankOutput mine;
  std::string error = Capture([&] {
    TaskPool writers(1, int64_t{1} << 40);
    SubmitSideFiles(o, x, rank, comm.size(), writers, mine);
    writers.Drain();
  });
  if (AnyFailed(comm, error, err, "ucp-convert")) return 1;
  const auto gathered = GatherRecords(comm, mine.records);
  size_t side_files = 0;
  error = rank == 0 ? Capture([&] {
    std::map<std::string, store::FileRecord> files;
    AddGathered(gathered, files);
    side_files = files.size();
    const Partitions parts = PartitionsOf(x);
    nlohmann::json storage = nlohmann::json::object();
    for (const auto& [name, runs] : parts.runs) storage[name] = {{"partitions", runs}};
    const nlohmann::json params = ParamEntries(x, storage);
    nlohmann::json source = store::SourceJson(x.L, x.M);
    source["weights_only"] = true, source["optimizer"] = "none";
    auto manifest = store::AssembleManifest(std::string(store::StoreName(x.kind)), source, store::FamilyJson(x.M), params, files);
    manifest["partition_files"] = parts.files;
    claim.folder->Mark({manifest.dump(1) + "\n"});  // the commit point
    store::Journal::Remove(o.output);
  }) : "";
  if (AnyFailed(comm, error, err, "ucp-convert")) return 1;
  if (rank == 0 && !o.quiet) {
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    char buf[96];
    std::snprintf(buf, sizeof buf, " in %.2fs", secs);
    err << "ucp-convert: wrote " << o.output << ": " << x.plan.params.size() << " parameters, the fp32 weights left in "
        << x.L.dir << "'s partitions (read from there, each record's CRC-32 checked), " << side_files
        << " side file(s)" << buf << "\n";
  }
  return 0;
}

}  // namespace ucp::convert
