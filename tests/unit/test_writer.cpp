// The writer: value trees we build are written with WriteTorchFile, read back by our reader, and
// left in UCP_TEST_WORK/written with their canonical JSON for check_written.py (Python torch.load).
#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <iterator>
#include <tuple>

#include "core/error.h"
#include "pt/torch_file.h"
#include "pt/zip_archive.h"
#include "pt/value_json.h"
#include "test_support.h"

using namespace ucp;
using pt::Value;
using pt::ValuePtr;
namespace fs = std::filesystem;

namespace {

// A tensor over owned memory filled with a deterministic pattern.
ValuePtr PatternTensor(pt::DType dtype, std::vector<int64_t> shape, uint8_t seed) {
  auto storage = std::make_shared<pt::Storage>();
  storage->dtype = dtype;
  storage->numel = 1;
  for (int64_t d : shape) storage->numel *= d;
  auto buf = std::make_shared<std::vector<uint8_t>>(storage->numel * pt::ElementSize(dtype));
  for (size_t k = 0; k < buf->size(); ++k) (*buf)[k] = static_cast<uint8_t>(seed + k * 7);
  if (dtype == pt::DType::Bool)
    for (auto& b : *buf) b &= 1;
  storage->bytes = {buf->data(), buf->size()};
  storage->owner = buf;
  pt::TensorView view;
  view.storage = storage;
  view.dtype = dtype;
  view.shape = shape;
  view.stride = pt::ContiguousStrides(shape);
  return Value::MakeTensor(view);
}

ValuePtr Dict(std::vector<std::pair<std::string, ValuePtr>> items) {
  auto d = Value::Make(Value::Kind::Dict);
  for (auto& [k, v] : items) d->dict.Set(Value::Str(k), v);
  return d;
}

ValuePtr List(std::vector<ValuePtr> items, Value::Kind kind = Value::Kind::List) {
  auto l = Value::Make(kind);
  l->items = std::move(items);
  return l;
}

// `written` is what goes to the file; `same` (default: itself) a tree with the same content whose
// tensors are in memory, for the canonical description.
void WriteCase(const std::string& name, const ValuePtr& root, const ValuePtr& same = nullptr) {
  fs::path dir = test::WorkDir() / "written";
  fs::create_directories(dir);
  pt::WriteTorchFile(dir / (name + ".pt"), *root);
  // Our own reader must give back exactly what we wrote.
  pt::TorchFile back = pt::ReadTorchFile(dir / (name + ".pt"), {.verify_pickle_crc = true, .verify_storage_crc = true});
  auto expected = pt::CanonicalJson(same ? *same : *root);
  CHECK(pt::CanonicalJson(*back.root) == expected);
  std::ofstream(dir / (name + ".json")) << expected.dump();
}

}  // namespace

TEST_CASE("writer: universal-checkpoint style dicts round-trip", "[writer]") {
  using pt::DType;
  WriteCase("universal_fp32", Dict({{"param", PatternTensor(DType::F32, {16, 8}, 1)},
                                    {"cat_dim", Value::Int(0)},
                                    {"vocab_tensor", Value::Bool(true)},
                                    {"param_n_sub_params", Value::Int(2)}}));
  std::vector<ValuePtr> all_dtypes;
  for (DType d : {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64, DType::I32, DType::I16, DType::I8,
                  DType::U8, DType::Bool})
    all_dtypes.push_back(PatternTensor(d, {3, 4}, static_cast<uint8_t>(d)));
  WriteCase("dtypes", Dict({{"tensors", List(all_dtypes)},
                            {"scalar", PatternTensor(DType::F32, {}, 9)},
                            {"empty", PatternTensor(DType::F32, {0, 3}, 0)},
                            {"strings", List({Value::Str("a"), Value::Str("päräm"), Value::Bytes(std::string("\x00\xff\x80", 3))})},
                            {"numbers", List({Value::Int(-1), Value::Int(300), Value::Int(70000), Value::Int(-70000),
                                              Value::Int(int64_t{1} << 40), Value::Float(0.1), Value::Float(-0.0),
                                              Value::Bool(false), Value::None()}, Value::Kind::Tuple)}}));
}

TEST_CASE("writer: strided views are written row-major without a copy", "[writer]") {
  ValuePtr base = PatternTensor(pt::DType::F32, {6, 10}, 3);
  pt::TensorView t = base->AsTensor();
  std::swap(t.shape[0], t.shape[1]);
  std::swap(t.stride[0], t.stride[1]);  // transpose
  pt::TensorView slice = base->AsTensor();
  slice.offset = 13;
  slice.shape = {3, 4};  // rows 1..3, columns 3..6
  WriteCase("views", Dict({{"transposed", Value::MakeTensor(t)}, {"slice", Value::MakeTensor(slice)}}));
}

TEST_CASE("writer: produced tensors are written chunk by chunk, equal to the same bytes in memory", "[writer]") {
  using pt::DType;
  // Larger than the writer's 4 MiB chunk and not a multiple of it; an odd-sized fp16; an empty one.
  std::vector<std::pair<std::string, ValuePtr>> produced, in_memory;
  int calls = 0;
  for (auto [name, dtype, shape, seed] : {std::tuple{"big", DType::F32, std::vector<int64_t>{1500001}, uint8_t{5}},
                                          std::tuple{"odd_half", DType::F16, std::vector<int64_t>{7, 3}, uint8_t{9}},
                                          std::tuple{"empty", DType::F32, std::vector<int64_t>{0}, uint8_t{1}}}) {
    ValuePtr mem = PatternTensor(dtype, shape, seed);
    const uint8_t* bytes = mem->AsTensor().data();
    produced.emplace_back(name, pt::ProducedTensor(dtype, shape, [mem, bytes, &calls](uint64_t off, uint64_t n, uint8_t* dst) {
      ++calls;
      std::memcpy(dst, bytes + off, n);
    }));
    in_memory.emplace_back(name, mem);
  }
  WriteCase("produced", Dict(produced), Dict(in_memory));
  CHECK(calls == 2 + 1);  // big: two chunks, odd_half: one; each produced once
}

TEST_CASE("writer: objects keep their class and state", "[writer]") {
  auto ns_state = Dict({{"tensor_model_parallel_size", Value::Int(2)}, {"bf16", Value::Bool(true)}});
  auto ns = Value::MakeObject("argparse", "Namespace", nullptr, ns_state);
  ns->via_new = true;
  WriteCase("objects", Dict({{"args", ns}}));
}

TEST_CASE("writer: a failed write leaves nothing under the final name", "[writer]") {
  fs::path dir = test::WorkDir() / "written_fail";
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto bad = Value::Make(Value::Kind::Storage);  // not writable
  CHECK_THROWS_AS(pt::WriteTorchFile(dir / "x.pt", *Dict({{"s", bad}})), Error);
  CHECK(fs::is_empty(dir));
}

TEST_CASE("writer: a framed file, its tensor written by others in between, is WriteTorchFile's byte for byte", "[writer]") {
  // The state file of a split item: head and tail from the value alone and the tensor's CRC-32.
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{6, 5}, std::vector<int64_t>{3}, std::vector<int64_t>{0, 4}}) {
    ValuePtr tensor = PatternTensor(pt::DType::F32, shape, 11);
    ValuePtr root = Dict({{"cat_dim", Value::Int(0)}, {"param", tensor}, {"vocab_tensor", Value::Bool(true)}});
    fs::path dir = test::WorkDir() / "framed";
    fs::create_directories(dir);
    pt::WriteTorchFile(dir / "whole.pt", *root);
    std::ifstream in(dir / "whole.pt", std::ios::binary);
    const std::string whole((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto& bytes = tensor->AsTensor().storage->bytes;
    const pt::TorchFileFrame f = pt::FrameTorchFile(*root, pt::Crc32(0, {bytes.data(), bytes.size()}));
    CHECK(f.data_size == bytes.size());
    CHECK(f.head + std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()) + f.tail == whole);
    // The head's size does not depend on the CRC-32: parts are placed before it is known.
    CHECK(pt::FrameTorchFile(*root, 0).head.size() == f.head.size());
  }
}
