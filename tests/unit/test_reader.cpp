// The reader against files written by Python's torch.save (tests/python/make_reader_cases.py):
// every case's value tree, tensors byte for byte, equals the canonical JSON Python made of it.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "pt/torch_file.h"
#include "pt/value_json.h"
#include "test_support.h"

using namespace ucp;
namespace fs = std::filesystem;

TEST_CASE("reader: torch.save cases equal Python's canonical form", "[reader]") {
  fs::path dir = test::WorkDir() / "reader_cases";
  REQUIRE(fs::exists(dir));
  int checked = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".pt" || entry.path().filename().string().rfind("bad_", 0) == 0) continue;
    fs::path expected_path = entry.path();
    expected_path.replace_extension(".json");
    INFO("case " << entry.path().filename());
    auto expected = nlohmann::json::parse(test::ReadText(expected_path));
    pt::TorchFile file = pt::ReadTorchFile(entry.path(), {.verify_pickle_crc = true, .verify_storage_crc = true});
    nlohmann::json actual = pt::CanonicalJson(*file.root);
    if (actual != expected) {
      // Narrow down to the first differing top-level key for a readable failure.
      for (size_t k = 0; k < expected["dict"].size(); ++k) {
        INFO("key " << expected["dict"][k][0].dump());
        CHECK(actual["dict"][k].dump() == expected["dict"][k].dump());
      }
    }
    CHECK(actual == expected);
    ++checked;
  }
  CHECK(checked >= 15);
}

TEST_CASE("reader: views share the archive's storage, no copy", "[reader]") {
  pt::TorchFile file = pt::ReadTorchFile(test::WorkDir() / "reader_cases" / "shared_storage.pt");
  const auto& a = file.root->At("a").AsTensor();
  const auto& b = file.root->At("b").AsTensor();
  CHECK(a.storage == b.storage);
  CHECK(b.offset == 8);
  const auto& bytes = file.archive->file()->bytes();
  CHECK(a.data() >= bytes.data());
  CHECK(a.data() < bytes.data() + bytes.size());
}

TEST_CASE("reader: lying pickles in well-formed archives are refused without allocating", "[reader]") {
  fs::path dir = test::WorkDir() / "reader_cases";
  int checked = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".error") continue;
    fs::path pt_path = entry.path();
    pt_path.replace_extension(".pt");
    std::string expected = test::ReadText(entry.path());
    INFO("case " << pt_path.filename());
    CHECK_THROWS_WITH(pt::ReadTorchFile(pt_path), Catch::StartsWith(pt_path.string()) && Catch::Contains(expected));
    ++checked;
  }
  CHECK(checked == 5);
}

TEST_CASE("reader: an archive over 4 GiB (zip64) is read exactly, without copying", "[large]") {
  fs::path dir = test::WorkDir() / "large";
  if (fs::exists(dir / "large.skip")) {
    WARN("skipped: " << test::ReadText(dir / "large.skip"));
    return;
  }
  pt::TorchFile file = pt::ReadTorchFile(dir / "large.pt");
  const auto& big = file.root->At("big").AsTensor();
  const uint64_t n = (uint64_t{4} << 30) + (uint64_t{64} << 20);
  REQUIRE(big.numel() == n);
  CHECK(big.data()[0] == 11);
  CHECK(big.data()[uint64_t{1} << 31] == 22);
  CHECK(big.data()[(uint64_t{1} << 32) + 5] == 33);
  CHECK(big.data()[n - 1] == 44);
  CHECK(big.data()[12345] == 0);
  // The storage after the 4 GiB one sits beyond every 32-bit offset.
  const auto& after = file.root->At("after").AsTensor();
  REQUIRE(after.numel() == 10);
  auto values = reinterpret_cast<const int64_t*>(after.data());
  for (int64_t k = 0; k < 10; ++k) CHECK(values[k] == k);
  CHECK(after.data() - file.archive->file()->bytes().data() > int64_t{0xFFFFFFFF});
}
