#include "formats/dcp/metadata_writer.h"

#include <map>

#include "core/error.h"
#include "pt/torch_file.h"

namespace ucp::formats::dcp {
using pt::Value;
using pt::ValuePtr;

namespace {

constexpr const char* kMetadataModule = "torch.distributed.checkpoint.metadata";

ValuePtr Size(const std::vector<int64_t>& dims) {  // torch.Size((...))
  auto t = Value::Make(Value::Kind::Tuple);
  for (int64_t d : dims) t->items.push_back(Value::Int(d));
  t->module = "torch", t->name = "Size";
  return t;
}

// cls.__new__(cls), then its fields (BUILD with a dict), in the order given; none: no BUILD.
ValuePtr Dataclass(const std::string& module, const std::string& name, std::vector<std::pair<std::string, ValuePtr>> fields) {
  auto v = Value::MakeObject(module, name, Value::Make(Value::Kind::Tuple));
  v->via_new = true;
  if (fields.empty()) return v;
  v->state = Value::Make(Value::Kind::Dict);
  for (auto& [key, value] : fields) pt::SetItem(*v->state, key, std::move(value));
  return v;
}

// TensorProperties of a tensor of `type`: its state is a tuple (dtype, layout, requires_grad,
// memory_format, pin_memory); the layout torch.serialization._get_layout('torch.strided'), the
// memory format _MEM_FORMAT_ENCODING(0) (torch.contiguous_format).
ValuePtr Properties(pt::DType type) {
  auto dtype = Value::Make(Value::Kind::Global);
  dtype->module = "torch", dtype->name = std::string(pt::DTypeName(type));
  auto layout_args = Value::Make(Value::Kind::Tuple);
  layout_args->items.push_back(Value::Str("torch.strided"));
  auto format_args = Value::Make(Value::Kind::Tuple);
  format_args->items.push_back(Value::Int(0));
  auto state = Value::Make(Value::Kind::Tuple);
  state->items = {dtype, Value::MakeObject("torch.serialization", "_get_layout", layout_args), Value::Bool(false),
                  Value::MakeObject(kMetadataModule, "_MEM_FORMAT_ENCODING", format_args), Value::Bool(false)};
  auto v = Value::MakeObject(kMetadataModule, "TensorProperties", Value::Make(Value::Kind::Tuple), state);
  v->via_new = true;
  return v;
}

// state_dict_metadata, as torch's global plan builds it: rank by rank, each rank's items in its
// plan's order, a tensor's chunks appended in that order. Returns each (key, chunk offsets) its
// index among its tensor's chunks.
ValuePtr StateDictMetadata(const SavedCheckpoint& c, std::map<std::pair<std::string, std::vector<int64_t>>, int64_t>& index) {
  auto md = Value::Make(Value::Kind::Dict);
  for (const auto& rank : c.items)
    for (const SavedItem& it : rank) {
      ValuePtr entry = md->dict.Get(it.key);
      if (it.bytes) {
        if (!entry) pt::SetItem(*md, it.key, Dataclass(kMetadataModule, "BytesStorageMetadata", {}));
        continue;
      }
      if (!entry) {
        entry = Dataclass(kMetadataModule, "TensorStorageMetadata",
                          {{"properties", Properties(it.dtype)}, {"size", Size(it.shape)}, {"chunks", Value::Make(Value::Kind::List)}});
        pt::SetItem(*md, it.key, entry);
      }
      auto& chunks = entry->state->dict.Get("chunks")->items;
      index[{it.key, it.offsets}] = static_cast<int64_t>(chunks.size());
      chunks.push_back(Dataclass(kMetadataModule, "ChunkStorageMetadata", {{"offsets", Size(it.offsets)}, {"sizes", Size(it.sizes)}}));
    }
  return md;
}

}  // namespace

std::string MetadataPickle(const SavedCheckpoint& c) {
  std::map<std::pair<std::string, std::vector<int64_t>>, int64_t> index;
  ValuePtr state_dict_metadata = StateDictMetadata(c, index);
  auto planner = Value::Make(Value::Kind::Dict);
  for (const auto& [key, path] : c.planner_data) pt::SetItem(*planner, key, path);
  auto storage = Value::Make(Value::Kind::Dict);
  for (size_t r = 0; r < c.items.size(); ++r)
    for (int k : c.file_order.at(r)) {
      const SavedItem& it = c.items[r].at(k);
      const bool b = it.bytes;
      std::vector<std::pair<std::string, ValuePtr>> fields = {
          {"fqn", Value::Str(it.key)}, {"index", b ? Value::None() : Value::Int(index.at({it.key, it.offsets}))}};
      if (!b) fields.emplace_back("offset", Size(it.offsets));  // a bytes item's has none (the class default, None)
      auto key = Dataclass(kMetadataModule, "MetadataIndex", std::move(fields));
      auto info = Dataclass("torch.distributed.checkpoint.filesystem", "_StorageInfo",
                            {{"relative_path", Value::Str(it.file)}, {"offset", Value::Int(it.offset)}, {"length", Value::Int(it.length)}});
      storage->dict.Set(key, info);
    }
  auto path_args = Value::Make(Value::Kind::Tuple);
  path_args->items.push_back(Value::Str(c.checkpoint_id));
  auto meta = Dataclass(kMetadataModule, "StorageMeta",
                        {{"checkpoint_id", Value::MakeObject("pathlib", "PosixPath", path_args)},
                         {"save_id", Value::Str(c.save_id)}, {"load_id", Value::None()}});
  auto root = Dataclass(kMetadataModule, "Metadata", {{"state_dict_metadata", state_dict_metadata}, {"planner_data", planner},
                                                      {"storage_data", storage}, {"storage_meta", meta}});
  return pt::PickleData(*root);
}

}  // namespace ucp::formats::dcp
