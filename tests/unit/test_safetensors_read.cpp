// The safetensors reader (safetensors/read.h) on headers built here byte by byte: what the
// format allows is read as written; each rule broken is refused naming the file and the tensor. And
// the import's inversion of the export's table (import_model.h): every row of every parameter filled
// exactly once, a fused tensor's rows from its parts in order.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <string>

#include "core/error.h"
#include "formats/hf/import_model.h"
#include "safetensors/read.h"

using namespace ucp;
using namespace ucp::safetensors;
using namespace ucp::formats::hf;

namespace {

// A file: the 8-byte length, the header padded with spaces to 8, `data` bytes of data.
std::string File(const std::string& header, size_t data) {
  std::string h = header + std::string((8 - header.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t n = h.size();
  std::memcpy(out.data(), &n, 8);
  return out + h + std::string(data, '\x01');
}

std::string Refusal(const std::string& file) {
  try {
    ParseSafetensorsHeader(file, file.size(), "m.safetensors");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a safetensors header is read as written, in offset order", "[safetensors]") {
  const std::string f = File(R"({"b":{"dtype":"BF16","shape":[2],"data_offsets":[16,20]},)"
                             R"("a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"__metadata__":{"format":"pt"}})", 20);
  const StHeader h = ParseSafetensorsHeader(f, f.size(), "m.safetensors");
  REQUIRE(h.tensors.size() == 2);
  CHECK(h.tensors[0].name == "a");
  CHECK(h.tensors[1].dtype == pt::DType::BF16);
  CHECK(h.metadata.at("format") == "pt");
  CHECK(h.data_start == f.size() - 20);
}

TEST_CASE("a damaged safetensors header is refused naming the rule", "[safetensors]") {
  const std::string good = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F16","shape":[2],"data_offsets":[8,12]}})";
  CHECK(Refusal(File(good, 12)).empty());
  CHECK(Refusal(File(good, 11)).find("truncated") != std::string::npos);
  CHECK(Refusal(File(good, 14)).find("bytes after the last tensor") != std::string::npos);
  std::string huge = File(good, 12);
  huge[5] = 1;  // a length of 2^40 and more
  CHECK(Refusal(huge).find("limit") != std::string::npos);
  std::string past = File(good, 12);
  past[2] = 1;  // a length past the file
  CHECK(Refusal(past).find("header length") != std::string::npos);
  CHECK(Refusal("1234").find("too short") != std::string::npos);
  CHECK(Refusal(File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F16","shape":[2],"data_offsets":[6,10]}})", 10))
            .find("overlaps") != std::string::npos);
  CHECK(Refusal(File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F16","shape":[2],"data_offsets":[10,14]}})", 14))
            .find("hole") != std::string::npos);
  CHECK(Refusal(File(R"({"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8)).find("'a': dtype \"I64\"") != std::string::npos);
  CHECK(Refusal(File(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8)).find("shape [3]") != std::string::npos);
  CHECK(Refusal(File(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,8]}})", 8)).find("'a'") != std::string::npos);
  CHECK(Refusal(File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8)).find("backwards") != std::string::npos);
  CHECK(Refusal(File(R"([1, 2])", 0)).find("no JSON object") != std::string::npos);
  CHECK(Refusal(File(R"({"__metadata__":{"format":3}})", 0)).find("__metadata__") != std::string::npos);
}

TEST_CASE("an index names files beside it and says total_size", "[safetensors]") {
  const StIndex i = ParseSafetensorsIndex(R"({"metadata":{"total_size":12},"weight_map":{"a":"x.safetensors","b":"y.safetensors","c":"x.safetensors"}})", "i.json");
  CHECK(i.total_size == 12);
  CHECK(i.files == std::vector<std::string>{"x.safetensors", "y.safetensors"});
  CHECK_THROWS_WITH(ParseSafetensorsIndex(R"({"weight_map":{"a":"../x.safetensors"}})", "i.json"), Catch::Contains("'a'"));
  CHECK_THROWS_WITH(ParseSafetensorsIndex(R"({"weight_map":{"a":"x.bin"}})", "i.json"), Catch::Contains("not a .safetensors file"));
  CHECK_THROWS_WITH(ParseSafetensorsIndex(R"({"metadata":{"total_size":-1},"weight_map":{}})", "i.json"), Catch::Contains("total_size"));
  CHECK_THROWS_WITH(ParseSafetensorsIndex(R"({"metadata":{}})", "i.json"), Catch::Contains("weight_map"));
}

TEST_CASE("the import inverts the export's table: every row once, fused rows from their parts", "[safetensors]") {
  HfConfig c;
  c.architecture = "LlamaForCausalLM";
  c.llama = {16, 2, 4, 2, 4, 24, 50, 64, 1e-5, 10000.0, false, true, false};
  const ImportModel M = ImportModelOf(c, "model");
  CHECK(M.atoms.size() == 3 + 2 * 8);  // embedding, final norm, output; 8 per layer (6, and the qkv and dense biases)
  for (const auto& a : M.atoms) CHECK(!a.fills.empty());
  const auto qkv = std::find_if(M.atoms.begin(), M.atoms.end(), [](const ImportAtom& a) {
    return a.name == "language_model.encoder.layers.1.self_attention.query_key_value.weight";
  });
  REQUIRE(qkv != M.atoms.end());
  CHECK(qkv->shape == std::vector<int64_t>{16 + 8 + 8, 16});
  // Each row of a Hugging Face tensor holds 100 x its projection's letter (q, k, v) plus the row.
  std::vector<float> dst(32 * 16, -1.0f);
  FillAtom(M, static_cast<size_t>(qkv - M.atoms.begin()), [](const reshard::ExportTensor& t, float* buf) {
    const char letter = t.name[t.name.size() - std::string("q_proj.weight").size()];
    for (int64_t r = 0; r < t.rows(); ++r)
      for (int64_t k = 0; k < 16; ++k) buf[r * 16 + k] = float(100 * letter + r);
  }, dst.data());
  CHECK(dst[0] == float(100 * 'q'));
  CHECK(dst[16 * 16] == float(100 * 'k'));
  CHECK(dst[27 * 16 + 5] == float(100 * 'v' + 3));
  CHECK(std::count(dst.begin(), dst.end(), -1.0f) == 0);
}
