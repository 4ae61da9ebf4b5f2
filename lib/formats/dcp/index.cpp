#include "formats/dcp/index.h"

#include <algorithm>
#include <array>
#include <map>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>

#include "core/error.h"
#include "core/mapped_file.h"
#include "formats/dcp/metadata.h"
#include "pt/torch_file.h"

namespace ucp::formats::dcp {

namespace fs = std::filesystem;
using source::Extent;
using source::Fragment;
using source::ShardFile;
using source::SourceIndex;
using pt::Value;

namespace {

constexpr const char* kStateNames[] = {"", "exp_avg", "exp_avg_sq"};  // the atomic states after fp32

// What a key of the state dict is, from its original nesting (planner_data), or from its flattened
// name when the metadata has none: a model tensor (`fqn`), an optimizer state of parameter `fqn`
// (`state`: exp_avg, exp_avg_sq, step, ...), or a param group's option (`group`, `option`).
struct Role {
  enum { Model, OptimizerState, GroupOption, Other } kind = Other;
  std::string fqn, state, option;
  int64_t group = -1;
};

Role RoleOf(const Item& item) {
  Role r;
  const auto& p = item.path;
  if (p.size() >= 3 && p[p.size() - 3].key == "state" && !p[p.size() - 2].key.empty() && !p.back().key.empty()) {
    r.kind = Role::OptimizerState, r.fqn = p[p.size() - 2].key, r.state = p.back().key;
    return r;
  }
  if (p.size() >= 3 && p[p.size() - 3].key == "param_groups" && p[p.size() - 2].index >= 0 && !p.back().key.empty()) {
    r.kind = Role::GroupOption, r.group = p[p.size() - 2].index, r.option = p.back().key;
    return r;
  }
  if (!p.empty()) {
    if (item.tensor && !p.back().key.empty()) r.kind = Role::Model, r.fqn = p.back().key;
    return r;
  }
  static const std::regex state(R"(^(?:.*\.)?state\.(.+)\.([A-Za-z_]+)$)"), group(R"(^(?:.*\.)?param_groups\.(\d+)\.([A-Za-z_]+)$)");
  std::smatch m;
  if (std::regex_match(item.fqn, m, state)) r.kind = Role::OptimizerState, r.fqn = m[1], r.state = m[2];
  else if (std::regex_match(item.fqn, m, group)) r.kind = Role::GroupOption, r.group = std::stoll(m[1]), r.option = m[2];
  else if (item.tensor) r.kind = Role::Model, r.fqn = item.fqn.rfind("model.", 0) == 0 ? item.fqn.substr(6) : item.fqn;
  return r;
}

// The checkpoint's files, opened once each.
class Files {
 public:
  Files(SourceIndex& L) : L_(L) {}
  int Index(const std::string& name) {
    auto it = index_.find(name);
    if (it != index_.end()) return it->second;
    ShardFile f;
    f.name = name, f.kind = "distcp";
    static const std::regex rank(R"(^__(\d+)_(\d+)\.distcp$)");
    if (std::smatch m; std::regex_match(name, m, rank)) f.dp = std::stoi(m[1]);
    L_.files.push_back(f);
    mapped_.push_back(MappedFile::Open(L_.dir + "/" + name));
    return index_[name] = static_cast<int>(L_.files.size()) - 1;
  }
  // The torch.save archive at `s`, its pickle's CRC-32 checked.
  pt::TorchFile Archive(const Storage& s, int* file) {
    *file = Index(s.relative_path);
    return pt::ReadTorchArchive(std::make_shared<pt::ZipArchive>(mapped_[*file], s.offset, s.length));
  }
  const uint8_t* Base(int file) const { return mapped_[file]->bytes().data(); }
  std::vector<std::shared_ptr<MappedFile>> mapped_;

 private:
  SourceIndex& L_;
  std::map<std::string, int> index_;
};

// A chunk's tensor: where its float32 elements start in its file, and the record holding them
// (added to the file's checksummed ranges).
struct Located {
  int file = -1;
  uint64_t offset = 0;
};

Located Locate(Files& files, SourceIndex& L, const Item& item, size_t c, const char* need_dtype) {
  Located out;
  auto archive = files.Archive(item.storage[c], &out.file);
  if (!archive.root || archive.root->kind != Value::Kind::Tensor)
    throw Error("chunk " + std::to_string(c) + " holds a " + (archive.root ? archive.root->TypeName() : "null") + ", not a tensor");
  const pt::TensorView& t = archive.root->AsTensor();
  if (need_dtype && pt::DTypeName(t.dtype) != need_dtype)
    throw Error("chunk " + std::to_string(c) + " is " + std::string(pt::DTypeName(t.dtype)) + " where the metadata says " + item.dtype);
  if (t.shape != item.chunks[c].sizes || !t.contiguous())
    throw Error("chunk " + std::to_string(c) + " is a " + (t.contiguous() ? "" : "non-contiguous ") + pt::ShapeString(t.shape) +
                " tensor where the metadata says " + pt::ShapeString(item.chunks[c].sizes));
  out.offset = static_cast<uint64_t>(t.data() - files.Base(out.file));
  const pt::ZipEntry* entry = archive.archive->Find(archive.prefix + "data/" + t.storage->key);
  if (!entry) throw Error("chunk " + std::to_string(c) + ": no record for its storage");
  L.files[out.file].checksummed.push_back({item.fqn + " chunk " + std::to_string(c) + " (" + entry->name + ")", entry->data_offset, entry->size, entry->crc32});
  return out;
}

// The runs of a box in the global tensor's row-major order: fn(src_start, dst_start, numel), src
// counting in the chunk's own row-major order.
template <typename Fn>
void ForEachRun(const std::vector<int64_t>& size, const Chunk& c, Fn&& fn) {
  const int n = static_cast<int>(size.size());
  if (pt::Numel(c.sizes) == 0) return;
  int k = n - 1;  // the outermost dimension of the contiguous run
  while (k > 0 && c.sizes[k] == size[k]) --k;
  std::vector<int64_t> stride = pt::ContiguousStrides(size);
  const int64_t run = n == 0 ? 1 : c.sizes[k] * stride[k];
  int64_t runs = 1;
  for (int d = 0; d < k; ++d) runs *= c.sizes[d];
  std::vector<int64_t> at(std::max(k, 0), 0);
  for (int64_t r = 0; r < runs; ++r) {
    int64_t dst = n == 0 ? 0 : c.offsets[k] * stride[k];
    for (int d = 0; d < k; ++d) dst += (c.offsets[d] + at[d]) * stride[d];
    fn(r * run, dst, run);
    for (int d = k - 1; d >= 0 && ++at[d] == c.sizes[d]; --d) at[d] = 0;
  }
}

std::string ChunkKey(const Chunk& c) { return pt::ShapeString(c.offsets) + pt::ShapeString(c.sizes); }

}  // namespace

bool LooksLikeCheckpoint(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_regular_file(fs::path(dir) / ".metadata", ec)) return false;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".distcp") return true;
  return false;
}

SourceIndex IndexCheckpoint(const std::string& dir, const source::IndexOptions&) {
  SourceIndex L;
  L.format = "dcp";
  L.root = L.dir = dir;
  L.framework = "torch-dcp";
  L.optimizer = "torch";
  L.naming = "plain";
  // Megatron-Core's torch_dist saves through DCP with its own keys (layers stacked on a leading axis,
  // experts on a global-expert axis, fused [gate; up], bucket-flat distributed-optimizer state) and
  // says so in metadata.json: said by name rather than read as plain parameters.
  if (std::ifstream meta(dir + "/metadata.json"); meta) {
    std::string text((std::istreambuf_iterator<char>(meta)), std::istreambuf_iterator<char>());
    if (text.find("sharded_backend") != std::string::npos)
      throw Error(dir + ": a Megatron-Core distributed checkpoint (metadata.json names its sharded_backend): its keys are "
                  "Megatron's sharded keys, not parameters, and ucp does not read them yet");
  }
  const Metadata M = ReadMetadata(dir + "/.metadata");
  Files files(L);

  // The keys by role: model tensors, each parameter's optimizer states, the param groups' options.
  std::map<std::string, const Item*> model;
  std::vector<std::string> model_order;
  std::map<std::string, std::map<std::string, const Item*>> states;
  std::map<int64_t, std::vector<std::pair<std::string, const Item*>>> options;  // in the order saved
  for (const Item& item : M.items) {
    Role r = RoleOf(item);
    if (r.kind == Role::Model) {
      if (!model.emplace(r.fqn, &item).second) L.errors.push_back("'" + item.fqn + "': a second model tensor named '" + r.fqn + "'");
      else model_order.push_back(r.fqn);
    } else if (r.kind == Role::OptimizerState) {
      states[r.fqn][r.state] = &item;
    } else if (r.kind == Role::GroupOption) {
      options[r.group].emplace_back(r.option, &item);
    }
  }
  if (states.empty())
    L.errors.push_back(dir + ": no optimizer state (model weights only): ucp-convert makes an atomic checkpoint of "
                       "fp32 weights and Adam's exp_avg / exp_avg_sq per parameter; a weights-only DCP is not supported yet");
  for (const auto& [fqn, s] : states)
    if (!model.count(fqn)) L.errors.push_back("optimizer state for '" + fqn + "', which is not among the model's tensors");

  // The param groups (torch's state_dict form: options, and `params` as the parameter names).
  std::map<std::string, int> group_of;
  auto osd = Value::Make(Value::Kind::Dict);
  auto groups = Value::Make(Value::Kind::List);
  for (const auto& [g, opts] : options) {
    auto group = Value::Make(Value::Kind::Dict);
    for (const auto& [option, item] : opts) {
      try {
        int file = -1;
        auto archive = files.Archive(item->storage[0], &file);
        pt::SetItem(*group, option, archive.root);
        if (option == "params" && archive.root && archive.root->IsSequence())
          for (const auto& name : archive.root->items)
            if (name && name->kind == Value::Kind::Str) group_of[name->s] = static_cast<int>(g);
      } catch (const std::exception& e) {
        L.errors.push_back("'" + item->fqn + "': " + e.what());
      }
    }
    groups->items.push_back(group);
  }
  pt::SetItem(*osd, "param_groups", groups);
  L.optimizer_state = osd;

  std::map<int, std::pair<std::string, pt::ValuePtr>> group_step;  // group -> (its first parameter, its step)
  std::vector<std::string> frozen;
  for (const std::string& fqn : model_order) {
    const Item& w = *model.at(fqn);
    auto st = states.find(fqn);
    if (st == states.end()) {
      frozen.push_back(fqn);
      continue;
    }
    try {
      WithContext("'" + w.fqn + "'", [&] {
        std::array<const Item*, 3> item{&w, nullptr, nullptr};
        for (int s = 1; s < 3; ++s) {
          auto it = st->second.find(kStateNames[s]);
          if (it == st->second.end())
            throw Error("no optimizer state '" + std::string(kStateNames[s]) + "' (ucp reads Adam's exp_avg and exp_avg_sq; this optimizer keeps " +
                        [&] { std::string k; for (const auto& [n, i] : st->second) k += (k.empty() ? "" : ", ") + n; return k; }() + ")");
          item[s] = it->second;
        }
        for (const Item* i : item) {
          if (i->dtype != "float32")
            throw Error("'" + i->fqn + "' is " + i->dtype + ": ucp reads float32 weights and Adam moments (a DCP of " + i->dtype +
                        " parameters is not supported yet)");
          if (i->size != w.size) throw Error("'" + i->fqn + "' is " + pt::ShapeString(i->size) + ", the weight " + pt::ShapeString(w.size));
        }
        source::ParamRecord rec;
        rec.name = fqn;
        auto g = group_of.find(fqn);
        rec.group = g == group_of.end() ? 0 : g->second;
        rec.tp_shape[0] = w.size;
        rec.stages.insert(0);
        const int param = static_cast<int>(L.params.size());
        // The moments' chunks by box: the same boxes as the weight's, wherever each was written.
        std::array<std::map<std::string, size_t>, 3> box;
        for (int s = 1; s < 3; ++s)
          for (size_t c = 0; c < item[s]->chunks.size(); ++c) box[s][ChunkKey(item[s]->chunks[c])] = c;
        for (size_t c = 0; c < w.chunks.size(); ++c) {
          std::array<Extent, 3> slot;
          const int64_t numel = pt::Numel(w.chunks[c].sizes);
          Located at = Locate(files, L, w, c, "float32");
          slot[0] = {at.offset, numel, -1};
          for (int s = 1; s < 3; ++s) {
            auto same = box[s].find(ChunkKey(w.chunks[c]));
            if (same == box[s].end())
              throw Error("its chunk at " + pt::ShapeString(w.chunks[c].offsets) + " of size " + pt::ShapeString(w.chunks[c].sizes) +
                          " has no '" + kStateNames[s] + "' chunk of the same box (the optimizer state is sharded otherwise)");
            Located m = Locate(files, L, *item[s], same->second, "float32");
            slot[s] = {m.offset, numel, m.file == at.file ? -1 : m.file};
          }
          ShardFile& f = L.files[at.file];
          f.data = true;
          const int group = static_cast<int>(f.groups.size());
          f.groups.push_back(slot);
          ForEachRun(w.size, w.chunks[c], [&](int64_t src, int64_t dst, int64_t n) {
            L.fragments.push_back(Fragment{at.file, group, param, src, n, dst});
          });
        }
        if (auto step = st->second.find("step"); step != st->second.end()) {
          int file = -1;
          auto archive = files.Archive(step->second->storage.at(0), &file);
          auto& [first, value] = group_step[rec.group];
          if (!value) {
            first = fqn, value = archive.root;
            L.steps[{0, 0, rec.group}] = value;
          } else if (archive.root->kind != Value::Kind::Tensor || value->kind != Value::Kind::Tensor ||
                     archive.root->AsTensor().nbytes() != value->AsTensor().nbytes() ||
                     std::memcmp(value->AsTensor().data(), archive.root->AsTensor().data(), value->AsTensor().nbytes()) != 0) {
            L.problems.push_back("'" + fqn + "': its Adam step differs from '" + first + "''s, in the same param group (the "
                                 "atomic checkpoint keeps one step per group)");
          }
        }
        L.params.push_back(std::move(rec));
      });
    } catch (const std::exception& e) {
      L.errors.push_back(dir + ": " + e.what());
    }
  }
  for (auto& f : L.files)
    std::sort(f.checksummed.begin(), f.checksummed.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
  L.keep_alive = std::make_shared<std::vector<std::shared_ptr<MappedFile>>>(files.mapped_);
  L.dtype = "fp32";
  if (!group_step.empty() && group_step.begin()->second.second)
    if (const auto& s = group_step.begin()->second.second; s->kind == Value::Kind::Tensor && s->AsTensor().dtype == pt::DType::F32) {
      float v;
      std::memcpy(&v, s->AsTensor().data(), 4);
      L.iteration = static_cast<int64_t>(v);
    }

  // What the files show of the writer and the sharding, for ucp-inspect.
  std::string fields;
  for (const auto& f : M.fields) fields += (fields.empty() ? "" : ", ") + f;
  L.notes.push_back("PyTorch Distributed Checkpoint written by " + std::to_string(L.files.size()) + " rank" + (L.files.size() == 1 ? "" : "s") +
                    "; Metadata fields: " + fields + (M.version ? "; version " + *M.version : "; no version field (torch 2.6 and earlier)"));
  std::map<std::string, int> sharding;  // how the weights are cut, counted
  for (const std::string& fqn : model_order) {
    const Item& w = *model.at(fqn);
    std::string how = "whole";
    if (w.chunks.size() > 1) {
      std::vector<int> dims;
      for (size_t d = 0; d < w.size.size(); ++d)
        for (const auto& c : w.chunks)
          if (c.sizes[d] != w.size[d]) {
            dims.push_back(static_cast<int>(d));
            break;
          }
      how = "in " + std::to_string(w.chunks.size()) + " chunks along dim" + (dims.size() > 1 ? "s " : " ");
      for (size_t k = 0; k < dims.size(); ++k) how += (k ? ", " : "") + std::to_string(dims[k]);
    }
    ++sharding[how];
  }
  std::string cut;
  for (const auto& [how, n] : sharding) cut += (cut.empty() ? "" : "; ") + std::to_string(n) + " " + how;
  L.notes.push_back("model tensors: " + cut);
  if (!frozen.empty()) {
    std::string names;
    for (size_t k = 0; k < frozen.size() && k < 5; ++k) names += (k ? ", " : "") + frozen[k];
    L.notes.push_back(std::to_string(frozen.size()) + " model tensor" + (frozen.size() == 1 ? "" : "s") +
                      " without optimizer state (buffers or frozen parameters) left out of the atomic checkpoint: " + names +
                      (frozen.size() > 5 ? ", ..." : ""));
  }
  return L;
}

}  // namespace ucp::formats::dcp
