// A safetensors file and a model.safetensors.index.json, as ucp-convert and ucp-inspect read a
// Hugging Face model folder: the input parsed as a file's header and as an index, then as the
// model.safetensors of a folder whose config.json is a small LlamaForCausalLM's, indexed whole
// (header, dtypes, offsets, the tensors against the config's shapes).
#include <sstream>

#include "safetensors/read.h"
#include "formats/registry.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fs = std::filesystem;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  ucp::fuzz::Run([&] { (void)ucp::safetensors::ParseSafetensorsHeader(bytes, size, "fuzz"); });
  ucp::fuzz::Run([&] { (void)ucp::safetensors::ParseSafetensorsIndex(bytes, "fuzz"); });
  static const std::string dir = [] {
    const std::string d = ucp::fuzz::WorkDir() + "/hf";
    fs::create_directories(d);
    std::ofstream(d + "/config.json") << R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 8, "num_hidden_layers": 1,
      "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 16, "vocab_size": 10, "dtype": "float32"})";
    return d;
  }();
  ucp::fuzz::AsFile(data, size, "hf/model.safetensors");
  ucp::fuzz::Run([&] { (void)ucp::formats::IndexSource(dir, {}); });
  return 0;
}
