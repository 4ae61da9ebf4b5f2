// A whole .pt file through the reader the tools use: zip, pickle (its CRC check off, so that the
// fuzzer reaches the unpickler), storages against their records; then every value walked as the
// JSON report does.
#include "fuzz_support.h"
#include "pt/torch_file.h"
#include "pt/value_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return ucp::fuzz::Run([&] {
    auto file = ucp::pt::ReadTorchFile(ucp::fuzz::AsFile(data, size, "input.pt"),
                                       {.verify_pickle_crc = false, .verify_storage_crc = true});
    (void)ucp::pt::CanonicalJson(*file.root);
  });
}
