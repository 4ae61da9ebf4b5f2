// A PyTorch Distributed Checkpoint's .metadata (a pickle of torch's Metadata), as ucp-convert and
// ucp-inspect index the folder: beside the real data files of a DCP case (UCP_FUZZ_DCP: a
// checkpoint folder whose __*.distcp files are copied next to the input once), so that a mutated
// metadata points into real chunks, past them, or at the wrong ones.
#include <cstdlib>
#include <sstream>

#include "formats/registry.h"
#include "fuzz_support.h"
#include "inspect/inspect.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fs = std::filesystem;
  static const std::string dir = [] {
    const std::string d = ucp::fuzz::WorkDir() + "/dcp";
    fs::create_directories(d);
    if (const char* from = std::getenv("UCP_FUZZ_DCP"))
      for (const auto& e : fs::directory_iterator(from))
        if (e.path().extension() == ".distcp") fs::copy_file(e.path(), d + "/" + e.path().filename().string(), fs::copy_options::overwrite_existing);
    return d;
  }();
  ucp::fuzz::AsFile(data, size, "dcp/.metadata");
  ucp::fuzz::Run([&] { (void)ucp::formats::IndexSource(dir, {}); });
  ucp::fuzz::Run([&] {
    std::ostringstream out, err;
    ucp::inspect::InspectOptions options;
    options.json = true;
    (void)ucp::inspect::RunInspect(dir, options, out, err);
  });
  return 0;
}
