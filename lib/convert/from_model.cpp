// ucp-convert of a model of whole tensors (a Hugging Face model folder: formats/driver.h,
// SourceDriver::read_param): no flat optimizer partitions to map and shuffle, so the import is the
// export pipeline backwards (reshard/export.h). Every rank indexes the folder and resolves the
// patterns; the parameters are spread over the ranks by bytes (largest first, to the least loaded);
// each rank reads its parameters whole from the driver and writes them through the store's
// AtomWriter, fp32 only (weights only), or with both Adam moments and the step where the driver
// reads them (SourceDriver::read_state: another family's atomic checkpoint); rank 0 writes the
// synthesized model-states file (and zero/optimizer_state.pt with the moments), carries the job's
// files (config.json, ...) byte for byte, and commits the manifest last. Memory per rank: two of the
// largest parameter (two writing threads), each with at most one source tensor beside it (two where
// the driver re-orders a tensor's rows: an atomic checkpoint's rotary or transposed ones).
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>

#include "convert/convert.h"
#include "convert/steps.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/format.h"
#include "core/process.h"
#include "core/output_lock.h"
#include "formats/registry.h"
#include "plan/convert_plan.h"
#include "pt/torch_file.h"
#include "shuffle/agree.h"
#include "store/universal_folder.h"

namespace ucp::convert {
using shuffle::AnyFailed;
using shuffle::Capture;

namespace {

// The file the import synthesizes: what a Megatron-DeepSpeed save of TP = PP = 1 names rank 0's.
constexpr const char* kModelStates = "mp_rank_00_model_states.pt";

// Whether the driver reads the optimizer's state too (then every parameter has all three states),
// unless the fp32 weights alone are asked for.
bool WithStates(const ConvertOptions& o, const formats::SourceDriver& driver, const Planned& x) {
  return driver.read_state && x.L.optimizer_state && !o.weights_only;
}

// Step 1, every rank: the writer's list of every parameter, each as a conversion describes it.
std::vector<store::AtomSpec> SpecsOf(const Planned& x, bool states) {
  std::vector<store::AtomSpec> specs;
  for (size_t i = 0; i < x.L.params.size(); ++i) {
    const auto& pat = x.M.params[i];
    plan::ParamPlan P;
    P.index = static_cast<int>(i);
    P.name = pat.name;
    P.full_shape = pat.full_shape;
    P.full_numel = pt::Numel(pat.full_shape);
    P.copies.resize(1);  // read once, whole
    store::ParamRelDir(P.name);  // every name must be a safe folder name
    store::AtomSpec s{P.name, P.full_shape, store::ParamMetaJson(x.L, pat, P), store::UniversalKeysOf(pat), nullptr,
                      pat.split_dim()};
    s.weights_only = !states;
    if (states) s.step = x.L.steps.at({0, 0, x.L.params[i].group});
    specs.push_back(std::move(s));
  }
  return specs;
}

// Step 3, every rank: its parameters, each read whole and written, on up to two threads where the
// store takes concurrent writes: one reads and widens a tensor while the other's bytes go out. A
// thread keeps one buffer, of the largest tensor it has held (memory: two tensors a rank). The
// error said is that of the first parameter that failed, as one thread would have said it. Returns
// the bytes written.
int64_t WriteOwned(const formats::SourceDriver& driver, const Planned& x, store::AtomWriter& writer, const std::vector<int>& owner,
                   int rank, int threads, std::vector<store::FileRecord>& records) {
  std::vector<size_t> mine;
  for (size_t i = 0; i < writer.specs().size(); ++i)
    if (owner[i] == rank) mine.push_back(i);
  std::atomic<size_t> next{0};
  std::mutex mu;  // records, written, the first failure
  int64_t written = 0;
  size_t failed_at = mine.size();
  std::exception_ptr failure;
  auto work = [&] {
    std::unique_ptr<float[]> buf;
    size_t held = 0;
    for (size_t k = next++; k < mine.size(); k = next++) {
      try {
        const auto& s = writer.specs()[mine[k]];
        const auto numel = static_cast<size_t>(std::max<int64_t>(pt::Numel(s.shape), 1));
        if (numel > held) buf = std::make_unique_for_overwrite<float[]>(numel), held = numel;
        for (int state = 0; state < store::StatesOf(s); ++state) {
          if (state == 0 && !driver.read_state) driver.read_param(x.L, static_cast<int>(mine[k]), buf.get());
          else driver.read_state(x.L, static_cast<int>(mine[k]), state, buf.get());
          auto written_records = writer.Write(s.name, static_cast<plan::State>(state), buf.get());
          std::lock_guard<std::mutex> lock(mu);
          for (auto& r : written_records) records.push_back(std::move(r));
          written += 4 * pt::Numel(s.shape);
        }
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (k < failed_at) failed_at = k, failure = std::current_exception();
        next = mine.size();  // the others take no new parameter
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < (writer.concurrent() ? std::min(threads, 2) : 1); ++t) pool.emplace_back(work);
  work();
  for (auto& th : pool) th.join();
  if (failure) std::rethrow_exception(failure);
  return written;
}

// Step 4, rank 0: the model-states file, the job's files, the manifest last.
void CommitImport(const ConvertOptions& o, const Planned& x, const std::vector<store::AtomSpec>& specs,
                  const store::StoreCommit& committed, const std::vector<std::string>& gathered, OutputFolder& folder) {
  std::map<std::string, store::FileRecord> files;
  AddGathered(gathered, files);
  for (const auto& r : committed.files) files[r.path] = r;
  const auto d = pt::WriteTorchFile(o.output + "/" + kModelStates, *x.L.model_states);
  files[kModelStates] = {kModelStates, d.size, d.xxh64};
  const bool states = !specs.empty() && !specs.front().weights_only;
  if (states) {  // the param groups, which ucp-reshard's DeepSpeed writer and DeepSpeed's universal load read
    std::filesystem::create_directories(o.output + "/zero");
    const auto g = pt::WriteTorchFile(o.output + "/zero/optimizer_state.pt", *x.L.optimizer_state);
    files["zero/optimizer_state.pt"] = {"zero/optimizer_state.pt", g.size, g.xxh64};
  }
  if (!x.L.job.carried.empty()) std::filesystem::create_directories(o.output + "/" + source::kJobFolder);
  for (const std::string& name : x.L.job.carried) {  // byte for byte, as the index read them
    const std::string rel = std::string(source::kJobFolder) + "/" + name;
    files[rel] = store::CopyFileAtomically(x.L.root + "/" + name, o.output, rel);
  }
  nlohmann::json params = nlohmann::json::array();
  for (const auto& s : specs) {
    nlohmann::json e = s.meta;
    e.update(committed.storage.at(s.name));
    params.push_back(e);
  }
  nlohmann::json source = store::SourceJson(x.L, x.M);
  source["model_states"] = kModelStates;
  if (!states) source["weights_only"] = true;  // (absent with the moments)
  auto manifest = store::AssembleManifest(std::string(store::StoreName(x.kind)), source, store::FamilyJson(x.M), params, files);
  folder.Mark({manifest.dump(1) + "\n"});  // the commit point (core/commit.h, step 4)
}

// --plan-only: which rank writes which parameter.
void PrintPlan(const ConvertOptions& o, const Planned& x, const std::vector<store::AtomSpec>& specs, const std::vector<int>& owner,
               std::ostream& out) {
  nlohmann::json j = nlohmann::json::array();
  for (size_t i = 0; i < specs.size(); ++i)
    j.push_back({{"name", specs[i].name}, {"shape", specs[i].shape}, {"rank", owner[i]}});
  if (o.json) {
    out << WithNotes(nlohmann::json{{"params", j}}, x).dump(1) << "\n";
    return;
  }
  for (const auto& p : j) out << "rank " << p["rank"].get<int>() << "  " << p["name"].get<std::string>() << " " << p["shape"].dump() << "\n";
}

}  // namespace

int RunConvertFromModel(const ConvertOptions& o, const formats::SourceDriver& driver, shuffle::Comm& comm, std::ostream& out,
                        std::ostream& err) {
  const int rank = comm.rank(), ranks = o.plan_ranks > 0 ? o.plan_ranks : comm.size();
  const bool talk = rank == 0 && !o.quiet;
  const auto t0 = std::chrono::steady_clock::now();

  // 1. Every rank: the index, the patterns, each parameter's spec and writer (by bytes, largest first).
  Planned x;
  std::vector<store::AtomSpec> specs;
  std::string error = Capture([&] {
    if (o.output.empty() && !o.plan_only) throw Error("an output folder is required (-o OUT)");
    if (o.resume) throw Error("--resume: an import writes each tensor whole in one pass; rerun with --force");
    x = IndexAndResolve(o);
    specs = SpecsOf(x, WithStates(o, driver, x));
    if (!o.output.empty()) RefuseOutputWithin(o.output, o.source, "the model folder");
  });
  if (AnyFailed(comm, error, err, "ucp-convert")) return 1;
  std::vector<int64_t> weights;
  for (const auto& s : specs) weights.push_back(pt::Numel(s.shape) + 1);
  const auto owner = plan::AssignLpt(weights, ranks);
  if (talk) {
    err << "ucp-convert: " << x.L.framework << " model " << o.source << " (" << x.L.dtype << "): " << specs.size()
        << " parameters, " << (specs.empty() || specs.front().weights_only ? "weights only" : "weights, Adam moments and step") << " -> " << (o.plan_only ? "(plan)" : o.output + " (" + o.format + ")") << "; "
        << (o.plan_ranks > 0 ? "planned for " + std::to_string(o.plan_ranks) + " MPI ranks (--ranks)" : comm.name()) << "\n";
    for (const auto* list : {&x.L.notes, &x.M.notes})
      for (const auto& n : *list) err << "ucp-convert: note: " << n << "\n";
  }
  if (o.plan_only) {
    if (rank == 0) PrintPlan(o, x, specs, owner, out);
    return 0;
  }

  // 2-3. Rank 0: the output folder; the writer (collective); then each rank's parameters.
  std::unique_ptr<OutputFolder> folder;
  std::unique_ptr<store::AtomWriter> writer;
  if (!ClaimAndOpenWriter(o, x.kind, specs, comm, err, folder, writer)) return 1;
  std::vector<store::FileRecord> records;
  int64_t written = 0;
  error = Capture([&] { written = WriteOwned(driver, x, *writer, owner, rank, ThreadsOf(o), records); });
  if (AnyFailed(comm, error, err, "ucp-convert")) return 1;
  store::StoreCommit committed;
  error = Capture([&] { committed = writer->Commit(); });
  if (AnyFailed(comm, error, err, "ucp-convert")) return 1;

  // 4. Rank 0: the side files and the manifest last.
  auto gathered = GatherRecords(comm, records);
  std::array<int64_t, 1> totals = {written};
  comm.AllreduceSum(totals);
  error = rank == 0 ? Capture([&] { CommitImport(o, x, specs, committed, gathered, *folder); }) : "";
  if (AnyFailed(comm, error, err, "ucp-convert")) return 1;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Each rank's own (its bytes written, its peak RSS), gathered for --report on every rank alike.
  const std::vector<std::string> per = comm.GatherToRoot(
      nlohmann::json{{"rank", rank}, {"bytes_written", written}, {"peak_rss_bytes", PeakRssBytes()}}.dump());
  if (rank == 0 && !o.report_path.empty()) {  // --report: what the run wrote, in the keys of a conversion's report
    nlohmann::json per_rank = nlohmann::json::array();
    for (const auto& p : per) per_rank.push_back(nlohmann::json::parse(p));
    const nlohmann::json report = {{"source", o.source}, {"output", o.output}, {"ranks", ranks}, {"weights_only", specs.empty() || specs.front().weights_only},
                                   {"parameters", specs.size()}, {"bytes_written", totals[0]}, {"per_rank", per_rank},
                                   {"phases_seconds", {{"total", secs}}}};
    error = Capture([&] { WriteFileAtomically(o.report_path, report.dump(1) + "\n"); });
    if (!error.empty()) {
      err << "ucp-convert: error: " << error << "\n";
      return 1;
    }
  }
  if (talk) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "ucp-convert: wrote %s (%s store): %zu parameters, %s, %s written in %.2fs\n",
                  o.output.c_str(), o.format.c_str(), specs.size(), specs.empty() || specs.front().weights_only ? "weights only" : "with their Adam moments",
                  HumanBytes(double(totals[0])).c_str(), secs);
    err << buf;
  }
  return 0;
}

}  // namespace ucp::convert
