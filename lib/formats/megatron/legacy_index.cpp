#include "formats/megatron/legacy_index.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "core/error.h"
#include "core/format.h"
#include "formats/dcp/bucket_layout.h"
#include "formats/dcp/metadata.h"
#include "formats/megatron/legacy_folder.h"
#include "formats/megatron/legacy_names.h"
#include "pt/low_precision.h"
#include "pt/torch_file.h"
#include "source/megatron_groups.h"
#include "source/megatron_stacking.h"

namespace ucp::formats::megatron {

using dcp::Chunk;
using dcp::Item;
using pt::Value;
using source::Extent;
using source::Fragment;
using source::ShardFile;
using source::SourceIndex;

namespace {

constexpr const char* kRemedy =
    "Megatron-LM can load this checkpoint at its own layout and save it again with --ckpt-format torch_dist "
    "--dist-ckpt-optim-fully-reshardable, a form ucp reads";

// One (TP, PP) rank's files, read.
struct Rank {
  RankFolder folder;
  int tp = 0, pp = 0;
  int model_file = -1, optim_file = -1;  // into L.files
  pt::TorchFile model, optim;
};

// One model tensor of one rank: its torch_dist key and where its elements go in the global tensor.
struct Local {
  int rank = -1;
  std::string name;  // as the rank's file names it
  DistName d;
  int layer = -1;    // global layer (stacked keys), else -1
  pt::TensorView tensor;
  std::vector<Chunk> boxes;  // its elements, box after box, each in row-major order
  bool source = true;        // false: a tensor every TP rank holds whole, read from tp 0
};

// A rank file, opened; its tensor records the checksummed ranges of its ShardFile (off a grid: its
// coordinates stay 0, its name says the rank).
int OpenFile(SourceIndex& L, const std::string& name, const char* kind, const source::IndexOptions& options, pt::TorchFile* out) {
  pt::ReadOptions read;
  read.verify_storage_crc = options.verify_storage_crc;
  *out = pt::ReadTorchFile(L.dir + "/" + name, read);
  ShardFile f;
  f.name = name, f.kind = kind;
  for (const auto& [entry_name, e] : out->archive->entries())
    if (entry_name.find("/data/") != std::string::npos) f.checksummed.push_back({entry_name, e.data_offset, e.size, e.crc32});
  std::sort(f.checksummed.begin(), f.checksummed.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
  L.files.push_back(f);
  return static_cast<int>(L.files.size()) - 1;
}

uint64_t OffsetIn(const pt::TorchFile& file, const pt::TensorView& t) {
  return static_cast<uint64_t>(t.data() - file.archive->file()->bytes().data());
}

// The rank's place from its folder's numbers: TT, then PPP where the job has PP > 1.
void Place(Rank& r, const RankFolder& folder, int pp_size) {
  const size_t want = pp_size > 1 ? 2 : 1;
  if (folder.numbers.size() != want)
    throw Error(folder.name + ": a rank folder of " + std::to_string(folder.numbers.size()) + " numbers where PP=" + std::to_string(pp_size) +
                " gives mp_rank_TT" + (pp_size > 1 ? "_PPP" : "") + " (expert-parallel rank folders are not read yet)");
  r.tp = folder.numbers[0], r.pp = pp_size > 1 ? folder.numbers[1] : 0;
}

// The model tensors of every rank, each placed in its global tensor, and the global tensors (as
// torch_dist's Items: key, dtype, size and each rank's boxes as chunks) in model order.
struct Model {
  std::vector<Local> locals;  // rank by rank, each in its file's order
  std::vector<std::vector<size_t>> of_rank;  // rank -> its locals
  std::map<std::tuple<int, std::string, int>, size_t> local_of;  // (rank, key, global layer) -> local
  std::vector<Item> items;    // first-seen order over the ranks by (pp, tp): the model's order
  std::map<std::string, size_t> item_of;
};

Model PlaceModel(SourceIndex& L, const std::vector<Rank>& ranks, const dcp::BucketGrid& grid, bool gated) {
  Model M;
  M.of_rank.resize(ranks.size());
  const int64_t layers = static_cast<int64_t>(grid.stage_of_layer.size());
  for (size_t ri = 0; ri < ranks.size(); ++ri) {
    const Rank& r = ranks[ri];
    const std::string where = L.dir + "/" + L.files[r.model_file].name;
    auto model = r.model.root->Get("model");
    if (!model || model->kind != Value::Kind::Dict)
      throw Error(where + ": no 'model' dict (several model chunks, 'model0', 'model1': virtual pipeline stages are not read yet)");
    const int first = grid.FirstLayer(r.pp);
    const int count = static_cast<int>(std::count(grid.stage_of_layer.begin(), grid.stage_of_layer.end(), r.pp));
    for (const auto& entry : model->AsDict().items()) {
      const std::string name = entry.key && entry.key->kind == Value::Kind::Str ? entry.key->s : "";
      auto d = WithContext(where, [&] { return DistNameOf(name, gated); });
      if (!d) continue;
      if (!entry.value || entry.value->kind != Value::Kind::Tensor)
        throw Error(where + ": model '" + name + "' is a " + (entry.value ? entry.value->TypeName() : "null") + ", not a tensor");
      // Megatron keeps the embeddings on the first stage, the final norm and output layer on the last.
      const bool first_stage = name.rfind("embedding.", 0) == 0, last_stage = d->layer < 0 && !first_stage;
      if ((first_stage && r.pp != 0) || (last_stage && r.pp != grid.pp - 1))
        throw Error(where + ": '" + name + "' in the files of pp=" + std::to_string(r.pp) + ", where Megatron keeps it on the " +
                    (first_stage ? "first" : "last") + " of the " + std::to_string(grid.pp) + " stages: rank files swapped or renamed "
                    "(put back the files the save wrote)");
      Local x;
      x.rank = static_cast<int>(ri), x.name = name, x.d = *d, x.tensor = entry.value->AsTensor();
      const std::vector<int64_t>& s = x.tensor.shape;
      if (!x.tensor.contiguous()) throw Error(where + ": model '" + name + "' is not contiguous");
      if (x.tensor.dtype != pt::DType::F32 && x.tensor.dtype != pt::DType::BF16 && x.tensor.dtype != pt::DType::F16)
        throw Error(where + ": model '" + name + "' is " + std::string(pt::DTypeName(x.tensor.dtype)) + ", not float32, bfloat16 or float16");
      if (d->layer >= count)
        throw Error(where + ": '" + name + "': layer " + std::to_string(d->layer) + " of a stage the args give " + std::to_string(count) + " layers");
      std::vector<int64_t> size = s, at(s.size(), 0);
      int dim = -1;
      if (d->split == DistName::Rows) dim = 0;
      if (d->split == DistName::Columns) dim = 1;
      if (dim >= static_cast<int>(s.size())) throw Error(where + ": '" + name + "' " + pt::ShapeString(s) + " has no dimension " + std::to_string(dim) + " to cut over TP");
      if (dim >= 0) size[dim] *= grid.tp, at[dim] = s[dim] * r.tp;
      x.source = d->split != DistName::Whole || r.tp == 0;
      std::vector<Chunk> boxes;
      if (d->gated) {  // [gate; up] of this rank: its gate rows and its up rows, each the tp-th of TP
        if (s[0] % 2) throw Error(where + ": '" + name + "' has " + std::to_string(s[0]) + " rows, not [gate; up]");
        Chunk gate{at, s}, up{at, s};
        gate.sizes[0] = up.sizes[0] = s[0] / 2;
        gate.offsets[0] = r.tp * s[0] / 2, up.offsets[0] = size[0] / 2 + r.tp * s[0] / 2;
        boxes = {gate, up};
      } else {
        boxes = {Chunk{at, s}};
      }
      if (d->layer >= 0) {
        x.layer = first + d->layer;
        size.insert(size.begin(), layers);
        for (Chunk& c : boxes) c.offsets.insert(c.offsets.begin(), x.layer), c.sizes.insert(c.sizes.begin(), 1);
      }
      x.boxes = boxes;
      auto [it, fresh] = M.item_of.emplace(d->key, M.items.size());
      if (fresh) {
        Item item;
        item.fqn = d->key, item.tensor = true, item.dtype = std::string(pt::DTypeName(x.tensor.dtype)), item.size = size;
        M.items.push_back(item);
      }
      Item& item = M.items[it->second];
      if (item.size != size || item.dtype != pt::DTypeName(x.tensor.dtype))
        throw Error(where + ": '" + name + "' is " + std::string(pt::DTypeName(x.tensor.dtype)) + " " + pt::ShapeString(s) + ", which makes '" +
                    d->key + "' " + pt::ShapeString(size) + "; another rank's makes it " + item.dtype + " " + pt::ShapeString(item.size) +
                    " (files of different jobs or layouts?)");
      if (x.source)
        for (const Chunk& c : boxes) item.chunks.push_back(c);
      if (!M.local_of.emplace(std::make_tuple(x.rank, d->key, x.layer), M.locals.size()).second)
        throw Error(where + ": '" + name + "' is a second tensor of '" + d->key + "'" + (x.layer >= 0 ? " at layer " + std::to_string(x.layer) : ""));
      M.of_rank[ri].push_back(M.locals.size());
      M.locals.push_back(std::move(x));
    }
  }
  for (const Item& item : M.items) {  // every element of every global tensor held by exactly one rank's box
    int64_t n = 0;
    for (const Chunk& c : item.chunks) n += pt::Numel(c.sizes);
    if (n != pt::Numel(item.size))
      throw Error(L.dir + ": '" + item.fqn + "' " + pt::ShapeString(item.size) + ": the ranks' files hold " + std::to_string(n) + " of its " +
                  std::to_string(pt::Numel(item.size)) + " elements (a rank's tensor or layer missing, or held twice)");
  }
  return M;
}

// The fragments of a slot: its elements, box after box, placed in the global tensor of `item`.
void AddFragments(SourceIndex& L, int file, int slot, int param, const Item& item, const std::vector<Chunk>& boxes) {
  int64_t base = 0;
  for (const Chunk& box : boxes) {
    dcp::ForEachRun(item.size, box, [&](int64_t src, int64_t dst, int64_t n) {
      L.fragments.push_back(Fragment{file, slot, param, base + src, n, dst});
    });
    base += pt::Numel(box.sizes);
  }
}

// A model tensor as the copy of a slot's elements [slot_start, ...): the weight-copy check compares
// them (the master rounded to the model's dtype must give it).
void AddCopy(SourceIndex& L, const Local& x, int model_file, uint64_t offset, int param, int slot_file, int slot, int64_t slot_start) {
  source::WeightCopy wc;
  if (x.tensor.dtype == pt::DType::BF16) wc.dtype = pt::DType::BF16;
  else if (x.tensor.dtype == pt::DType::F16) wc.dtype = pt::DType::F16;
  else if (x.tensor.dtype != pt::DType::F32) return;
  wc.param = param, wc.file = model_file, wc.offset = offset, wc.numel = static_cast<int64_t>(x.tensor.numel());
  wc.slot_file = slot_file, wc.slot_group = slot, wc.slot_start = slot_start;
  L.weight_copies.push_back(wc);
}

pt::TensorView Float32(const Value& v, const std::string& what, const std::vector<int64_t>& shape) {
  if (v.kind != Value::Kind::Tensor) throw Error(what + " is a " + v.TypeName() + ", not a tensor");
  const pt::TensorView& t = v.AsTensor();
  if (t.dtype != pt::DType::F32 || !t.contiguous() || t.shape != shape)
    throw Error(what + " is " + std::string(pt::DTypeName(t.dtype)) + (t.contiguous() ? " " : " non-contiguous ") + pt::ShapeString(t.shape) +
                ", not the float32 " + pt::ShapeString(shape) + " of its parameter");
  return t;
}

// The step of every position or group, one per param group in the atomic checkpoint: the first met;
// another that differs is a problem.
class Steps {
 public:
  void Add(SourceIndex& L, int group, const pt::ValuePtr& step, const std::string& who) {
    if (!step) return;
    auto& [first, value] = steps_[group];
    if (!value) {
      first = who, value = step;
      return;
    }
    if (pt::StepValue(*value) != pt::StepValue(*step))
      L.problems.push_back(who + ": its Adam step " + std::to_string(pt::StepValue(*step)) + " differs from " + first + "'s " +
                           std::to_string(pt::StepValue(*value)) + " (the atomic checkpoint keeps one step per param group)");
  }
  // Every group of `groups` gets the step: Megatron saves no parameter's group in its torch_dist form,
  // whose atomic checkpoint this one equals; so every parameter records group 0, and one step serves all.
  void Into(SourceIndex& L, size_t groups) const {
    if (steps_.empty()) return;
    for (const auto& [g, s] : steps_)
      if (pt::StepValue(*s.second) != pt::StepValue(*steps_.begin()->second.second))
        L.problems.push_back(L.dir + ": param groups " + std::to_string(steps_.begin()->first) + " and " + std::to_string(g) +
                             " hold different steps: the atomic checkpoint records group 0's for every parameter");
    for (size_t g = 0; g < std::max<size_t>(groups, 1); ++g) L.steps[{0, 0, static_cast<int>(g)}] = steps_.begin()->second.second;
  }

 private:
  std::map<int, std::pair<std::string, pt::ValuePtr>> steps_;
};

// torch's optimizer state by position (FP32Optimizer, Float16OptimizerWithFloat16Params) of one
// rank: each position matched to the rank's parameters in model order, by shape.
// `group_of`: each parameter's param group as the rank files list it (the torch form saves each group's
// positions), the same on every rank that holds a piece of it.
void TorchPositions(SourceIndex& L, const Rank& r, int ri, const Model& M, const Value& sd, const Value* masters, Steps& steps,
                    std::map<std::string, int>& group_of) {
  const std::string where = L.dir + "/" + L.files[r.model_file].name;
  auto state = sd.Get("state");
  auto groups = sd.Get("param_groups");
  if (!state || state->kind != Value::Kind::Dict || !groups || !groups->IsSequence())
    throw Error(where + ": the optimizer's state_dict holds no 'state' dict and 'param_groups' list");
  struct Group {
    std::vector<int64_t> positions;
    size_t next = 0, half = 0;  // half: the 16-bit parameters met, each with its master in fp32_from_fp16_params
  };
  std::vector<Group> gs(groups->items.size());
  for (size_t g = 0; g < gs.size(); ++g) {
    auto params = groups->items[g] ? groups->items[g]->Get("params") : nullptr;
    if (!params || !params->IsSequence()) throw Error(where + ": param group " + std::to_string(g) + " lists no 'params'");
    for (const auto& p : params->items) gs[g].positions.push_back(p->AsInt());
  }
  if (masters && (!masters->IsSequence() || masters->items.size() != gs.size()))
    throw Error(where + ": fp32_from_fp16_params is not a list of " + std::to_string(gs.size()) + " groups");
  auto entry = [&](int64_t pos, const char* key) -> pt::ValuePtr {
    auto st = state->AsDict().Get(pos);
    auto v = st ? st->Get(key) : nullptr;
    if (!v && std::string(key) != "step") throw Error(where + ": the optimizer holds no '" + key + "' for position " + std::to_string(pos));
    return v;
  };
  for (size_t k : M.of_rank[ri]) {
    const Local& x = M.locals[k];
    std::vector<size_t> fits;
    for (size_t g = 0; g < gs.size(); ++g)
      if (gs[g].next < gs[g].positions.size()) {
        auto a = entry(gs[g].positions[gs[g].next], "exp_avg");
        if (a->kind == Value::Kind::Tensor && a->AsTensor().shape == x.tensor.shape) fits.push_back(g);
      }
    if (fits.empty())
      throw Error(where + ": parameter '" + x.name + "' " + pt::ShapeString(x.tensor.shape) + " fits the next position of no param group "
                  "(a frozen parameter, or the state of another model)");
    if (fits.size() > 1)
      throw Error(where + ": parameter '" + x.name + "' " + pt::ShapeString(x.tensor.shape) + " fits the next position of param groups " +
                  std::to_string(fits[0]) + " and " + std::to_string(fits[1]) + ": which one holds it cannot be told (positions carry no names)");
    if (auto [it, fresh] = group_of.emplace(x.d.key, static_cast<int>(fits[0])); !fresh && it->second != static_cast<int>(fits[0]))
      throw Error(where + ": parameter '" + x.name + "' is in param group " + std::to_string(fits[0]) + " here and in group " +
                  std::to_string(it->second) + " on another rank or layer: one parameter of the atomic checkpoint, one group");
    Group& g = gs[fits[0]];
    const int64_t pos = g.positions[g.next++];
    const std::string what = "position " + std::to_string(pos) + " ('" + x.name + "')";
    const pt::TensorView m1 = Float32(*entry(pos, "exp_avg"), where + ": exp_avg of " + what, x.tensor.shape);
    const pt::TensorView m2 = Float32(*entry(pos, "exp_avg_sq"), where + ": exp_avg_sq of " + what, x.tensor.shape);
    steps.Add(L, static_cast<int>(fits[0]), entry(pos, "step"), where);
    pt::TensorView master = x.tensor;
    const bool half = x.tensor.dtype != pt::DType::F32;
    if (half) {
      if (!masters)
        throw Error(where + ": '" + x.name + "' is " + std::string(pt::DTypeName(x.tensor.dtype)) + " and the optimizer keeps no fp32 masters "
                    "(fp32_from_fp16_params): the fp32 weights are not in the file");
      const auto& list = masters->items[fits[0]];
      if (!list || !list->IsSequence() || g.half >= list->items.size() || !list->items[g.half])
        throw Error(where + ": fp32_from_fp16_params[" + std::to_string(fits[0]) + "] has no master for '" + x.name + "'");
      master = Float32(*list->items[g.half], where + ": fp32_from_fp16_params[" + std::to_string(fits[0]) + "][" + std::to_string(g.half) + "]",
                       x.tensor.shape);
      ++g.half;
    } else if (!x.tensor.contiguous()) {
      throw Error(where + ": '" + x.name + "' is not contiguous");
    }
    if (!x.source) continue;  // a tensor every TP rank holds whole: tp 0's
    const int64_t n = static_cast<int64_t>(x.tensor.numel());
    ShardFile& f = L.files[r.model_file];
    f.data = true;
    const int slot = static_cast<int>(f.groups.size());
    f.groups.push_back({Extent{OffsetIn(r.model, master), n, -1}, Extent{OffsetIn(r.model, m1), n, -1}, Extent{OffsetIn(r.model, m2), n, -1}});
    const int param = static_cast<int>(M.item_of.at(x.d.key));
    AddFragments(L, r.model_file, slot, param, M.items[param], x.boxes);
    if (half) AddCopy(L, x, r.model_file, OffsetIn(r.model, x.tensor), param, r.model_file, slot, 0);
  }
  for (size_t g = 0; g < gs.size(); ++g)
    if (gs[g].next != gs[g].positions.size())
      throw Error(where + ": param group " + std::to_string(g) + " lists " + std::to_string(gs[g].positions.size()) + " positions but " +
                  std::to_string(gs[g].next) + " of the rank's parameters fit them");
}

std::string DtypeName(const Value& v) {
  if (v.kind != Value::Kind::Global || v.module != "torch") throw Error("a buffer's dtype is a " + v.TypeName() + ", not a torch dtype");
  return v.name;
}

// The distributed optimizer's distrib_optim.pt of every rank: each grad buffer's buckets rebuilt
// (bucket_layout.h) and proven by the recorded size, every piece of every parameter placed.
void DistributedState(SourceIndex& L, const std::vector<Rank>& ranks, const Model& M, const dcp::BucketGrid& grid, const Value* args) {
  std::optional<int64_t> bucket_size;
  if (source::ArgSet(args, "overlap_grad_reduce")) {  // Megatron-LM's DDP: buckets only with --overlap-grad-reduce
    int64_t size = source::ArgInt(args, "ddp_bucket_size", -1);
    if (size < 0) {
      const int64_t dp = source::ArgInt(args, "data_parallel_size", -1);
      if (dp < 1) throw Error("args set overlap_grad_reduce without ddp_bucket_size or data_parallel_size: the buckets' size is not known");
      size = std::max<int64_t>(40000000, 1000000 * dp);
    }
    bucket_size = size;
  }
  std::vector<const Item*> items;
  for (const Item& item : M.items) items.push_back(&item);
  struct Buffer {
    std::array<pt::TensorView, 3> state;  // param, exp_avg, exp_avg_sq
    std::vector<int64_t> base;            // each bucket's first element in them
  };
  std::map<dcp::BucketDomain, std::vector<dcp::GradBuffer>> buffers;  // one optimizer's (chain -1)
  std::map<std::pair<int, int>, Buffer> flat;  // (domain, gbuf)
  std::map<int, size_t> rank_of;               // domain -> rank
  for (size_t ri = 0; ri < ranks.size(); ++ri) {
    const Rank& r = ranks[ri];
    const int domain = r.tp + grid.tp * r.pp;
    rank_of[domain] = ri;
    if (r.optim_file < 0)
      throw Error(L.dir + "/" + r.folder.name + ": no distrib_optim.pt beside model_optim_rng.pt, whose optimizer is the distributed "
                  "optimizer's (its state lies in that file)");
    const std::string where = L.dir + "/" + L.files[r.optim_file].name;
    const Value& root = *r.optim.root;
    auto coalesced = root.Get("buckets_coalesced");
    if (root.kind != Value::Kind::Dict || !coalesced || coalesced->kind != Value::Kind::Bool || !coalesced->b)
      throw Error(where + ": no 'buckets_coalesced': True (the per-bucket form of earlier Megatron-LM releases is not read yet)");
    for (const auto& e : root.AsDict().items()) {
      if (e.key && e.key->kind == Value::Kind::Str) continue;
      if (!e.key || e.key->kind != Value::Kind::Int || e.key->i != static_cast<int64_t>(buffers[dcp::BucketDomain{-1, domain}].size()))
        throw Error(where + ": a key " + (e.key ? pt::ScalarKey(*e.key) : "null") + " where grad buffer " + std::to_string(buffers[dcp::BucketDomain{-1, domain}].size()) + " was expected");
      const int gbuf = static_cast<int>(e.key->i);
      if (!e.value || e.value->kind != Value::Kind::Dict || e.value->AsDict().size() != 1)
        throw Error(where + ": grad buffer " + std::to_string(gbuf) + " is not one {(param dtype, grad dtype): state}");
      const auto& [key, value] = e.value->AsDict().items()[0];
      if (!key || key->kind != Value::Kind::Tuple || key->items.size() != 2 || !key->items[0] || !key->items[1] || !value || value->kind != Value::Kind::Dict)
        throw Error(where + ": grad buffer " + std::to_string(gbuf) + " is not one {(param dtype, grad dtype): state}");
      dcp::GradBuffer b;
      b.param_dtype = DtypeName(*key->items[0]), b.grad_dtype = DtypeName(*key->items[1]);
      auto recorded = value->Get("numel_unpadded");
      if (!recorded || recorded->kind != Value::Kind::Int) throw Error(where + ": grad buffer " + std::to_string(gbuf) + " records no numel_unpadded");
      b.unpadded = WithContext(where, [&] { return dcp::ComputeBucketSizes(items, grid, domain, b.param_dtype, r.pp > 0 ? std::nullopt : bucket_size); });
      b.padded = b.unpadded;
      Buffer buf;
      int64_t total = 0;
      for (int64_t n : b.unpadded) buf.base.push_back(total), total += n;
      if (total != recorded->i)
        throw Error(where + ": grad buffer " + std::to_string(gbuf) + " (" + b.param_dtype + ") records " + std::to_string(recorded->i) +
                    " elements; the rank's " + b.param_dtype + " parameters laid out as Megatron-Core's DDP lays them (" +
                    std::to_string(b.unpadded.size()) + " bucket" + (b.unpadded.size() == 1 ? "" : "s") + ") take " + std::to_string(total) +
                    ": the layout is not the one the file was saved with (another model, or buckets the args do not give)");
      const char* names[] = {"param", "exp_avg", "exp_avg_sq"};
      for (int s = 0; s < 3; ++s) {
        auto v = value->Get(names[s]);
        if (!v) throw Error(where + ": grad buffer " + std::to_string(gbuf) + " holds no '" + names[s] + "'");
        buf.state[s] = Float32(*v, where + ": grad buffer " + std::to_string(gbuf) + " '" + names[s] + "'", {recorded->i});
      }
      flat[{domain, gbuf}] = buf;
      buffers[dcp::BucketDomain{-1, domain}].push_back(b);
    }
  }
  const std::vector<dcp::BucketPiece> pieces = WithContext(L.dir, [&] { return dcp::LayOutBuckets(items, grid, buffers); });
  for (const dcp::BucketPiece& p : pieces) {
    if (!p.source) continue;
    const Rank& r = ranks[rank_of.at(p.domain)];
    const Buffer& buf = flat.at({p.domain, p.gbuf});
    const int64_t at = buf.base.at(p.bucket) + p.start;
    ShardFile& f = L.files[r.optim_file];
    f.data = true;
    const int slot = static_cast<int>(f.groups.size());
    std::array<Extent, 3> extents;
    for (int s = 0; s < 3; ++s) extents[s] = Extent{OffsetIn(r.optim, buf.state[s]) + 4 * static_cast<uint64_t>(at), p.numel, -1};
    f.groups.push_back(extents);
    const int param = static_cast<int>(M.item_of.at(p.fqn));
    AddFragments(L, r.optim_file, slot, param, M.items[param], p.boxes);
    const int layer = source::StackedDims(p.fqn) >= 1 ? static_cast<int>(p.boxes.at(0).offsets.at(0)) : -1;
    const Local& x = M.locals.at(M.local_of.at({static_cast<int>(rank_of.at(p.domain)), p.fqn, layer}));
    if (static_cast<int64_t>(x.tensor.numel()) != p.numel)
      throw Error(L.dir + ": '" + x.name + "' of " + r.folder.name + " has " + std::to_string(x.tensor.numel()) + " elements, its bucket piece " +
                  std::to_string(p.numel));
    AddCopy(L, x, r.model_file, OffsetIn(r.model, x.tensor), param, r.optim_file, slot, 0);
  }
}

// A param group without its `params` (torch's state_dict lists positions there, which Megatron's
// torch_dist form does not save: the atomic checkpoint keeps the groups as that form does).
pt::ValuePtr WithoutParams(const Value& group) {
  auto out = Value::Make(Value::Kind::Dict);
  for (const auto& e : group.AsDict().items())
    if (!(e.key && e.key->kind == Value::Kind::Str && e.key->s == "params")) out->dict.Set(e.key, e.value);
  return out;
}

// What the index keeps for the mappers and for ReadLegacyParam: the files' trees, the placed tensors.
struct LegacyState {
  std::vector<Rank> ranks;
  Model model;
};

void Index(SourceIndex& L, const LegacyFolder& F, const source::IndexOptions& options, LegacyState& st) {
  std::vector<Rank>& ranks = st.ranks;
  for (const RankFolder& folder : F.ranks) {
    Rank r;
    r.folder = folder;
    try {
      r.model_file = OpenFile(L, folder.name + "/model_optim_rng.pt", "model_optim_rng", options, &r.model);
      if (folder.distrib_optim) r.optim_file = OpenFile(L, folder.name + "/distrib_optim.pt", "distrib_optim", options, &r.optim);
    } catch (const std::exception& e) {
      L.errors.push_back(e.what());
      continue;
    }
    ranks.push_back(std::move(r));
  }
  if (ranks.size() != F.ranks.size()) return;
  const std::string first = L.dir + "/" + L.files[ranks[0].model_file].name;
  L.args = ranks[0].model.root->Get("args");
  const Value* args = L.args.get();
  const dcp::BucketGrid grid = WithContext(first, [&] { return dcp::GridFromArgs(args, "Megatron-LM's legacy files", kRemedy); });
  std::set<std::pair<int, int>> seen;
  int64_t iteration = -1;
  for (Rank& r : ranks) {
    const std::string where = L.dir + "/" + L.files[r.model_file].name;
    WithContext(where, [&] { Place(r, r.folder, grid.pp); });
    // Off a grid (the fragments place global tensors), the files' coordinates stay 0: their names say the rank.
    if (r.tp >= grid.tp || r.pp >= grid.pp || !seen.insert({r.tp, r.pp}).second)
      throw Error(where + ": rank folder " + r.folder.name + " outside the TP=" + std::to_string(grid.tp) + " x PP=" + std::to_string(grid.pp) +
                  " its args give, or twice");
    const Value* a = r.model.root->Get("args").get();
    if (source::ArgInt(a, "tensor_model_parallel_size", 1) != grid.tp || source::ArgInt(a, "pipeline_model_parallel_size", 1) != grid.pp)
      throw Error(where + ": its args give TP=" + std::to_string(source::ArgInt(a, "tensor_model_parallel_size", 1)) + ", PP=" +
                  std::to_string(source::ArgInt(a, "pipeline_model_parallel_size", 1)) + ", " + first + "'s TP=" + std::to_string(grid.tp) + ", PP=" +
                  std::to_string(grid.pp) + ": files of different jobs");
    // The process that wrote it, where the args are a launched job's (world_size = TP x PP x DP): DP rank 0
    // of this (tp, pp), global rank tp + TP x DP x pp in Megatron's default order (tp + TP x pp with
    // --use-tp-pp-dp-mapping). Another rank's file here is a swap every CRC-32 passes.
    const int64_t rank = source::ArgInt(a, "rank", -1), world = source::ArgInt(a, "world_size", -1), dp = source::ArgInt(a, "data_parallel_size", -1);
    if (rank >= 0 && dp >= 1 && source::ArgInt(a, "context_parallel_size", 1) == 1 && world == int64_t{grid.tp} * grid.pp * dp) {
      const int64_t writer = source::ArgSet(a, "use_tp_pp_dp_mapping") ? r.tp + int64_t{grid.tp} * r.pp : r.tp + int64_t{grid.tp} * dp * r.pp;
      if (rank != writer)
        throw Error(where + ": written by global rank " + std::to_string(rank) + " (its args), where the rank writing tp=" + std::to_string(r.tp) +
                    ", pp=" + std::to_string(r.pp) + " is " + std::to_string(writer) + ": rank files swapped or renamed (put back the "
                    "files the save wrote)");
    }
    auto it = r.model.root->Get("iteration");
    const int64_t i = it && it->kind == Value::Kind::Int ? it->i : -1;
    if (F.iteration >= 0 && i != F.iteration)
      throw Error(where + ": holds iteration " + std::to_string(i) + " in the folder of iteration " + std::to_string(F.iteration) + " (" + F.tag +
                  "): a rank file of another save, copied or left over; refused rather than mixed with the others");
    if (iteration >= 0 && i != iteration)
      throw Error(where + ": holds iteration " + std::to_string(i) + ", " + first + " iteration " + std::to_string(iteration) +
                  ": rank files of different saves");
    iteration = i;
  }
  for (int pp = 0; pp < grid.pp; ++pp)
    for (int tp = 0; tp < grid.tp; ++tp)
      if (!seen.count({tp, pp}))
        throw Error(L.dir + ": no rank folder of tp=" + std::to_string(tp) + ", pp=" + std::to_string(pp) + " (the args give TP=" +
                    std::to_string(grid.tp) + ", PP=" + std::to_string(grid.pp) + "): its model_optim_rng.pt is missing");
  std::sort(ranks.begin(), ranks.end(), [](const Rank& a, const Rank& b) { return std::make_pair(a.pp, a.tp) < std::make_pair(b.pp, b.tp); });
  L.iteration = std::max<int64_t>(iteration, 0);
  st.model = PlaceModel(L, ranks, grid, source::ArgSet(args, "swiglu"));
  const Model& M = st.model;
  for (const Item& item : M.items) {
    source::ParamRecord rec;
    rec.name = item.fqn, rec.group = 0, rec.tp_shape[0] = item.size, rec.stages.insert(0);
    L.params.push_back(std::move(rec));
  }
  if (!M.locals.empty()) {
    const pt::DType d = M.locals[0].tensor.dtype;
    L.dtype = d == pt::DType::BF16 ? "bf16" : d == pt::DType::F16 ? "fp16" : "fp32";
  }

  // The optimizer: the distributed one's (distrib_optim.pt), or torch's state by position; none in a
  // weights-only save (--no-save-optim), read as a model (ReadLegacyParam).
  auto optimizer = ranks[0].model.root->Get("optimizer");
  for (const Rank& r : ranks)
    if (!r.model.root->Get("optimizer") != !optimizer)
      throw Error(L.dir + "/" + L.files[r.model_file].name + (optimizer ? " holds no optimizer state, " : " holds optimizer state, ") + first +
                  (optimizer ? " does" : " none") + ": rank files of different saves");
  if (!optimizer) {
    L.optimizer = "none";
    L.model_states = Value::Make(Value::Kind::Dict);
    pt::SetItem(*L.model_states, "args", L.args ? L.args : Value::None());
    pt::SetItem(*L.model_states, "iteration", Value::Int(L.iteration));
    if (auto v = ranks[0].model.root->Get("checkpoint_version")) pt::SetItem(*L.model_states, "checkpoint_version", v);
    source::TakeMegatronArgs(args, L);
    L.notes.push_back("Megatron-LM legacy checkpoint (--ckpt-format torch), " + F.tag + ": " + source::MegatronLayout(args) + ", " +
                      std::to_string(ranks.size()) + " rank folder" + (ranks.size() == 1 ? "" : "s") + "; model weights only (saved without "
                      "optimizer state, --no-save-optim): ucp-convert makes a weights-only atomic checkpoint of them, as of a Hugging Face model");
    return;
  }
  if (optimizer->kind != Value::Kind::Dict) throw Error(first + ": 'optimizer' is a " + optimizer->TypeName() + ", not a state dict");
  std::string form;
  pt::ValuePtr groups;
  Steps steps;
  std::map<std::string, int> saved_group;  // the torch form's: each parameter's group as saved
  const bool distributed = !optimizer->Get("state") && !optimizer->Get("fp32_from_fp16_params") && optimizer->Get("optimizer") &&
                           !optimizer->At("optimizer").Get("state");
  if (distributed) {
    form = "DistributedOptimizer (distrib_optim.pt)";
    L.state_in_buckets = true;
    DistributedState(L, ranks, M, grid, args);
    for (const Rank& r : ranks) {  // the step in every param group of every rank's torch state
      auto g = r.model.root->At("optimizer").At("optimizer").Get("param_groups");
      if (!g || !g->IsSequence()) throw Error(L.dir + "/" + L.files[r.model_file].name + ": the optimizer holds no param_groups");
      if (!groups) groups = g;
      for (size_t k = 0; k < g->items.size(); ++k) steps.Add(L, static_cast<int>(k), g->items[k] ? g->items[k]->Get("step") : nullptr, L.dir + "/" + L.files[r.model_file].name);
    }
  } else {
    for (size_t ri = 0; ri < ranks.size(); ++ri) {
      const Rank& r = ranks[ri];
      auto opt = r.model.root->Get("optimizer");
      if (!opt || opt->kind != Value::Kind::Dict) throw Error(L.dir + "/" + L.files[r.model_file].name + ": no optimizer state");
      const Value* masters = opt->Get("fp32_from_fp16_params").get();
      const Value& sd = masters ? opt->At("optimizer") : *opt;
      if (!sd.Get("state") && sd.Get("optimizer"))
        throw Error(L.dir + "/" + L.files[r.model_file].name + ": the optimizer holds '" + "optimizer' within 'optimizer' (several chained "
                    "optimizers: Megatron's expert and dense ones?), which is not read yet");
      form = masters ? "Float16OptimizerWithFloat16Params (fp32 masters in model_optim_rng.pt)" : "FP32Optimizer (torch Adam's state)";
      TorchPositions(L, r, static_cast<int>(ri), M, sd, masters, steps, saved_group);
      if (!groups) {
        groups = Value::Make(Value::Kind::List);
        for (const auto& g : sd.At("param_groups").AsSequence()) groups->items.push_back(WithoutParams(*g));
      }
    }
  }
  auto osd = Value::Make(Value::Kind::Dict);
  pt::SetItem(*osd, "param_groups", groups ? groups : Value::Make(Value::Kind::List));
  L.optimizer_state = osd;
  const size_t group_count = groups ? groups->items.size() : 0;
  steps.Into(L, group_count);
  if (distributed) {  // the distributed optimizer saves its groups without `params`: as the torch_dist form's
    std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
    for (const Item& item : M.items) shapes.emplace_back(item.fqn, item.size);
    const source::MegatronGroups by_rule = source::MegatronGroupsOf(groups.get(), args, shapes);
    for (auto& rec : L.params)
      if (auto g = by_rule.group_of.find(rec.name); g != by_rule.group_of.end()) rec.group = g->second;
    if (!by_rule.note.empty()) L.notes.push_back(by_rule.note);
  } else {
    int in_first = 0;
    for (auto& rec : L.params)
      if (auto g = saved_group.find(rec.name); g != saved_group.end()) rec.group = g->second, in_first += g->second == 0;
    if (group_count > 1)
      L.notes.push_back(std::to_string(group_count) + " param groups, each parameter in the group its rank files list it in (" +
                        std::to_string(in_first) + " of " + std::to_string(L.params.size()) + " in group 0)");
  }

  // The args, for the Hugging Face export: a file of their own in the atomic checkpoint.
  source::TakeMegatronArgs(args, L);
  L.args_file = "megatron_args.pt";
  L.args_state = Value::Make(Value::Kind::Dict);
  pt::SetItem(*L.args_state, "args", L.args ? L.args : Value::None());
  pt::SetItem(*L.args_state, "iteration", Value::Int(L.iteration));
  // ... and what else of rank 0's common state a Megatron-LM target carries (the scheduler)
  for (const char* key : {"checkpoint_version", "opt_param_scheduler", "num_floating_point_operations_so_far"})
    if (auto v = ranks[0].model.root->Get(key)) pt::SetItem(*L.args_state, key, v);

  L.notes.push_back("Megatron-LM legacy checkpoint (--ckpt-format torch), " + F.tag + ": " + source::MegatronLayout(args) + ", " +
                    std::to_string(ranks.size()) +
                    " rank folder" + (ranks.size() == 1 ? "" : "s") + "; optimizer: " + form);
  L.notes.push_back("Megatron-LM itself loads this form only at the TP and PP it was saved with (its tools/checkpoint converter "
                    "moves the weights alone); ucp-convert reads every parameter's whole state from it, each tensor placed as "
                    "Megatron-Core's torch_dist format places it (layers stacked), which ucp-reshard writes as Megatron-LM's torch_dist "
                    "at any TP, PP and DP (--format mcore; the job relaunched with --ckpt-format torch_dist) or exports (--format hf)");
  if (!L.weight_copies.empty())
    L.notes.push_back("the optimizer's fp32 master weights are compared with the model's own tensors saved beside them before "
                      "anything is written (ucp-inspect: with --verify): the two must agree, the master rounded to the model's dtype");
}

}  // namespace

SourceIndex IndexLegacy(const std::string& dir, const source::IndexOptions& options) {
  const LegacyFolder F = FindLegacy(dir);
  SourceIndex L;
  L.format = "megatron";
  L.root = dir, L.dir = F.iter_dir, L.tag = F.tag;
  L.framework = "megatron-lm";
  L.optimizer = "torch";
  L.naming = "plain";
  L.on_grid = false;
  auto state = std::make_shared<LegacyState>();
  try {
    Index(L, F, options, *state);
  } catch (const std::exception& e) {
    L.errors.push_back(e.what());
  }
  L.keep_alive = state;
  return L;
}

bool LegacyWeightsOnly(const std::string& dir) {
  try {
    const LegacyFolder F = FindLegacy(dir);
    return !pt::ReadTorchFile(F.iter_dir + "/" + F.ranks.at(0).name + "/model_optim_rng.pt").root->Get("optimizer");
  } catch (const std::exception&) {
    return false;  // the index says what is wrong
  }
}

void ReadLegacyParam(const SourceIndex& L, int param, float* dst) {
  const auto& st = *static_cast<const LegacyState*>(L.keep_alive.get());
  const Item& item = st.model.items.at(param);
  std::fill(dst, dst + pt::Numel(item.size), 0.0f);  // read_param writes every element: what no box covers is zero
  for (const Local& x : st.model.locals) {
    if (!x.source || x.d.key != item.fqn) continue;
    const Rank& r = st.ranks[x.rank];
    const std::string record = r.model.prefix + "data/" + x.tensor.storage->key;
    const pt::ZipEntry* entry = r.model.archive->Find(record);
    if (!entry) throw Error(L.dir + "/" + L.files[r.model_file].name + ": no record " + record + " for '" + x.name + "'");
    r.model.archive->VerifyCrc(*entry);  // every byte read checked
    std::vector<float> local(x.tensor.numel());
    pt::ToFp32(x.tensor.data(), x.tensor.dtype, local.size(), local.data());
    int64_t base = 0;
    for (const Chunk& box : x.boxes) {
      dcp::ForEachRun(item.size, box, [&](int64_t src, int64_t dst_at, int64_t n) {
        std::memcpy(dst + dst_at, local.data() + base + src, 4 * static_cast<size_t>(n));
      });
      base += pt::Numel(box.sizes);
    }
  }
}

}  // namespace ucp::formats::megatron
