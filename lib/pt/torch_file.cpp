#include "pt/torch_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <optional>
#include <unordered_map>

#include "core/atomic_file.h"
#include "core/buffer_pool.h"
#include "core/error.h"
#include "pt/pickle_text.h"
#include "pt/unpickler.h"

namespace ucp::pt {

// Every format ucp reads and writes (torch.save records, safetensors, DCP, the HDF5 store's datasets) holds
// little-endian numbers, which ucp maps, copies and hashes as they lie: x86-64 and aarch64 are little-endian.
static_assert(std::endian::native == std::endian::little,
              "ucp reads and writes tensors as little-endian bytes in native order: a big-endian host is not supported");

TorchFile ReadTorchFile(const std::string& path, const ReadOptions& options) {
  return ReadTorchArchive(std::make_shared<ZipArchive>(MappedFile::Open(path)), options);
}

TorchFile ReadTorchArchive(std::shared_ptr<ZipArchive> archive, const ReadOptions& options) {
  TorchFile out;
  out.archive = std::move(archive);
  const ZipArchive& zip = *out.archive;
  const std::string& path = zip.path();
  // The pickle is <prefix>data.pkl; every other record of the archive shares that prefix.
  for (const auto& [name, entry] : zip.entries()) {
    if (name.size() >= 8 && name.compare(name.size() - 8, 8, "data.pkl") == 0 &&
        std::count(name.begin(), name.end(), '/') == 1) {
      out.prefix = name.substr(0, name.size() - 8);
      break;
    }
  }
  const ZipEntry* pkl = zip.Find(out.prefix + "data.pkl");
  if (pkl == nullptr) throw Error(path + ": not a torch.save archive: no '<name>/data.pkl' record");
  if (options.verify_pickle_crc) zip.VerifyCrc(*pkl);
  // torch.save records the saving machine's byte order and writes its storages in it; torch.load swaps
  // them where the two differ. ucp maps the storages as they lie (little-endian, as on x86-64 and aarch64):
  // a file saved on a big-endian machine is refused rather than read as other numbers. (No record: torch
  // before 1.13 wrote none, and only little-endian machines ran it for training.)
  if (const ZipEntry* order = zip.Find(out.prefix + "byteorder")) {
    zip.VerifyCrc(*order);  // a damaged byte is said as damage, not as another byte order
    const auto bytes = zip.Payload(*order);
    const std::string value(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    if (value != "little")
      throw Error(path + ": record '" + out.prefix + "byteorder' says " +
                  (value == "big" ? std::string("'big': saved on a big-endian machine") : "neither 'little' nor 'big'") +
                  "; ucp reads little-endian tensors only: load it with torch on a little-endian machine and save it again");
  }

  std::unordered_map<std::string, std::shared_ptr<Storage>> storages;
  auto resolve = [&](DType dtype, const std::string& key, uint64_t numel) -> std::shared_ptr<Storage> {
    auto it = storages.find(key);
    if (it != storages.end()) {
      if (it->second->dtype != dtype || it->second->numel != numel)
        throw Error("storage '" + key + "' referenced with two different types or sizes");
      return it->second;
    }
    const ZipEntry* entry = zip.Find(out.prefix + "data/" + key);
    if (entry == nullptr) throw Error("storage '" + key + "' has no record " + out.prefix + "data/" + key);
    unsigned __int128 need = (unsigned __int128)numel * ElementSize(dtype);
    if (need > entry->size)
      throw Error("storage '" + key + "' declares " + std::to_string(numel) + " " + std::string(DTypeName(dtype)) +
                  " elements but its record holds only " + std::to_string(entry->size) + " bytes");
    if (options.verify_storage_crc || entry->size <= kAlwaysCheckedStorageBytes) zip.VerifyCrc(*entry);
    auto s = std::make_shared<Storage>();
    s->dtype = dtype;
    s->key = key;
    s->numel = numel;
    s->bytes = zip.Payload(*entry).subspan(0, static_cast<size_t>(need));
    s->owner = zip.file();
    storages.emplace(key, s);
    return s;
  };
  out.root = WithContext(path, [&] { return Unpickle(zip.Payload(*pkl), resolve); });
  if (options.verify_storage_crc)  // every byte read: the small records beside them too (byteorder, version, ...)
    for (const auto& [name, entry] : zip.entries())
      if (&entry != pkl && name.rfind(out.prefix + "data/", 0) != 0) zip.VerifyCrc(entry);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Writing. Pickle protocol 2, as torch.save emits it; tensors as persistent storage references.

namespace {

class Pickler {
 public:
  std::string out;
  std::vector<const TensorView*> tensors;  // storage key = index

  void Dump(const Value& root) {
    out += "\x80\x02";
    Write(root, 0);
    out += '.';
  }

 private:
  void Op(char c) { out += c; }
  void U32(uint32_t v) {
    for (int k = 0; k < 4; ++k) out += static_cast<char>((v >> (8 * k)) & 0xFF);
  }
  void Str(const std::string& s) {
    if (s.size() > 0xFFFFFFFFu) throw Error("string too long to pickle");
    Op('X');
    U32(static_cast<uint32_t>(s.size()));
    out += s;
  }
  void Int(int64_t v) {
    if (v >= 0 && v < 256) {
      Op('K');
      out += static_cast<char>(v);
    } else if (v >= 0 && v < 65536) {
      Op('M');
      out += static_cast<char>(v & 0xFF);
      out += static_cast<char>(v >> 8);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      Op('J');
      U32(static_cast<uint32_t>(static_cast<int32_t>(v)));
    } else {
      Op('\x8a');
      out += static_cast<char>(8);
      for (int k = 0; k < 8; ++k) out += static_cast<char>((static_cast<uint64_t>(v) >> (8 * k)) & 0xFF);
    }
  }
  void Global(const std::string& module, const std::string& name) {
    Op('c');
    out += module + "\n" + name + "\n";
  }
  void Tuple(const std::vector<ValuePtr>& items, int depth) {
    Op('(');
    for (const auto& v : items) Write(*v, depth + 1);
    Op('t');
  }
  void IntTuple(const std::vector<int64_t>& v) {
    Op('(');
    for (int64_t x : v) Int(x);
    Op('t');
  }
  void DictItems(const Dict& d, int depth) {
    // SETITEMS in batches, as Python's pickler does.
    const auto& items = d.items();
    for (size_t start = 0; start < items.size(); start += 1000) {
      Op('(');
      for (size_t k = start; k < std::min(items.size(), start + 1000); ++k) {
        Write(*items[k].key, depth + 1);
        Write(*items[k].value, depth + 1);
      }
      Op('u');
    }
  }
  void Tensor(const TensorView& t) {
    // _rebuild_tensor_v2(storage, 0, size, stride, False, OrderedDict())
    size_t key = tensors.size();
    tensors.push_back(&t);
    Global("torch._utils", "_rebuild_tensor_v2");
    Op('(');
    Op('(');
    Str("storage");
    Global("torch", std::string(StorageClassName(t.dtype)));
    Str(std::to_string(key));
    Str("cpu");
    Int(static_cast<int64_t>(t.numel()));
    Op('t');
    Op('Q');
    Int(0);
    IntTuple(t.shape);
    IntTuple(ContiguousStrides(t.shape));
    Op('\x89');
    Global("collections", "OrderedDict");
    Op(')');
    Op('R');
    Op('t');
    Op('R');
  }
  // APPENDS of `items` (a list's, a set's, a list subclass's), none for an empty one.
  void Appends(const std::vector<ValuePtr>& items, int depth) {
    if (items.empty()) return;
    Op('(');
    for (const auto& e : items) Write(*e, depth + 1);
    Op('e');
  }
  void Float(double f) {
    Op('G');
    uint64_t bits;
    std::memcpy(&bits, &f, 8);
    for (int k = 7; k >= 0; --k) out += static_cast<char>((bits >> (8 * k)) & 0xFF);
  }
  // Protocol 2 has no bytes opcode: _codecs.encode(<latin-1 text>, 'latin1').
  void Bytes(const std::string& bytes) {
    Global("_codecs", "encode");
    Op('(');
    Str(Latin1Text(bytes));
    Str("latin1");
    Op('t');
    Op('R');
  }
  void TupleValue(const Value& v, int depth) {
    if (v.name.empty()) return Tuple(v.items, depth);
    // torch.Size((...)): the subclass it was read as
    Global(v.module, v.name);
    Op('(');
    Tuple(v.items, depth);
    Op('t');
    Op('R');
  }
  void Set(const Value& v, int depth) {
    Global("builtins", "set");
    Op('(');
    Op(']');
    Appends(v.items, depth);
    Op('t');
    Op('R');
  }
  void DictValue(const Value& v, int depth) {
    if (!v.name.empty()) {  // collections.OrderedDict(), then its items
      Global(v.module, v.name);
      Op(')');
      Op('R');
    } else {
      Op('}');
    }
    DictItems(v.dict, depth);
  }
  // cls(*args) or cls.__new__(cls, *args), then BUILD with the state; list/dict subclass items after.
  void Object(const Value& v, int depth) {
    Global(v.module, v.name);
    if (v.args) {
      Tuple(v.args->items, depth);
    } else {
      Op(')');
    }
    Op(v.via_new ? '\x81' : 'R');
    Appends(v.items, depth);
    if (v.dict.size() > 0) DictItems(v.dict, depth);
    if (v.state) {
      Write(*v.state, depth + 1);
      Op('b');
    }
  }
  void Write(const Value& v, int depth) {
    if (depth > 1000) throw Error("value nests deeper than 1000 levels");
    using K = Value::Kind;
    switch (v.kind) {
      case K::None: Op('N'); break;
      case K::Bool: Op(v.b ? '\x88' : '\x89'); break;
      case K::Int: Int(v.i); break;
      case K::BigInt:
        Op('\x8b');
        U32(static_cast<uint32_t>(v.s.size()));
        out += v.s;
        break;
      case K::Float: Float(v.f); break;
      case K::Str: Str(v.s); break;
      case K::Bytes: Bytes(v.s); break;
      case K::List:
        Op(']');
        Appends(v.items, depth);
        break;
      case K::Tuple: TupleValue(v, depth); break;
      case K::Set: Set(v, depth); break;
      case K::Dict: DictValue(v, depth); break;
      case K::Global: Global(v.module, v.name); break;
      case K::Object: Object(v, depth); break;
      case K::Tensor: Tensor(*v.tensor); break;
      case K::Storage: throw Error("a bare storage cannot be written; wrap it in a tensor");
    }
  }
};

// Zip writer: stored entries, payloads aligned to 64 bytes as torch's own writer does, zip64 records
// wherever a size or offset needs them.
class ZipWriter {
 public:
  // Bytes go to `emit`, in order; Reserve leaves a gap of bytes others write.
  explicit ZipWriter(std::function<void(const uint8_t*, size_t)> emit) : emit_(std::move(emit)) {}

  // Writes one entry whose payload is produced as consecutive chunks by `chunks`. Without a CRC
  // the entry is streamed: the CRC is computed as the payload goes out and follows it in a data
  // descriptor (general purpose flag bit 3; the local header's CRC and sizes are zero), as zip
  // writers that cannot seek do. Readers take CRC and sizes from the central directory.
  void Add(const std::string& name, uint64_t size, std::optional<uint32_t> crc,
           const std::function<void(const std::function<void(const uint8_t*, size_t)>&)>& chunks) {
    const bool streamed = !crc.has_value();
    Central c{name, offset_, size, crc.value_or(0), static_cast<uint16_t>(streamed ? 0x0008 : 0)};
    bool z64 = size >= 0xFFFFFFFFull;
    const uint64_t local_size = streamed ? 0 : size;
    std::string h;
    Le(h, 0x04034b50, 4);
    Le(h, z64 ? 45 : 20, 2);  // version needed
    Le(h, c.flags, 2);        // flags
    Le(h, 0, 2);              // stored
    Le(h, 0, 2);              // time
    Le(h, 0x21, 2);           // date (1980-01-01)
    Le(h, c.crc, 4);
    Le(h, z64 ? 0xFFFFFFFF : local_size, 4);
    Le(h, z64 ? 0xFFFFFFFF : local_size, 4);
    Le(h, name.size(), 2);
    std::string extra;
    if (z64) {
      Le(extra, 0x0001, 2);
      Le(extra, 16, 2);
      Le(extra, local_size, 8);
      Le(extra, local_size, 8);
    }
    // Pad with an 'FB' extra field so the payload starts at a multiple of 64.
    uint64_t data_start = offset_ + h.size() + 2 + name.size() + extra.size();
    uint64_t pad = (64 - (data_start + 4) % 64) % 64;
    Le(extra, 0x4246, 2);
    Le(extra, pad, 2);
    extra.append(pad, 'Z');
    Le(h, extra.size(), 2);
    h += name;
    h += extra;
    Emit(reinterpret_cast<const uint8_t*>(h.data()), h.size());
    uint64_t before = offset_;
    uint32_t running = 0;
    chunks([&](const uint8_t* p, size_t n) {
      if (streamed) running = Crc32(running, {p, n});
      Emit(p, n);
    });
    if (offset_ - before != size) throw Error("internal: entry '" + name + "' wrote a different size than declared");
    if (streamed) {
      c.crc = running;
      std::string d;
      Le(d, 0x08074b50, 4);
      Le(d, c.crc, 4);
      Le(d, size, z64 ? 8 : 4);
      Le(d, size, z64 ? 8 : 4);
      Emit(reinterpret_cast<const uint8_t*>(d.data()), d.size());
    }
    central_.push_back(c);
  }

  // An entry whose `size` payload bytes (of CRC-32 `crc`) are not emitted: `skip()` is called where
  // they go.
  void Reserve(const std::string& name, uint64_t size, uint32_t crc, const std::function<void()>& skip) {
    Add(name, size, crc, [&](const auto&) {
      skip();
      offset_ += size;
    });
  }

  void AddBytes(const std::string& name, const std::string& bytes) {
    auto span = std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    Add(name, bytes.size(), Crc32(0, span), [&](const auto& sink) { sink(span.data(), span.size()); });
  }

  void Finish() {
    uint64_t cd_start = offset_;
    for (const auto& c : central_) {
      bool z64 = c.size >= 0xFFFFFFFFull || c.offset >= 0xFFFFFFFFull;
      std::string h;
      Le(h, 0x02014b50, 4);
      Le(h, 45, 2);  // made by
      Le(h, z64 ? 45 : 20, 2);
      Le(h, c.flags, 2);
      Le(h, 0, 2);
      Le(h, 0, 2);
      Le(h, 0x21, 2);
      Le(h, c.crc, 4);
      Le(h, z64 ? 0xFFFFFFFF : c.size, 4);
      Le(h, z64 ? 0xFFFFFFFF : c.size, 4);
      Le(h, c.name.size(), 2);
      Le(h, z64 ? 28 : 0, 2);  // extra
      Le(h, 0, 2);             // comment
      Le(h, 0, 2);             // disk
      Le(h, 0, 2);             // internal attributes
      Le(h, 0, 4);             // external attributes
      Le(h, z64 ? 0xFFFFFFFF : c.offset, 4);
      h += c.name;
      if (z64) {
        Le(h, 0x0001, 2);
        Le(h, 24, 2);
        Le(h, c.size, 8);
        Le(h, c.size, 8);
        Le(h, c.offset, 8);
      }
      Emit(reinterpret_cast<const uint8_t*>(h.data()), h.size());
    }
    uint64_t cd_size = offset_ - cd_start;
    uint64_t count = central_.size();
    std::string t;
    bool z64 = cd_start >= 0xFFFFFFFFull || count >= 0xFFFF;
    if (z64) {
      uint64_t z64_start = offset_;
      Le(t, 0x06064b50, 4);
      Le(t, 44, 8);
      Le(t, 45, 2);
      Le(t, 45, 2);
      Le(t, 0, 4);
      Le(t, 0, 4);
      Le(t, count, 8);
      Le(t, count, 8);
      Le(t, cd_size, 8);
      Le(t, cd_start, 8);
      Le(t, 0x07064b50, 4);
      Le(t, 0, 4);
      Le(t, z64_start, 8);
      Le(t, 1, 4);
    }
    Le(t, 0x06054b50, 4);
    Le(t, 0, 2);
    Le(t, 0, 2);
    Le(t, z64 ? 0xFFFF : count, 2);
    Le(t, z64 ? 0xFFFF : count, 2);
    Le(t, z64 ? 0xFFFFFFFF : cd_size, 4);
    Le(t, z64 ? 0xFFFFFFFF : cd_start, 4);
    Le(t, 0, 2);
    Emit(reinterpret_cast<const uint8_t*>(t.data()), t.size());
  }

 private:
  struct Central {
    std::string name;
    uint64_t offset, size;
    uint32_t crc;
    uint16_t flags;
  };
  static void Le(std::string& s, uint64_t v, int n) {
    for (int k = 0; k < n; ++k) s += static_cast<char>((v >> (8 * k)) & 0xFF);
  }
  void Emit(const uint8_t* p, size_t n) {
    emit_(p, n);
    offset_ += n;
  }
  std::function<void(const uint8_t*, size_t)> emit_;
  uint64_t offset_ = 0;
  std::vector<Central> central_;
};

constexpr uint64_t kProduceChunk = uint64_t{4} << 20;

// Visits a tensor's elements in row-major order as runs of contiguous bytes.
void ForEachRun(const TensorView& t, const std::function<void(const uint8_t*, size_t)>& fn) {
  size_t es = ElementSize(t.dtype);
  if (t.numel() == 0) return;
  if (t.contiguous()) {
    fn(t.data(), t.nbytes());
    return;
  }
  // Innermost contiguous run: trailing dims with row-major strides.
  size_t nd = t.shape.size();
  size_t inner = nd;
  int64_t run = 1;
  while (inner > 0 && t.stride[inner - 1] == run) run *= t.shape[--inner];
  std::vector<int64_t> idx(inner, 0);
  const uint8_t* base = t.data();
  while (true) {
    int64_t off = 0;
    for (size_t k = 0; k < inner; ++k) off += idx[k] * t.stride[k];
    fn(base + off * es, static_cast<size_t>(run) * es);
    size_t k = inner;
    while (k > 0) {
      if (++idx[k - 1] < t.shape[k - 1]) break;
      idx[--k] = 0;
    }
    if (k == 0) return;
  }
}

}  // namespace

std::string PickleForTesting(const Value& root) {
  Pickler p;
  p.Dump(root);
  return p.out;
}

namespace {

// The records torch.save writes before the tensors.
const std::string kArchive = "archive/";
void AddHead(ZipWriter& zip, const std::string& pickle) {
  zip.AddBytes(kArchive + "data.pkl", pickle);
  zip.AddBytes(kArchive + "byteorder", "little");
}

}  // namespace

TorchFileFrame FrameTorchFile(const Value& root, uint32_t crc) {
  Pickler pickler;
  pickler.Dump(root);
  if (pickler.tensors.size() != 1) throw Error("internal: a framed torch file holds one tensor, not " + std::to_string(pickler.tensors.size()));
  TorchFileFrame f;
  std::string* into = &f.head;
  ZipWriter zip([&](const uint8_t* p, size_t n) { into->append(reinterpret_cast<const char*>(p), n); });
  AddHead(zip, pickler.out);
  const TensorView& t = *pickler.tensors.front();
  f.data_size = t.nbytes();
  zip.Reserve(kArchive + "data/0", t.nbytes(), crc, [&] { into = &f.tail; });
  zip.AddBytes(kArchive + "version", "3\n");
  zip.Finish();
  return f;
}

namespace {

// The archive of a pickled tree: its records in torch.save's order, each tensor's bytes streamed
// into `zip` (a produced one in chunks, with its CRC after it).
void AddRecords(ZipWriter& zip, const Pickler& pickler) {
  const std::string& prefix = kArchive;
  AddHead(zip, pickler.out);
  // Produced tensors pass through this buffer, kept by the thread from file to file: its pages
  // are faulted in once per run, not once per file.
  thread_local ScratchBytes chunk;
  for (size_t k = 0; k < pickler.tensors.size(); ++k) {
    const TensorView& t = *pickler.tensors[k];
    const std::string entry = prefix + "data/" + std::to_string(k);
    if (t.storage->produce) {  // produced once, in chunks, and streamed with its CRC after it
      const uint64_t step = std::min<uint64_t>(t.nbytes(), kProduceChunk);
      uint8_t* buf = chunk.Reserve(static_cast<size_t>(step));
      zip.Add(entry, t.nbytes(), std::nullopt, [&](const auto& sink) {
        for (uint64_t at = 0; at < t.nbytes(); at += step) {
          const uint64_t n = std::min<uint64_t>(step, t.nbytes() - at);
          t.storage->produce(at, n, buf);
          sink(buf, static_cast<size_t>(n));
        }
      });
      continue;
    }
    uint32_t crc = 0;
    ForEachRun(t, [&](const uint8_t* p, size_t n) { crc = Crc32(crc, {p, n}); });
    zip.Add(entry, t.nbytes(), crc, [&](const auto& sink) { ForEachRun(t, sink); });
  }
  zip.AddBytes(prefix + "version", "3\n");
  zip.Finish();
}

}  // namespace

FileDigest WriteTorchFile(const std::string& path, const Value& root, Durability durability, Digest digest) {
  return WithContext(path, [&] {
    Pickler pickler;
    pickler.Dump(root);
    AtomicFile file(path, durability, digest);
    ZipWriter zip([&](const uint8_t* p, size_t n) { file.Write(p, n); });
    AddRecords(zip, pickler);
    return file.Commit();
  });
}

std::string TorchFileBytes(const Value& root) {
  Pickler pickler;
  pickler.Dump(root);
  std::string out;
  ZipWriter zip([&](const uint8_t* p, size_t n) { out.append(reinterpret_cast<const char*>(p), n); });
  AddRecords(zip, pickler);
  return out;
}

std::string PickleData(const Value& root) {
  Pickler pickler;
  pickler.Dump(root);
  if (!pickler.tensors.empty()) throw Error("internal: a pickle of data alone holds no tensor");
  return pickler.out;
}

}  // namespace ucp::pt
