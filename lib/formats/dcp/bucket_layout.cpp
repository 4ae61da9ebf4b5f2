#include "formats/dcp/bucket_layout.h"

#include <algorithm>
#include <regex>
#include <set>

#include "core/error.h"
#include "source/megatron_stacking.h"
#include "source/source_index.h"

namespace ucp::formats::dcp {

using pt::Value;

bool DistributedOptimizerKey(const std::string& key) {
  static const std::string distributed = "optimizer.distributed.";
  if (key.rfind(distributed, 0) == 0) return true;
  if (key.rfind("chained_", 0) != 0) return false;
  size_t i = 8;
  while (i < key.size() && i < 12 && key[i] >= '0' && key[i] <= '9') ++i;
  return i > 8 && key.compare(i, distributed.size() + 1, "." + distributed) == 0;
}

std::optional<BucketDomain> ParseDomainPrefix(const std::string& key, std::string* rest) {
  // Megatron writes the numbers as Python's str(int): no leading zeros, so each domain has one spelling
  static const std::regex prefix(R"(^(?:chained_(0|[1-9]\d{0,2})\.)?optimizer\.distributed\.dp_group_idx_(0|[1-9]\d{0,5})\.(.+)$)");
  std::smatch m;
  if (!std::regex_match(key, m, prefix)) return std::nullopt;
  *rest = m[3];
  return BucketDomain{m[1].matched ? std::stoi(m[1]) : -1, std::stoi(m[2])};
}

std::optional<BucketKey> ParseBucketKey(const std::string& fqn) {
  static const std::regex key(R"(^gbuf_idx_(0|[1-9]\d{0,5})\.dtype_\(torch\.(\w+), torch\.(\w+)\)\.bucket_idx_(0|[1-9]\d{0,5})\.(\w+)$)");
  std::string rest;
  const auto domain = ParseDomainPrefix(fqn, &rest);
  std::smatch m;
  if (!domain || !std::regex_match(rest, m, key)) return std::nullopt;
  BucketKey k;
  k.chain = domain->chain, k.domain = domain->index;
  k.gbuf = std::stoi(m[1]), k.param_dtype = m[2], k.grad_dtype = m[3], k.bucket = std::stoi(m[4]), k.state = m[5];
  return k;
}

std::string DomainName(const BucketDomain& d) {
  return (d.chain >= 0 ? "chained_" + std::to_string(d.chain) + "." : std::string()) + "optimizer.distributed.dp_group_idx_" + std::to_string(d.index);
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

bool Stacked(const std::string& fqn) { return source::StackedDims(fqn) >= 1; }

// SequentialMLP's experts, stacked [layers, experts, ...].
bool Expert(const std::string& fqn) { return source::StackedDims(fqn) == 2; }

// Which parameters one distributed optimizer holds: all (one optimizer), or in Megatron-LM's chain at
// EP > 1 the dense ones (chained_0) or the experts' (chained_1).
enum class Holds { All, Dense, Experts };

std::string Where(const BucketPiece& p, const std::vector<int64_t>& size, bool stacked) {
  std::string s = "'" + p.fqn + "'";
  if (stacked) s += " layer " + std::to_string(p.boxes[0].offsets[0]);
  const bool expert = Expert(p.fqn) && size.size() >= 2;
  if (expert) s += ", expert " + std::to_string(p.boxes[0].offsets[1]);
  const int64_t per = stacked ? std::max<int64_t>(size[0], 1) * (expert ? std::max<int64_t>(size[1], 1) : 1) : 1;
  if (p.numel != pt::Numel(size) / per)
    s += " (its part at " + pt::ShapeString(p.boxes[0].offsets) + " of size " + pt::ShapeString(p.boxes[0].sizes) + (p.boxes.size() > 1 ? " and more" : "") + ")";
  return s;
}

Holds HoldsOf(int chain) { return chain < 0 ? Holds::All : chain == 0 ? Holds::Dense : Holds::Experts; }

int DomainCount(const BucketGrid& g, Holds holds) { return holds == Holds::Experts ? g.etp * g.ep * g.pp : g.tp * g.pp; }

// A domain's ranks: the model-parallel domain tp + TP pp; the experts' etp + ETP (ep + EP pp).
struct DomainRanks {
  int tp = 0, ep = 0, pp = 0;  // tp: the expert TP rank in the experts' domains
};
DomainRanks RanksOf(const BucketGrid& g, Holds holds, int index) {
  if (holds == Holds::Experts) return {index % g.etp, index / g.etp % g.ep, index / (g.etp * g.ep)};
  return {index % g.tp, 0, index / g.tp};
}

// The degrees the args give, as the messages say them: "TP=2, PP=1" (and ", EP=2, expert TP=2" for the experts').
std::string Degrees(const BucketGrid& g, Holds holds) {
  return "TP=" + std::to_string(g.tp) + ", PP=" + std::to_string(g.pp) +
         (holds == Holds::Experts ? ", EP=" + std::to_string(g.ep) + ", expert TP=" + std::to_string(g.etp) : std::string());
}

// A domain as the messages name it: its keys' prefix and its ranks.
std::string DomainWhere(const BucketGrid& g, const BucketDomain& d) {
  const DomainRanks r = RanksOf(g, HoldsOf(d.chain), d.index);
  if (HoldsOf(d.chain) == Holds::Experts)
    return DomainName(d) + " (the experts' optimizer: expert tp=" + std::to_string(r.tp) + ", ep=" + std::to_string(r.ep) + ", pp=" + std::to_string(r.pp) + ")";
  return DomainName(d) + " (tp=" + std::to_string(r.tp) + ", pp=" + std::to_string(r.pp) + ")";
}

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

// The domain's parameters in the order DDP's named_parameters walks them: of the domain `index` of
// the optimizer that `holds` them. A layer's experts come where their keys first come, each expert's
// parameters together (local_experts.<e>.linear_fc1, then .linear_fc2), the EP rank's experts only.
std::vector<BucketPiece> DomainParams(const std::vector<const Item*>& model, const BucketGrid& g, Holds holds, int index) {
  const bool only_experts = holds == Holds::Experts;
  const DomainRanks r = RanksOf(g, holds, index);
  const int tp = r.tp, pp = r.pp;
  const int local = g.experts / std::max(g.ep, 1), first = only_experts ? r.ep * local : 0;
  const int count = only_experts ? local : g.experts;
  std::vector<const Item*> pre, layers, post;
  for (const Item* item : model)
    (Stacked(item->fqn) ? layers : layers.empty() ? pre : post).push_back(item);
  std::vector<BucketPiece> out;
  auto whole = [&](const Item* item) {
    std::vector<const Chunk*> chunks;
    for (const Chunk& c : item->chunks) chunks.push_back(&c);
    out.push_back(PieceOfItem(*item, chunks, tp, g.tp, ""));
  };
  // A layer's experts: each expert's parameters, in the keys' order.
  auto experts = [&](size_t l) {
    for (int e = first; e < first + count; ++e)
      for (const Item* item : layers) {
        if (!Expert(item->fqn)) continue;
        if (item->size.size() < 2 || item->size[1] != g.experts)
          throw Error("'" + item->fqn + "' is " + pt::ShapeString(item->size) + ", not [layers, " + std::to_string(g.experts) +
                      " experts, ...] as args.num_experts gives");
        std::vector<const Chunk*> chunks;
        for (const Chunk& c : item->chunks)
          if (c.offsets.size() >= 2 && c.offsets[0] == static_cast<int64_t>(l) && c.offsets[1] == e) {
            if (c.sizes[0] != 1 || c.sizes[1] != 1)
              throw Error("'" + item->fqn + "': a chunk at layer " + std::to_string(l) + ", expert " + std::to_string(e) +
                          " spans several layers or experts (Megatron-Core saves each expert of each layer as its own chunk)");
            chunks.push_back(&c);
          }
        if (chunks.empty()) continue;
        out.push_back(PieceOfItem(*item, chunks, tp, holds == Holds::All ? g.tp : g.etp,
                                  " at layer " + std::to_string(l) + ", expert " + std::to_string(e)));
      }
  };
  if (pp == 0 && !only_experts)
    for (const Item* item : pre) whole(item);
  for (size_t l = 0; l < g.stage_of_layer.size(); ++l) {
    if (g.stage_of_layer[l] != pp) continue;
    bool experts_done = false;
    for (const Item* item : layers) {
      if (Expert(item->fqn)) {
        if (g.experts == 0)
          throw Error("'" + item->fqn + "' holds experts, and the args give no num_experts (or the layout was read without them): "
                      "which expert lies in which bucket is not known");
        if (holds != Holds::Dense && !experts_done) experts(l);
        experts_done = true;
        continue;
      }
      if (only_experts) continue;
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
  if (pp == g.pp - 1 && !only_experts)
    for (const Item* item : post) whole(item);
  return out;
}

}  // namespace

int BucketGrid::FirstLayer(int pp) const {
  return static_cast<int>(std::find(stage_of_layer.begin(), stage_of_layer.end(), pp) - stage_of_layer.begin());
}

BucketGrid GridFromArgs(const Value* args, const std::string& what, const std::string& remedy, bool experts) {
  if (!args) throw Error("no args saved: the layout of " + what + " follows the job's TP, PP and layers");
  auto number = [&](const char* name, int64_t otherwise) { return source::ArgInt(args, name, otherwise); };
  auto set = [&](const char* name) { return source::ArgSet(args, name); };
  for (const char* name : {"num_layers_per_virtual_pipeline_stage", "virtual_pipeline_model_parallel_size", "pipeline_model_parallel_layout",
                           "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split", "num_experts", "mtp_num_layers"})
    if (set(name) && !(experts && std::string(name) == "num_experts"))
      throw Error(std::string("args.") + name + " is set: " + what + " of " +
                  (std::string(name).find("expert") != std::string::npos ? "Mixture-of-Experts models"
                   : std::string(name) == "mtp_num_layers" ? "multi-token prediction layers" : "virtual or custom pipeline layouts") +
                  " are not read yet; " + remedy);
  BucketGrid g;
  g.tp = static_cast<int>(number("tensor_model_parallel_size", 1));
  g.pp = static_cast<int>(number("pipeline_model_parallel_size", 1));
  const int64_t layers = number("num_layers", -1);
  if (g.tp < 1 || g.pp < 1 || g.tp > (1 << 16) || g.pp > (1 << 16) || int64_t{g.tp} * g.pp > (1 << 20) || layers < 1 || layers > (1 << 20))
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
  if (experts && set("num_experts")) {
    for (const char* name : {"moe_grouped_gemm", "moe_shared_expert_intermediate_size", "moe_use_legacy_grouped_gemm"})
      if (set(name))
        throw Error(std::string("args.") + name + " is set: " + what + " of SequentialMLP experts are read, not of grouped-GEMM or shared "
                    "experts; " + remedy);
    if (auto freq = args->Get("moe_layer_freq"); freq && freq->kind != Value::Kind::None && !(freq->kind == Value::Kind::Int && freq->i == 1))
      throw Error("args.moe_layer_freq is not 1: " + what + " of dense layers among Mixture-of-Experts ones are not read yet; " + remedy);
    g.experts = static_cast<int>(number("num_experts", 0));
    g.ep = static_cast<int>(number("expert_model_parallel_size", 1));
    g.etp = static_cast<int>(number("expert_tensor_parallel_size", g.tp));
    if (g.experts < 1 || g.experts > (1 << 16) || g.ep < 1 || g.etp < 1 || g.ep > (1 << 16) || g.etp > (1 << 16) ||
        int64_t{g.etp} * g.ep * g.pp > (1 << 20))
      throw Error("args give num_experts=" + std::to_string(g.experts) + ", EP=" + std::to_string(g.ep) + ", expert TP=" + std::to_string(g.etp) +
                  ": out of range");
    if (g.experts % g.ep != 0)
      throw Error("args give num_experts=" + std::to_string(g.experts) + " and EP=" + std::to_string(g.ep) + ": EP does not divide the experts");
    if (g.ep == 1 && g.etp != g.tp)
      throw Error("args give expert TP=" + std::to_string(g.etp) + " and TP=" + std::to_string(g.tp) + " at EP=1: " + what +
                  " of experts at their own TP with no expert parallelism are not read yet; " + remedy);
  }
  return g;
}

std::vector<int64_t> ComputeBucketSizes(const std::vector<const Item*>& model, const BucketGrid& grid, int domain,
                                        const std::string& dtype, std::optional<int64_t> bucket_size) {
  std::map<std::string, const Item*> by_fqn;
  for (const Item* item : model) by_fqn[item->fqn] = item;
  if (grid.experts > 0)  // (the legacy reader's: its experts are refused before)
    throw Error("the bucket sizes of a Mixture-of-Experts model are not computed here: they are read from the files");
  const std::vector<BucketPiece> params = DomainParams(model, grid, Holds::All, domain);
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
                                       const std::map<BucketDomain, std::vector<GradBuffer>>& buffers) {
  std::map<std::string, const Item*> by_fqn;
  for (const Item* item : model) by_fqn[item->fqn] = item;
  std::set<int> chains;
  for (const auto& entry : buffers) chains.insert(entry.first.chain);
  const bool chained = grid.experts > 0 && grid.ep > 1;  // Megatron-LM's get_megatron_optimizer chains the experts' own optimizer
  std::string held;  // what the files hold, in words
  for (int c : chains) held += (held.empty() ? "" : ", ") + (c < 0 ? std::string("one optimizer's (no prefix)") : "chained_" + std::to_string(c) + ".");
  if (!buffers.empty() && chains != (chained ? std::set<int>{0, 1} : std::set<int>{-1}))
    throw Error(chained ? "the args give EP=" + std::to_string(grid.ep) + " (Mixture of Experts), where Megatron-LM chains a dense and an "
                          "expert distributed optimizer (chained_0., chained_1.); the files hold the buckets of " + held
                        : "the files hold the buckets of " + held + ", where the args give " + (grid.experts > 0 ? "EP=1" : "no experts") +
                              " and Megatron-LM builds one optimizer");
  for (int chain : chains)
    for (int d = 0; d < DomainCount(grid, HoldsOf(chain)); ++d)
      if (!buffers.count({chain, d}))
        throw Error("no per_bucket_numel_unpadded of " + DomainWhere(grid, {chain, d}) + ": the files of that model-parallel domain are "
                    "missing (" + Degrees(grid, HoldsOf(chain)) + " by the args)");
  std::vector<BucketPiece> out;
  for (const auto& [domain, bufs] : buffers) {
    const Holds holds = HoldsOf(domain.chain);
    if (domain.index >= DomainCount(grid, holds))
      throw Error(DomainName(domain) + " beyond the " + std::to_string(DomainCount(grid, holds)) + " domains the args give (" +
                  Degrees(grid, holds) + ")");
    const std::string where = DomainWhere(grid, domain);
    std::vector<BucketPiece> params = DomainParams(model, grid, holds, domain.index);
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
        p.start = Pad64(pos), p.chain = domain.chain, p.domain = domain.index, p.gbuf = static_cast<int>(b), p.bucket = static_cast<int>(k);
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
