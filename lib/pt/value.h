// The value tree a pickle turns into: Python's data types, plus inert Object values for any other
// class (argparse.Namespace, DeepSpeed enums and dataclasses, loss scalers) and TensorViews over
// the archive's memory-mapped storages. Nothing here executes or imports anything.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ucp::pt {

enum class DType { F32, F64, F16, BF16, I64, I32, I16, I8, U8, Bool, C64, C128 };

size_t ElementSize(DType dtype);
std::string_view DTypeName(DType dtype);         // "float32", "bfloat16", ...
std::string_view StorageClassName(DType dtype);  // "FloatStorage", "BFloat16Storage", ...
bool DTypeFromStorageClass(std::string_view name, DType* out);
bool DTypeFromName(std::string_view name, DType* out);

// Fills `size` bytes at byte `offset` of a produced storage into `dst`; the writer asks for each
// range once, in order.
using Producer = std::function<void(uint64_t offset, uint64_t size, uint8_t* dst)>;

// A typed storage of an archive: `bytes` points into memory that `owner` keeps alive. A storage to
// be written may instead be produced piece by piece while the file is written (`produce`; `bytes`
// empty): a tensor too large to hold whole costs only the writer's chunk.
struct Storage {
  DType dtype = DType::U8;
  std::string key;  // archive/data/<key>
  uint64_t numel = 0;
  std::span<const uint8_t> bytes;
  std::shared_ptr<const void> owner;
  Producer produce;
};

// A strided view of a storage, as torch's _rebuild_tensor_v2 describes it (offset in elements).
struct TensorView {
  std::shared_ptr<Storage> storage;
  DType dtype = DType::F32;
  int64_t offset = 0;
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;

  uint64_t numel() const;
  uint64_t nbytes() const { return numel() * ElementSize(dtype); }
  bool contiguous() const;
  // First element; the view's extent was checked against the storage when it was built.
  const uint8_t* data() const { return storage->bytes.data() + offset * ElementSize(dtype); }
};

// A contiguous tensor over `data`, which `owner` keeps alive.
struct Value;
std::shared_ptr<Value> OwnedTensor(std::shared_ptr<const void> owner, const void* data, DType dtype,
                                   const std::vector<int64_t>& shape);

// A contiguous tensor whose bytes `produce` gives while the file is written.
std::shared_ptr<Value> ProducedTensor(DType dtype, const std::vector<int64_t>& shape, Producer produce);

// Building trees to write: dict[key] = v (key a str), and a list of ints.
void SetItem(Value& dict, const std::string& key, std::shared_ptr<Value> v);
std::shared_ptr<Value> IntList(const std::vector<int64_t>& values);

// Elements of a tensor of this shape (1 for a scalar's empty shape).
// A shape read from a file: throws ucp::Error ("shape [..] has a negative dimension" / "more than
// 2^48 elements": 1 PiB of float32, a damaged or hostile file) before any arithmetic can overflow.
int64_t CheckedNumel(const std::vector<int64_t>& shape);
int64_t Numel(const std::vector<int64_t>& shape);

// A step as a number: a 0-d float32 / float64 / int64 tensor (torch 2.x's Adam, DeepSpeed's) or a
// Python number. Throws ucp::Error for a tensor of another dtype.
double StepValue(const Value& v);

// Row-major strides of a shape.
std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& shape);
std::string ShapeString(const std::vector<int64_t>& shape);  // "[3, 4]"

struct Value;
using ValuePtr = std::shared_ptr<Value>;

// Insertion-ordered dictionary; scalar keys (str, int, bool, None) are indexed for lookup.
class Dict {
 public:
  struct Item {
    ValuePtr key;
    ValuePtr value;
  };
  void Set(ValuePtr key, ValuePtr value);  // replaces an equal scalar key, as Python does
  ValuePtr Get(std::string_view key) const;
  ValuePtr Get(int64_t key) const;
  const std::vector<Item>& items() const { return items_; }
  size_t size() const { return items_.size(); }
  std::vector<Item> TakeItems();  // leaves the dict empty

 private:
  std::vector<Item> items_;
  std::unordered_map<std::string, size_t> index_;
};

struct Value {
  enum class Kind { None, Bool, Int, BigInt, Float, Str, Bytes, List, Tuple, Set, Dict, Global, Object, Tensor, Storage };
  Value() = default;
  Value(const Value&) = default;
  Value(Value&&) = default;
  Value& operator=(const Value&) = default;
  Value& operator=(Value&&) = default;
  // Tears down the values only this one holds without recursion: a chain nested a million deep
  // (a hostile pickle's) may be dropped anywhere, mid-unpickle included, without exhausting the
  // stack. A cycle is not freed: the unpickler breaks the ones it built (ClearChildren).
  ~Value();
  Kind kind = Kind::None;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                  // Str, Bytes; BigInt: little-endian two's complement bytes
  std::vector<ValuePtr> items;    // List, Tuple, Set; Object: items appended to a list subclass
  pt::Dict dict;                  // Dict; Object: items set on a dict subclass
  std::string module, name;       // Global, Object: the class. Dict, Tuple: a subclass kept for
                                  // writing back (collections.OrderedDict, torch.Size), else empty
  ValuePtr args, state;           // Object: constructor arguments (a Tuple) and __setstate__ state
  bool via_new = false;           // Object: built by cls.__new__(cls, *args) (NEWOBJ), not cls(*args)
  std::shared_ptr<TensorView> tensor;
  std::shared_ptr<pt::Storage> storage;

  static ValuePtr None();
  static ValuePtr Bool(bool v);
  static ValuePtr Int(int64_t v);
  static ValuePtr Float(double v);
  static ValuePtr Str(std::string v);
  static ValuePtr Bytes(std::string v);
  static ValuePtr Make(Kind kind);
  static ValuePtr MakeObject(std::string module, std::string name, ValuePtr args = nullptr, ValuePtr state = nullptr);
  static ValuePtr MakeTensor(TensorView view);

  bool is(Kind k) const { return kind == k; }
  // Calls f(const ValuePtr&) on each value this one holds (null ones included): the one list of a
  // value's edges, for every walk over a tree.
  template <class F>
  void ForEachChild(F&& f) const {
    for (const auto& c : items) f(c);
    for (const auto& it : dict.items()) f(it.key), f(it.value);
    f(args);
    f(state);
  }
  // Drops every edge ForEachChild walks.
  void ClearChildren() {
    std::vector<ValuePtr> gone;
    MoveChildrenTo(gone);
  }
  // Moves every edge ForEachChild walks into `out`.
  void MoveChildrenTo(std::vector<ValuePtr>& out);
  bool IsSequence() const { return kind == Kind::List || kind == Kind::Tuple; }
  bool IsNumber() const { return kind == Kind::Int || kind == Kind::Float; }  // AsFloat() holds it
  std::string QualifiedName() const { return module + "." + name; }
  // "dict", "list", "object argparse.Namespace", ... for error messages.
  std::string TypeName() const;

  // Typed access; each throws ucp::Error("expected X, found Y") on a mismatch.
  int64_t AsInt() const;      // Int, Bool, and enum-like Objects whose first argument is an int
  double AsFloat() const;     // Float or Int
  bool AsBool() const;
  const std::string& AsStr() const;
  const TensorView& AsTensor() const;
  const std::vector<ValuePtr>& AsSequence() const;  // List or Tuple
  const pt::Dict& AsDict() const;

  // Key of a Dict, or attribute of an Object (its state dict, as for Namespace and dataclasses).
  // nullptr when absent or when this value has neither.
  ValuePtr Get(std::string_view key) const;
  // Like Get but throws ucp::Error naming the key when absent.
  const Value& At(std::string_view key) const;
};

// Two option values alike (a param group's): None, booleans, numbers (an int equal to a float), strings,
// and tuples or lists of them; false for any other kind.
bool SameValue(const Value& a, const Value& b);

// Scalar Python-style key for dict indexing: "s:name", "i:3", "b:1", "n:"; empty if not scalar.
std::string ScalarKey(const Value& v);

}  // namespace ucp::pt
