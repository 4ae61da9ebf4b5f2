#include "formats/dcp/bucket_layout.h"

#include <algorithm>
#include <regex>

#include "core/error.h"
#include "source/source_index.h"

namespace ucp::formats::dcp {

using pt::Value;

std::optional<BucketKey> ParseBucketKey(const std::string& fqn) {
  static const std::regex key(
      R"(^optimizer\.distributed\.dp_group_idx_(\d{1,6})\.gbuf_idx_(\d{1,6})\.dtype_\(torch\.(\w+), torch\.(\w+)\)\.bucket_idx_(\d{1,6})\.(\w+)$)");
  std::smatch m;
  if (!std::regex_match(fqn, m, key)) return std::nullopt;
  BucketKey k;
  k.domain = std::stoi(m[1]), k.gbuf = std::stoi(m[2]), k.param_dtype = m[3], k.grad_dtype = m[4];
  k.bucket = std::stoi(m[5]), k.state = m[6];
  return k;
}

namespace {

// A saved object's value: Megatron's torch_dist keeps it inside a one-element list.
const Value& Unwrapped(const Value& v) {
  if (v.kind == Value::Kind::List && v.items.size() == 1 && v.items[0] && v.items[0]->kind == Value::Kind::List)
    return *v.items[0];
  return v;
}

std::string DtypeName(const Value& v) {
  if (v.kind != Value::Kind::Global || v.module != "torch") throw Error("a dtype key holds a " + v.TypeName() + ", not a torch dtype");
  return v.name;
}

// One buffer's entry: {(param dtype, grad dtype): [numel per bucket]}.
void ReadEntry(const Value& entry, std::string* param_dtype, std::string* grad_dtype, std::vector<int64_t>* sizes) {
  if (entry.kind != Value::Kind::Dict || entry.AsDict().size() != 1)
    throw Error("a buffer's entry is a " + entry.TypeName() + " of " + std::to_string(entry.kind == Value::Kind::Dict ? entry.AsDict().size() : 0) +
                " items, not one {(param dtype, grad dtype): [sizes]} (Megatron-Core supports one dtype per buffer)");
  const auto& item = entry.AsDict().items()[0];
  if (!item.key || item.key->kind != Value::Kind::Tuple || item.key->items.size() != 2 || !item.key->items[0] || !item.key->items[1])
    throw Error("a buffer's key is not a (param dtype, grad dtype) pair");
  *param_dtype = DtypeName(*item.key->items[0]), *grad_dtype = DtypeName(*item.key->items[1]);
  if (!item.value || !item.value->IsSequence() || item.value->items.empty()) throw Error("a buffer's bucket sizes are not a list");
  for (const auto& n : item.value->items) {
    if (!n || n->kind != Value::Kind::Int || n->i < 0) throw Error("a bucket size is not a non-negative integer");
    sizes->push_back(n->i);
  }
}

int64_t Pad64(int64_t n) { return (n + 63) / 64 * 64; }

std::string Where(const BucketPiece& p, const std::vector<int64_t>& size, bool stacked) {
  std::string s = "'" + p.fqn + "'";
  if (stacked) s += " layer " + std::to_string(p.boxes[0].offsets[0]);
  if (p.numel != pt::Numel(size) / (stacked ? std::max<int64_t>(size[0], 1) : 1))
    s += " (its part at " + pt::ShapeString(p.boxes[0].offsets) + " of size " + pt::ShapeString(p.boxes[0].sizes) + (p.boxes.size() > 1 ? " and more" : "") + ")";
  return s;
}

bool Stacked(const std::string& fqn) { return fqn.rfind("decoder.layers.", 0) == 0; }

// The domain's part of a key among `chunks` (one layer's, or a whole key's): the one chunk of a tensor
// every TP rank holds whole, or the TP rank's t-th of each run of TP chunks (sorted by offset).
BucketPiece PieceOfItem(const Item& item, const std::vector<const Chunk*>& chunks, int tp, int tp_size, const std::string& what) {
  BucketPiece p;
  p.fqn = item.fqn;
  std::vector<const Chunk*> sorted = chunks;
  std::sort(sorted.begin(), sorted.end(), [](const Chunk* a, const Chunk* b) { return a->offsets < b->offsets; });
  if (chunks.size() == 1) {  // whole on every TP rank
    p.boxes = {*sorted[0]}, p.source = tp == 0;
  } else if (tp_size == 1) {  // several chunks of one rank's tensor (SwiGLU's gate and up), in order
    for (const Chunk* c : sorted) p.boxes.push_back(*c);
  } else if (chunks.size() % tp_size == 0) {  // runs of TP chunks: the rank's t-th of each
    for (size_t j = 0; j < chunks.size() / tp_size; ++j) p.boxes.push_back(*sorted[j * tp_size + tp]);
  } else {
    throw Error("'" + item.fqn + "'" + what + " is saved in " + std::to_string(chunks.size()) + " chunks, neither whole nor a multiple of "
                "TP=" + std::to_string(tp_size) + ": which of them a domain's buckets hold is not known");
  }
  for (const Chunk& c : p.boxes) p.numel += pt::Numel(c.sizes);
  return p;
}

// The domain's parameters in the order DDP's named_parameters walks them.
std::vector<BucketPiece> DomainParams(const std::vector<const Item*>& model, const BucketGrid& g, int tp, int pp) {
  std::vector<const Item*> pre, layers, post;
  for (const Item* item : model)
    (Stacked(item->fqn) ? layers : layers.empty() ? pre : post).push_back(item);
  std::vector<BucketPiece> out;
  auto whole = [&](const Item* item) {
    std::vector<const Chunk*> chunks;
    for (const Chunk& c : item->chunks) chunks.push_back(&c);
    out.push_back(PieceOfItem(*item, chunks, tp, g.tp, ""));
  };
  if (pp == 0)
    for (const Item* item : pre) whole(item);
  for (size_t l = 0; l < g.stage_of_layer.size(); ++l) {
    if (g.stage_of_layer[l] != pp) continue;
    for (const Item* item : layers) {
      std::vector<const Chunk*> chunks;
      for (const Chunk& c : item->chunks)
        if (!c.offsets.empty() && c.offsets[0] == static_cast<int64_t>(l)) {
          if (c.sizes[0] != 1)
            throw Error("'" + item->fqn + "': a chunk at layer " + std::to_string(l) + " spans " + std::to_string(c.sizes[0]) +
                        " layers (Megatron-Core saves each layer of a stacked tensor as its own chunk)");
          chunks.push_back(&c);
        }
      if (chunks.empty()) continue;  // a layer without this module (a layer of another kind)
      out.push_back(PieceOfItem(*item, chunks, tp, g.tp, " at layer " + std::to_string(l)));
    }
  }
  if (pp == g.pp - 1)
    for (const Item* item : post) whole(item);
  return out;
}

}  // namespace

int BucketGrid::FirstLayer(int pp) const {
  return static_cast<int>(std::find(stage_of_layer.begin(), stage_of_layer.end(), pp) - stage_of_layer.begin());
}

BucketGrid GridFromArgs(const Value* args, const std::string& what, const std::string& remedy) {
  if (!args) throw Error("no args saved: the layout of " + what + " follows the job's TP, PP and layers");
  auto number = [&](const char* name, int64_t otherwise) { return source::ArgInt(args, name, otherwise); };
  auto set = [&](const char* name) { return source::ArgSet(args, name); };
  for (const char* name : {"num_layers_per_virtual_pipeline_stage", "virtual_pipeline_model_parallel_size", "pipeline_model_parallel_layout",
                           "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split", "num_experts", "mtp_num_layers"})
    if (set(name))
      throw Error(std::string("args.") + name + " is set: " + what + " of " +
                  (std::string(name).find("expert") != std::string::npos ? "Mixture-of-Experts models"
                   : std::string(name) == "mtp_num_layers" ? "multi-token prediction layers" : "virtual or custom pipeline layouts") +
                  " are not read yet; " + remedy);
  BucketGrid g;
  g.tp = static_cast<int>(number("tensor_model_parallel_size", 1));
  g.pp = static_cast<int>(number("pipeline_model_parallel_size", 1));
  const int64_t layers = number("num_layers", -1);
  if (g.tp < 1 || g.pp < 1 || g.tp > (1 << 16) || g.pp > (1 << 16) || layers < 1 || layers > (1 << 20))
    throw Error("args give TP=" + std::to_string(g.tp) + ", PP=" + std::to_string(g.pp) + ", num_layers=" + std::to_string(layers));
  if (g.pp > 1 && !set("untie_embeddings_and_output_weights"))
    throw Error("tied embeddings with PP=" + std::to_string(g.pp) + ": the last stage's copy of the word embeddings (" + what +
                " keep it apart) is not read yet; " + remedy);
  const int64_t first = number("decoder_first_pipeline_num_layers", -1), last = number("decoder_last_pipeline_num_layers", -1);
  std::vector<int64_t> count(g.pp, 0);
  int64_t rest = layers, middle = g.pp;
  if (g.pp > 1 && first >= 0) count[0] = first, rest -= first, --middle;
  if (g.pp > 1 && last >= 0) count[g.pp - 1] = last, rest -= last, --middle;
  if (rest < 0 || (middle == 0 ? rest != 0 : rest % middle != 0))
    throw Error("num_layers " + std::to_string(layers) + " does not split over PP=" + std::to_string(g.pp) + " stages as the args give");
  for (int p = 0; p < g.pp; ++p)
    if (!(g.pp > 1 && ((p == 0 && first >= 0) || (p == g.pp - 1 && last >= 0)))) count[p] = rest / middle;
  for (int p = 0; p < g.pp; ++p) g.stage_of_layer.insert(g.stage_of_layer.end(), count[p], p);
  return g;
}

std::vector<int64_t> ComputeBucketSizes(const std::vector<const Item*>& model, const BucketGrid& grid, int domain,
                                        const std::string& dtype, std::optional<int64_t> bucket_size) {
  std::map<std::string, const Item*> by_fqn;
  for (const Item* item : model) by_fqn[item->fqn] = item;
  const std::vector<BucketPiece> params = DomainParams(model, grid, domain % grid.tp, domain / grid.tp);
  std::vector<int64_t> sizes;
  int64_t pos = 0;
  bool open = false;
  for (size_t i = params.size(); i-- > 0;) {  // DDP walks the parameters in reverse
    if (by_fqn.at(params[i].fqn)->dtype != dtype) continue;
    if (params[i].numel == 0) continue;
    pos = Pad64(pos) + params[i].numel, open = true;
    if (bucket_size && pos >= *bucket_size) sizes.push_back(pos), pos = 0, open = false;
  }
  if (open) sizes.push_back(pos);
  return sizes;
}

std::vector<GradBuffer> ReadGradBuffers(const Value& unpadded, const Value& padded) {
  const Value& u = Unwrapped(unpadded);
  const Value& p = Unwrapped(padded);
  if (!u.IsSequence() || !p.IsSequence() || u.items.size() != p.items.size() || u.items.empty())
    throw Error("per_bucket_numel_unpadded and per_bucket_numel are not two lists over the same buffers");
  std::vector<GradBuffer> out(u.items.size());
  for (size_t b = 0; b < u.items.size(); ++b) {
    if (!u.items[b] || !p.items[b]) throw Error("buffer " + std::to_string(b) + " is None");
    std::string pd, gd;
    ReadEntry(*u.items[b], &out[b].param_dtype, &out[b].grad_dtype, &out[b].unpadded);
    ReadEntry(*p.items[b], &pd, &gd, &out[b].padded);
    if (pd != out[b].param_dtype || gd != out[b].grad_dtype || out[b].padded.size() != out[b].unpadded.size())
      throw Error("buffer " + std::to_string(b) + ": per_bucket_numel and per_bucket_numel_unpadded disagree on its dtypes or bucket count");
    for (size_t k = 0; k < out[b].padded.size(); ++k)
      if (out[b].padded[k] < out[b].unpadded[k] || out[b].padded[k] % 128 != 0)
        throw Error("buffer " + std::to_string(b) + " bucket " + std::to_string(k) + ": " + std::to_string(out[b].padded[k]) +
                    " elements padded, " + std::to_string(out[b].unpadded[k]) + " unpadded (Megatron pads a bucket to a multiple of lcm(DP, 128))");
  }
  return out;
}

std::vector<BucketPiece> LayOutBuckets(const std::vector<const Item*>& model, const BucketGrid& grid,
                                       const std::map<int, std::vector<GradBuffer>>& buffers) {
  std::map<std::string, const Item*> by_fqn;
  for (const Item* item : model) by_fqn[item->fqn] = item;
  for (int d = 0; d < grid.tp * grid.pp; ++d)
    if (!buffers.count(d))
      throw Error("no per_bucket_numel_unpadded of dp_group_idx_" + std::to_string(d) + " (tp=" + std::to_string(d % grid.tp) + ", pp=" +
                  std::to_string(d / grid.tp) + "): the files of that model-parallel domain are missing (TP=" + std::to_string(grid.tp) +
                  ", PP=" + std::to_string(grid.pp) + " by the args)");
  std::vector<BucketPiece> out;
  for (const auto& [domain, bufs] : buffers) {
    if (domain >= grid.tp * grid.pp)
      throw Error("dp_group_idx_" + std::to_string(domain) + " beyond the TP=" + std::to_string(grid.tp) + " x PP=" + std::to_string(grid.pp) +
                  " domains the args give");
    const std::string where = "dp_group_idx_" + std::to_string(domain) + " (tp=" + std::to_string(domain % grid.tp) + ", pp=" +
                              std::to_string(domain / grid.tp) + ")";
    std::vector<BucketPiece> params = DomainParams(model, grid, domain % grid.tp, domain / grid.tp);
    std::vector<bool> placed(params.size(), false);
    for (size_t b = 0; b < bufs.size(); ++b) {
      const GradBuffer& buf = bufs[b];
      for (size_t c = 0; c < b; ++c)
        if (bufs[c].param_dtype == buf.param_dtype)
          throw Error(where + ": two gradient buffers of " + buf.param_dtype + " parameters (gbuf_idx_" + std::to_string(c) + " and " +
                      std::to_string(b) + "): several model chunks (virtual pipeline stages) are not read yet");
      size_t k = 0;
      int64_t pos = 0;
      for (size_t i = params.size(); i-- > 0;) {  // DDP walks the parameters in reverse
        BucketPiece& p = params[i];
        const Item& item = *by_fqn.at(p.fqn);
        if (item.dtype != buf.param_dtype) continue;
        placed[i] = true;
        const int64_t n = p.numel;
        if (n == 0) continue;
        if (k < buf.unpadded.size() && pos > 0 && Pad64(pos) + n > buf.unpadded[k] && Pad64(pos) == buf.unpadded[k]) ++k, pos = 0;  // a bucket closed before it
        const std::string bucket = where + " gbuf_idx_" + std::to_string(b) + " bucket_idx_" + std::to_string(k);
        if (k >= buf.unpadded.size())
          throw Error(where + " gbuf_idx_" + std::to_string(b) + ": " + Where(p, item.size, Stacked(p.fqn)) + " lies past the " +
                      std::to_string(buf.unpadded.size()) + " recorded buckets: the parameters computed for this domain are more "
                      "than its buffer holds (a model tensor that is not a trained parameter: a buffer, a frozen weight?)");
        p.start = Pad64(pos), p.domain = domain, p.gbuf = static_cast<int>(b), p.bucket = static_cast<int>(k);
        if (p.start + n > buf.unpadded[k])
          throw Error(bucket + ": " + Where(p, item.size, Stacked(p.fqn)) + " would end at element " + std::to_string(p.start + n) +
                      ", past the bucket's recorded " + std::to_string(buf.unpadded[k]) + " (per_bucket_numel_unpadded): the layout "
                      "computed here is not the one the files were saved with");
        pos = p.start + n;
        out.push_back(p);
        if (pos == buf.unpadded[k]) ++k, pos = 0;
      }
      if (k != buf.unpadded.size() || pos != 0)
        throw Error(where + " gbuf_idx_" + std::to_string(b) + ": the domain's " + buf.param_dtype + " parameters fill " +
                    (k < buf.unpadded.size() ? std::to_string(pos) + " elements of bucket_idx_" + std::to_string(k) + ", recorded " +
                                                   std::to_string(buf.unpadded[k])
                                             : std::to_string(k) + " buckets") +
                    " (per_bucket_numel_unpadded): the layout computed here is not the one the files were saved with (a model tensor "
                    "missing, or a parameter the checkpoint does not save)");
    }
    for (size_t i = 0; i < params.size(); ++i)
      if (!placed[i])
        throw Error(where + ": " + Where(params[i], by_fqn.at(params[i].fqn)->size, Stacked(params[i].fqn)) + " is " +
                    by_fqn.at(params[i].fqn)->dtype + ", and no gradient buffer of the domain holds " + by_fqn.at(params[i].fqn)->dtype +
                    " parameters");
  }
  return out;
}

std::vector<ChunkRun> PieceChunks(const BucketPiece& piece, const Item& bucket) {
  const int64_t begin = piece.start, end = piece.start + piece.numel;
  std::vector<ChunkRun> runs;
  for (size_t c = 0; c < bucket.chunks.size(); ++c) {
    const int64_t o = bucket.chunks[c].offsets.at(0), n = bucket.chunks[c].sizes.at(0);
    if (o + n <= begin || o >= end || n == 0) continue;
    if (o < begin || o + n > end)
      throw Error("'" + bucket.fqn + "': its chunk at [" + std::to_string(o) + ", " + std::to_string(o + n) + ") crosses the edge of '" +
                  piece.fqn + "' at " + pt::ShapeString(piece.boxes.at(0).offsets) + ", which the layout computed here puts at [" +
                  std::to_string(begin) + ", " + std::to_string(end) + "): Megatron saves each parameter's range as chunks of its own, "
                  "so the layout is not the one the files were saved with");
    runs.push_back({c, o - begin, n});
  }
  std::sort(runs.begin(), runs.end(), [](const ChunkRun& a, const ChunkRun& b) { return a.box_flat < b.box_flat; });
  int64_t at = 0;
  for (const ChunkRun& r : runs) {
    if (r.box_flat != at) break;
    at += r.numel;
  }
  if (at != end - begin)
    throw Error("'" + bucket.fqn + "': its chunks do not cover '" + piece.fqn + "' at " + pt::ShapeString(piece.boxes.at(0).offsets) + " ([" +
                std::to_string(begin) + ", " + std::to_string(end) + ") of the bucket): elements from " + std::to_string(begin + at) +
                " on are in no chunk (a DP rank's file missing from .metadata?)");
  return runs;
}

}  // namespace ucp::formats::dcp
