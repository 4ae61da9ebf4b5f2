#include "inspect/inspect.h"
#include "inspect/table.h"

#include <filesystem>
#include <iomanip>
#include <regex>
#include <sstream>

#include "core/error.h"
#include "core/format.h"
#include "core/task_pool.h"
#include "formats/registry.h"
#include "map/weight_copies.h"
#include "shuffle/comm.h"
#include "patterns/resolve.h"
#include "store/universal_folder.h"
#include "store/atomic_store.h"
#include "source/source_index.h"

namespace ucp::inspect {
namespace {

using nlohmann::json;

std::string Reason(const patterns::ParamPattern& p) {
  if (!p.match) return p.vocab ? "vocabulary rule; no TP rule" : "no rule (default Shard-V)";
  std::string src = p.match->source == "checkpoint universal_checkpoint_info" ? "checkpoint" : p.match->source;
  auto slash = src.find_last_of('/');
  if (slash != std::string::npos) src = src.substr(slash + 1);
  return p.match->key + " '" + p.match->rule + "' (" + src + ")";
}

// What the layout says of itself: format, framework, degrees, ZeRO stage, dtype, tag.
void AddLayout(const source::SourceIndex& L, json& r) {
  r["ucp_inspect_version"] = 1;
  r["kind"] = "source";
  r["path"] = L.root;
  r["shard_dir"] = L.dir;
  r["tag"] = L.tag;
  r["format"] = L.format;
  r["framework"] = L.framework;
  r["ds_version"] = L.ds_version;
  r["optimizer"] = L.optimizer;
  r["zero_stage"] = L.zero_stage;
  r["dtype"] = L.dtype;
  // dp without SP; ZeRO partitions span dp x sp ranks (source_index.h).
  r["layout"] = source::LayoutWords(L);
  r["degrees"] = {{"dp", L.DataParallel()}, {"sp", L.sp}, {"sp_recorded", L.sp_recorded}, {"tp", L.tp}, {"pp", L.pp}, {"ep", L.ep}};
  if (!L.on_grid)  // global tensors, whose files hold no grid: the saving job's degrees, where its Megatron-LM args say them
    for (const auto& [name, degree] : source::MegatronDegrees(source::MegatronArgsOf(L), L.files_world)) {
      if (name == "dp_recorded") r["degrees"][name] = degree != 0;
      else if (name != "cp") r["degrees"][name] = degree;
    }
  r["iteration"] = L.iteration;
  r["naming"] = L.naming;
  if (!L.job.empty()) r["job"] = L.job.ToJson();  // the framework's files beside the tag (Trainer's)
}

// What --verify read: every zip record of every file, CRC-32 checked; and every value stored twice,
// as ucp-convert compares it before it writes anything: files that read whole but disagree are a
// problem of the checkpoint (exit 1), damage an error (exit 2).
json VerifyStoredTwice(source::SourceIndex& L) {
  int64_t records = 0, bytes = 0;
  for (const auto& f : L.files)
    for (const auto& c : f.checksummed) records += 1, bytes += static_cast<int64_t>(c.size);
  json verified = {{"zip_records", records}, {"bytes", bytes}, {"weight_copies", static_cast<int64_t>(L.weight_copies.size())}};
  try {
    const auto one = shuffle::MakeLocalComm();
    if (const std::string why = map::CheckWeightCopies(L, *one, AvailableCores()); !why.empty()) L.problems.insert(L.problems.begin(), why);
  } catch (const std::exception& e) {
    L.errors.push_back(e.what());
  }
  return verified;
}

json FilesJson(const source::SourceIndex& L) {
  json files = json::array();
  for (const auto& f : L.files) {
    json e = {{"name", f.name}, {"kind", f.kind}, {"tp", f.tp}};
    if (f.layer >= 0) e["layer"] = f.layer;
    else e["pp"] = f.pp;
    if (f.per_dp) e["dp"] = f.dp;
    if (f.expert >= 0) e["expert"] = f.expert;
    files.push_back(e);
  }
  return files;
}

// The checkpoint's own rules (universal_checkpoint_info): whether present, and which variant.
json CheckpointInfoJson(const source::SourceIndex& L, const patterns::ModelPatterns* M) {
  json uc = {{"present", L.universal_checkpoint_info != nullptr}};
  if (!M || !M->checkpoint_rules) return uc;
  const auto& cr = *M->checkpoint_rules;
  uc["version"] = cr.version ? json(*cr.version) : json(nullptr);
  uc["has_sub_param_shard_widths"] = !cr.shard_widths.empty();
  uc["original_vocab_size"] = cr.original_vocab_size ? json(*cr.original_vocab_size) : json(nullptr);
  uc["padded_vocab_size"] = cr.padded_vocab_size ? json(*cr.padded_vocab_size) : json(nullptr);
  std::string variant = cr.version ? "universal-checkpoint " + json(*cr.version).dump() : "unversioned";
  variant += cr.shard_widths.empty() ? ", no sub_param_shard_widths" : ", with sub_param_shard_widths";
  if (cr.sub_params.empty()) variant += ", no sub-parameter rules";
  uc["variant"] = variant;
  return uc;
}

std::optional<std::regex> ParamsFilter(const std::string& params_regex) {
  if (params_regex.empty()) return std::nullopt;
  try {
    return std::regex(params_regex);
  } catch (const std::regex_error& e) {
    throw Error("--params '" + params_regex + "': invalid regular expression: " + e.what());
  }
}

// A parameter read as its global tensor (off a grid): no TP rule, and none needed.
constexpr const char* kGlobalTensor = "global tensor (no TP rule needed to read it)";

// One parameter's line of the report: its shapes, pattern here and under TP > 1, and why.
// The fp32 tensors an atomic checkpoint keeps per parameter: the weights and Adam's two moments, or
// the weights alone from a model without optimizer state (a Hugging Face model: optimizer "none").
int64_t AtomicStates(const source::SourceIndex& L) { return L.optimizer == "none" ? 1 : 3; }

json ParamJson(const source::SourceIndex& L, const patterns::ParamPattern& p, const source::ParamRecord& rec, int64_t numel) {
  json local = json::object();
  for (const auto& [t, s] : rec.tp_shape) local[std::to_string(t)] = s;
  json e = {{"name", p.name},
            {"shape", p.full_shape},
            {"local_shapes", local},
            {"numel", numel},
            {"dtype", L.dtype},
            {"group", rec.group},
            {"stages", rec.stages},
            {"pattern", rec.WholeOverTp() ? std::string("Expert") : std::string(patterns::PatternName(p.here))},
            {"model_pattern", patterns::PatternName(p.model_pattern)},
            {"reason", Reason(p)},
            {"vocab", p.vocab},
            {"vocab_padding_rows", p.vocab_padding_rows},
            {"pp_replicated", p.pp_replicated},
            {"bytes_atomic", numel * 4 * AtomicStates(L)}};
  if (p.match) e["rule"] = {{"key", p.match->key}, {"pattern", p.match->rule}, {"source", p.match->source}};
  // Off a grid (DCP, Megatron-LM's files, a Hugging Face model) each parameter reads as its global
  // tensor: no rule says how TP cut it, and none is needed to read it.
  else if (!L.on_grid && !p.vocab) e["reason"] = kGlobalTensor;
  if (!p.sub_param_sizes.empty()) e["sub_param_sizes"] = p.sub_param_sizes;
  if (rec.expert >= 0) {
    e["expert"] = {{"id", rec.expert}, {"ep_rank", rec.ep_rank}};
    e["reason"] = "expert " + std::to_string(rec.expert) + ", whole on expert-parallel rank " + std::to_string(rec.ep_rank) +
                  " of " + std::to_string(L.ep) + ", at every TP degree (DeepSpeed "
                  "splits no expert over TP without expert tensor parallelism); with it: " + Reason(p);
  }
  if (rec.fused_experts > 0) {
    const int64_t local_experts = rec.fused_experts / std::max(1, L.ep);
    e["fused_experts"] = rec.fused_experts;
    e["reason"] = "the " + std::to_string(rec.fused_experts) + " experts of an MoE layer fused along dim 0 (DeepSpeed's "
                  "AutoEP): expert-parallel rank R of " + std::to_string(L.ep) + " holds experts [R*" +
                  std::to_string(local_experts) + ", (R+1)*" + std::to_string(local_experts) + ")";
  }
  return e;
}

// The parameters' lines (those --params selects) and the totals over all of them.
void AddParams(const source::SourceIndex& L, const patterns::ModelPatterns& M, const std::optional<std::regex>& filter,
               json& r) {
  json params = json::array();
  int64_t total_numel = 0, vocab_rows = 0;
  for (const auto& p : M.params) {
    const source::ParamRecord& rec = *L.Find(p.name);
    int64_t numel = 1;
    for (int64_t d : p.full_shape) numel *= d;
    total_numel += numel;
    vocab_rows += p.vocab_padding_rows;
    if (filter && !std::regex_search(p.name, *filter)) continue;
    params.push_back(ParamJson(L, p, rec, numel));
  }
  r["params"] = params;
  r["padding"] = {{"zero_elements", L.zero_padding_elements}, {"vocab_rows", vocab_rows}};
  r["totals"] = {{"params", L.params.size()}, {"numel", total_numel}, {"bytes_atomic", total_numel * 4 * AtomicStates(L)}};
}

}  // namespace

json InspectReport(const std::string& dir, const InspectOptions& options) {
  source::IndexOptions index;
  index.verify_storage_crc = options.verify;
  source::SourceIndex L = formats::IndexSource(dir, index);
  json r;
  AddLayout(L, r);
  if (options.verify && L.errors.empty()) r["verified"] = VerifyStoredTwice(L);
  r["files"] = FilesJson(L);
  json errors = L.errors, problems = L.problems, notes = L.notes;
  std::optional<patterns::ModelPatterns> M;
  if (L.errors.empty()) {
    M = patterns::ResolvePatterns(L, {options.pattern_files, options.patterns_dir});
    for (const auto& p : M->problems) problems.push_back(p);
    for (const auto& n : M->notes) notes.push_back(n);
    AddParams(L, *M, ParamsFilter(options.params_regex), r);
  } else {
    AddParams(L, patterns::ModelPatterns{}, std::nullopt, r);
  }
  r["universal_checkpoint_info"] = CheckpointInfoJson(L, M ? &*M : nullptr);
  r["family"] = M && M->family ? json{{"name", M->family->family}, {"source", M->family->source}, {"explicit", M->family_explicit}}
                               : json(nullptr);
  r["errors"] = errors;
  r["problems"] = problems;
  r["notes"] = notes;
  r["strict"] = options.strict;
  r["ok"] = errors.empty() && (problems.empty() || !options.strict);
  return r;
}

// The report as text: the layout, then one line per parameter, then totals and notes.
void PrintReport(const json& r, std::ostream& out) {
  out << "checkpoint   " << r["path"].get<std::string>()
      << (r["tag"].get<std::string>().empty() ? "" : "  (tag " + r["tag"].get<std::string>() + ")") << "\n"
      << "format       " << r["format"].get<std::string>() << "  (ucp-inspect --list-formats)\n"
      << "framework    " << r["framework"].get<std::string>() << "  ("
      << (r["ds_version"].get<std::string>().empty() ? "" : "DeepSpeed " + r["ds_version"].get<std::string>() + ", ")
      << r["naming"].get<std::string>() << " naming)\n";
  if (r["params"].empty() && !r["errors"].empty()) {  // nothing was read: no layout, iteration or table to show
    out << "not read     the checkpoint was refused (the errors below say why)\n";
    return;
  }
  out << "layout       " << r["layout"].get<std::string>() << "\n";
  out << "iteration    " << r["iteration"] << "\n";
  if (r.contains("job")) {
    const auto& job = r["job"];
    const std::string weights = JoinNames(job["weights_not_carried"], " ", [](const json& w) { return w.get<std::string>(); });
    out << "job          " << (job["kind"] == "hf-trainer" ? "Hugging Face Trainer" : "Hugging Face model") << ": "
        << job["files"].size() << " files beside the tag, carried" << (weights.empty() ? "" : "; " + weights + " not (a copy of the weights)")
        << (job["rng_world"].get<int>() > 0 ? "; RNG files of " + job["rng_world"].dump() + " processes" : "") << "\n";
  }
  const auto& uc = r["universal_checkpoint_info"];
  out << "uc info      " << (uc["present"].get<bool>() ? uc.value("variant", "present") : "absent") << "\n";
  out << "model rules  "
      << (r["family"].is_null() ? std::string("none")
                                : r["family"]["name"].get<std::string>() + " (" + r["family"]["source"].get<std::string>() + ")")
      << "\n";
  // The file grid: one line per kind.
  std::map<std::string, int> kinds;
  for (const auto& f : r["files"]) kinds[f["kind"].get<std::string>()]++;
  out << "files        ";
  for (const auto& [k, n] : kinds) out << n << " " << k << "  ";
  out << "\n\n";
  size_t w = NameWidth(r["params"]);
  out << std::left << std::setw(w + 2) << "parameter" << std::setw(14) << "shape" << std::setw(11) << "pattern"
      << std::setw(11) << "under TP>1" << std::setw(11) << "size" << "rule\n";
  for (const auto& p : r["params"]) {
    std::string shape = CompactShape(p["shape"]);
    std::string rule = p["reason"].get<std::string>();
    if (p["vocab_padding_rows"].get<int64_t>() > 0)
      rule += "; vocab padding " + p["vocab_padding_rows"].dump() + " rows";
    if (p.contains("sub_param_sizes")) rule += "; sub-params " + p["sub_param_sizes"].dump();
    out << std::setw(w + 2) << p["name"].get<std::string>() << std::setw(14) << shape << std::setw(11)
        << p["pattern"].get<std::string>() << std::setw(11) << (rule == kGlobalTensor ? "-" : p["model_pattern"].get<std::string>()) << std::setw(11)
        << HumanBytes(p["bytes_atomic"].get<double>()) << rule << "\n";
  }
  if (!r["errors"].empty())  // the sizes below would count only what read: say nothing false
    out << "\n" << r["totals"]["params"] << " parameters; sizes unknown: the checkpoint did not read whole (errors below)\n";
  else
    out << "\n" << r["totals"]["params"] << " parameters, " << r["totals"]["numel"] << " elements, atomic size "
        << HumanBytes(r["totals"]["bytes_atomic"].get<double>()) << "; padding: " << r["padding"]["zero_elements"]
        << " ZeRO elements, " << r["padding"]["vocab_rows"] << " vocabulary rows\n";
  for (const auto& n : r["notes"]) out << "note: " << n.get<std::string>() << "\n";
  if (r.contains("verified") && r.value("format", "") == "hf")  // safetensors: no checksum to verify
    out << "verified: the structure of " << r["files"].size() << " safetensors file(s) (header, dtypes, offsets, the index); "
        << "safetensors carries no checksum of its data, so no data byte could be checked\n";
  else if (r.contains("verified"))
    out << "verified: " << r["verified"]["zip_records"] << " zip records ("
        << HumanBytes(r["verified"]["bytes"].get<double>()) << ") of " << r["files"].size()
        << " files read whole, every CRC-32 as the zip directory records it; " << r["verified"]["weight_copies"]
        << " weights of the model compared with their fp32 masters\n";
}

int RunInspect(const std::string& given, const InspectOptions& options, std::ostream& out, std::ostream& err) {
  // A Megatron-LM torch_dist root: the iteration its tracker names, as Megatron-LM's --load reads it.
  const std::string iteration = formats::TrackedIteration(given), dir = iteration.empty() ? given : iteration;
  if (!iteration.empty())
    err << "ucp-inspect: note: " << given << " is a Megatron-LM checkpoint root: reading " << iteration
        << ", the iteration its latest_checkpointed_iteration.txt names\n";
  if (store::IsUnfinishedConversion(dir)) {
    err << "ucp-inspect: error: " << dir << ": an unfinished ucp-convert run (a journal but no ucp_manifest.json); "
        << "finish it with ucp-convert --resume\n";
    return 2;
  }
  if (store::IsAtomicCheckpoint(dir) || store::IsDeepSpeedUniversal(dir)) return RunInspectAtomic(dir, options, out, err);
  json r;
  try {
    r = InspectReport(dir, options);
  } catch (const std::exception& e) {
    err << "ucp-inspect: error: " << e.what() << "\n";
    return 2;
  }
  int code = !r["errors"].empty() ? 2 : (!r["problems"].empty() && options.strict ? 1 : 0);
  if (options.json) out << r.dump(1, ' ', false, json::error_handler_t::replace) << "\n";
  else PrintReport(r, out);
  for (const auto& e : r["errors"]) err << "ucp-inspect: error: " << e.get<std::string>() << "\n";
  for (const auto& p : r["problems"])
    err << "ucp-inspect: " << (options.strict ? "error" : "warning") << ": " << p.get<std::string>() << "\n";
  if (code == 1) err << "ucp-inspect: " << r["problems"].size() << " problem(s); --no-strict reports them as warnings\n";
  return code;
}

int ListPatterns(const std::string& patterns_dir, bool json_out, std::ostream& out, std::ostream& err) {
  static const std::vector<std::pair<const char*, const char*>> vocabulary = {
      {"Unique", "a PP stage owns the parameter alone"},
      {"Replicate", "identical on every TP rank (LayerNorm, row-parallel biases); tied embeddings across PP"},
      {"Partial", "updated independently per rank; union is the element-wise mean"},
      {"Shard-V", "split along dim 0 (column-parallel weights, vocabulary-parallel embeddings)"},
      {"Shard-H", "split along dim 1 (row-parallel weights)"},
      {"Shard-NC", "fused tensor split per sub-parameter (GQA fused QKV, SwiGLU [gate; up])"}};
  std::vector<patterns::RuleSet> families;
  try {
    families = patterns::LoadFamilyFiles(patterns_dir);
  } catch (const std::exception& e) {
    err << "ucp-inspect: error: " << e.what() << "\n";
    return 2;
  }
  if (json_out) {
    json j = {{"patterns", json::array()}, {"families", json::array()}};
    for (const auto& [n, d] : vocabulary) j["patterns"].push_back({{"name", n}, {"description", d}});
    for (const auto& f : families)
      j["families"].push_back({{"name", f.family}, {"file", f.source}, {"description", f.description}, {"rules", f.RuleCount()}});
    out << j.dump(1, ' ', false, json::error_handler_t::replace) << "\n";
    return 0;
  }
  out << "patterns:\n";
  for (const auto& [n, d] : vocabulary) out << "  " << std::left << std::setw(10) << n << d << "\n";
  out << "\nmodel-family rule files in " << patterns_dir << ":\n";
  for (const auto& f : families) out << "  " << std::setw(22) << f.family << f.description << "\n";
  return 0;
}

}  // namespace ucp::inspect
