// Step 1 of a conversion: the source indexed, its patterns resolved and the plan made, on every
// rank from metadata only; what the checkpoint stores twice compared before anything is written.
#include <cstdio>

#include "convert/steps.h"
#include "core/error.h"
#include "core/task_pool.h"
#include "formats/registry.h"
#include "map/weight_copies.h"
#include "store/atomic_store.h"
#include "store/universal_folder.h"

namespace ucp::convert {

namespace {

std::string VersionString(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// Whether a problem is a file that is missing or not the rank's, save's or run's its name says:
// --no-strict converts no such checkpoint, so it is not offered.
bool FileFault(const std::string& problem) {
  for (const char* mark : {"missing rank file", "swapped or renamed", "mixed into this tag", "a file of another"})
    if (problem.find(mark) != std::string::npos) return true;
  return false;
}

// One fault, one error: the first of what the index found (a missing or odd file comes first, and
// most of what follows it are its consequences), one line, with the count of the rest.
std::string FirstFault(const std::vector<std::string>& lines, const std::string& head, const std::string& source) {
  std::string s = head + ": " + lines.front();
  if (lines.size() > 1)
    s += " (and " + std::to_string(lines.size() - 1) + " more found with it; `ucp-inspect " + source + "` lists every one)";
  return s;
}

// An atomic checkpoint is converted already: said as such, not as a training checkpoint missing its rank files.
void RefuseConvertedAlready(const std::string& source) {
  if (store::IsAtomicCheckpoint(source) || store::IsDeepSpeedUniversal(source))
    throw Error(source + " is " + (store::IsAtomicCheckpoint(source) ? "an atomic checkpoint (ucp_manifest.json)" :
                "DeepSpeed's universal checkpoint (ds_to_universal.py)") + ", converted already: ucp-reshard reads it; "
                "ucp-convert --from-atomic copies a ucp one into another store");
}

// The note --split-above earns where it cannot split a tensor.
void NoteSplitAbove(const ConvertOptions& o, bool parts, int plan_ranks, Planned& x) {
  if (!parts && o.split_above > 0)
    x.L.notes.push_back(std::string("--split-above: every tensor is written whole (") +
                        (x.kind == store::StoreKind::Hdf5 ? "the HDF5 store writes each dataset whole"
                                                          : "a ZeRO-3 source's universal form is a padded 1-D tensor") +
                        "); the size still cuts larger optimizer files between the ranks that read them");
  else if (o.split_above > 0 && plan_ranks == 1)
    x.L.notes.push_back("--split-above: one rank has none to share an item with: every tensor is written whole");
}

}  // namespace

Planned IndexAndResolve(const ConvertOptions& o) {
  Planned x;
  x.kind = store::WritableStoreFromName(o.format);
  if (x.kind == store::StoreKind::Hdf5 && o.resume)
    throw Error("--resume is not supported with --format hdf5: atoms.h5 is one file, written whole; rerun with --force");
  if (!o.as_deepspeed) RefuseConvertedAlready(o.source);
  source::IndexOptions model;
  model.model_config_path = o.model_config_path, model.model_config_text = o.model_config_text, model.weights_only = o.weights_only;
  x.L = o.as_deepspeed ? formats::AtomicAsDeepSpeedSource().index(o.source, model) : formats::IndexSource(o.source);
  const auto& L = x.L;
  if (!L.errors.empty()) throw Error(FirstFault(L.errors, o.source + ": unreadable, malformed or not supported", o.source));
  if (o.strict && !L.problems.empty())
    throw Error(FirstFault(L.problems, o.source + ": the checkpoint is inconsistent" + (FileFault(L.problems.front()) ? "" : " (--no-strict to convert anyway)"), o.source));
  x.M = patterns::ResolvePatterns(L, {o.pattern_files, o.patterns_dir});
  if (o.strict && !x.M.problems.empty())
    throw Error(FirstFault(x.M.problems, o.source + ": pattern problems (--no-strict to convert anyway)", o.source));
  return x;
}

Planned IndexAndPlan(const ConvertOptions& o, int ranks) {
  Planned x = IndexAndResolve(o);
  const auto& L = x.L;
  const bool parts = store::WritesParts(x.kind, L.zero_stage);
  const int plan_ranks = o.plan_ranks > 0 ? o.plan_ranks : ranks;
  NoteSplitAbove(o, parts, plan_ranks, x);
  x.plan = plan::MakeConvertPlan(L, x.M, plan_ranks, o.buffer_bytes, parts ? o.split_above : 0, o.split_above,
                                 o.weights_only ? 1 : plan::kStates);
  for (const auto& P : x.plan.params) store::ParamRelDir(P.name);  // every name must be a safe folder name
  return x;
}

void SayPlanned(const ConvertOptions& o, const Planned& x, const std::string& comm_name, std::ostream& err) {
  const auto& L = x.L;
  const auto& M = x.M;
  err << "ucp-convert: " << L.framework << " " << source::LayoutWords(L)
      << (L.format != "deepspeed" ? "" : "; DeepSpeed " + (L.ds_version.empty() ? "?" : L.ds_version) + ", universal_checkpoint_version " +
          (M.checkpoint_rules && M.checkpoint_rules->version ? VersionString(*M.checkpoint_rules->version) : "none"))
      << "; " << x.plan.params.size() << " parameters; "
      << (o.plan_ranks > 0 ? "planned for " + std::to_string(o.plan_ranks) + " MPI ranks (--ranks)" : comm_name) << "\n";
  for (const auto* list : {&L.notes, &M.notes})
    for (const auto& n : *list) err << "ucp-convert: note: " << n << "\n";
  if (!o.strict)
    for (const auto* list : {&L.problems, &M.problems})
      for (const auto& p : *list) err << "ucp-convert: warning: " << p << "\n";
}

nlohmann::json WithNotes(nlohmann::json plan, const Planned& x) {
  plan["notes"] = nlohmann::json::array();
  for (const auto* list : {&x.L.notes, &x.M.notes})
    for (const auto& n : *list) plan["notes"].push_back(n);
  return plan;
}

// Files mixed from other saves, ranks or runs pass every CRC-32: each rank compares the masters of
// its share of the data files.
std::vector<std::vector<char>> RequireWeightCopiesAgree(const ConvertOptions& o, const source::SourceIndex& L, shuffle::Comm& comm) {
  std::vector<std::vector<char>> verified;
  const std::string why = map::CheckWeightCopies(L, comm, ThreadsOf(o), &verified);
  if (!why.empty()) throw Error(o.source + ": " + why + "; nothing was converted");
  return verified;
}

pt::ValuePtr StepOf(const source::SourceIndex& L, const plan::ParamPlan& P) {
  auto it = L.steps.find(P.step_key);
  return it == L.steps.end() || !it->second || it->second->kind == pt::Value::Kind::None ? nullptr : it->second;
}

}  // namespace ucp::convert
