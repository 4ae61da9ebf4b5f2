// A --layout file of ucp-reshard (schemas/layout.schema.json): JSON, then every key's type and range.
#include <nlohmann/json.hpp>

#include "fuzz_support.h"
#include "layout/target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return ucp::fuzz::Run([&] {
    std::vector<std::string> given;
    auto layout = ucp::reshard::ReadLayoutFile(ucp::fuzz::AsFile(data, size, "layout.json"), {}, &given);
    (void)ucp::reshard::MissingLayoutKeys(given);
    (void)layout.Describe();
    (void)layout.ToJson();
  });
}
