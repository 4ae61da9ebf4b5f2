// atoms.h5 as the tools that read an HDF5 atomic checkpoint take it. HDF5 1.10 trusts what it reads
// (a damaged file can crash it), so ucp opens atoms.h5 only once its size and XXH64 match the
// manifest's: the harness does the same, with the manifest of the seed file (UCP_FUZZ_MANIFEST, set
// by scripts/fuzz.sh). A file that passes is opened and every dataset of every parameter is read
// and checked against its recorded digest, as ucp-inspect --verify does.
#include <vector>

#include <nlohmann/json.hpp>

#include "fuzz_support.h"
#include "store/atom_store.h"
#include "store/atomic_store.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string manifest = [] {
    const char* path = std::getenv("UCP_FUZZ_MANIFEST");
    if (!path) {
      std::fprintf(stderr, "fuzz_atoms_h5: set UCP_FUZZ_MANIFEST to the ucp_manifest.json of the seed atoms.h5\n");
      std::abort();
    }
    std::ifstream in(path);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }();
  const std::string dir = ucp::fuzz::WorkDir() + "/h5";
  std::filesystem::create_directories(dir);
  ucp::fuzz::AsFile(reinterpret_cast<const uint8_t*>(manifest.data()), manifest.size(), "h5/ucp_manifest.json");
  ucp::fuzz::AsFile(data, size, "h5/atoms.h5");
  return ucp::fuzz::Run([&] {
    const auto m = ucp::store::ReadManifest(dir);
    for (const auto& f : m.at("files")) {
      const auto record = ucp::store::FileRecord::FromJson(f);
      std::string why;
      if (record.path == "atoms.h5" && !ucp::store::Verify(dir, record, &why)) throw ucp::Error("atoms.h5: " + why);
    }
    auto reader = ucp::store::AtomReader::Open(dir);
    for (const auto& p : reader->params()) {
      if (p.numel > (int64_t{1} << 20)) continue;
      std::vector<float> buf(static_cast<size_t>(p.numel));
      for (int s = 0; s < ucp::plan::kStates; ++s) reader->ReadAll(p.name, static_cast<ucp::plan::State>(s), buf.data());
    }
  });
}
