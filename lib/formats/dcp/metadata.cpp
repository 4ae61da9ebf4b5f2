#include "formats/dcp/metadata.h"

#include <algorithm>
#include <set>
#include <unordered_set>

#include "core/error.h"
#include "core/mapped_file.h"
#include "pt/unpickler.h"

namespace ucp::formats::dcp {

using pt::Value;
using Kind = pt::Value::Kind;

const char* const kMetadataClasses[] = {
    "torch.distributed.checkpoint.metadata.Metadata",
    "torch.distributed.checkpoint.metadata.TensorStorageMetadata",
    "torch.distributed.checkpoint.metadata.ChunkStorageMetadata",
    "torch.distributed.checkpoint.metadata.BytesStorageMetadata",
    "torch.distributed.checkpoint.metadata.TensorProperties",
    "torch.distributed.checkpoint.metadata.MetadataIndex",
    "torch.distributed.checkpoint.metadata.StorageMeta",
    "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING",
    "torch.distributed.checkpoint.filesystem._StorageInfo",
    "torch.Size",
    "torch.serialization._get_layout",
    "torch.strided",
    // Megatron-Core's torch_dist keeps its save plans in planner_data: torch's own plan dataclasses
    "torch.distributed.checkpoint.planner.SavePlan",
    "torch.distributed.checkpoint.planner.WriteItem",
    "torch.distributed.checkpoint.planner.WriteItemType",
    "torch.distributed.checkpoint.planner.TensorWriteData",
    "pathlib.PosixPath",         // StorageMeta.checkpoint_id, Python before 3.13
    "pathlib._local.PosixPath",  // the same class's name from Python 3.13
    "collections.OrderedDict",
    // dtypes, pickled as globals
    "torch.float32", "torch.float64", "torch.float16", "torch.bfloat16", "torch.int64", "torch.int32",
    "torch.int16", "torch.int8", "torch.uint8", "torch.bool", "torch.complex64", "torch.complex128",
    "torch.float8_e4m3fn", "torch.float8_e5m2",
    nullptr};

namespace {

constexpr const char* kPrefix = "torch.distributed.checkpoint.metadata.";

// Every class the tree names (globals, objects, tuple and dict subclasses), each value visited once.
std::set<std::string> ClassesOf(const pt::ValuePtr& root) {
  std::set<std::string> out;
  std::unordered_set<const Value*> seen;
  std::vector<const Value*> todo{root.get()};
  while (!todo.empty()) {
    const Value* v = todo.back();
    todo.pop_back();
    if (!v || !seen.insert(v).second) continue;
    if (v->kind == Kind::Global || v->kind == Kind::Object || !v->module.empty()) out.insert(v->QualifiedName());
    v->ForEachChild([&](const pt::ValuePtr& c) { todo.push_back(c.get()); });
  }
  return out;
}

bool IsClass(const Value& v, const char* name) { return v.kind == Kind::Object && v.QualifiedName() == std::string(kPrefix) + name; }

// A dataclass instance's field (its BUILD state dict), or nullptr.
pt::ValuePtr Field(const Value& v, std::string_view name) {
  return v.state && v.state->kind == Kind::Dict ? v.state->Get(name) : nullptr;
}
const Value& NeedField(const Value& v, std::string_view name) {
  auto f = Field(v, name);
  if (!f) throw Error(v.name + " has no field '" + std::string(name) + "'");
  return *f;
}

std::vector<int64_t> IntsOf(const Value& v, const char* what) {
  std::vector<int64_t> out;
  for (const auto& x : v.AsSequence()) {
    if (!x || x->kind != Kind::Int) throw Error(std::string(what) + " holds a " + (x ? x->TypeName() : "null") + ", not an int");
    out.push_back(x->i);
  }
  return out;
}

// TensorProperties keeps its fields as a tuple (its __getstate__: dtype, layout, requires_grad,
// memory_format, pin_memory) in torch 2.x; a dict of fields is accepted too.
std::string DTypeOf(const Value& properties) {
  pt::ValuePtr dtype;
  if (properties.state && properties.state->IsSequence() && !properties.state->items.empty()) dtype = properties.state->items[0];
  else dtype = Field(properties, "dtype");
  if (!dtype || dtype->kind != Kind::Global || dtype->module != "torch")
    throw Error("TensorProperties holds no torch dtype");
  return dtype->name;
}

std::string Key(const std::string& fqn, const std::vector<int64_t>& offsets) {
  std::string k = fqn + "@";
  for (int64_t o : offsets) k += std::to_string(o) + ",";
  return k;
}

// Every class the pickle names, each checked to be one DCP writes: any other is refused by name.
std::vector<std::string> CheckedClasses(const pt::ValuePtr& root) {
  std::set<std::string> allowed;
  for (const char* const* c = kMetadataClasses; *c; ++c) allowed.insert(*c);
  std::vector<std::string> classes;
  for (const auto& c : ClassesOf(root)) {
    if (!allowed.count(c))
      throw Error("the pickle names class '" + c + "', which is not one a PyTorch Distributed Checkpoint's metadata "
                  "holds (Megatron-Core's MCoreMetadata and other classes of its own are not read yet): refused, nothing of it is used");
    classes.push_back(c);
  }
  return classes;
}

// One _StorageInfo(relative_path, offset, length) of `fqn`'s chunk, its fields beyond those three
// (torch 2.7+'s transforms) listed in `transform_fields` and refused where set.
Storage StorageOf(const Value& info, const std::string& fqn, std::vector<std::string>& transform_fields) {
  Storage s;
  s.relative_path = NeedField(info, "relative_path").AsStr();
  const int64_t off = NeedField(info, "offset").AsInt(), len = NeedField(info, "length").AsInt();
  if (off < 0 || len <= 0) throw Error("'" + fqn + "': storage at offset " + std::to_string(off) + " of length " + std::to_string(len));
  s.offset = static_cast<uint64_t>(off), s.length = static_cast<uint64_t>(len);
  if (s.relative_path.empty() || s.relative_path.find('/') != std::string::npos || s.relative_path == "." ||
      s.relative_path == ".." || s.relative_path.find('\0') != std::string::npos)
    throw Error("'" + fqn + "': storage file '" + s.relative_path + "' is not a plain file name in the checkpoint folder");
  for (const auto& f : info.state->AsDict().items())
    if (f.key->kind == Kind::Str && f.key->s != "relative_path" && f.key->s != "offset" && f.key->s != "length") {
      if (f.value && f.value->kind != Kind::None && !(f.value->IsSequence() && f.value->items.empty()))
        throw Error("'" + fqn + "': its storage has '" + f.key->s + "' (a transform of the saved bytes, torch 2.7+), "
                    "which ucp does not undo yet: refused rather than read as raw bytes");
      if (std::find(transform_fields.begin(), transform_fields.end(), f.key->s) == transform_fields.end())
        transform_fields.push_back(f.key->s);
    }
  return s;
}

// Where each chunk lies: MetadataIndex(fqn, offset, index) -> _StorageInfo(relative_path, offset, length),
// by Key(fqn, offset).
std::map<std::string, Storage> StorageData(const Value& root, std::vector<std::string>& transform_fields) {
  std::map<std::string, Storage> where;
  for (const auto& it : NeedField(root, "storage_data").AsDict().items()) {
    if (!it.key || !IsClass(*it.key, "MetadataIndex") || !it.value || it.value->QualifiedName() != "torch.distributed.checkpoint.filesystem._StorageInfo")
      throw Error("storage_data maps a " + (it.key ? it.key->TypeName() : "null") + " to a " + (it.value ? it.value->TypeName() : "null") +
                  ", not a MetadataIndex to a _StorageInfo");
    const std::string fqn = NeedField(*it.key, "fqn").AsStr();
    auto offset = Field(*it.key, "offset");
    const std::vector<int64_t> at = offset && offset->IsSequence() ? IntsOf(*offset, "a MetadataIndex offset") : std::vector<int64_t>{};
    const Storage s = StorageOf(*it.value, fqn, transform_fields);
    where[Key(fqn, at)] = s;
  }
  return where;
}

// Each key's original nesting, from planner_data (absent: none).
std::map<std::string, std::vector<PathPart>> PlannerPaths(const Value& root) {
  std::map<std::string, std::vector<PathPart>> paths;
  if (auto planner = Field(root, "planner_data"); planner && planner->kind == Kind::Dict)
    for (const auto& it : planner->AsDict().items()) {
      if (!it.key || it.key->kind != Kind::Str || !it.value || !it.value->IsSequence()) continue;
      std::vector<PathPart> p;
      for (const auto& part : it.value->items) {
        if (part && part->kind == Kind::Str) p.push_back({part->s, -1});
        else if (part && part->kind == Kind::Int && part->i >= 0) p.push_back({"", part->i});
        else throw Error("planner_data['" + it.key->s + "'] holds a " + (part ? part->TypeName() : "null"));
      }
      paths[it.key->s] = std::move(p);
    }
  return paths;
}

// A TensorStorageMetadata's dtype, size and chunks, each chunk inside the tensor and with its
// storage, the chunks covering every element.
void ReadTensorItem(const Value& m, const std::map<std::string, Storage>& where, Item& item) {
  item.tensor = true;
  item.dtype = DTypeOf(NeedField(m, "properties"));
  item.size = IntsOf(NeedField(m, "size"), "a tensor size");
  const int64_t numel = pt::CheckedNumel(item.size);
  int64_t covered = 0;
  for (const auto& c : NeedField(m, "chunks").AsSequence()) {
    if (!c || !IsClass(*c, "ChunkStorageMetadata")) throw Error("a chunk that is not a ChunkStorageMetadata");
    Chunk chunk{IntsOf(NeedField(*c, "offsets"), "chunk offsets"), IntsOf(NeedField(*c, "sizes"), "chunk sizes")};
    if (chunk.offsets.size() != item.size.size() || chunk.sizes.size() != item.size.size())
      throw Error("a chunk of " + std::to_string(chunk.sizes.size()) + " dimensions in a tensor of " + std::to_string(item.size.size()));
    for (size_t d = 0; d < item.size.size(); ++d)
      if (chunk.offsets[d] < 0 || chunk.sizes[d] < 0 || chunk.offsets[d] > item.size[d] - chunk.sizes[d])
        throw Error("chunk at " + pt::ShapeString(chunk.offsets) + " of size " + pt::ShapeString(chunk.sizes) +
                    " lies outside the tensor's " + pt::ShapeString(item.size));
    covered += pt::Numel(chunk.sizes);
    auto s = where.find(Key(item.fqn, chunk.offsets));
    if (s == where.end()) throw Error("chunk at " + pt::ShapeString(chunk.offsets) + " has no storage_data entry");
    item.storage.push_back(s->second);
    item.chunks.push_back(std::move(chunk));
  }
  if (covered != numel)
    throw Error("its chunks hold " + std::to_string(covered) + " elements, the tensor " + pt::ShapeString(item.size) +
                " has " + std::to_string(numel));
}

// One state_dict_metadata entry: a bytes item or a tensor, with where its bytes lie.
Item ItemOf(const pt::Dict::Item& it, const std::map<std::string, Storage>& where) {
  Item item;
  item.fqn = it.key->AsStr();
  WithContext("'" + item.fqn + "'", [&] {
    const Value& m = *it.value;
    if (IsClass(m, "BytesStorageMetadata")) {
      auto s = where.find(Key(item.fqn, {}));
      if (s == where.end()) throw Error("a bytes item without storage_data");
      item.storage.push_back(s->second);
    } else if (IsClass(m, "TensorStorageMetadata")) {
      ReadTensorItem(m, where, item);
    } else {
      throw Error("described by a " + m.TypeName() + ", not a Tensor- or BytesStorageMetadata");
    }
  });
  return item;
}

}  // namespace

Metadata ReadMetadata(const std::string& path) {
  return WithContext(path, [&] {
    auto file = MappedFile::Open(path);
    auto root = pt::Unpickle(file->bytes(), [](pt::DType, const std::string&, uint64_t) -> std::shared_ptr<pt::Storage> {
      throw Error("a persistent id (tensor storage) in the metadata pickle, which DCP never writes");
    });
    Metadata M;
    M.classes = CheckedClasses(root);
    if (!root || !IsClass(*root, "Metadata")) throw Error("not a torch.distributed.checkpoint Metadata pickle");
    if (!root->state || root->state->kind != Kind::Dict) throw Error("Metadata has no fields");
    for (const auto& it : root->state->AsDict().items()) M.fields.push_back(it.key->kind == Kind::Str ? it.key->s : "?");
    if (auto v = Field(*root, "version"); v && v->kind == Kind::Str) M.version = v->s;
    const std::map<std::string, Storage> where = StorageData(*root, M.transform_fields);
    const std::map<std::string, std::vector<PathPart>> paths = PlannerPaths(*root);
    for (const auto& it : NeedField(*root, "state_dict_metadata").AsDict().items()) {
      Item item = ItemOf(it, where);
      if (auto p = paths.find(item.fqn); p != paths.end()) item.path = p->second;
      if (!M.by_fqn.emplace(item.fqn, M.items.size()).second) throw Error("'" + item.fqn + "' is listed twice");
      M.items.push_back(std::move(item));
    }
    return M;
  });
}

}  // namespace ucp::formats::dcp
