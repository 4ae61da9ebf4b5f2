// The store conformance suite: the same cases against every store (pt, hdf5). Tensors of random
// bit patterns (NaN payloads, denormals, negative zero included) are written through AtomWriter,
// then read back through AtomReader whole and as many random hyperslabs, and compared byte for
// byte with what the test wrote, the slabs cut by the test's own index arithmetic. Also: steps and
// DeepSpeed keys round-trip, bytes-read accounting, and damaged stores refused with the file named.
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/xxhash64.h"
#include "h5/h5.h"
#include "pt/torch_file.h"
#include "shuffle/comm.h"
#include "store/atom_store.h"
#include "test_support.h"

using namespace ucp;
using store::StoreKind;
namespace fs = std::filesystem;

namespace {

struct Case {
  std::string name;
  std::vector<int64_t> shape;
  int split_dim;
  store::UniversalKeys keys;
  pt::ValuePtr step;
  std::vector<float> data[plan::kStates];
};

pt::ValuePtr StepTensor(float v) {
  auto mem = std::make_shared<float>(v);
  const void* p = mem.get();
  return pt::OwnedTensor(std::shared_ptr<const void>(mem, p), p, pt::DType::F32, {});
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  store::UniversalKeys shard_v;
  shard_v.cat_dim = 0;
  store::UniversalKeys shard_h;
  shard_h.cat_dim = 1;
  store::UniversalKeys vocab = shard_v;
  vocab.vocab_tensor = true;
  store::UniversalKeys fused;
  fused.sub_param_shape = store::UniversalKeys::SubParamShape{{"a\\.qkv", "b\\.qkv"}, {12, 6, 6}, 0};
  store::UniversalKeys two;
  two.cat_dim = 0;
  two.param_n_sub_params = 2;
  cases.push_back({"embed.word_embeddings.weight", {37, 16}, 0, vocab, StepTensor(12.0f), {}});
  cases.push_back({"layers.0.attention.dense.weight", {24, 40}, 1, shard_h, StepTensor(12.0f), {}});
  cases.push_back({"layers.0.qkv.weight", {24, 9}, 0, fused, pt::Value::Int(7), {}});
  cases.push_back({"layers.0.mlp.weight", {10, 3}, 0, two, nullptr, {}});
  cases.push_back({"layers.0.norm.weight", {131}, -1, {}, pt::Value::Float(3.5), {}});
  cases.push_back({"empty.weight", {0}, -1, {}, StepTensor(1.0f), {}});
  cases.push_back({"empty2.weight", {5, 0}, 1, shard_h, nullptr, {}});
  cases.push_back({"cube.weight", {3, 5, 7}, 2, shard_v, nullptr, {}});
  cases.push_back({"scalar", {}, -1, {}, nullptr, {}});
  std::mt19937 rng(11);
  for (auto& c : cases)
    for (auto& d : c.data) {
      d.resize(static_cast<size_t>(pt::Numel(c.shape)));
      for (auto& x : d) {
        uint32_t bits = static_cast<uint32_t>(rng());
        std::memcpy(&x, &bits, 4);
      }
    }
  return cases;
}

nlohmann::json Meta(const Case& c) {
  return {{"name", c.name}, {"shape", c.shape}, {"dtype", "float32"}, {"numel", pt::Numel(c.shape)},
          {"pattern", c.split_dim < 0 ? "Replicate" : "Shard-V"}, {"split_dim", c.split_dim < 0 ? nlohmann::json(nullptr) : nlohmann::json(c.split_dim)},
          {"split_dim_known", true}, {"sub_param_sizes", std::vector<int64_t>{}}, {"vocab", c.keys.vocab_tensor},
          {"group", 0}, {"pattern_in_source", "Replicate"}, {"vocab_padding_rows_in_source", 0},
          {"pp_replicated", false}, {"rule", nullptr}, {"source_copies", 1}, {"source_fragments", 1}};
}

// Writes the cases into `dir` with the store, and the manifest as ucp-convert would.
void WriteStore(StoreKind kind, const fs::path& dir, const std::vector<Case>& cases) {
  fs::remove_all(dir);
  fs::create_directories(dir / "zero");
  auto comm = shuffle::MakeLocalComm();
  std::vector<store::AtomSpec> specs;
  for (const auto& c : cases) specs.push_back({c.name, c.shape, Meta(c), c.keys, c.step, c.split_dim});
  auto writer = store::AtomWriter::Create(kind, dir, specs, *comm);
  std::map<std::string, store::FileRecord> files;
  // Written out of order, as reducers finish them.
  for (int s = plan::kStates - 1; s >= 0; --s)
    for (const auto& c : cases)
      for (const auto& r : writer->Write(c.name, static_cast<plan::State>(s), c.data[s].data())) files[r.path] = r;
  auto committed = writer->Commit();
  for (const auto& r : committed.files) files[r.path] = r;
  nlohmann::json params = nlohmann::json::array();
  for (const auto& c : cases) {
    auto p = Meta(c);
    p.update(committed.storage.at(c.name));
    params.push_back(p);
  }
  // Every key schemas/manifest.schema.json requires (ReadManifest checks them).
  nlohmann::json source = {{"path", "/src"}, {"tag", "global_step1"}, {"framework", "deepspeed"}, {"optimizer", "zero"},
                           {"zero_stage", 1}, {"dtype", "fp32"}, {"dp", 1}, {"tp", 1}, {"pp", 1}, {"iteration", 1},
                           {"ds_version", "0.14.5"}, {"naming", "plain"}, {"universal_checkpoint_version", nullptr}};
  auto m = store::AssembleManifest(std::string(store::StoreName(kind)), source, nullptr, params, files);
  WriteFileAtomically((dir / store::kManifestName).string(), m.dump(1));
}

// The slab [start, start + count) of a row-major tensor, element by element.
std::vector<float> Slab(const std::vector<float>& all, const std::vector<int64_t>& shape, const std::vector<int64_t>& start,
                        const std::vector<int64_t>& count) {
  std::vector<float> out;
  int64_t n = pt::Numel(count);
  for (int64_t k = 0; k < n; ++k) {
    int64_t rest = k, off = 0, stride = 1;
    std::vector<int64_t> idx(shape.size());
    for (size_t d = shape.size(); d-- > 0;) idx[d] = rest % count[d], rest /= count[d];
    for (size_t d = shape.size(); d-- > 0;) off += (start[d] + idx[d]) * stride, stride *= shape[d];
    out.push_back(all[static_cast<size_t>(off)]);
  }
  return out;
}

bool SameBytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), 4 * a.size()) == 0);
}

fs::path StoreDir(StoreKind kind, const std::string& what) {
  return test::WorkDir() / "store" / (std::string(store::StoreName(kind)) + "-" + what);
}

}  // namespace

TEST_CASE("store: every store gives back whole tensors and random hyperslabs byte for byte", "[store]") {
  for (StoreKind kind : {StoreKind::Pt, StoreKind::Hdf5}) {
    DYNAMIC_SECTION(store::StoreName(kind)) {
      auto cases = Cases();
      fs::path dir = StoreDir(kind, "roundtrip");
      WriteStore(kind, dir, cases);
      auto reader = store::AtomReader::Open(dir.string());
      REQUIRE(reader->store() == kind);
      REQUIRE(reader->params().size() == cases.size());
      std::mt19937 rng(5);
      uint64_t expected_read = 0;
      for (size_t i = 0; i < cases.size(); ++i) {
        const Case& c = cases[i];
        const auto& p = reader->params()[i];
        CHECK(p.name == c.name);
        CHECK(p.shape == c.shape);
        CHECK(p.has_step == (c.step != nullptr));
        for (int s = 0; s < plan::kStates; ++s) {
          auto state = static_cast<plan::State>(s);
          std::vector<float> all(c.data[s].size() + (c.shape.empty() ? 1 : 0));
          reader->ReadAll(c.name, state, all.data());
          all.resize(c.data[s].size());
          CHECK(SameBytes(all, c.data[s]));
          expected_read += 4 * c.data[s].size();
          CHECK(reader->TensorDigest(c.name, state) == XxHash64::Of(c.data[s].data(), 4 * c.data[s].size()));
          expected_read += 4 * c.data[s].size();
          // Random slabs, empty ones included.
          for (int t = 0; t < 60 && !c.shape.empty(); ++t) {
            std::vector<int64_t> start(c.shape.size()), count(c.shape.size());
            for (size_t d = 0; d < c.shape.size(); ++d) {
              int64_t n = c.shape[d];
              int64_t a = n == 0 ? 0 : static_cast<int64_t>(rng() % (n + 1)), b = n == 0 ? 0 : static_cast<int64_t>(rng() % (n + 1));
              start[d] = std::min(a, b), count[d] = std::max(a, b) - std::min(a, b);
            }
            auto want = Slab(c.data[s], c.shape, start, count);
            std::vector<float> got(want.size() + 1, 0.0f);
            uint64_t before = reader->bytes_read();
            reader->ReadSlab(c.name, state, start, count, got.data());
            CHECK(reader->bytes_read() - before == 4 * want.size());
            expected_read += 4 * want.size();
            got.pop_back();
            INFO(c.name << " " << plan::StateName(state) << " start " << pt::ShapeString(start) << " count "
                        << pt::ShapeString(count));
            CHECK(SameBytes(got, want));
          }
        }
        // Steps and DeepSpeed's keys come back as written.
        auto step = reader->ReadStep(c.name);
        REQUIRE((step != nullptr) == (c.step != nullptr));
        if (step) CHECK(pt::PickleForTesting(*step) == pt::PickleForTesting(*c.step));
        CHECK(reader->ReadUniversalKeys(c.name) == c.keys);
      }
      CHECK(reader->bytes_read() == expected_read);
    }
  }
}

// A tensor record of a .pt file lies wherever its zip put it (torch aligns to 64 bytes, other zip writers
// do not): its float32 bytes at every offset modulo 4 copy as the element-by-element slab does.
TEST_CASE("store: CopySlab reads a tensor's bytes at any alignment", "[store]") {
  const std::vector<int64_t> shape = {5, 3, 4};
  std::vector<float> all(static_cast<size_t>(pt::Numel(shape)));
  for (size_t k = 0; k < all.size(); ++k) all[k] = 0.25f * static_cast<float>(k) - 3.0f;
  std::mt19937 rng(11);
  for (size_t misalign = 0; misalign < 4; ++misalign) {
    std::vector<uint8_t> bytes(4 * all.size() + 4, 0xA5);
    std::memcpy(bytes.data() + misalign, all.data(), 4 * all.size());
    for (int t = 0; t < 40; ++t) {
      std::vector<int64_t> start(shape.size()), count(shape.size());
      for (size_t d = 0; d < shape.size(); ++d) {
        const int64_t a = static_cast<int64_t>(rng() % (shape[d] + 1)), b = static_cast<int64_t>(rng() % (shape[d] + 1));
        start[d] = std::min(a, b), count[d] = std::max(a, b) - std::min(a, b);
      }
      const auto want = Slab(all, shape, start, count);
      std::vector<float> got(want.size());
      store::CopySlab(bytes.data() + misalign, shape, start, count, got.data());
      INFO("offset " << misalign << " start " << pt::ShapeString(start) << " count " << pt::ShapeString(count));
      CHECK(SameBytes(got, want));
    }
    float scalar = 0;
    store::CopySlab(bytes.data() + misalign + 4 * 7, {}, {}, {}, &scalar);
    CHECK(scalar == all[7]);
  }
}

TEST_CASE("store: readers are thread-safe: four threads reading slabs at once get the right bytes", "[store]") {
  for (StoreKind kind : {StoreKind::Pt, StoreKind::Hdf5}) {
    DYNAMIC_SECTION(store::StoreName(kind)) {
      auto cases = Cases();
      fs::path dir = StoreDir(kind, "threads");
      WriteStore(kind, dir, cases);
      auto reader = store::AtomReader::Open(dir.string());
      std::atomic<int> wrong{0}, done{0};
      std::vector<std::thread> threads;
      for (int t = 0; t < 4; ++t)
        threads.emplace_back([&, t] {
          std::mt19937 rng(100 + t);
          for (int k = 0; k < 300; ++k) {
            const Case& c = cases[rng() % cases.size()];
            if (c.shape.empty() || pt::Numel(c.shape) == 0) continue;
            int s = static_cast<int>(rng() % plan::kStates);
            std::vector<int64_t> start(c.shape.size()), count(c.shape.size());
            for (size_t d = 0; d < c.shape.size(); ++d) {
              start[d] = static_cast<int64_t>(rng() % c.shape[d]);
              count[d] = 1 + static_cast<int64_t>(rng() % (c.shape[d] - start[d]));
            }
            auto want = Slab(c.data[s], c.shape, start, count);
            std::vector<float> got(want.size());
            reader->ReadSlab(c.name, static_cast<plan::State>(s), start, count, got.data());
            if (!SameBytes(got, want)) ++wrong;
            if (k % 50 == 0) reader->Forget(c.name);  // handles dropped while others may read
            ++done;
          }
        });
      for (auto& th : threads) th.join();
      CHECK(wrong == 0);
      CHECK(done > 600);  // the empty and 0-dim tensors are skipped
    }
  }
}

TEST_CASE("store: slabs outside the shape and unknown parameters are refused by name", "[store]") {
  for (StoreKind kind : {StoreKind::Pt, StoreKind::Hdf5}) {
    DYNAMIC_SECTION(store::StoreName(kind)) {
      auto cases = Cases();
      fs::path dir = StoreDir(kind, "refusals");
      WriteStore(kind, dir, cases);
      auto reader = store::AtomReader::Open(dir.string());
      float buf[64];
      std::vector<int64_t> start = {30, 0}, count = {8, 16}, bad_rank = {1};
      CHECK_THROWS_WITH(reader->ReadSlab(cases[0].name, plan::State::Fp32, start, count, buf),
                        Catch::Contains(cases[0].name) && Catch::Contains("outside the shape [37, 16]"));
      CHECK_THROWS_WITH(reader->ReadSlab(cases[0].name, plan::State::Fp32, bad_rank, bad_rank, buf), Catch::Contains("rank 1"));
      CHECK_THROWS_WITH(reader->ReadSlab("no.such.param", plan::State::Fp32, start, count, buf),
                        Catch::Contains("no parameter 'no.such.param'"));
    }
  }
}

TEST_CASE("store: a truncated atoms.h5 is refused naming the file", "[store]") {
  auto cases = Cases();
  fs::path dir = StoreDir(StoreKind::Hdf5, "truncated");
  WriteStore(StoreKind::Hdf5, dir, cases);
  fs::path h5 = dir / store::kAtomsH5;
  for (uintmax_t keep : {fs::file_size(h5) / 2, uintmax_t{100}, uintmax_t{0}}) {
    fs::resize_file(h5, keep);
    CHECK_THROWS_WITH(store::AtomReader::Open(dir.string()), Catch::Contains(h5.string()) && Catch::Contains("H5Fopen"));
  }
}

TEST_CASE("store: a garbled atoms.h5 is an error or a correct read, never a crash or wrong bytes", "[store]") {
  // Bytes flipped anywhere in the file: metadata damage must be an Error naming atoms.h5; damage to
  // raw data shows in the per-dataset XXH64 that --verify checks.
  auto cases = Cases();
  fs::path dir = StoreDir(StoreKind::Hdf5, "garbled");
  WriteStore(StoreKind::Hdf5, dir, cases);
  fs::path h5 = dir / store::kAtomsH5;
  std::string orig = test::ReadText(h5);
  std::mt19937 rng(3);
  int errors = 0, fine = 0, caught_by_digest = 0;
  for (int trial = 0; trial < 150; ++trial) {
    std::string bytes = orig;
    size_t at = rng() % bytes.size();
    bytes[at] = static_cast<char>(bytes[at] ^ (1 + rng() % 255));
    { std::ofstream(h5, std::ios::binary) << bytes; }
    try {
      auto reader = store::AtomReader::Open(dir.string());
      bool all_same = true;
      for (const auto& c : cases)
        for (int s = 0; s < plan::kStates; ++s) {
          auto st = static_cast<plan::State>(s);
          std::string recorded = store::RecordedDatasetDigest(*reader, c.name, st);
          bool same = HexDigest(reader->TensorDigest(c.name, st)) == recorded &&
                      recorded == HexDigest(XxHash64::Of(c.data[s].data(), 4 * c.data[s].size()));
          all_same = all_same && same;
        }
      if (all_same) ++fine;
      else ++caught_by_digest;
    } catch (const Error& e) {
      CHECK_THAT(e.what(), Catch::Contains(store::kAtomsH5));
      ++errors;
    }
    CHECK(h5::OpenIdCount() == 0);  // whatever failed, every handle was closed
  }
  CHECK(errors + fine + caught_by_digest == 150);
  CHECK(errors > 0);
}

TEST_CASE("store: a missing dataset or state file is refused naming it", "[store]") {
  auto cases = Cases();
  {
    fs::path dir = StoreDir(StoreKind::Hdf5, "missing");
    WriteStore(StoreKind::Hdf5, dir, cases);
    {
      h5::File f = h5::File::Open((dir / store::kAtomsH5).string(), true);
      f.OpenGroup(cases[1].name).Unlink("exp_avg");
      f.CloseFile();
    }
    auto reader = store::AtomReader::Open(dir.string());
    std::vector<float> buf(static_cast<size_t>(pt::Numel(cases[1].shape)));
    CHECK_THROWS_WITH(reader->ReadAll(cases[1].name, plan::State::ExpAvg, buf.data()),
                      Catch::Contains("atoms.h5") && Catch::Contains("/" + cases[1].name + "/exp_avg") &&
                          Catch::Contains("no such dataset"));
    reader->ReadAll(cases[1].name, plan::State::Fp32, buf.data());  // the others are still there
  }
  {
    fs::path dir = StoreDir(StoreKind::Pt, "missing");
    WriteStore(StoreKind::Pt, dir, cases);
    fs::remove(dir / store::StateRelPath(cases[1].name, plan::State::ExpAvg));
    auto reader = store::AtomReader::Open(dir.string());
    std::vector<float> buf(static_cast<size_t>(pt::Numel(cases[1].shape)));
    CHECK_THROWS_WITH(reader->ReadAll(cases[1].name, plan::State::ExpAvg, buf.data()),
                      Catch::Contains(store::StateRelPath(cases[1].name, plan::State::ExpAvg)));
  }
}

TEST_CASE("store: a tensor of another shape or dtype than the manifest's is refused", "[store]") {
  auto cases = Cases();
  fs::path dir = StoreDir(StoreKind::Pt, "wrong_shape");
  WriteStore(StoreKind::Pt, dir, cases);
  // Replace a state file with one holding a tensor of another shape.
  std::vector<float> other(10, 1.0f);
  auto t = pt::OwnedTensor(std::shared_ptr<const void>(), other.data(), pt::DType::F32, {2, 5});
  const std::string rel = store::StateRelPath(cases[3].name, plan::State::Fp32);
  pt::WriteTorchFile((dir / rel).string(), *store::StateFileValue(cases[3].keys, {2, 5}, t));
  // ... and a manifest whose record of it says so: its checksum passes, its shape may not.
  auto m = store::ReadManifest(dir.string());
  for (auto& f : m["files"])
    if (f["path"] == rel) {
      uint64_t size = 0;
      f["xxh64"] = HexDigest(XxHash64File((dir / rel).string(), &size));
      f["bytes"] = size;
    }
  WriteFileAtomically((dir / store::kManifestName).string(), m.dump(1));
  auto reader = store::AtomReader::Open(dir.string());
  std::vector<float> buf(64);
  CHECK_THROWS_WITH(reader->ReadAll(cases[3].name, plan::State::Fp32, buf.data()),
                    Catch::Contains("fp32.pt") && Catch::Contains("shape [2, 5], the manifest says [10, 3]"));
}

// Issue 29, finding 1: a flipped byte inside an atom passed through ucp-reshard. Every reader checks
// what it reads against the manifest (the .pt store: each file's XXH64; HDF5: each dataset's) before
// any byte is used, and refuses naming the file, the parameter and the state.
TEST_CASE("store: a flipped byte in an atom is refused naming the file, parameter and state", "[store]") {
  auto cases = Cases();
  fs::path dir = StoreDir(StoreKind::Pt, "flipped_byte");
  WriteStore(StoreKind::Pt, dir, cases);
  const std::string rel = store::StateRelPath(cases[1].name, plan::State::ExpAvgSq);
  uint64_t at = 0;
  {
    auto file = pt::ReadTorchFile((dir / rel).string());
    const auto& tensor = file.root->At("param").AsTensor();
    at = static_cast<uint64_t>(tensor.data() - file.archive->file()->bytes().data()) + tensor.nbytes() / 2;
  }
  {
    std::fstream f(dir / rel, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at));
    char c = 0;
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(static_cast<std::streamoff>(at));
    f.write(&c, 1);
  }
  auto reader = store::AtomReader::Open(dir.string());
  std::vector<float> buf(static_cast<size_t>(pt::Numel(cases[1].shape)));
  // A slab that does not even touch the flipped element is refused too: the file is checked whole.
  std::vector<int64_t> start(cases[1].shape.size(), 0), count = cases[1].shape;
  count[0] = 1;
  CHECK_THROWS_WITH(reader->ReadSlab(cases[1].name, plan::State::ExpAvgSq, start, count, buf.data()),
                    Catch::Contains(rel) && Catch::Contains("'" + cases[1].name + "' exp_avg_sq") &&
                        Catch::Contains("damaged") && Catch::Contains("XXH64"));
  // The other states of the parameter read as they were written.
  CHECK_NOTHROW(reader->ReadAll(cases[1].name, plan::State::Fp32, buf.data()));
}

TEST_CASE("store: storage bytes: a TP slice of an HDF5 tensor reads whole chunks and nothing more", "[store]") {
  for (StoreKind kind : {StoreKind::Pt, StoreKind::Hdf5}) {
    DYNAMIC_SECTION(store::StoreName(kind)) {
      auto cases = Cases();
      fs::path dir = StoreDir(kind, "storage_bytes");
      WriteStore(kind, dir, cases);
      auto reader = store::AtomReader::Open(dir.string());
      const Case& c = cases[1];  // [24, 40], split along dim 1: chunks [24, 5]
      std::vector<float> buf(24 * 40);
      for (int64_t tp : {1, 2, 4, 8}) {
        for (int64_t r = 0; r < tp; ++r) {
          std::vector<int64_t> start = {0, r * 40 / tp}, count = {24, 40 / tp};
          uint64_t before = reader->storage_bytes_read();
          reader->ReadSlab(c.name, plan::State::ExpAvg, start, count, buf.data());
          CHECK(reader->storage_bytes_read() - before == static_cast<uint64_t>(4 * 24 * 40 / tp));
          CHECK(SameBytes({buf.begin(), buf.begin() + 24 * 40 / tp}, Slab(c.data[1], c.shape, start, count)));
        }
      }
      uint64_t before = reader->storage_bytes_read();
      std::vector<int64_t> start = {3, 7}, count = {1, 1};
      reader->ReadSlab(c.name, plan::State::ExpAvg, start, count, buf.data());
      CHECK(reader->storage_bytes_read() - before == (kind == StoreKind::Hdf5 ? 4u * 24 * 5 : 4u));
    }
  }
}

TEST_CASE("store: HDF5 chunks are whole rows, split along a split dimension > 0", "[store]") {
  // Rows divide the eighth of the split dimension (6250 = 2 x 5^5): TP boundaries fall between chunks.
  CHECK(store::ChunkShape({50000, 1024}, 0) == std::vector<int64_t>{250, 1024});
  // GQA QKV [q, k, v] = [2048, 256, 256] rows: per sub-parameter eighths of 32 rows.
  CHECK(store::ChunkShape({2560, 1024}, 0, {2048, 256, 256}) == std::vector<int64_t>{32, 1024});
  // A prime number of rows: plain 1 MiB chunks.
  CHECK(store::ChunkShape({50257, 1024}, -1) == std::vector<int64_t>{256, 1024});
  CHECK(store::ChunkShape({3840, 1920}, 0) == std::vector<int64_t>{120, 1920});
  CHECK(store::ChunkShape({1024, 4096}, 1) == std::vector<int64_t>{512, 512});
  CHECK(store::ChunkShape({7}, -1) == std::vector<int64_t>{7});
  CHECK(store::ChunkShape({3, 5, 7}, 2) == std::vector<int64_t>{3, 5, 7});
  CHECK(store::ChunkShape({0, 4}, 0).empty());
  CHECK(store::ChunkShape({}, -1).empty());
}

TEST_CASE("store: HDF5 errors name the file, the object and the operation", "[store]") {
  fs::path p = test::WorkDir() / "store" / "not_hdf5.h5";
  fs::create_directories(p.parent_path());
  { std::ofstream(p) << "this is not an HDF5 file"; }
  CHECK_THROWS_WITH(h5::File::Open(p.string(), false), Catch::Contains(p.string()) && Catch::Contains("H5Fopen") &&
                                                           Catch::Contains("signature"));
  fs::path q = test::WorkDir() / "store" / "small.h5";
  auto f = h5::File::Create(q.string());
  auto g = f.CreateGroup("a.b");
  CHECK_THROWS_WITH(f.CreateGroup("a.b"), Catch::Contains(q.string() + ": /a.b: H5Gcreate2") && Catch::Contains("already exists"));
  CHECK_THROWS_WITH(g.IntAttribute("nope"), Catch::Contains("/a.b attribute 'nope'") && Catch::Contains("H5Aopen"));
}

TEST_CASE("store: the folder of parameter folders is created, again too, and marked to spread them", "[store]") {
  const auto root = test::WorkDir() / "spread";
  std::filesystem::remove_all(root);
  const std::string dir = (root / "out" / "zero").string();
  CreateSpreadFolder(dir);
  CreateSpreadFolder(dir);  // a resumed run finds it there
  REQUIRE(std::filesystem::is_directory(dir));
  auto flags_of = [](const std::filesystem::path& p) -> std::optional<int> {
    const int fd = ::open(p.c_str(), O_RDONLY | O_DIRECTORY);
    int flags = 0;
    const bool ok = fd >= 0 && ::ioctl(fd, FS_IOC_GETFLAGS, &flags) == 0;
    if (fd >= 0) ::close(fd);
    return ok ? std::optional<int>(flags) : std::nullopt;
  };
  if (auto parent = flags_of(root / "out")) {  // a file system with the flags (ext4 here): the hint is set
    CHECK(!(*parent & FS_TOPDIR_FL));
    CHECK((flags_of(dir).value() & FS_TOPDIR_FL) != 0);
  }
  std::ofstream(root / "file") << "x";
  CHECK_THROWS(CreateSpreadFolder((root / "file" / "zero").string()));
}

TEST_CASE("store: a weights-only checkpoint (issue 44) reads its weights and refuses its moments by name", "[store]") {
  auto cases = Cases();
  for (StoreKind kind : {StoreKind::Pt, StoreKind::Hdf5}) {
    fs::path dir = StoreDir(kind, "weights-only");
    WriteStore(kind, dir, cases);
    // The weights-only form of the manifest, as ucp-convert HF_FOLDER writes one: fp32 alone, no step.
    auto m = nlohmann::json::parse(*ReadWholeFile((dir / store::kManifestName).string()));
    m["source"]["weights_only"] = true;
    m["source"]["optimizer"] = "none";
    std::set<std::string> dropped;
    for (auto& p : m["params"]) {
      if (kind == StoreKind::Hdf5) {
        p["hdf5"]["xxh64"].erase("exp_avg"), p["hdf5"]["xxh64"].erase("exp_avg_sq"), p["hdf5"]["step"] = false;
        continue;
      }
      for (const char* state : {"exp_avg", "exp_avg_sq", "step"})
        if (p["files"].contains(state)) dropped.insert(p["files"][state].get<std::string>()), p["files"].erase(state);
    }
    auto& files = m["files"];
    files.erase(std::remove_if(files.begin(), files.end(), [&](const auto& f) { return dropped.count(f["path"]); }), files.end());
    for (const auto& rel : dropped) fs::remove(dir / rel);
    WriteFileAtomically((dir / store::kManifestName).string(), m.dump(1));
    auto reader = store::AtomReader::Open(dir.string());
    CHECK(reader->weights_only());
    for (const auto& c : cases) {
      std::vector<float> got(static_cast<size_t>(pt::Numel(c.shape)));
      reader->ReadAll(c.name, plan::State::Fp32, got.data());
      CHECK(SameBytes(got, c.data[0]));
      CHECK(reader->ReadStep(c.name) == nullptr);
      CHECK(reader->ReadBlock(c.name, plan::State::ExpAvg).empty());
      CHECK_THROWS_WITH(reader->ReadAll(c.name, plan::State::ExpAvgSq, got.data()),
                        Catch::Contains("'" + c.name + "' exp_avg_sq") && Catch::Contains("weights only"));
    }
    // A manifest that says weights only yet lists a moment is refused by the schema.
    if (kind == StoreKind::Pt) m["params"][0]["files"]["exp_avg"] = "zero/x/exp_avg.pt";
    else m["params"][0]["hdf5"]["xxh64"]["exp_avg"] = "0123456789abcdef";
    WriteFileAtomically((dir / store::kManifestName).string(), m.dump(1));
    CHECK_THROWS(store::AtomReader::Open(dir.string()));
  }
}
