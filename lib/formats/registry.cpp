#include "formats/registry.h"

#include <span>

#include "core/error.h"
#include "store/atom_store.h"

namespace ucp::formats {
namespace {

// The tables: one row per format folder, each defined there (formats/<name>/driver.cpp). A source's
// place is the order probes are tried in.
std::span<const SourceDriver* const> Sources() {
  static const SourceDriver* const table[] = {&DeepSpeedSource(), &DcpSource()};
  return table;
}
std::span<const TargetDriver* const> Targets() {
  static const TargetDriver* const table[] = {&DeepSpeedTarget(), &HuggingFaceTarget()};
  return table;
}

}  // namespace

const TargetDriver& FindTarget(std::string_view name) {
  std::string known;
  for (const TargetDriver* d : Targets()) {
    if (name == d->name) return *d;
    known += (known.empty() ? "" : ", ") + std::string(d->name);
  }
  throw Error("unknown target format '" + std::string(name) + "' (known: " + known + ")");
}

source::SourceIndex IndexSource(const std::string& dir, const source::IndexOptions& options) {
  for (const SourceDriver* d : Sources())
    if (d->probe(dir)) return d->index(dir, options);
  return Sources()[0]->index(dir, options);
}

nlohmann::json FormatsJson() {
  nlohmann::json sources = nlohmann::json::array();
  for (const SourceDriver* d : Sources()) sources.push_back({{"name", d->name}, {"description", d->description}, {"files", d->files}});
  nlohmann::json targets = nlohmann::json::array();
  for (const TargetDriver* d : Targets()) targets.push_back({{"name", d->name}, {"description", d->description}, {"files", d->files}});
  nlohmann::json atomic = nlohmann::json::array();
  for (const auto& [name, description] : store::StoreDescriptions())
    atomic.push_back({{"name", name}, {"description", description}});
  return {{"sources", sources}, {"targets", targets}, {"atomic_stores", atomic}};
}

void PrintFormats(std::ostream& out) {
  out << "sources (ucp-convert, ucp-inspect):\n";
  for (const SourceDriver* d : Sources()) out << "  " << d->name << "\n    " << d->description << "\n    files: " << d->files << "\n";
  out << "atomic checkpoint stores (ucp-convert --format; read by ucp-reshard and ucp-inspect):\n";
  for (const auto& [name, description] : store::StoreDescriptions()) out << "  " << name << "\n    " << description << "\n";
  out << "targets (ucp-reshard):\n";
  for (const TargetDriver* d : Targets()) out << "  " << d->name << "\n    " << d->description << "\n    files: " << d->files << "\n";
}

}  // namespace ucp::formats
