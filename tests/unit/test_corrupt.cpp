// Bad input: truncated files, flipped bytes, missing rank files. Each must give a clear error naming
// the file (ucp::Error, never a crash); run under AddressSanitizer by scripts/test.sh.
#include <catch2/catch.hpp>

#include <fstream>
#include <random>
#include <sstream>

#include "core/error.h"
#include "inspect/inspect.h"
#include "store/atom_store.h"
#include "patterns/rules.h"
#include "pt/torch_file.h"
#include "pt/unpickler.h"
#include "test_support.h"

using namespace ucp;
namespace fs = std::filesystem;

namespace {

fs::path Fixture(const std::string& name) { return test::WorkDir() / "fixtures" / name; }

std::string Bytes(const fs::path& p) { return test::ReadText(p); }

fs::path WriteBytes(const std::string& name, const std::string& bytes) {
  fs::path dir = test::WorkDir() / "corrupt";
  fs::create_directories(dir);
  fs::path p = dir / name;
  std::ofstream(p, std::ios::binary) << bytes;
  return p;
}

// Reads the whole file, touching every tensor: any failure must be a ucp::Error naming the path.
void ExpectCleanError(const fs::path& p, pt::ReadOptions options) {
  try {
    pt::TorchFile f = pt::ReadTorchFile(p, options);
    FAIL_CHECK("read succeeded: " << p);
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::StartsWith(p.string()));
  }
}

// Where the pickle record of a good shard file lies.
pt::ZipEntry PickleEntry(const fs::path& p) {
  pt::TorchFile clean = pt::ReadTorchFile(p);
  const pt::ZipEntry* pkl = clean.archive->Find(clean.prefix + "data.pkl");
  REQUIRE(pkl != nullptr);
  return *pkl;
}

}  // namespace

TEST_CASE("corrupt: truncated shard files give an error naming the file", "[corrupt]") {
  fs::path src = Fixture("zero2_dp3") / "global_step12" / "zero_pp_rank_1_mp_rank_00_optim_states.pt";
  std::string bytes = Bytes(src);
  REQUIRE(bytes.size() > 1000);
  for (size_t cut : {size_t{0}, size_t{10}, size_t{100}, bytes.size() / 3, bytes.size() / 2, bytes.size() - 30,
                     bytes.size() - 1}) {
    INFO("truncated at " << cut);
    ExpectCleanError(WriteBytes("truncated_" + std::to_string(cut) + ".pt", bytes.substr(0, cut)), {});
  }
}

TEST_CASE("corrupt: flipped bytes in the pickle are caught by its CRC", "[corrupt]") {
  fs::path src = Fixture("zero2_dp3") / "global_step12" / "mp_rank_00_model_states.pt";
  pt::ZipEntry pkl = PickleEntry(src);
  std::string flipped = Bytes(src);
  flipped[pkl.data_offset + pkl.size / 2] ^= 0x5A;
  fs::path p = WriteBytes("flipped_crc.pt", flipped);
  CHECK_THROWS_WITH(pt::ReadTorchFile(p), Catch::Contains("CRC-32 mismatch") && Catch::Contains("data.pkl"));
}

TEST_CASE("corrupt: every single-byte change of a pickle is an error or a value, never a crash", "[corrupt]") {
  // With the CRC check off the unpickler itself faces the damage: all 256 values at a spread of offsets.
  fs::path src = Fixture("zero2_dp3") / "global_step12" / "zero_pp_rank_0_mp_rank_00_optim_states.pt";
  std::string bytes = Bytes(src);
  pt::ZipEntry pkl = PickleEntry(src);
  int errors = 0, parsed = 0;
  std::mt19937 rng(7);
  for (int trial = 0; trial < 600; ++trial) {
    std::string damaged = bytes;
    size_t at = pkl.data_offset + rng() % pkl.size;
    damaged[at] = static_cast<char>(rng() & 0xFF);
    fs::path p = WriteBytes("fuzz.pt", damaged);
    try {
      pt::ReadTorchFile(p, {.verify_pickle_crc = false});
      ++parsed;
    } catch (const Error& e) {
      CHECK_THAT(e.what(), Catch::StartsWith(p.string()));
      ++errors;
    }
  }
  CHECK(errors > 0);
  CHECK(errors + parsed == 600);
}

TEST_CASE("corrupt: a missing rank file is named, and strict inspect fails", "[corrupt]") {
  fs::path src = Fixture("tp2_pp2_dp2_bf16");
  fs::path dst = test::WorkDir() / "corrupt" / "missing_rank";
  fs::remove_all(dst);
  fs::create_directories(dst.parent_path());
  fs::copy(src, dst, fs::copy_options::recursive);
  fs::remove(dst / "global_step12" / "bf16_zero_pp_rank_1_mp_rank_02_optim_states.pt");
  inspect::InspectOptions o;
  o.patterns_dir = patterns::DefaultPatternsDir();
  std::ostringstream out, err;
  CHECK(inspect::RunInspect(dst, o, out, err) == 1);
  CHECK_THAT(err.str(), Catch::Contains("missing rank file bf16_zero_pp_rank_1_mp_rank_02_optim_states.pt") &&
                            Catch::Contains("pp=1, tp=0, dp=1"));
  // The fragments of that rank are gone too: one fault, one error: the parameters that lost elements
  // are counted in the missing file's line, not each repeated as a missing fragment (issue 29, finding 9).
  CHECK_THAT(err.str(), Catch::Contains("parameters lack the elements only it held"));
  CHECK_THAT(err.str(), !Catch::Contains("missing fragment"));
  o.strict = false;
  std::ostringstream out2, err2;
  CHECK(inspect::RunInspect(dst, o, out2, err2) == 0);
  CHECK_THAT(err2.str(), Catch::Contains("warning: missing rank file"));
}

TEST_CASE("corrupt: a truncated shard inside a checkpoint makes inspect exit 2 naming it", "[corrupt]") {
  fs::path dst = test::WorkDir() / "corrupt" / "truncated_ckpt";
  fs::remove_all(dst);
  fs::copy(Fixture("tp2_dp2"), dst, fs::copy_options::recursive);
  fs::path victim = dst / "global_step12" / "layer_02-model_01-model_states.pt";
  fs::resize_file(victim, fs::file_size(victim) / 2);
  inspect::InspectOptions o;
  o.patterns_dir = patterns::DefaultPatternsDir();
  std::ostringstream out, err;
  CHECK(inspect::RunInspect(dst, o, out, err) == 2);
  CHECK_THAT(err.str(), Catch::Contains(victim.string()));
}

TEST_CASE("corrupt: hostile pickles are refused before they grow the machine without bound", "[corrupt]") {
  // tests/python/hostile_sizes.py measures the peak RSS of the same through ucp-convert.
  const pt::StorageResolver none = [](pt::DType, const std::string& key, uint64_t) -> std::shared_ptr<pt::Storage> {
    throw Error("no storage " + key);
  };
  auto refused = [&](const std::string& pickle, const std::string& why) {
    const auto* p = reinterpret_cast<const uint8_t*>(pickle.data());
    CHECK_THROWS_WITH(pt::Unpickle({p, pickle.size()}, none), Catch::Contains(why));
  };
  const std::string proto = "\x80\x02";
  std::string nested = proto, marks = proto, memo = proto + "N";
  for (int k = 0; k < 1000000; ++k) nested += "](";
  nested += std::string(1000000, 'e') + ".";
  refused(nested, "more than 65536 values on the pickle stack");
  marks += std::string(1000000, '(') + "N.";
  refused(marks, "more than 65536 MARKs open");
  for (uint32_t k = 0; k <= (uint32_t{1} << 22); ++k) memo += "r" + std::string(reinterpret_cast<const char*>(&k), 4);
  refused(memo + ".", "more than 4194304 memo entries");
  const uint64_t huge = 1000000000000ull;
  refused(proto + "\x8e" + std::string(reinterpret_cast<const char*>(&huge), 8) + "x.", "needs 1000000000000 more bytes");
  // At the bounds themselves, a pickle still reads: 65535 values under one MARK, as a tuple.
  std::string wide = proto + "(";
  for (int k = 0; k < 65535; ++k) wide += "N";
  wide += "t.";
  const auto* w = reinterpret_cast<const uint8_t*>(wide.data());
  CHECK(pt::Unpickle({w, wide.size()}, none)->AsSequence().size() == 65535);
  // Nesting is the longest chain, through shared values too: a tuple of `wrap` lists around a list
  // nested 600 deep (kept in the memo) and of that same list is 1 + wrap + 600 deep, whichever way
  // the walk meets the shared list first; the bound (1000 by default) is a chain of 1000 values.
  auto shared_chain = [&](int wrap) {
    const std::string put(std::string("q\0", 2)), get(std::string("h\0", 2));
    const std::string deep = std::string(599, '(') + "]" + std::string(599, 'l') + put + "0";  // built, kept, popped
    return proto + deep + "(" + std::string(wrap, '(') + get + std::string(wrap, 'l') + get + "t.";
  };
  const std::string at_bound = shared_chain(399);
  const auto* a = reinterpret_cast<const uint8_t*>(at_bound.data());
  CHECK(pt::Unpickle({a, at_bound.size()}, none)->AsSequence().size() == 2);
  refused(shared_chain(400), "nests deeper than 1000 levels");
  // What the machine drops on the way goes without recursion and without leaking: a tuple chain a
  // million deep, popped (it overflowed the stack); a list appended to itself, then popped, kept
  // only in the memo, the pickle succeeding (leak-checked under ASan).
  const std::string popped = proto + "N" + std::string(1000000, '\x85') + "0N.";
  const auto* q = reinterpret_cast<const uint8_t*>(popped.data());
  CHECK(pt::Unpickle({q, popped.size()}, none)->is(pt::Value::Kind::None));
  const std::string stray = proto + "]" + std::string("q\0", 2) + "2a0N.";
  const auto* r = reinterpret_cast<const uint8_t*>(stray.data());
  CHECK(pt::Unpickle({r, stray.size()}, none)->is(pt::Value::Kind::None));
}

// Inputs the fuzzers of tests/fuzz found (scripts/fuzz.sh), kept in tests/data/fuzz_regressions/<harness>/.
TEST_CASE("corrupt: inputs the fuzzers found stay refused with ucp::Error", "[corrupt]") {
  const fs::path regressions = fs::path(UCP_SOURCE_DIR) / "tests" / "data" / "fuzz_regressions";
  int cases = 0;
  for (const auto& e : fs::directory_iterator(regressions / "manifest")) {
    // A manifest whose source lacks "path" (the report read it through nlohmann's const operator[]:
    // a use after free under ASan); numbers like 1e300 where integers belong (nlohmann converts them
    // with undefined behaviour: fatal under UBSan). Each refused by the schema check, naming the key.
    fs::path dir = test::WorkDir() / "fuzz_regressions" / e.path().stem();
    fs::create_directories(dir);
    fs::copy_file(e.path(), dir / "ucp_manifest.json", fs::copy_options::overwrite_existing);
    for (bool json : {true, false}) {
      std::ostringstream out, err;
      inspect::InspectOptions options;
      options.json = json;
      CHECK(inspect::RunInspect(dir.string(), options, out, err) == 2);
      CHECK_THAT(err.str(), Catch::Contains("ucp_manifest.json"));
    }
    CHECK_THROWS_AS(store::AtomReader::Open(dir.string()), Error);
    ++cases;
  }
  for (const auto& e : fs::directory_iterator(regressions / "unpickle")) {
    // A pickle whose value holds itself (through the memo), or one whose cycle was popped before
    // the pickle failed: both leaked. Refused, and freed (leak checks under ASan).
    const std::string bytes = Bytes(e.path());
    const pt::StorageResolver none = [](pt::DType, const std::string& key, uint64_t) -> std::shared_ptr<pt::Storage> {
      throw Error("no storage " + key);
    };
    // (list_in_itself.pkl also holds a str that is no UTF-8, which the unpickler now refuses where it
    // reads it; whichever comes first, nothing may leak: ASan's leak check runs this test.)
    const std::string why = e.path().filename() == "popped_cycle.pkl" ? "stack underflow" : "cycle";
    CHECK_THROWS_WITH(pt::Unpickle({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, none),
                      Catch::Contains(why) || Catch::Contains("not UTF-8"));
    ++cases;
  }
  for (const auto& e : fs::directory_iterator(regressions / "dcp_metadata")) {
    // A DCP .metadata whose key held a byte that is no UTF-8 (0xFF): inspect --json's report threw
    // nlohmann's type_error. Refused by the unpickler, as Python's own pickle would.
    const std::string bytes = Bytes(e.path());
    const pt::StorageResolver none = [](pt::DType, const std::string& key, uint64_t) -> std::shared_ptr<pt::Storage> {
      throw Error("no storage " + key);
    };
    CHECK_THROWS_WITH(pt::Unpickle({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, none),
                      Catch::Contains("not UTF-8"));
    ++cases;
  }
  for (const auto& e : fs::directory_iterator(regressions / "patterns")) {
    // A rule that made std::regex backtrack for minutes: refused before it is compiled.
    CHECK_THROWS_WITH(patterns::RuleSet::FromFile(e.path().string()), Catch::Contains("exponential time"));
    ++cases;
  }
  CHECK(cases >= 8);
}
