// Megatron-Core's distributed optimizer in its dp_reshardable form: the fp32 masters and Adam's
// moments saved as Megatron's DDP holds them, one flat tensor per gradient bucket
// (`optimizer.distributed.dp_group_idx_<G>.gbuf_idx_<b>.dtype_(<param>, <grad>).bucket_idx_<k>.<state>`),
// one set per model-parallel domain G = tp + TP * pp. The files do not say which parameter lies
// where: the layout is rebuilt as Megatron-Core 0.17.1's _ParamAndGradBuffer builds it (the domain's
// parameters in reverse order, each starting at a multiple of 64 elements, a bucket closing after the
// parameter that ends it), then proven against what the files record: each bucket's unpadded size
// (per_bucket_numel_unpadded) and every chunk's extent in .metadata (Megatron saves each parameter's
// range, and each padding gap, as a chunk of its own). Anything that disagrees is refused by name.
// A Mixture-of-Experts model at EP > 1 has two distributed optimizers, which Megatron-LM chains
// (keys prefixed `chained_0.` and `chained_1.`): the dense parameters' over the model-parallel domains,
// the experts' over the expert domains G = etp + ETP * (ep + EP * pp), each holding its EP rank's
// experts (SequentialMLP's local experts, each expert's linear_fc1 then linear_fc2).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "formats/dcp/metadata.h"
#include "pt/value.h"

namespace ucp::formats::dcp {

// Whether a key is the distributed optimizer's bucket-flat state or objects: `optimizer.distributed.*`,
// `chained_<i>.optimizer.distributed.*` in a chain.
bool DistributedOptimizerKey(const std::string& key);

struct BucketDomain;
// `[chained_<i>.]optimizer.distributed.dp_group_idx_<G>.<rest>`: the domain, and `rest`; nullopt otherwise.
std::optional<BucketDomain> ParseDomainPrefix(const std::string& key, std::string* rest);

// A bucket-flat tensor key, parsed.
struct BucketKey {
  int chain = -1;  // the optimizer's place in Megatron-LM's chain (its `chained_<i>.` prefix); -1: one optimizer
  int domain = -1, gbuf = -1, bucket = -1;
  std::string param_dtype, grad_dtype;  // torch's names without "torch.": "bfloat16", "float32"
  std::string state;                    // "param" (the fp32 master), "exp_avg", "exp_avg_sq", ...
};
std::optional<BucketKey> ParseBucketKey(const std::string& fqn);

// One distributed optimizer's model-parallel domain: (chain, dp_group_idx).
struct BucketDomain {
  int chain = -1, index = 0;
  auto operator<=>(const BucketDomain&) const = default;
};
// Its keys' prefix: "optimizer.distributed.dp_group_idx_<index>", after "chained_<chain>." in a chain.
std::string DomainName(const BucketDomain& d);

// A domain's gradient buffer as Megatron records it (per_bucket_numel and per_bucket_numel_unpadded):
// its dtypes and each bucket's size with and without the padding to a multiple of lcm(DP, 128).
struct GradBuffer {
  std::string param_dtype, grad_dtype;
  std::vector<int64_t> unpadded, padded;
};

// The buffers of one domain from the two saved objects (a list over gbuf_idx of
// {(param dtype, grad dtype): [numel per bucket]}, as pickled, possibly inside a one-element list).
// Throws ucp::Error on any other shape.
std::vector<GradBuffer> ReadGradBuffers(const pt::Value& unpadded, const pt::Value& padded);

// The model-parallel grid the buckets were built on, from Megatron-LM's args.
struct BucketGrid {
  int tp = 1, pp = 1;
  std::vector<int> stage_of_layer;  // global layer -> its pipeline stage
  int experts = 0;                  // a Mixture-of-Experts model's experts per layer (0: dense)
  int ep = 1, etp = 1;              // its expert-parallel and expert tensor-parallel degrees
  int FirstLayer(int pp) const;      // the first global layer of stage `pp`
};

// Megatron-LM's args (`args`, from common.pt or a legacy rank file) as that grid: TP, PP and each
// layer's stage (even, or with the first / last stage's layer counts the args give). What would change
// the layout in ways not read here (virtual or custom pipeline layouts, Mixture of Experts unless
// `experts`, multi-token prediction, tied embeddings with PP > 1) is refused by name: `what` names the
// form refused ("the dp_reshardable buckets"), `remedy` what the user can do instead. With `experts`, a
// model of SequentialMLP experts in every layer is read (EP and expert TP from the args); grouped
// GEMM, shared experts and dense layers among MoE ones are refused by name.
BucketGrid GridFromArgs(const pt::Value* args, const std::string& what, const std::string& remedy, bool experts = false);

// A piece of an atomic parameter's state in a bucket: the domain's part of the model tensor (a
// layer's, a TP rank's), one or more boxes of the global tensor whose elements, box after box, each in
// row-major order, lie at [start, start + numel) of the bucket's flat tensor. A TP rank's part is
// several boxes where Megatron saves the parameter so: SwiGLU's linear_fc1, [gate; up] on each rank,
// is saved as gate and up chunks; rank t's boxes are then the t-th of each run of TP chunks.
struct BucketPiece {
  std::string fqn;  // the model key: the atomic parameter
  std::vector<Chunk> boxes;
  int64_t numel = 0;
  int chain = -1, domain = 0, gbuf = 0, bucket = 0;
  int64_t start = 0;
  bool source = true;  // false: a tensor every TP rank holds whole, read from tp 0's domain only
};

// The pieces of every parameter of every domain. `model` lists the model tensors (those with
// optimizer state in the buckets) in the order .metadata lists them, which is the order of the
// model's sharded_state_dict: its modules' order, as DDP's named_parameters walks them. Layer keys
// (`decoder.layers.*`, stacked on a leading axis) repeat per layer of the stage; the keys before them
// belong to the first stage, those after to the last. `buffers` are one optimizer's (chain -1) or a
// chain's dense (0) and expert (1) optimizers'. Throws ucp::Error naming the domain, the bucket and
// the parameter where the computed layout and the recorded sizes disagree.
std::vector<BucketPiece> LayOutBuckets(const std::vector<const Item*>& model, const BucketGrid& grid,
                                       const std::map<BucketDomain, std::vector<GradBuffer>>& buffers);

// The unpadded size of each gradient bucket of `domain`'s `dtype` buffer as Megatron-Core 0.17.1's
// _ParamAndGradBuffer closes them: a bucket ends after the parameter that brings it to `bucket_size`
// elements (none: one bucket; Megatron-LM's DDP has none without --overlap-grad-reduce, and on every
// pipeline stage but the first), each parameter starting at a multiple of 64. For the legacy
// distrib_optim.pt, which records only the buffer's total: the buckets' end padding is dropped there.
std::vector<int64_t> ComputeBucketSizes(const std::vector<const Item*>& model, const BucketGrid& grid, int domain,
                                        const std::string& dtype, std::optional<int64_t> bucket_size);

// Where a piece's elements lie in a bucket item's chunks: each chunk overlapping the piece
// must lie inside it (Megatron saves a parameter's range, cut only at DP shard edges, as chunks of
// its own), and together they must cover it. `fn(chunk, box_flat, numel)`: chunk `chunk` holds
// elements [box_flat, box_flat + numel) of the piece's box. Throws ucp::Error otherwise.
struct ChunkRun {
  size_t chunk = 0;
  int64_t box_flat = 0, numel = 0;
};
std::vector<ChunkRun> PieceChunks(const BucketPiece& piece, const Item& bucket);

}  // namespace ucp::formats::dcp
