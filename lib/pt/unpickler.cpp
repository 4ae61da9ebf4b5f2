#include "pt/unpickler.h"

#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "pt/pickle_text.h"
#include "pt/tree_shape.h"

namespace ucp::pt {
namespace {

using Kind = Value::Kind;

class Machine {
 public:
  Machine(std::span<const uint8_t> in, const StorageResolver& storages) : in_(in), storages_(storages) {}
  // Breaks every cycle among the values the machine built, except within `keep` (the result,
  // checked to hold none), so that all of them but `keep`'s go with the machine: a list appended to
  // itself, then popped or left behind by a failure, would otherwise never be freed.
  void Release(const std::unordered_set<const Value*>& keep = {});

  ValuePtr Run();

 private:
  [[noreturn]] void Fail(const std::string& what) const {
    throw Error("pickle offset " + std::to_string(op_pos_) + ": " + what);
  }
  const uint8_t* Take(uint64_t n) {
    if (n > in_.size() - pos_) Fail("truncated: needs " + std::to_string(n) + " more bytes, " +
                                    std::to_string(in_.size() - pos_) + " left");
    const uint8_t* p = in_.data() + pos_;
    pos_ += n;
    return p;
  }
  uint64_t LE(int n) {
    const uint8_t* p = Take(n);
    uint64_t v = 0;
    for (int k = n - 1; k >= 0; --k) v = (v << 8) | p[k];
    return v;
  }
  std::string Line() {
    const uint8_t* start = in_.data() + pos_;
    const void* nl = std::memchr(start, '\n', in_.size() - pos_);
    if (!nl) Fail("truncated: unterminated text argument");
    size_t n = static_cast<const uint8_t*>(nl) - start;
    pos_ += n + 1;
    return std::string(reinterpret_cast<const char*>(start), n);
  }
  // A decimal integer argument of the text opcodes (protocol 0).
  int64_t TextInt(const std::string& s, const char* op) {
    try {
      size_t used = 0;
      int64_t v = std::stoll(s, &used);
      if (used == s.size()) return v;
    } catch (const std::exception&) {
    }
    Fail(std::string("malformed or out-of-range ") + op + " '" + s + "'");
  }
  std::string Bytes(uint64_t n) {
    const uint8_t* p = Take(n);
    return std::string(reinterpret_cast<const char*>(p), n);
  }

  // A str's bytes, which Python's pickle writes as UTF-8 (surrogates passed through, as its
  // 'surrogatepass' does): anything else is a damaged pickle, refused here rather than carried into
  // names, paths and JSON reports.
  std::string Utf8(uint64_t n) {
    std::string s = Bytes(n);
    if (const size_t bad = FirstNonUtf8Byte(s); bad != std::string_view::npos)
      Fail("a str that is not UTF-8 (byte " + std::to_string(bad) + " of " + std::to_string(s.size()) + ")");
    return s;
  }

  // Bounds on what a pickle may make this machine hold, far above what torch.save writes (it builds
  // dicts and lists in batches of 1000, and memoizes each object once) and far below what would let
  // a small hostile file take gigabytes: refused as soon as they are passed.
  static constexpr size_t kMaxStack = size_t{1} << 16;  // values and marks on the stack
  static constexpr size_t kMaxMemo = size_t{1} << 22;   // memo entries

  void Push(ValuePtr v) {
    if (stack_.size() >= kMaxStack) Fail("more than " + std::to_string(kMaxStack) + " values on the pickle stack");
    // Only a value that was on the stack can be given children later (APPEND, SETITEM, BUILD act
    // on the top), so only these can close a cycle: Release knows them all.
    if (v && (v->kind == Kind::List || v->kind == Kind::Set || v->kind == Kind::Dict || v->kind == Kind::Object)) {
      if (mutable_.size() >= 2 * mutable_live_ + 4096) {  // a weak_ptr keeps its value's memory: drop the dead
        std::erase_if(mutable_, [](const std::weak_ptr<Value>& w) { return w.expired(); });
        mutable_live_ = mutable_.size();
      }
      mutable_.push_back(v);
    }
    stack_.push_back(std::move(v));
  }
  ValuePtr Pop() {
    if (stack_.size() <= Floor()) Fail("stack underflow");
    ValuePtr v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  ValuePtr& Top() {
    if (stack_.size() <= Floor()) Fail("stack underflow");
    return stack_.back();
  }
  size_t Floor() const { return marks_.empty() ? 0 : marks_.back(); }
  std::vector<ValuePtr> PopMark() {
    if (marks_.empty()) Fail("no MARK on the stack");
    size_t m = marks_.back();
    marks_.pop_back();
    std::vector<ValuePtr> out(std::make_move_iterator(stack_.begin() + m), std::make_move_iterator(stack_.end()));
    stack_.resize(m);
    return out;
  }
  void MemoPut(uint64_t index) {
    if (memo_.size() >= kMaxMemo && !memo_.count(index)) Fail("more than " + std::to_string(kMaxMemo) + " memo entries");
    memo_[index] = Top();
  }
  ValuePtr MemoGet(uint64_t index) {
    auto it = memo_.find(index);
    if (it == memo_.end()) Fail("memo index " + std::to_string(index) + " was never stored");
    return it->second;
  }

  ValuePtr MakeSequence(Kind kind, std::vector<ValuePtr> items) {
    auto v = Value::Make(kind);
    v->items = std::move(items);
    return v;
  }
  ValuePtr Long(const std::string& le_bytes);
  ValuePtr Global(std::string module, std::string name);
  ValuePtr Reduce(const ValuePtr& callable, const ValuePtr& args);
  ValuePtr NewObject(const ValuePtr& cls, const ValuePtr& args);
  ValuePtr PersistentLoad(const ValuePtr& pid);
  ValuePtr RebuildTensor(const std::vector<ValuePtr>& args);
  void SetItems(const ValuePtr& target, std::vector<ValuePtr> kv);
  void Append(const ValuePtr& target, std::vector<ValuePtr> items);

  std::span<const uint8_t> in_;
  const StorageResolver& storages_;
  size_t pos_ = 0;
  size_t op_pos_ = 0;
  std::vector<ValuePtr> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, ValuePtr> memo_;
  std::vector<std::weak_ptr<Value>> mutable_;  // lists, sets, dicts, objects ever pushed
  size_t mutable_live_ = 0;                     // of them alive at the last sweep
};

ValuePtr Machine::Long(const std::string& le) {
  // Strip redundant sign-extension bytes, then fit into int64 when possible.
  size_t n = le.size();
  if (n == 0) return Value::Int(0);
  bool negative = static_cast<uint8_t>(le[n - 1]) & 0x80;
  uint8_t fill = negative ? 0xFF : 0x00;
  while (n > 1 && static_cast<uint8_t>(le[n - 1]) == fill &&
         ((static_cast<uint8_t>(le[n - 2]) & 0x80) != 0) == negative)
    --n;
  if (n <= 8) {
    uint64_t v = negative ? ~uint64_t{0} : 0;
    for (size_t k = n; k-- > 0;) v = (v << 8) | static_cast<uint8_t>(le[k]);
    return Value::Int(static_cast<int64_t>(v));
  }
  auto v = Value::Make(Kind::BigInt);
  v->s = le.substr(0, n);
  return v;
}

ValuePtr Machine::Global(std::string module, std::string name) {
  if (module.empty() || name.empty()) Fail("GLOBAL with an empty module or name");
  // Python 2 module names that protocol-2 pickles still carry.
  if (module == "__builtin__") module = "builtins";
  auto v = Value::Make(Kind::Global);
  v->module = std::move(module);
  v->name = std::move(name);
  return v;
}

ValuePtr Machine::PersistentLoad(const ValuePtr& pid) {
  // torch.save: ('storage', <Global torch.XStorage>, key: str, location: str, numel: int)
  if (pid->kind != Kind::Tuple || pid->items.size() < 5 || pid->items[0]->kind != Kind::Str ||
      pid->items[0]->s != "storage")
    Fail("persistent id is not a torch storage reference (found " + pid->TypeName() + ")");
  const Value& cls = *pid->items[1];
  const Value& key = *pid->items[2];
  const Value& numel = *pid->items[4];
  DType dtype;
  if (cls.kind != Kind::Global || !DTypeFromStorageClass(cls.name, &dtype))
    Fail("unsupported storage class " + cls.TypeName());
  if (key.kind != Kind::Str || numel.kind != Kind::Int || numel.i < 0)
    Fail("malformed storage reference (key " + key.TypeName() + ", numel " + numel.TypeName() + ")");
  auto v = Value::Make(Kind::Storage);
  v->storage = storages_(dtype, key.s, static_cast<uint64_t>(numel.i));
  return v;
}

ValuePtr Machine::RebuildTensor(const std::vector<ValuePtr>& args) {
  // _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
  if (args.size() < 4 || args[0]->kind != Kind::Storage)
    Fail("_rebuild_tensor_v2 expects (storage, offset, size, stride, ...)");
  const Storage& storage = *args[0]->storage;
  TensorView view;
  view.storage = args[0]->storage;
  view.dtype = storage.dtype;
  auto ints = [&](const Value& v, const char* what) {
    std::vector<int64_t> out;
    if (!v.IsSequence()) Fail(std::string("tensor ") + what + " is " + v.TypeName() + ", not a tuple");
    for (const auto& e : v.items) {
      if (e->kind != Kind::Int || e->i < 0) Fail(std::string("tensor ") + what + " holds a negative or non-int value");
      out.push_back(e->i);
    }
    return out;
  };
  if (args[1]->kind != Kind::Int || args[1]->i < 0) Fail("tensor storage offset is not a non-negative int");
  view.offset = args[1]->i;
  view.shape = ints(*args[2], "size");
  view.stride = ints(*args[3], "stride");
  if (view.shape.size() != view.stride.size())
    Fail("tensor size has " + std::to_string(view.shape.size()) + " dims but stride has " +
         std::to_string(view.stride.size()));
  // The furthest element the view touches must lie inside the storage; computed in 128 bits.
  unsigned __int128 numel = 1, last = static_cast<uint64_t>(view.offset);
  for (size_t k = 0; k < view.shape.size(); ++k) {
    numel *= static_cast<uint64_t>(view.shape[k]);
    if (numel > (unsigned __int128)1 << 62) Fail("tensor size " + ShapeString(view.shape) + " is absurd");
    if (view.shape[k] > 0) last += (unsigned __int128)(view.shape[k] - 1) * static_cast<uint64_t>(view.stride[k]);
  }
  if (numel > 0 && last >= storage.numel)
    Fail("tensor of size " + ShapeString(view.shape) + " at offset " + std::to_string(view.offset) +
         " needs storage '" + storage.key + "' to hold more than its " + std::to_string(storage.numel) + " elements");
  return Value::MakeTensor(std::move(view));
}

ValuePtr Machine::Reduce(const ValuePtr& callable, const ValuePtr& args) {
  if (callable->kind != Kind::Global) Fail("REDUCE on " + callable->TypeName() + ", not a class or function");
  if (args->kind != Kind::Tuple) Fail("REDUCE arguments are " + args->TypeName() + ", not a tuple");
  const std::string& m = callable->module;
  const std::string& n = callable->name;
  const auto& a = args->items;
  if (m == "torch._utils" && (n == "_rebuild_tensor_v2" || n == "_rebuild_tensor")) return RebuildTensor(a);
  if (m == "torch._utils" && (n == "_rebuild_parameter" || n == "_rebuild_parameter_with_state")) {
    if (a.empty() || a[0]->kind != Kind::Tensor) Fail(n + " expects a tensor as its first argument");
    return a[0];
  }
  if (m == "torch._tensor" && n == "_rebuild_from_type_v2") {
    // (func, type, args, state): the tensor is func(*args); the subclass type is dropped.
    if (a.size() < 3 || a[2]->kind != Kind::Tuple) Fail("_rebuild_from_type_v2 expects (func, type, args, ...)");
    return Reduce(a[0], a[2]);
  }
  if (m == "torch._utils" && n.rfind("_rebuild_", 0) == 0) Fail("unsupported tensor kind torch._utils." + n);
  if (m == "collections" && n == "OrderedDict") {
    auto d = Value::Make(Kind::Dict);
    d->module = m, d->name = n;
    if (!a.empty()) {
      if (!a[0]->IsSequence()) Fail("OrderedDict argument is " + a[0]->TypeName());
      for (const auto& pair : a[0]->items) {
        if (!pair->IsSequence() || pair->items.size() != 2) Fail("OrderedDict item is not a pair");
        d->dict.Set(pair->items[0], pair->items[1]);
      }
    }
    return d;
  }
  if (m == "builtins" && (n == "set" || n == "frozenset")) {
    auto s = Value::Make(Kind::Set);
    if (!a.empty()) {
      if (!a[0]->IsSequence() && a[0]->kind != Kind::Set) Fail(n + " argument is " + a[0]->TypeName());
      s->items = a[0]->items;
    }
    return s;
  }
  if (m == "_codecs" && n == "encode") {
    // Protocol 2 writes bytes b as _codecs.encode(b.decode('latin1'), 'latin1').
    if (a.empty() || a[0]->kind != Kind::Str) Fail("_codecs.encode expects a str");
    auto bytes = Latin1Bytes(a[0]->s);
    if (!bytes) Fail("_codecs.encode: character outside latin-1");
    return Value::Bytes(std::move(*bytes));
  }
  if (m == "builtins" && n == "bytearray") {
    if (a.empty()) return Value::Bytes("");
    if (a[0]->kind != Kind::Bytes) Fail("bytearray expects bytes");
    return Value::Bytes(a[0]->s);
  }
  if (m == "copyreg" && n == "_reconstructor") {
    if (a.empty() || a[0]->kind != Kind::Global) Fail("copyreg._reconstructor expects a class");
    return Value::MakeObject(a[0]->module, a[0]->name);
  }
  if (m == "torch" && n == "Size") {
    if (a.empty()) return Value::Make(Kind::Tuple);
    if (!a[0]->IsSequence()) Fail("torch.Size expects a tuple");
    auto size = MakeSequence(Kind::Tuple, a[0]->items);
    size->module = m, size->name = n;
    return size;
  }
  return Value::MakeObject(m, n, args);
}

ValuePtr Machine::NewObject(const ValuePtr& cls, const ValuePtr& args) {
  if (cls->kind != Kind::Global) Fail("NEWOBJ on " + cls->TypeName() + ", not a class");
  if (args->kind != Kind::Tuple) Fail("NEWOBJ arguments are " + args->TypeName() + ", not a tuple");
  if (cls->module == "collections" && cls->name == "OrderedDict") {
    auto d = Value::Make(Kind::Dict);
    d->module = cls->module, d->name = cls->name;
    return d;
  }
  if (cls->module == "builtins" && cls->name == "object") return Value::MakeObject("builtins", "object");
  ValuePtr obj = Value::MakeObject(cls->module, cls->name, args);
  obj->via_new = true;
  return obj;
}

void Machine::SetItems(const ValuePtr& target, std::vector<ValuePtr> kv) {
  if (kv.size() % 2 != 0) Fail("SETITEMS with an odd number of stack items");
  if (target->kind != Kind::Dict && target->kind != Kind::Object) Fail("SETITEM on " + target->TypeName());
  for (size_t k = 0; k < kv.size(); k += 2) {
    // Object: a dict subclass (e.g. a DeepSpeed config dict); its items are kept beside its state.
    target->dict.Set(std::move(kv[k]), std::move(kv[k + 1]));
  }
}

void Machine::Append(const ValuePtr& target, std::vector<ValuePtr> items) {
  if (target->kind != Kind::List && target->kind != Kind::Object && target->kind != Kind::Set)
    Fail("APPEND on " + target->TypeName());
  for (auto& v : items) target->items.push_back(std::move(v));
}

ValuePtr Machine::Run() {
  while (true) {
    op_pos_ = pos_;
    uint8_t op = *Take(1);
    switch (op) {
      case 0x80: {  // PROTO
        uint8_t proto = *Take(1);
        if (proto > 5) Fail("pickle protocol " + std::to_string(proto) + " is newer than 5");
        break;
      }
      case 0x95: Take(8); break;  // FRAME: a hint only
      case '.': {                  // STOP
        if (!marks_.empty() || stack_.size() != 1) Fail("STOP with a stack of " + std::to_string(stack_.size()));
        ValuePtr root = Pop();
        return root;
      }
      case '(':  // MARK
        if (marks_.size() >= kMaxStack) Fail("more than " + std::to_string(kMaxStack) + " MARKs open");
        marks_.push_back(stack_.size());
        break;
      case '0': Pop(); break;                               // POP
      case '1': PopMark(); break;                           // POP_MARK
      case '2': Push(Top()); break;                         // DUP
      case 'N': Push(Value::None()); break;
      case 0x88: Push(Value::Bool(true)); break;
      case 0x89: Push(Value::Bool(false)); break;
      case 'J': Push(Value::Int(static_cast<int32_t>(LE(4)))); break;  // BININT
      case 'K': Push(Value::Int(static_cast<int64_t>(LE(1)))); break;  // BININT1
      case 'M': Push(Value::Int(static_cast<int64_t>(LE(2)))); break;  // BININT2
      case 0x8a: Push(Long(Bytes(LE(1)))); break;                       // LONG1
      case 0x8b: {                                                      // LONG4
        int32_t n = static_cast<int32_t>(LE(4));
        if (n < 0) Fail("LONG4 with negative length");
        Push(Long(Bytes(static_cast<uint64_t>(n))));
        break;
      }
      case 'G': {  // BINFLOAT, big-endian
        const uint8_t* p = Take(8);
        uint64_t bits = 0;
        for (int k = 0; k < 8; ++k) bits = (bits << 8) | p[k];
        double d;
        std::memcpy(&d, &bits, 8);
        Push(Value::Float(d));
        break;
      }
      case 'I': {  // INT (text); "I01\n" / "I00\n" are booleans
        std::string s = Line();
        if (s == "01" || s == "00") {
          Push(Value::Bool(s == "01"));
          break;
        }
        Push(Value::Int(TextInt(s, "INT")));
        break;
      }
      case 'L': {  // LONG (text)
        std::string s = Line();
        if (!s.empty() && s.back() == 'L') s.pop_back();
        Push(Value::Int(TextInt(s, "LONG")));
        break;
      }
      case 'F': {  // FLOAT (text)
        std::string s = Line();
        try {
          Push(Value::Float(std::stod(s)));
        } catch (const std::exception&) {
          Fail("malformed FLOAT '" + s + "'");
        }
        break;
      }
      case 'X': Push(Value::Str(Utf8(LE(4)))); break;      // BINUNICODE
      case 0x8c: Push(Value::Str(Utf8(LE(1)))); break;     // SHORT_BINUNICODE
      case 0x8d: Push(Value::Str(Utf8(LE(8)))); break;     // BINUNICODE8
      case 'V': Push(Value::Str(Line())); break;           // UNICODE (raw)
      case 'B': Push(Value::Bytes(Bytes(LE(4)))); break;   // BINBYTES
      case 'C': Push(Value::Bytes(Bytes(LE(1)))); break;   // SHORT_BINBYTES
      case 0x8e: Push(Value::Bytes(Bytes(LE(8)))); break;  // BINBYTES8
      case 0x96: Push(Value::Bytes(Bytes(LE(8)))); break;  // BYTEARRAY8
      case 'T': {                                          // BINSTRING (Python 2 str)
        int32_t n = static_cast<int32_t>(LE(4));
        if (n < 0) Fail("BINSTRING with negative length");
        Push(Value::Str(Bytes(static_cast<uint64_t>(n))));
        break;
      }
      case 'U': Push(Value::Str(Bytes(LE(1)))); break;  // SHORT_BINSTRING
      case 'S': {                                       // STRING (quoted text)
        std::string s = Line();
        if (s.size() < 2 || (s.front() != '\'' && s.front() != '"') || s.back() != s.front())
          Fail("malformed STRING argument");
        Push(Value::Str(s.substr(1, s.size() - 2)));
        break;
      }
      case ')': Push(Value::Make(Kind::Tuple)); break;
      case ']': Push(Value::Make(Kind::List)); break;
      case '}': Push(Value::Make(Kind::Dict)); break;
      case 0x8f: Push(Value::Make(Kind::Set)); break;  // EMPTY_SET
      case 't': Push(MakeSequence(Kind::Tuple, PopMark())); break;
      case 'l': Push(MakeSequence(Kind::List, PopMark())); break;
      case 0x91: Push(MakeSequence(Kind::Set, PopMark())); break;  // FROZENSET
      case 0x85: Push(MakeSequence(Kind::Tuple, {Pop()})); break;
      case 0x86: {
        ValuePtr b = Pop(), a = Pop();
        Push(MakeSequence(Kind::Tuple, {a, b}));
        break;
      }
      case 0x87: {
        ValuePtr c = Pop(), b = Pop(), a = Pop();
        Push(MakeSequence(Kind::Tuple, {a, b, c}));
        break;
      }
      case 'd': {  // DICT
        auto d = Value::Make(Kind::Dict);
        SetItems(d, PopMark());
        Push(d);
        break;
      }
      case 'a': {  // APPEND
        ValuePtr v = Pop();
        Append(Top(), {v});
        break;
      }
      case 'e': {  // APPENDS
        auto items = PopMark();
        Append(Top(), std::move(items));
        break;
      }
      case 0x90: {  // ADDITEMS
        auto items = PopMark();
        Append(Top(), std::move(items));
        break;
      }
      case 's': {  // SETITEM
        ValuePtr v = Pop(), k = Pop();
        SetItems(Top(), {k, v});
        break;
      }
      case 'u': {  // SETITEMS
        auto kv = PopMark();
        SetItems(Top(), std::move(kv));
        break;
      }
      case 'c': {  // GLOBAL
        std::string module = Line();
        std::string name = Line();
        Push(Global(std::move(module), std::move(name)));
        break;
      }
      case 0x93: {  // STACK_GLOBAL
        ValuePtr name = Pop(), module = Pop();
        if (module->kind != Kind::Str || name->kind != Kind::Str) Fail("STACK_GLOBAL expects two str");
        Push(Global(module->s, name->s));
        break;
      }
      case 'R': {  // REDUCE
        ValuePtr args = Pop(), callable = Pop();
        Push(Reduce(callable, args));
        break;
      }
      case 0x81: {  // NEWOBJ
        ValuePtr args = Pop(), cls = Pop();
        Push(NewObject(cls, args));
        break;
      }
      case 0x92: {  // NEWOBJ_EX
        ValuePtr kwargs = Pop(), args = Pop(), cls = Pop();
        ValuePtr obj = NewObject(cls, args);
        if (obj->kind == Kind::Object && kwargs->kind == Kind::Dict && kwargs->dict.size() > 0) obj->state = kwargs;
        Push(obj);
        break;
      }
      case 'i': {  // INST module\nname\n, arguments from the mark
        std::string module = Line();
        std::string name = Line();
        Push(NewObject(Global(module, name), MakeSequence(Kind::Tuple, PopMark())));
        break;
      }
      case 'o': {  // OBJ: class and arguments from the mark
        auto items = PopMark();
        if (items.empty()) Fail("OBJ without a class");
        ValuePtr cls = items.front();
        items.erase(items.begin());
        Push(NewObject(cls, MakeSequence(Kind::Tuple, std::move(items))));
        break;
      }
      case 'b': {  // BUILD
        ValuePtr state = Pop();
        ValuePtr& obj = Top();
        if (obj->kind == Kind::Object) {
          obj->state = state;
        } else if (obj->kind != Kind::Tensor && obj->kind != Kind::Dict) {
          Fail("BUILD on " + obj->TypeName());
        }  // tensors (hooks, parameter state) and OrderedDict subclasses: state is not data we use
        break;
      }
      case 'Q': {  // BINPERSID
        ValuePtr pid = Pop();
        Push(PersistentLoad(pid));
        break;
      }
      case 'P': Fail("text persistent ids are not written by torch.save");
      case 'q': MemoPut(LE(1)); break;          // BINPUT
      case 'r': MemoPut(LE(4)); break;          // LONG_BINPUT
      case 0x94: MemoPut(memo_.size()); break;  // MEMOIZE
      case 'p': {                               // PUT (text)
        std::string s = Line();
        try {
          MemoPut(std::stoull(s));
        } catch (const std::exception&) {
          Fail("malformed PUT '" + s + "'");
        }
        break;
      }
      case 'h': Push(MemoGet(LE(1))); break;  // BINGET
      case 'j': Push(MemoGet(LE(4))); break;  // LONG_BINGET
      case 'g': {                             // GET (text)
        std::string s = Line();
        try {
          Push(MemoGet(std::stoull(s)));
        } catch (const Error&) {
          throw;
        } catch (const std::exception&) {
          Fail("malformed GET '" + s + "'");
        }
        break;
      }
      case 0x82:
      case 0x83:
      case 0x84: Fail("extension registry opcodes (EXT1/2/4) are not supported");
      case 0x97:
      case 0x98: Fail("out-of-band buffers (protocol 5) are not supported");
      default: {
        char buf[8];
        std::snprintf(buf, sizeof buf, "0x%02x", op);
        Fail(std::string("unknown opcode ") + buf);
      }
    }
  }
}

}  // namespace

void Machine::Release(const std::unordered_set<const Value*>& keep) {
  for (const auto& w : mutable_)
    if (ValuePtr v = w.lock(); v && !keep.count(v.get())) v->ClearChildren();
  mutable_.clear();
}

ValuePtr Unpickle(std::span<const uint8_t> bytes, const StorageResolver& storages, UnpickleLimits limits) {
  Machine machine(bytes, storages);
  ValuePtr root;
  try {
    root = machine.Run();
  } catch (...) {
    machine.Release();
    throw;
  }
  TreeShape shape = MeasureTree(root, limits.max_nesting);
  if (shape.cycle || shape.depth > limits.max_nesting) {
    machine.Release();
    throw Error(shape.cycle ? "pickle holds a cycle (a value inside itself), which torch.save never writes"
                            : "pickle nests deeper than " + std::to_string(limits.max_nesting) + " levels");
  }
  machine.Release(shape.values);
  return root;
}

}  // namespace ucp::pt
