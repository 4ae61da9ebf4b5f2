// An atomic checkpoint's manifest (ucp_manifest.json) as ucp-reshard and ucp-convert --from-atomic
// open it (AtomReader::Open: the manifest, each parameter's entry, the store it names), and as
// ucp-inspect reports on it.
#include <sstream>

#include "fuzz_support.h"
#include "inspect/inspect.h"
#include "store/atom_store.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string dir = ucp::fuzz::WorkDir() + "/manifest";
  std::filesystem::create_directories(dir);
  ucp::fuzz::AsFile(data, size, "manifest/ucp_manifest.json");
  ucp::fuzz::Run([&] {
    auto reader = ucp::store::AtomReader::Open(dir);
    for (const auto& p : reader->params()) (void)reader->param(p.name);
  });
  for (bool json : {true, false})
    ucp::fuzz::Run([&] {
      std::ostringstream out, err;
      ucp::inspect::InspectOptions options;
      options.json = json;
      (void)ucp::inspect::RunInspect(dir, options, out, err);
    });
  return 0;
}
