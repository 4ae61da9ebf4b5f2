// The unpickler alone: any bytes as a pickle, storages resolved to a zeroed buffer when they are
// small enough to be real (the .pt reader checks them against their records; see fuzz_torch_file).
#include <vector>

#include "fuzz_support.h"
#include "pt/unpickler.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<uint8_t> zeros(1 << 16);
  const ucp::pt::StorageResolver resolve = [](ucp::pt::DType dtype, const std::string& key, uint64_t numel) {
    const unsigned __int128 bytes = static_cast<unsigned __int128>(numel) * ucp::pt::ElementSize(dtype);
    if (bytes > zeros.size()) throw ucp::Error("storage '" + key + "' larger than the fuzz buffer");
    auto s = std::make_shared<ucp::pt::Storage>();
    s->dtype = dtype;
    s->key = key;
    s->numel = numel;
    s->bytes = {zeros.data(), static_cast<size_t>(bytes)};
    return s;
  };
  return ucp::fuzz::Run([&] { ucp::pt::Unpickle({data, size}, resolve); });
}
