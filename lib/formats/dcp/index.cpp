#include "formats/dcp/index.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <regex>
#include <set>

#include "core/error.h"
#include "core/format.h"
#include "core/mapped_file.h"
#include "formats/dcp/bucket_layout.h"
#include "formats/dcp/megatron_core.h"
#include "formats/dcp/metadata.h"
#include "pt/low_precision.h"
#include "pt/torch_file.h"
#include "source/megatron_groups.h"

namespace ucp::formats::dcp {

namespace fs = std::filesystem;
using source::Extent;
using source::Fragment;
using source::ShardFile;
using source::SourceIndex;
using pt::Value;

namespace {

constexpr const char* kRemedy = "Megatron-LM's --dist-ckpt-optim-fully-reshardable saves a form ucp reads";
constexpr const char* kStateNames[] = {"", "exp_avg", "exp_avg_sq"};  // the atomic states after fp32

// What a key of the state dict is, from its original nesting (planner_data), or from its flattened
// name when the metadata has none: a model tensor (`fqn`), an optimizer state of parameter `fqn`
// (`state`: exp_avg, exp_avg_sq, step, ...), or a param group's option (`group`, `option`).
struct Role {
  enum { Model, OptimizerState, GroupOption, BucketFlat, Unread, Other } kind = Other;
  std::string fqn, state, option;
  int64_t group = -1;
};

Role RoleOf(const Item& item, bool megatron) {
  Role r;
  if (megatron) {  // Megatron-Core's sharded keys, flat (its planner_data holds save plans, not nestings)
    const MegatronKey k = MegatronKeyOf(item.fqn, item.tensor);
    if (k.kind == MegatronKey::Model) r.kind = Role::Model, r.fqn = k.fqn;
    else if (k.kind == MegatronKey::OptimizerState) r.kind = Role::OptimizerState, r.fqn = k.fqn, r.state = k.state;
    else if (k.kind == MegatronKey::BucketFlat) r.kind = Role::BucketFlat;
    else if (k.kind == MegatronKey::Unread) r.kind = Role::Unread;
    return r;
  }
  const auto& p = item.path;
  if (p.size() >= 3 && p[p.size() - 3].key == "state" && !p[p.size() - 2].key.empty() && !p.back().key.empty()) {
    r.kind = Role::OptimizerState, r.fqn = p[p.size() - 2].key, r.state = p.back().key;
    return r;
  }
  if (p.size() >= 3 && p[p.size() - 3].key == "param_groups" && p[p.size() - 2].index >= 0 && !p.back().key.empty()) {
    r.kind = Role::GroupOption, r.group = p[p.size() - 2].index, r.option = p.back().key;
    return r;
  }
  if (!p.empty()) {  // a model tensor: its path joined (get_state_dict's are one fqn, under "model")
    if (!item.tensor) return r;
    r.kind = Role::Model;
    for (size_t k = p.size() > 1 && p[0].key == "model" ? 1 : 0; k < p.size(); ++k)
      r.fqn += (r.fqn.empty() ? "" : ".") + (p[k].key.empty() ? std::to_string(p[k].index) : p[k].key);
    return r;
  }
  static const std::regex state(R"(^(?:.*\.)?state\.(.+)\.([A-Za-z_]+)$)"), group(R"(^(?:.*\.)?param_groups\.(\d{1,9})\.([A-Za-z_]+)$)");
  std::smatch m;
  if (std::regex_match(item.fqn, m, state)) r.kind = Role::OptimizerState, r.fqn = m[1], r.state = m[2];
  else if (std::regex_match(item.fqn, m, group)) r.kind = Role::GroupOption, r.group = std::stoll(m[1]), r.option = m[2];
  else if (item.tensor) r.kind = Role::Model, r.fqn = item.fqn.rfind("model.", 0) == 0 ? item.fqn.substr(6) : item.fqn;
  return r;
}

// The rank in a data file's name, `__<rank>_<n>.distcp` as torch's FileSystemWriter names each rank's
// files; -1 for another name.
int RankOfFile(const std::string& name) {
  static const std::regex rank(R"(^__(\d{1,9})_(\d+)\.distcp$)");
  std::smatch m;
  return std::regex_match(name, m, rank) ? std::stoi(m[1]) : -1;
}

// The checkpoint's files, opened once each.
class Files {
 public:
  Files(SourceIndex& L) : L_(L) {}
  // A file that cannot be opened is reported once (Report), however many chunks lie in it.
  int Index(const std::string& name) {
    auto it = index_.find(name);
    if (it != index_.end()) return it->second;
    std::shared_ptr<MappedFile> mapped;
    try {
      mapped = MappedFile::Open(L_.dir + "/" + name);
    } catch (const std::exception& e) {
      if (unopened_.insert(name).second) L_.errors.push_back(std::string(e.what()) + " (.metadata places chunks in it)");
      throw;
    }
    ShardFile f;
    f.name = name, f.kind = "distcp";
    if (const int rank = RankOfFile(name); rank >= 0) f.dp = rank;
    L_.files.push_back(f);
    mapped_.push_back(std::move(mapped));
    return index_[name] = static_cast<int>(L_.files.size()) - 1;
  }
  // A fault into L.errors, unless it is about a file already reported as unopened.
  void Report(const std::string& message) {
    for (const auto& name : unopened_)
      if (message.find(L_.dir + "/" + name) != std::string::npos) return;
    L_.errors.push_back(message);
  }
  // The torch.save archive at `s`, its pickle's CRC-32 checked; with `whole`, every record's (a small
  // item read here whole, a step or an option, rather than by a mapper).
  pt::TorchFile Archive(const Storage& s, int* file, bool whole = false) {
    *file = Index(s.relative_path);
    pt::ReadOptions options;
    options.verify_storage_crc = whole;
    try {
      return pt::ReadTorchArchive(std::make_shared<pt::ZipArchive>(mapped_[*file], s.offset, s.length), options);
    } catch (const std::exception& e) {  // .metadata says an archive lies there: a file of another rank or save does not hold it
      throw Error(std::string(e.what()) + " where .metadata places a saved item (is " + s.relative_path +
                  " another rank's file, swapped or renamed, or of another save?)");
    }
  }
  const uint8_t* Base(int file) const { return mapped_[file]->bytes().data(); }
  // Whether the record at `offset` of `file` is met for the first time (each is checksummed once).
  bool FirstTime(int file, uint64_t offset) { return seen_.insert({file, offset}).second; }
  std::vector<std::shared_ptr<MappedFile>> mapped_;

 private:
  SourceIndex& L_;
  std::map<std::string, int> index_;
  std::set<std::string> unopened_;
  std::set<std::pair<int, uint64_t>> seen_;
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
  if (files.FirstTime(out.file, entry->data_offset))
    L.files[out.file].checksummed.push_back({item.fqn + " chunk " + std::to_string(c) + " (" + entry->name + ")", entry->data_offset, entry->size, entry->crc32});
  return out;
}

std::string ChunkKey(const Chunk& c) { return pt::ShapeString(c.offsets) + pt::ShapeString(c.sizes); }

using Options = std::map<int64_t, std::vector<std::pair<std::string, const Item*>>>;  // group -> options, in the order saved

// The param groups in torch's state_dict form (options, `params` as the parameter names) into
// L.optimizer_state; returns each named parameter's group.
std::map<std::string, int> ReadParamGroups(Files& files, const Options& options, SourceIndex& L) {
  std::map<std::string, int> group_of;
  auto osd = Value::Make(Value::Kind::Dict);
  auto groups = Value::Make(Value::Kind::List);
  for (const auto& [g, opts] : options) {
    auto group = Value::Make(Value::Kind::Dict);
    for (const auto& [option, item] : opts) {
      try {
        int file = -1;
        auto archive = files.Archive(item->storage[0], &file, true);
        pt::SetItem(*group, option, archive.root);
        if (option == "params" && archive.root && archive.root->IsSequence())
          for (const auto& name : archive.root->items)
            if (name && name->kind == Value::Kind::Str) group_of[name->s] = static_cast<int>(g);
      } catch (const std::exception& e) {
        files.Report(L.dir + ": '" + item->fqn + "': " + e.what());
      }
    }
    groups->items.push_back(group);
  }
  pt::SetItem(*osd, "param_groups", groups);
  L.optimizer_state = osd;
  return group_of;
}

// The parameters: each weight with its Adam moments, chunk by chunk, and its group's step.
class Parameters {
 public:
  Parameters(Files& files, SourceIndex& L, const std::map<std::string, int>& group_of, bool megatron)
      : files_(files), L_(L), group_of_(group_of), megatron_(megatron) {}

  // Model tensor `model` of parameter `fqn` with its optimizer states by name; a fault goes to
  // L.errors. The weight is the optimizer's fp32 master copy where it keeps one (`fp32_param`,
  // Megatron-Core's mixed precision and distributed optimizers), else the model tensor.
  void Add(const Item& model, const std::string& fqn, const std::map<std::string, const Item*>& states) {
    try {
      WithContext("'" + model.fqn + "'", [&] {
        auto master = states.find("fp32_param");  // Megatron's mixed-precision optimizer's; the distributed one's "param"
        if (master == states.end()) master = states.find("param");
        const Item& w = master == states.end() ? model : *master->second;
        if (w.size != model.size)
          throw Error("'" + w.fqn + "' is " + pt::ShapeString(w.size) + ", the model tensor " + pt::ShapeString(model.size));
        std::array<const Item*, 3> item{&w, Moment(states, 1), Moment(states, 2)};
        for (const auto& [name, state] : states)  // what the atomic checkpoint would not keep: never dropped unsaid
          if (name != "exp_avg" && name != "exp_avg_sq" && name != "step" && name != "fp32_param" && name != "param")
            throw Error("optimizer state '" + name + "' (" + state->fqn + ") besides Adam's: the atomic checkpoint keeps "
                        "exp_avg, exp_avg_sq and step only (AMSGrad's max_exp_avg_sq, SGD's momentum_buffer and other "
                        "optimizers are not supported yet)");
        for (const Item* i : item) {
          if (i->dtype != "float32")
            throw Error("'" + i->fqn + "' is " + i->dtype + ": ucp reads float32 weights and Adam moments (a DCP of " +
                        i->dtype + " parameters is not supported yet)");
          if (i->size != w.size)
            throw Error("'" + i->fqn + "' is " + pt::ShapeString(i->size) + ", the weight " + pt::ShapeString(w.size) +
                        (megatron_ ? " (Megatron-Core's distributed optimizer in its fully_sharded_model_space form saves "
                                     "flattened ranges, which ucp does not read yet)" : ""));
        }
        source::ParamRecord rec;
        rec.name = fqn;
        auto g = group_of_.find(fqn);
        rec.group = g == group_of_.end() ? 0 : g->second;
        rec.tp_shape[0] = w.size;
        rec.stages.insert(0);
        Place(item, static_cast<int>(L_.params.size()), &w == &model ? nullptr : &model);
        if (auto step = states.find("step"); step != states.end()) Step(*step->second, fqn, rec.group);
        L_.params.push_back(std::move(rec));
      });
    } catch (const std::exception& e) {
      files_.Report(L_.dir + ": " + e.what());
    }
  }

  // Model tensor `model`'s state from the distributed optimizer's buckets (the dp_reshardable form):
  // each piece a domain holds, chunk by chunk of its bucket, placed as its boxes' runs.
  // `states(piece)` gives the bucket's items by state name.
  template <typename States>
  void AddBuckets(const Item& model, const std::vector<const BucketPiece*>& pieces, States&& states) {
    try {
      WithContext("'" + model.fqn + "'", [&] {
        source::ParamRecord rec;
        rec.name = model.fqn;
        auto g = group_of_.find(model.fqn);
        rec.group = g == group_of_.end() ? 0 : g->second;
        rec.tp_shape[0] = model.size;
        rec.stages.insert(0);
        const int param = static_cast<int>(L_.params.size());
        std::map<std::string, size_t> copies;  // the model tensor's chunks: the weights the masters must give
        for (size_t c = 0; c < model.chunks.size(); ++c) copies[ChunkKey(model.chunks[c])] = c;
        for (const BucketPiece* piece : pieces) {
          if (!piece->source) continue;
          const std::map<std::string, const Item*>& st = states(*piece);
          for (const auto& [name, state] : st)
            if (name != "param" && name != "exp_avg" && name != "exp_avg_sq")
              throw Error("optimizer state '" + name + "' (" + state->fqn + ") besides Adam's: the atomic checkpoint keeps exp_avg, "
                          "exp_avg_sq and step only");
          std::array<const Item*, 3> item{};
          for (int s = 0; s < 3; ++s) {
            auto it = st.find(s == 0 ? "param" : kStateNames[s]);
            if (it == st.end())
              throw Error("its bucket (" + DomainName({piece->chain, piece->domain}) + " gbuf_idx_" + std::to_string(piece->gbuf) +
                          " bucket_idx_" + std::to_string(piece->bucket) + ") has no '" + (s == 0 ? "param" : kStateNames[s]) +
                          "' tensor (ucp reads the fp32 master, exp_avg and exp_avg_sq of Adam)");
            item[s] = it->second;
            if (item[s]->dtype != "float32") throw Error("'" + item[s]->fqn + "' is " + item[s]->dtype + ", not float32");
          }
          std::array<std::map<std::string, size_t>, 3> box;
          for (int s = 1; s < 3; ++s)
            for (size_t c = 0; c < item[s]->chunks.size(); ++c) box[s][ChunkKey(item[s]->chunks[c])] = c;
          for (const ChunkRun& run : PieceChunks(*piece, *item[0])) {
            std::array<Extent, 3> slot;
            const Located at = Locate(files_, L_, *item[0], run.chunk, "float32");
            slot[0] = {at.offset, run.numel, -1};
            for (int s = 1; s < 3; ++s) {
              auto same = box[s].find(ChunkKey(item[0]->chunks[run.chunk]));
              if (same == box[s].end())
                throw Error("'" + item[0]->fqn + "' chunk " + std::to_string(run.chunk) + " has no '" + kStateNames[s] + "' chunk of the same extent");
              const Located m = Locate(files_, L_, *item[s], same->second, "float32");
              slot[s] = {m.offset, run.numel, m.file == at.file ? -1 : m.file};
            }
            ShardFile& f = L_.files[at.file];
            f.data = true;
            const int group = static_cast<int>(f.groups.size());
            f.groups.push_back(slot);
            const int64_t lo = run.box_flat, hi = run.box_flat + run.numel;
            int64_t base = 0;  // the box's first element in the piece's order
            for (const Chunk& box : piece->boxes) {
              const int64_t a = std::max(base, lo), b = std::min(base + pt::Numel(box.sizes), hi);
              if (a < b) {
                ForEachRun(model.size, box, [&](int64_t src, int64_t dst, int64_t n) {
                  const int64_t x = std::max(base + src, lo), y = std::min(base + src + n, hi);
                  if (x < y) L_.fragments.push_back(Fragment{at.file, group, param, x - lo, y - x, dst + (x - base - src)});
                });
                if (auto copy = copies.find(ChunkKey(box)); copy != copies.end()) Copy(model, copy->second, a - base, b - a, param, at.file, group, a - lo);
              }
              base += pt::Numel(box.sizes);
            }
          }
        }
        L_.params.push_back(std::move(rec));
      });
    } catch (const std::exception& e) {
      files_.Report(L_.dir + ": " + e.what());
    }
  }

  // The first group's step as the iteration (Adam counts the optimizer steps taken), or 0.
  int64_t Iteration() const {
    if (steps_.empty() || !steps_.begin()->second.second) return 0;
    return static_cast<int64_t>(pt::StepValue(*steps_.begin()->second.second));
  }

 private:
  // Elements [from, from + numel) of model tensor chunk `chunk`, a copy of elements [slot_start, ...)
  // of slot `group` of data file `file`, recorded for the weight-copy check (the model's dtype: the
  // master rounded to it must give it). A dtype no master rounds to is not compared.
  void Copy(const Item& model, size_t chunk, int64_t from, int64_t numel, int param, int file, int group, int64_t slot_start) {
    source::WeightCopy wc;
    if (model.dtype == "bfloat16") wc.dtype = pt::DType::BF16;
    else if (model.dtype == "float16") wc.dtype = pt::DType::F16;
    else if (model.dtype != "float32") return;
    const Located at = Locate(files_, L_, model, chunk, model.dtype.c_str());
    wc.param = param, wc.file = at.file, wc.offset = at.offset + pt::ElementSize(wc.dtype) * static_cast<uint64_t>(from), wc.numel = numel;
    wc.slot_file = file, wc.slot_group = group, wc.slot_start = slot_start;
    L_.weight_copies.push_back(wc);
  }

  static const Item* Moment(const std::map<std::string, const Item*>& states, int s) {
    auto it = states.find(kStateNames[s]);
    if (it != states.end()) return it->second;
    const std::string kept = JoinNames(states, ", ", [](const auto& state) { return state.first; });
    throw Error("no optimizer state '" + std::string(kStateNames[s]) + "' (ucp reads Adam's exp_avg and exp_avg_sq; this "
                "optimizer keeps " + kept + ")");
  }

  // Each chunk of the weight a slot (its bytes and its moments' chunks of the same box, wherever
  // each was written), its rows runs of the global tensor. Where the weight is an fp32 master, the
  // model tensor's chunk of the same box is its copy (map/weight_copies.h compares them).
  void Place(const std::array<const Item*, 3>& item, int param, const Item* model) {
    const Item& w = *item[0];
    std::array<std::map<std::string, size_t>, 3> box;
    for (int s = 1; s < 3; ++s)
      for (size_t c = 0; c < item[s]->chunks.size(); ++c) box[s][ChunkKey(item[s]->chunks[c])] = c;
    std::map<std::string, size_t> copies;
    for (size_t c = 0; model && c < model->chunks.size(); ++c) copies[ChunkKey(model->chunks[c])] = c;
    for (size_t c = 0; c < w.chunks.size(); ++c) {
      std::array<Extent, 3> slot;
      const int64_t numel = pt::Numel(w.chunks[c].sizes);
      const Located at = Locate(files_, L_, w, c, "float32");
      slot[0] = {at.offset, numel, -1};
      for (int s = 1; s < 3; ++s) {
        auto same = box[s].find(ChunkKey(w.chunks[c]));
        if (same == box[s].end())
          throw Error("its chunk at " + pt::ShapeString(w.chunks[c].offsets) + " of size " + pt::ShapeString(w.chunks[c].sizes) +
                      " has no '" + kStateNames[s] + "' chunk of the same box (the optimizer state is sharded otherwise)");
        const Located m = Locate(files_, L_, *item[s], same->second, "float32");
        slot[s] = {m.offset, numel, m.file == at.file ? -1 : m.file};
      }
      ShardFile& f = L_.files[at.file];
      f.data = true;
      const int group = static_cast<int>(f.groups.size());
      f.groups.push_back(slot);
      ForEachRun(w.size, w.chunks[c], [&](int64_t src, int64_t dst, int64_t n) {
        L_.fragments.push_back(Fragment{at.file, group, param, src, n, dst});
      });
      if (auto copy = copies.find(ChunkKey(w.chunks[c])); copy != copies.end()) Copy(*model, copy->second, 0, numel, param, at.file, group, 0);
    }
  }

  // The group's step (the atomic checkpoint keeps one per group): the first parameter's; another
  // that differs is a problem.
  // A step is a 0-d tensor (torch 2.x's Adam), or a number saved as a bytes item (earlier releases).
  void Step(const Item& item, const std::string& fqn, int group) {
    int file = -1;
    auto archive = files_.Archive(item.storage.at(0), &file, true);
    const auto& v = archive.root;
    if (!v || (v->kind != Value::Kind::Tensor && v->kind != Value::Kind::Int && v->kind != Value::Kind::Float))
      throw Error("its step is a " + (v ? v->TypeName() : std::string("null")) + ", not a tensor or a number");
    if (v->kind == Value::Kind::Tensor && v->AsTensor().numel() != 1)
      throw Error("its step is a tensor of " + std::to_string(v->AsTensor().numel()) + " elements, not one");
    const double step = pt::StepValue(*v);  // a dtype no step has is refused here
    auto& [first, value] = steps_[group];
    if (!value) {
      first = fqn, value = v;
      L_.steps[{0, 0, group}] = value;
      return;
    }
    if (pt::StepValue(*value) != step)
      L_.problems.push_back(L_.dir + ": '" + fqn + "': its Adam step differs from '" + first + "''s, in the same param "
                            "group (the atomic checkpoint keeps one step per group)");
  }

  Files& files_;
  SourceIndex& L_;
  const std::map<std::string, int>& group_of_;
  const bool megatron_;
  std::map<int, std::pair<std::string, pt::ValuePtr>> steps_;  // group -> (its first parameter, its step)
};

// What the files show of the writer and of the sharding, as notes for ucp-inspect.
void Describe(const Metadata& M, const std::map<std::string, const Item*>& model, const std::vector<std::string>& order,
              const std::vector<std::string>& frozen, SourceIndex& L) {
  const std::string fields = JoinNames(M.fields);
  L.notes.push_back("PyTorch Distributed Checkpoint in " + std::to_string(L.files.size()) + " data file" +
                    (L.files.size() == 1 ? "" : "s") + "; Metadata fields: " + fields +
                    (M.version ? "; version " + *M.version : "; no version field (torch 2.6 and earlier)"));
  std::map<std::string, int> sharding;  // how the weights are cut, counted
  for (const std::string& fqn : order) {
    const Item& w = *model.at(fqn);
    std::string how = "whole";
    if (w.chunks.size() > 1) {
      std::vector<int> dims;
      for (size_t d = 0; d < w.size.size(); ++d)
        if (std::any_of(w.chunks.begin(), w.chunks.end(), [&](const Chunk& c) { return c.sizes[d] != w.size[d]; }))
          dims.push_back(static_cast<int>(d));
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
}

// The training job's precision: its model tensors' where the optimizer keeps fp32 masters of them
// (Megatron's bf16 and fp16 training), else fp32 (the atomic checkpoint's weights are the masters).
std::string JobDtype(const std::map<std::string, const Item*>& model, const std::map<std::string, std::map<std::string, const Item*>>& states) {
  std::set<std::string> dtypes;
  for (const auto& [fqn, s] : states)
    if ((s.count("param") || s.count("fp32_param")) && model.count(fqn)) dtypes.insert(model.at(fqn)->dtype);
  if (dtypes.size() != 1) return "fp32";
  const std::string& d = *dtypes.begin();
  return d == "bfloat16" ? "bf16" : d == "float16" ? "fp16" : "fp32";
}

// Megatron-Core's common state: the param groups as saved (Megatron saves no `params` in them and
// rebuilds the groups from its configuration on load: megatron_groups.h), the step every parameter
// shares, as each group's.
void MegatronCommon(const MegatronCore& mc, SourceIndex& L) {
  if (mc.args) {
    L.args = mc.args;
    source::TakeMegatronArgs(mc.args.get(), L);
  }
  auto osd = Value::Make(Value::Kind::Dict);
  pt::SetItem(*osd, "param_groups", mc.param_groups ? mc.param_groups : Value::Make(Value::Kind::List));
  if (!mc.chained.empty()) pt::SetItem(*osd, source::kMegatronChained, pt::IntList(mc.chained));  // --format mcore writes the chain again
  L.optimizer_state = osd;
  const size_t groups = mc.param_groups ? mc.param_groups->items.size() : 0;
  for (const auto& step : mc.steps)  // the atomic checkpoint keeps one step per group, and Megatron saves no parameter's group
    if (pt::StepValue(*step) != pt::StepValue(*mc.steps[0]))
      throw Error(L.dir + "/common.pt: its param groups hold different steps (" + std::to_string(pt::StepValue(*mc.steps[0])) + ", " +
                  std::to_string(pt::StepValue(*step)) + "), and Megatron saves no parameter's group: which step is whose is unknown");
  if (!mc.steps.empty())
    for (size_t g = 0; g < std::max<size_t>(groups, 1); ++g) L.steps[{0, 0, static_cast<int>(g)}] = mc.steps[0];
  std::string keys = JoinNames(mc.common_keys);
  if (keys.empty()) keys = "nothing";
  if (!mc.has_iteration) L.notes.push_back("common.pt holds no iteration: the atomic checkpoint records iteration 0");
  if (mc.steps.empty() && mc.param_groups)
    L.notes.push_back("common.pt holds no optimizer step (optimizer.state.common_step, or a step in the param groups): "
                      "the atomic checkpoint records none, and Adam's bias correction restarts where it is loaded");
  const std::string layout = source::MegatronLayout(mc.args.get(), L.files_world);
  L.notes.push_back("Megatron-Core dist_checkpointing (" + mc.backend + ")" + (layout.empty() ? "" : ", saved by a job of " + layout) +
                    "; optimizer: " + mc.optimizer_form + "; common.pt holds " + keys);
  L.notes.push_back(std::string(mc.bucket_flat ? "Megatron-LM itself loads this dp_reshardable form only at the TP, PP (and EP) it was "
                                                 "saved with (DP may change)"
                                               : "Megatron-LM itself loads this form at any TP, PP and DP") +
                    "; ucp-convert reads every parameter's whole state from it, which ucp-reshard writes as Megatron-LM's "
                    "torch_dist at any TP, PP and DP (--format mcore), writes as Megatron-DeepSpeed's layouts (its Adam state "
                    "too) or exports (--format hf)");
}

// The dp_reshardable form's saved objects, per model-parallel domain of each optimizer (one, or a
// chain's): its buffers' bucket sizes, and its torch optimizer's param groups holding the step (into
// `mc`: the chain's groups in its order, each optimizer's the same in all its domains, one step in all).
std::map<BucketDomain, std::vector<GradBuffer>> ReadBucketObjects(Files& files, const Metadata& M, MegatronCore& mc, SourceIndex& L) {
  static const std::regex object(R"(^(\w+)/shard_[0-9_.]+$)");
  std::map<BucketDomain, std::map<std::string, pt::ValuePtr>> saved;
  for (const Item& item : M.items) {
    std::string rest;
    std::smatch m;
    const auto d = item.tensor ? std::nullopt : ParseDomainPrefix(item.fqn, &rest);
    if (!d || !std::regex_match(rest, m, object)) continue;
    int file = -1;
    saved[*d][m[1]] = WithContext(L.dir + ": '" + item.fqn + "'", [&] { return files.Archive(item.storage.at(0), &file, true).root; });
  }
  std::set<int> chains, want;  // the chain common.pt declares, and the one the objects are of
  for (const auto& entry : saved) chains.insert(entry.first.chain);
  for (int c = 0; c < mc.chain_parts; ++c) want.insert(c);
  if (mc.chain_parts == 0) want.insert(-1);
  if (!saved.empty() && chains != want)
    throw Error(L.dir + ": common.pt holds " + (mc.chain_parts ? "a chain of " + std::to_string(mc.chain_parts) + " optimizers" : std::string("one optimizer")) +
                ", and the DCP's bucket objects are of " +
                JoinNames(chains, ", ", [](int c) { return c < 0 ? std::string("one optimizer (no prefix)") : "chained_" + std::to_string(c) + "."; }) +
                ": not one save's");
  std::map<BucketDomain, std::vector<GradBuffer>> buffers;
  std::map<int, std::pair<BucketDomain, pt::ValuePtr>> groups_of;  // each optimizer's param groups, from its first domain
  std::map<int, size_t> steps_of;                                    // and how many steps they hold
  std::optional<std::pair<BucketDomain, pt::ValuePtr>> first_step;   // the first step seen: every one must be it
  for (const auto& entry : saved) {  // (not a structured binding: a lambda below uses it, which clang 14 refuses)
    const BucketDomain domain = entry.first;
    const std::map<std::string, pt::ValuePtr>& objects = entry.second;
    const std::string where = L.dir + ": " + DomainName(domain);
    WithContext(where, [&] {
      for (const char* name : {"per_bucket_numel", "per_bucket_numel_unpadded", "optimizer"})
        if (!objects.count(name) || !objects.at(name)) throw Error(std::string("no '") + name + "' object saved");
      buffers[domain] = ReadGradBuffers(*objects.at("per_bucket_numel_unpadded"), *objects.at("per_bucket_numel"));
      const Value* state = objects.at("optimizer").get();
      if (state->kind == Value::Kind::List && state->items.size() == 1 && state->items[0]) state = state->items[0].get();
      auto groups = state->Get("param_groups");
      if (!groups || !groups->IsSequence() || groups->items.empty()) throw Error("'optimizer' holds no param_groups list");
      std::vector<pt::ValuePtr> steps;
      for (const auto& g : groups->items)
        if (auto step = g ? g->Get("step") : nullptr) steps.push_back(step);
      auto first = groups_of.find(domain.chain);
      if (first == groups_of.end()) {
        groups_of[domain.chain] = {domain, groups}, steps_of[domain.chain] = steps.size();
        mc.steps.insert(mc.steps.end(), steps.begin(), steps.end());
      } else if (groups->items.size() != first->second.second->items.size() || steps.size() != steps_of[domain.chain]) {
        throw Error("its " + std::to_string(groups->items.size()) + " param groups (" + std::to_string(steps.size()) + " with a step) differ from " +
                    DomainName(first->second.first) + "'s " + std::to_string(first->second.second->items.size()) + " (" +
                    std::to_string(steps_of[domain.chain]) + "): the domains are of different saves");
      }
      for (const auto& step : steps) {
        if (!first_step) first_step = std::make_pair(domain, step);
        if (pt::StepValue(*step) != pt::StepValue(*first_step->second))
          throw Error("its step " + std::to_string(pt::StepValue(*step)) + " differs from " + DomainName(first_step->first) + "'s " +
                      std::to_string(pt::StepValue(*first_step->second)) + ": the domains are of different saves");
      }
    });
  }
  auto list = Value::Make(Value::Kind::List);  // the chain's groups in its order (dense, then expert), as a chain's common.pt gives them
  for (const auto& [chain, first] : groups_of) {
    list->items.insert(list->items.end(), first.second->items.begin(), first.second->items.end());
    if (chain >= 0) mc.chained.push_back(static_cast<int64_t>(first.second->items.size()));
  }
  if (!groups_of.empty()) mc.param_groups = list;
  return buffers;
}

// 1 + the highest rank of the data files .metadata places chunks in: the ranks that wrote data, a
// lower bound of the saving job's world.
int FilesWorld(const Metadata& M) {
  int world = 0;
  for (const Item& item : M.items)
    for (const Storage& st : item.storage) world = std::max(world, RankOfFile(st.relative_path) + 1);
  return world;
}

// A weights-only DCP (Megatron-LM's --no-save-optim; a model's state dict saved alone): the model
// tensors, each read whole by ReadWeightsOnlyParam, as a model source's are.
struct WeightsOnly {
  std::vector<Item> items;  // the atomic parameters, in order
  std::map<std::string, std::shared_ptr<MappedFile>> mapped;  // by relative path
};

void IndexWeightsOnly(SourceIndex& L, Files& files, const std::map<std::string, const Item*>& model, const std::vector<std::string>& order,
                      const MegatronCore* mc) {
  auto state = std::make_shared<WeightsOnly>();
  std::set<std::string> dtypes;
  for (const std::string& fqn : order) {
    const Item& item = *model.at(fqn);
    if (item.dtype != "float32" && item.dtype != "bfloat16" && item.dtype != "float16") {
      L.errors.push_back(L.dir + ": '" + item.fqn + "' is " + item.dtype + ": ucp reads float32, bfloat16 and float16 weights");
      continue;
    }
    for (const Storage& st : item.storage) try {
        state->mapped[st.relative_path] = files.mapped_.at(static_cast<size_t>(files.Index(st.relative_path)));
      } catch (const std::exception&) {  // reported once by Files
      }
    source::ParamRecord rec;
    rec.name = fqn, rec.group = 0, rec.tp_shape[0] = item.size, rec.stages.insert(0);
    L.params.push_back(std::move(rec));
    state->items.push_back(item);
    dtypes.insert(item.dtype);
  }
  L.optimizer = "none";
  L.dtype = dtypes.size() == 1 && *dtypes.begin() == "bfloat16" ? "bf16" : dtypes.size() == 1 && *dtypes.begin() == "float16" ? "fp16" : "fp32";
  L.model_states = Value::Make(Value::Kind::Dict);
  if (mc) {
    if (mc->args) L.args = mc->args, source::TakeMegatronArgs(mc->args.get(), L), pt::SetItem(*L.model_states, "args", mc->args);
    L.iteration = mc->iteration;
    pt::SetItem(*L.model_states, "iteration", Value::Int(mc->iteration));
    const std::string layout = source::MegatronLayout(mc->args.get(), L.files_world);
    L.notes.push_back("Megatron-Core dist_checkpointing (" + mc->backend + ")" + (layout.empty() ? "" : ", saved by a job of " + layout) +
                      "; model weights only (saved without optimizer state, --no-save-optim)");
  }
  L.notes.push_back("model weights only: ucp-convert makes a weights-only atomic checkpoint of them (each widened to fp32 exactly), as "
                    "of a Hugging Face model; ucp-reshard --format hf exports them in the job's precision");
  L.keep_alive = state;
}

}  // namespace

bool IsWeightsOnly(const std::string& dir) {
  try {
    const Metadata M = ReadMetadata(dir + "/.metadata");
    const bool mcore = IsMegatronCore(dir);
    bool weights = false;
    for (const Item& item : M.items) {
      const Role r = RoleOf(item, mcore);
      if (r.kind == Role::OptimizerState || r.kind == Role::BucketFlat || r.kind == Role::Unread || r.kind == Role::GroupOption) return false;
      weights = weights || r.kind == Role::Model;
    }
    return weights;
  } catch (const std::exception&) {
    return false;  // the index says what is wrong
  }
}

void ReadWeightsOnlyParam(const SourceIndex& L, int param, float* dst) {
  const auto& state = *static_cast<const WeightsOnly*>(L.keep_alive.get());
  const Item& item = state.items.at(static_cast<size_t>(param));
  for (size_t c = 0; c < item.chunks.size(); ++c) {
    const Storage& st = item.storage.at(c);
    const std::string where = L.dir + "/" + st.relative_path + ": '" + item.fqn + "' chunk " + std::to_string(c);
    auto it = state.mapped.find(st.relative_path);
    if (it == state.mapped.end()) throw Error(where + ": the file is not open");
    pt::ReadOptions options;
    options.verify_storage_crc = true;  // every byte read checked against its record's CRC-32
    const pt::TorchFile archive = WithContext(where, [&] {
      return pt::ReadTorchArchive(std::make_shared<pt::ZipArchive>(it->second, st.offset, st.length), options);
    });
    if (!archive.root || archive.root->kind != Value::Kind::Tensor) throw Error(where + ": not a tensor");
    const pt::TensorView& t = archive.root->AsTensor();
    if (t.shape != item.chunks[c].sizes || !t.contiguous() || pt::DTypeName(t.dtype) != item.dtype)
      throw Error(where + ": a " + std::string(pt::DTypeName(t.dtype)) + " " + pt::ShapeString(t.shape) + " tensor where the metadata says " +
                  item.dtype + " " + pt::ShapeString(item.chunks[c].sizes));
    std::vector<float> local(t.numel());
    pt::ToFp32(t.data(), t.dtype, local.size(), local.data());
    ForEachRun(item.size, item.chunks[c], [&](int64_t src, int64_t d, int64_t n) {
      std::memcpy(dst + d, local.data() + src, 4 * static_cast<size_t>(n));
    });
  }
}

bool LooksLikeCheckpoint(const std::string& dir) {  // its data files are enough: a missing .metadata is then said
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".distcp") return true;
  return false;
}

SourceIndex IndexCheckpoint(const std::string& dir, const source::IndexOptions& options) {
  SourceIndex L;
  L.format = "dcp";
  L.root = L.dir = dir;
  L.framework = "torch-dcp";
  L.optimizer = "torch";
  L.naming = "plain";
  L.on_grid = false;
  // Megatron-Core's torch_dist: DCP with Megatron's sharded keys, its common state in common.pt.
  std::optional<MegatronCore> mcore;
  if (IsMegatronCore(dir)) {
    mcore = ReadMegatronCore(dir);
    // Megatron-LM's iter_NNNNNNN folder holds that iteration's save: common.pt of another is a file of another save
    static const std::regex iter_folder(R"(^iter_(\d{7,9})$)");
    std::smatch m;
    fs::path folder = fs::path(dir).lexically_normal();
    if (folder.filename().empty()) folder = folder.parent_path();  // "iter_0000003/"
    const std::string base = folder.filename().string();
    if (std::regex_match(base, m, iter_folder) && mcore->has_iteration && std::stoll(m[1]) != mcore->iteration)
      throw Error(dir + "/common.pt: iteration " + std::to_string(mcore->iteration) + " in a folder named " + base +
                  ": a file of another save (Megatron-LM writes each iteration's common.pt into its own iter_NNNNNNN folder)");
  }
  else if (std::error_code ec; fs::exists(fs::path(dir) / "common.pt", ec))
    throw Error(dir + ": common.pt beside .metadata but no metadata.json: a Megatron-Core torch_dist checkpoint without "
                "the file naming its backends (metadata.json, written by dist_checkpointing.save) is not read");
  const Metadata M = ReadMetadata(dir + "/.metadata");
  Files files(L);
  L.files_world = FilesWorld(M);

  // The keys by role: model tensors, each parameter's optimizer states, the param groups' options.
  std::map<std::string, const Item*> model;
  std::vector<std::string> model_order;
  std::map<std::string, std::map<std::string, const Item*>> states;
  Options group_options;
  std::vector<std::string> bucket_flat;
  for (const Item& item : M.items) {
    Role r = RoleOf(item, mcore.has_value());
    if (r.kind == Role::BucketFlat) {
      bucket_flat.push_back(item.fqn);
    } else if (r.kind == Role::Unread) {
      L.errors.push_back(dir + ": '" + item.fqn + "': an optimizer tensor ucp does not know how to read (Megatron-Core's "
                         "per-parameter state is optimizer.state.<state>.<key>): refused rather than left out");
    } else if (r.kind == Role::Model) {
      if (!model.emplace(r.fqn, &item).second) L.errors.push_back(dir + ": '" + item.fqn + "': a second model tensor named '" + r.fqn + "'");
      else model_order.push_back(r.fqn);
    } else if (r.kind == Role::OptimizerState) {
      states[r.fqn][r.state] = &item;
    } else if (r.kind == Role::GroupOption) {
      group_options[r.group].emplace_back(r.option, &item);
    }
  }
  const bool buckets = mcore && mcore->bucket_flat;
  if (states.empty() && !buckets && bucket_flat.empty() && group_options.empty() && !model.empty()) {  // model weights only
    IndexWeightsOnly(L, files, model, model_order, mcore ? &*mcore : nullptr);
    std::vector<std::string> none;
    Describe(M, model, model_order, none, L);
    if (mcore) L.files.push_back(mcore->file);
    return L;
  }
  if (states.empty() && !buckets && bucket_flat.empty())
    L.errors.push_back(dir + (model.empty() ? ": no optimizer state and no model tensor: nothing ucp-convert could make an atomic checkpoint of"
                                            : ": model tensors beside param-group options but no optimizer state: not a save ucp knows"));
  for (const auto& [fqn, s] : states)
    if (!model.count(fqn)) L.errors.push_back(dir + ": optimizer state for '" + fqn + "', which is not among the model's tensors");

  if (!bucket_flat.empty() && !buckets)
    L.errors.push_back(dir + ": '" + bucket_flat[0] + "' and " + std::to_string(bucket_flat.size() - 1) + " more: Megatron-Core's "
                       "distributed optimizer state in its dp_reshardable form (bucket-flat, laid out by Megatron's gradient "
                       "buckets), where common.pt does not declare that form (its optimizer's param_state_sharding_type): not one "
                       "save's, or a form ucp does not know");
  std::map<BucketDomain, std::vector<GradBuffer>> buffers;
  if (buckets) buffers = ReadBucketObjects(files, M, *mcore, L);
  std::map<std::string, int> group_of;
  if (mcore) {
    std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
    for (const std::string& fqn : model_order) shapes.emplace_back(fqn, model.at(fqn)->size);
    source::MegatronGroups groups = source::MegatronGroupsOf(mcore->param_groups.get(), mcore->args.get(), shapes);
    group_of = std::move(groups.group_of);
    if (!groups.note.empty()) L.notes.push_back(groups.note);
  } else {
    group_of = ReadParamGroups(files, group_options, L);
  }
  if (mcore) MegatronCommon(*mcore, L);
  Parameters parameters(files, L, group_of, mcore.has_value());
  std::vector<std::string> frozen;
  if (buckets) {  // the dp_reshardable form: every model tensor's state in the buckets, by the layout proven here
    if (!states.empty())
      throw Error(dir + ": per-parameter optimizer state ('optimizer.state.*') beside the dp_reshardable buckets: two forms in one save");
    std::map<std::tuple<int, int, int, int>, std::map<std::string, const Item*>> bucket_items;
    for (const Item& item : M.items)
      if (auto k = item.tensor ? ParseBucketKey(item.fqn) : std::nullopt) bucket_items[{k->chain, k->domain, k->gbuf, k->bucket}][k->state] = &item;
      else if (item.tensor && MegatronKeyOf(item.fqn, true).kind == MegatronKey::BucketFlat)
        throw Error(dir + ": '" + item.fqn + "': a bucket-flat tensor not named as Megatron-Core 0.17's dp_reshardable form names them");
    std::vector<const Item*> in_order;
    for (const std::string& fqn : model_order) in_order.push_back(model.at(fqn));
    const std::vector<BucketPiece> pieces = WithContext(dir, [&] { return LayOutBuckets(in_order, GridFromArgs(mcore->args.get(), "the dp_reshardable buckets", kRemedy, true), buffers); });
    std::map<std::string, std::vector<const BucketPiece*>> of;
    for (const BucketPiece& p : pieces) of[p.fqn].push_back(&p);
    static const std::map<std::string, const Item*> none;
    for (const std::string& fqn : model_order)
      parameters.AddBuckets(*model.at(fqn), of[fqn], [&](const BucketPiece& p) -> const std::map<std::string, const Item*>& {
        auto it = bucket_items.find({p.chain, p.domain, p.gbuf, p.bucket});
        return it == bucket_items.end() ? none : it->second;
      });
  }
  for (const std::string& fqn : buckets ? std::vector<std::string>{} : model_order) {
    auto st = states.find(fqn);
    if (st == states.end()) frozen.push_back(fqn);
    else parameters.Add(*model.at(fqn), fqn, st->second);
  }
  if (!L.weight_copies.empty())
    L.notes.push_back("the optimizer's fp32 master weights are compared with the model's own tensors saved beside them before "
                      "anything is written (ucp-inspect: with --verify): the two must agree, the master rounded to the model's dtype");
  // ucp-inspect --verify: every archive of every item read whole and checked, those no parameter uses too.
  if (options.verify_storage_crc)
    for (const Item& item : M.items)
      for (size_t c = 0; c < item.storage.size(); ++c) try {
          int file = -1;
          (void)files.Archive(item.storage[c], &file, true);
        } catch (const std::exception& e) {
          files.Report(dir + ": '" + item.fqn + "' chunk " + std::to_string(c) + ": " + e.what());
        }
  for (auto& f : L.files)
    std::sort(f.checksummed.begin(), f.checksummed.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
  L.keep_alive = std::make_shared<std::vector<std::shared_ptr<MappedFile>>>(files.mapped_);
  L.dtype = JobDtype(model, states);
  L.state_in_buckets = buckets;
  if (buckets && !model.empty()) {  // every model tensor has an fp32 master in the buckets: the job's dtype is theirs
    const std::string& d = model.begin()->second->dtype;
    L.dtype = d == "bfloat16" ? "bf16" : d == "float16" ? "fp16" : "fp32";
  }
  L.iteration = mcore ? mcore->iteration : parameters.Iteration();
  Describe(M, model, model_order, frozen, L);
  if (mcore) L.files.push_back(mcore->file), L.args_file = mcore->file.name;  // after every data file (Files indexes them)
  return L;
}

}  // namespace ucp::formats::dcp
