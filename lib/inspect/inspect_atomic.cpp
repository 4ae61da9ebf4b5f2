// ucp-inspect on an atomic checkpoint of either store: what the manifest says (source layout,
// parameters, shapes, patterns, sizes) and, with --verify, whether every file still has its size and
// XXH64 and, for the HDF5 store, every dataset the XXH64 atoms.h5 and the manifest record for it.
#include <algorithm>
#include <filesystem>
#include <iomanip>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "core/error.h"
#include "inspect/inspect.h"
#include "core/xxhash64.h"
#include "inspect/table.h"
#include "shuffle/agree.h"
#include "store/atom_store.h"
#include "store/atomic_store.h"
#include "store/universal_folder.h"

namespace ucp::inspect {
namespace fs = std::filesystem;
using nlohmann::json;

// The report's reading of the manifest goes through at() and value(): a manifest missing a key or
// holding the wrong type is refused (nlohmann's const operator[] on a missing key is undefined).
json ReportOf(const std::string& dir, const json& m, const InspectOptions& options);

json AtomicReport(const std::string& dir, const InspectOptions& options) {
  const json m = store::ReadAtomicManifest(dir);  // a DeepSpeed universal folder: described as ucp-convert would
  return WithContext(dir + "/" + store::kManifestName, [&] { return ReportOf(dir, m, options); });
}

namespace {

// The parameters --params selects, each with the bytes its files (or its share of atoms.h5) hold.
json ParamsJson(const json& m, const std::string& params_regex) {
  std::regex filter(params_regex.empty() ? ".*" : params_regex);
  json params = json::array();
  std::map<std::string, uint64_t> sizes;
  for (const auto& f : m.at("files")) sizes[f.at("path").get<std::string>()] = f.at("bytes").get<uint64_t>();
  for (const auto& p : m.at("params")) {
    if (!std::regex_search(p.at("name").get<std::string>(), filter)) continue;
    uint64_t bytes = 0;
    if (p.contains("files"))
      for (const auto& [state, path] : p.at("files").items()) bytes += sizes.count(path) ? sizes[path] : 0;
    else
      bytes = 4 * (m.at("source").value("weights_only", false) ? 1 : plan::kStates) * p.at("numel").get<uint64_t>();  // atoms.h5
    json q = {{"name", p.at("name")}, {"shape", p.value("shape", json())}, {"pattern", p.value("pattern", json())},
              {"pattern_in_source", p.value("pattern_in_source", json())}, {"split_dim", p.value("split_dim", json())},
              {"split_dim_known", p.value("split_dim_known", json())}, {"vocab", p.value("vocab", json())}, {"bytes", bytes}};
    params.push_back(q);
  }
  return params;
}

// What the manifest names but does not list: a parameter's storage entry or file, atoms.h5.
void CheckListing(const json& m, store::StoreKind kind, const std::set<std::string>& listed, json& problems) {
  for (const auto& p : m.at("params")) {
    if (!p.contains(kind == store::StoreKind::Pt ? "files" : "hdf5"))
      problems.push_back("parameter '" + p.at("name").get<std::string>() + "': no '" +
                         (kind == store::StoreKind::Pt ? "files" : "hdf5") + "' entry for its " +
                         std::string(store::StoreName(kind)) + " store");
    else if (kind == store::StoreKind::Pt)
      for (const auto& [state, path] : p.at("files").items())
        if (!listed.count(path.get<std::string>()))
          problems.push_back("parameter '" + p.at("name").get<std::string>() + "': " + state + " file " +
                             path.get<std::string>() + " is not in the manifest's file list");
  }
  if (kind == store::StoreKind::Hdf5 && !listed.count(store::kAtomsH5))
    problems.push_back(std::string(store::kAtomsH5) + " is not in the manifest's file list");
}

// Each dataset's bytes through HDF5, against the XXH64 atoms.h5 and the manifest record for it;
// returns how many were checked.
int64_t CheckDatasets(const std::string& dir, const json& m, json& problems) {
  int64_t datasets = 0;
  std::string error = shuffle::Capture([&] {
    auto reader = store::AtomReader::Open(dir);
    for (const auto& p : reader->params()) {
      for (int s = 0; s < reader->states(); ++s) {
        auto state = static_cast<plan::State>(s);
        std::string name(plan::StateName(state)), where = std::string(store::kAtomsH5) + ": /" + p.name + "/" + name;
        std::string got = HexDigest(reader->TensorDigest(p.name, state));
        std::string attr = store::RecordedDatasetDigest(*reader, p.name, state);
        std::string listed_digest = m.at("params").at(static_cast<size_t>(&p - &reader->params()[0])).at("hdf5").at("xxh64").value(name, "");
        if (got != attr || got != listed_digest)
          problems.push_back(where + ": xxh64 " + got + ", the file's attribute says " + attr + ", the manifest says " +
                             listed_digest);
        ++datasets;
      }
      reader->Forget(p.name);
    }
  });
  if (!error.empty()) problems.push_back(error);
  return datasets;
}

// --verify: every listed file against its record (store::Verify), every file on disk listed, and in
// the HDF5 store every dataset.
json VerifyFolder(const std::string& dir, const json& m, store::StoreKind kind, const std::set<std::string>& listed,
                  json& problems) {
  int64_t checked = 0, bytes = 0;
  for (const auto& f : m.at("files")) {
    store::FileRecord rec = store::FileRecord::FromJson(f);
    std::string why;
    if (!store::Verify(dir, rec, &why)) problems.push_back(rec.path + ": " + why);
    ++checked;
    bytes += static_cast<int64_t>(rec.bytes);
  }
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    std::string rel = fs::relative(e.path(), dir).string();
    if (rel != store::kManifestName && !listed.count(rel)) problems.push_back(rel + ": not listed in the manifest");
  }
  int64_t datasets = 0;
  // HDF5 1.10 trusts what it reads from a file: atoms.h5 is opened only once its XXH64 matches.
  const bool h5_intact = std::none_of(problems.begin(), problems.end(), [](const json& p) {
    return p.get<std::string>().rfind(std::string(store::kAtomsH5) + ":", 0) == 0;
  });
  if (kind == store::StoreKind::Hdf5 && !h5_intact) {
    problems.push_back(std::string(store::kAtomsH5) + ": datasets not checked: the file does not match the manifest, "
                       "and HDF5 does not guard against damaged files");
  } else if (kind == store::StoreKind::Hdf5) {
    datasets = CheckDatasets(dir, m, problems);
  }
  json verify = {{"files_checked", checked}, {"bytes_checked", bytes}};
  if (kind == store::StoreKind::Hdf5) verify["datasets_checked"] = datasets;
  return verify;
}

}  // namespace

json ReportOf(const std::string& dir, const json& m, const InspectOptions& options) {
  json r;
  r["ucp_inspect_version"] = 1;
  r["kind"] = "atomic";
  r["path"] = dir;
  r["format_version"] = m.value("format_version", json());
  r["created"] = m.value("created", json());
  r["ucp_version"] = m.value("ucp_version", json());
  const store::StoreKind kind = WithContext(dir + "/" + store::kManifestName, [&] { return store::StoreOf(m); });
  r["store"] = std::string(store::StoreName(kind));
  r["source"] = m.value("source", json());
  r["family"] = m.value("family", json());
  r["deepspeed_universal"] = m.value("deepspeed_universal", false);
  r["weights_only"] = m.at("source").value("weights_only", false);
  r["params"] = ParamsJson(m, options.params_regex);
  r["totals"] = m.value("totals", json());
  json problems = json::array();
  std::set<std::string> listed;
  for (const auto& f : m.at("files")) listed.insert(f.at("path").get<std::string>());
  CheckListing(m, kind, listed, problems);
  r["verify"] = options.verify ? VerifyFolder(dir, m, kind, listed, problems) : json(nullptr);
  r["problems"] = problems;
  r["ok"] = problems.empty();
  return r;
}

int RunInspectAtomic(const std::string& dir, const InspectOptions& options, std::ostream& out, std::ostream& err) {
  json r;
  try {
    r = AtomicReport(dir, options);
  } catch (const std::exception& e) {
    err << "ucp-inspect: error: " << e.what() << "\n";
    return 2;
  }
  int code = r["problems"].empty() ? 0 : 1;
  if (options.json) {
    out << r.dump(1, ' ', false, json::error_handler_t::replace) << "\n";
    return code;
  }
  // The manifest's values as the table shows them: a key of the wrong type is refused here.
  std::ostringstream text;  // printed whole, or not at all
  try {
    const auto& s = r["source"];
    if (r["deepspeed_universal"].get<bool>())
      text << "atomic checkpoint  " << dir << "  (DeepSpeed's own universal checkpoint, ds_to_universal.py: no ucp "
           << "manifest; described from its files, read-only, each file checked by its zip CRC-32s)\n"
           << "made from tag      " << s.at("tag").get<std::string>() << "\n";
    else
      text << "atomic checkpoint  " << dir << "  (format " << r["format_version"] << ", ucp " << r["ucp_version"].get<std::string>()
           << ", " << r["created"].get<std::string>() << ")\n"
           << "converted from     " << s.at("path").get<std::string>()
           << (s.at("tag").get<std::string>().empty() ? "" : "  (tag " + s.at("tag").get<std::string>() + ")") << "\n";
    if (s.at("framework") == "torch-dcp" || s.at("framework") == "megatron-lm")  // no (dp, tp, pp) grid: chunks of global tensors
      text << "source layout      " << (s.at("framework") == "torch-dcp" ? "a PyTorch Distributed Checkpoint" : "Megatron-LM's legacy files")
           << " (global tensors in chunks), " << s.at("dtype").get<std::string>()
           << ", iteration " << s.at("iteration") << "\n";
    else
      text
        << "source layout      dp=" << s.at("dp") << (s.value("sp", 1) > 1 ? " sp=" + std::to_string(s.value("sp", 1)) : "") << " tp=" << s.at("tp") << " pp=" << s.at("pp")
        << (s.value("moe", false) ? " ep=" + std::to_string(s.value("ep", 1)) + " (Mixture of Experts)" : "") << "  ZeRO-" << s.at("zero_stage") << " ("
        << s.at("optimizer").get<std::string>() << "), " << s.at("dtype").get<std::string>() << ", iteration " << s.at("iteration")
        << ", DeepSpeed " << s.at("ds_version").get<std::string>() << "\n";
    text
        << "model rules        "
        << (r["family"].is_null() ? std::string("none") : r["family"]["name"].get<std::string>()) << "\n"
        << "store              " << r["store"].get<std::string>()
        << (r["weights_only"].get<bool>() ? "  (weights only: no optimizer state; ucp-reshard writes a fresh optimizer or none)" : "")
        << "\n"
        << "contents           " << r["totals"]["params"] << " parameters, " << r["totals"]["files"] << " files, "
        << r["totals"]["bytes"] << " bytes\n\n";
    size_t w = NameWidth(r["params"]);
    text << std::left << std::setw(w + 2) << "parameter" << std::setw(14) << "shape" << std::setw(11) << "pattern"
        << std::setw(11) << "in source" << std::setw(11) << "split dim" << "bytes\n";
    for (const auto& p : r["params"]) {
      std::string shape = CompactShape(p["shape"]);
      std::string split = p["split_dim"].is_null() ? "-" : p["split_dim"].dump();
      if (!p["split_dim_known"].get<bool>()) split += "?";
      text << std::setw(w + 2) << p["name"].get<std::string>() << std::setw(14) << shape << std::setw(11)
          << p["pattern"].get<std::string>() << std::setw(11) << p["pattern_in_source"].get<std::string>() << std::setw(11)
          << split << p["bytes"] << (p["vocab"].get<bool>() ? "  vocab" : "") << "\n";
    }
    if (!r["verify"].is_null())
      text << "\nverify             " << r["verify"]["files_checked"] << " files, " << r["verify"]["bytes_checked"]
          << (r["deepspeed_universal"].get<bool>() ? " bytes checked: every zip record's CRC-32"
                                                   : " bytes checked against the manifest's XXH64")
          << (r["verify"].contains("datasets_checked")
                  ? "; " + r["verify"]["datasets_checked"].dump() + " datasets of atoms.h5 against their recorded XXH64"
                  : std::string())
          << "\n";
  } catch (const std::exception& e) {
    err << "ucp-inspect: error: " << dir << "/" << store::kManifestName << ": " << e.what() << "\n";
    return 2;
  }
  out << text.str();
  for (const auto& p : r["problems"]) out << "PROBLEM  " << p.get<std::string>() << "\n";
  if (!r["verify"].is_null() && r["problems"].empty()) out << "all files match\n";
  return code;
}

}  // namespace ucp::inspect
