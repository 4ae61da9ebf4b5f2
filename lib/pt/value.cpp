#include "pt/value.h"

#include <cstring>
#include <utility>

#include "core/error.h"

namespace ucp::pt {
namespace {

struct DTypeInfo {
  DType dtype;
  size_t size;
  const char* name;
  const char* storage;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::F32, 4, "float32", "FloatStorage"},        {DType::F64, 8, "float64", "DoubleStorage"},
    {DType::F16, 2, "float16", "HalfStorage"},         {DType::BF16, 2, "bfloat16", "BFloat16Storage"},
    {DType::I64, 8, "int64", "LongStorage"},           {DType::I32, 4, "int32", "IntStorage"},
    {DType::I16, 2, "int16", "ShortStorage"},          {DType::I8, 1, "int8", "CharStorage"},
    {DType::U8, 1, "uint8", "ByteStorage"},            {DType::Bool, 1, "bool", "BoolStorage"},
    {DType::C64, 8, "complex64", "ComplexFloatStorage"}, {DType::C128, 16, "complex128", "ComplexDoubleStorage"},
};

const DTypeInfo& Info(DType d) {
  for (const auto& info : kDTypes)
    if (info.dtype == d) return info;
  throw Error("unknown dtype");
}

}  // namespace

size_t ElementSize(DType d) { return Info(d).size; }
std::string_view DTypeName(DType d) { return Info(d).name; }
std::string_view StorageClassName(DType d) { return Info(d).storage; }

bool DTypeFromStorageClass(std::string_view name, DType* out) {
  for (const auto& info : kDTypes)
    if (name == info.storage) return *out = info.dtype, true;
  if (name == "UntypedStorage") return *out = DType::U8, true;
  return false;
}

bool DTypeFromName(std::string_view name, DType* out) {
  for (const auto& info : kDTypes)
    if (name == info.name) return *out = info.dtype, true;
  return false;
}

uint64_t TensorView::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

bool TensorView::contiguous() const {
  int64_t expected = 1;
  for (size_t k = shape.size(); k-- > 0;) {
    if (shape[k] != 1 && stride[k] != expected) return false;
    expected *= shape[k];
  }
  return true;
}

std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> stride(shape.size());
  int64_t s = 1;
  for (size_t k = shape.size(); k-- > 0;) {
    stride[k] = s;
    s *= shape[k];
  }
  return stride;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t k = 0; k < shape.size(); ++k) out += (k ? ", " : "") + std::to_string(shape[k]);
  return out + "]";
}

std::string ScalarKey(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Str: return "s:" + v.s;
    case Value::Kind::Int: return "i:" + std::to_string(v.i);
    case Value::Kind::Bool: return "i:" + std::to_string(v.b ? 1 : 0);  // Python: True == 1
    case Value::Kind::None: return "n:";
    default: return "";
  }
}

std::vector<Dict::Item> Dict::TakeItems() {
  index_.clear();
  return std::exchange(items_, {});
}

void Value::MoveChildrenTo(std::vector<ValuePtr>& out) {
  for (auto& c : items) out.push_back(std::move(c));
  items.clear();
  for (auto& it : dict.TakeItems()) out.push_back(std::move(it.key)), out.push_back(std::move(it.value));
  if (args) out.push_back(std::move(args));
  if (state) out.push_back(std::move(state));
}

Value::~Value() {
  if (items.empty() && dict.size() == 0 && !args && !state) return;  // a leaf
  std::vector<ValuePtr> todo;
  MoveChildrenTo(todo);
  while (!todo.empty()) {
    ValuePtr v = std::move(todo.back());
    todo.pop_back();
    if (v && v.use_count() == 1) v->MoveChildrenTo(todo);  // then it goes, a leaf, at the end of this turn
  }
}

void Dict::Set(ValuePtr key, ValuePtr value) {
  std::string k = ScalarKey(*key);
  if (!k.empty()) {
    auto [it, inserted] = index_.emplace(k, items_.size());
    if (!inserted) {
      items_[it->second].value = std::move(value);
      return;
    }
  }
  items_.push_back({std::move(key), std::move(value)});
}

ValuePtr Dict::Get(std::string_view key) const {
  auto it = index_.find("s:" + std::string(key));
  return it == index_.end() ? nullptr : items_[it->second].value;
}

ValuePtr Dict::Get(int64_t key) const {
  auto it = index_.find("i:" + std::to_string(key));
  return it == index_.end() ? nullptr : items_[it->second].value;
}

ValuePtr Value::Make(Kind kind) {
  auto v = std::make_shared<Value>();
  v->kind = kind;
  return v;
}
ValuePtr Value::None() { return Make(Kind::None); }
ValuePtr Value::Bool(bool b) {
  auto v = Make(Kind::Bool);
  v->b = b;
  return v;
}
ValuePtr Value::Int(int64_t i) {
  auto v = Make(Kind::Int);
  v->i = i;
  return v;
}
ValuePtr Value::Float(double f) {
  auto v = Make(Kind::Float);
  v->f = f;
  return v;
}
ValuePtr Value::Str(std::string s) {
  auto v = Make(Kind::Str);
  v->s = std::move(s);
  return v;
}
ValuePtr Value::Bytes(std::string s) {
  auto v = Make(Kind::Bytes);
  v->s = std::move(s);
  return v;
}
ValuePtr Value::MakeObject(std::string module, std::string name, ValuePtr args, ValuePtr state) {
  auto v = Make(Kind::Object);
  v->module = std::move(module);
  v->name = std::move(name);
  v->args = args ? std::move(args) : Make(Kind::Tuple);
  v->state = std::move(state);
  return v;
}
int64_t CheckedNumel(const std::vector<int64_t>& shape) {
  constexpr int64_t kMaxElements = int64_t{1} << 48;
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw Error("shape " + ShapeString(shape) + " has a negative dimension");
    if (d > 0 && n > kMaxElements / d) throw Error("shape " + ShapeString(shape) + " has more than 2^48 elements");
    n = d == 0 ? 0 : n * d;
  }
  return n;
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {

// A contiguous tensor over the whole of a new storage of `shape`, which `fill` completes.
template <typename Fill>
ValuePtr WholeStorageTensor(DType dtype, const std::vector<int64_t>& shape, Fill&& fill) {
  auto storage = std::make_shared<Storage>();
  storage->dtype = dtype;
  storage->numel = static_cast<uint64_t>(Numel(shape));
  fill(*storage);
  TensorView view;
  view.storage = std::move(storage);
  view.dtype = dtype;
  view.shape = shape;
  view.stride = ContiguousStrides(shape);
  return Value::MakeTensor(std::move(view));
}

}  // namespace

ValuePtr OwnedTensor(std::shared_ptr<const void> owner, const void* data, DType dtype, const std::vector<int64_t>& shape) {
  return WholeStorageTensor(dtype, shape, [&](Storage& st) {
    st.bytes = {static_cast<const uint8_t*>(data), st.numel * ElementSize(dtype)};
    st.owner = std::move(owner);
  });
}

ValuePtr ProducedTensor(DType dtype, const std::vector<int64_t>& shape, Producer produce) {
  return WholeStorageTensor(dtype, shape, [&](Storage& st) { st.produce = std::move(produce); });
}

void SetItem(Value& dict, const std::string& key, ValuePtr v) { dict.dict.Set(Value::Str(key), std::move(v)); }

ValuePtr IntList(const std::vector<int64_t>& values) {
  auto l = Value::Make(Value::Kind::List);
  for (int64_t x : values) l->items.push_back(Value::Int(x));
  return l;
}

ValuePtr Value::MakeTensor(TensorView view) {
  auto v = Make(Kind::Tensor);
  v->tensor = std::make_shared<TensorView>(std::move(view));
  return v;
}

std::string Value::TypeName() const {
  switch (kind) {
    case Kind::None: return "None";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::BigInt: return "int (beyond 64 bits)";
    case Kind::Float: return "float";
    case Kind::Str: return "str";
    case Kind::Bytes: return "bytes";
    case Kind::List: return "list";
    case Kind::Tuple: return "tuple";
    case Kind::Set: return "set";
    case Kind::Dict: return "dict";
    case Kind::Global: return "global " + QualifiedName();
    case Kind::Object: return "object " + QualifiedName();
    case Kind::Tensor: return "tensor";
    case Kind::Storage: return "storage";
  }
  return "?";
}

namespace {
[[noreturn]] void Mismatch(const char* expected, const Value& found) {
  throw Error(std::string("expected ") + expected + ", found " + found.TypeName());
}
}  // namespace

int64_t Value::AsInt() const {
  if (kind == Kind::Int) return i;
  if (kind == Kind::Bool) return b ? 1 : 0;
  // Python enums pickle as Class(value): ZeroStageEnum(2) reads as 2.
  if (kind == Kind::Object && args && args->items.size() == 1 && args->items[0]->kind == Kind::Int)
    return args->items[0]->i;
  Mismatch("int", *this);
}
double StepValue(const Value& v) {
  if (v.kind != Value::Kind::Tensor) return v.AsFloat();
  const TensorView& t = v.AsTensor();
  if (t.dtype == DType::F32) {
    float f;
    std::memcpy(&f, t.data(), 4);
    return f;
  }
  if (t.dtype == DType::F64) {
    double d;
    std::memcpy(&d, t.data(), 8);
    return d;
  }
  if (t.dtype == DType::I64) {
    int64_t i;
    std::memcpy(&i, t.data(), 8);
    return static_cast<double>(i);
  }
  throw Error("its step is a " + std::string(DTypeName(t.dtype)) + " tensor");
}

double Value::AsFloat() const {
  if (kind == Kind::Float) return f;
  if (kind == Kind::Int) return static_cast<double>(i);
  Mismatch("float", *this);
}
bool Value::AsBool() const {
  if (kind == Kind::Bool) return b;
  Mismatch("bool", *this);
}
const std::string& Value::AsStr() const {
  if (kind == Kind::Str) return s;
  Mismatch("str", *this);
}
const TensorView& Value::AsTensor() const {
  if (kind == Kind::Tensor) return *tensor;
  Mismatch("tensor", *this);
}
const std::vector<ValuePtr>& Value::AsSequence() const {
  if (kind == Kind::List || kind == Kind::Tuple) return items;
  Mismatch("list or tuple", *this);
}
const pt::Dict& Value::AsDict() const {
  if (kind == Kind::Dict) return dict;
  if (kind == Kind::Object && state && state->kind == Kind::Dict) return state->dict;
  Mismatch("dict", *this);
}

ValuePtr Value::Get(std::string_view key) const {
  if (kind == Kind::Dict) return dict.Get(key);
  if (kind == Kind::Object) {
    if (state && state->kind == Kind::Dict) return state->dict.Get(key);
    return dict.Get(key);
  }
  return nullptr;
}

const Value& Value::At(std::string_view key) const {
  ValuePtr v = Get(key);
  if (!v) {
    if (kind != Kind::Dict && kind != Kind::Object) Mismatch("dict", *this);
    throw Error("missing key '" + std::string(key) + "'");
  }
  return *v;
}

bool SameValue(const Value& a, const Value& b) {
  if (a.IsNumber() && b.IsNumber()) return a.AsFloat() == b.AsFloat();
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::None: return true;
    case Value::Kind::Bool: return a.b == b.b;
    case Value::Kind::Str: return a.s == b.s;
    case Value::Kind::Tuple:
    case Value::Kind::List:
      if (a.items.size() != b.items.size()) return false;
      for (size_t i = 0; i < a.items.size(); ++i)
        if (!a.items[i] || !b.items[i] || !SameValue(*a.items[i], *b.items[i])) return false;
      return true;
    default: return false;
  }
}


}  // namespace ucp::pt
