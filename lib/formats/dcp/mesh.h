// The mesh a DCP target is written for, and the box of each tensor every rank of it holds, as
// torchtitan's Llama lays its parameters out: FSDP2 (`fully_shard`) shards every parameter on
// dimension 0 over dp; DTensor tensor parallelism over tp, torchtitan's plan: Shard(0) for
// tok_embeddings, wq, wk, wv, w1, w3 and output (colwise), Shard(1) for wo and w2 (rowwise), the
// norms replicated (plain tensors on every rank, saved once). A shard is torch.chunk's: ceil(n /
// parts) rows each, the trailing ranks holding fewer or none (an empty box at offset n).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ucp::formats::dcp {

struct Mesh {
  int64_t dp = 1, tp = 1;
  int64_t ranks() const { return dp * tp; }
  std::string text() const;  // "dp=2", "tp=2"
};

// --mesh: "dp=N", "tp=M" or "dp=N,tp=M" (empty: dp=1, one rank). Throws ucp::Error naming --mesh for
// another dimension, a degree below 1, or dp and tp both above 1 (FSDP2 over tensor parallelism is
// not written: its DTensors are strided shards, _StridedShard, whose chunks ucp has not checked).
Mesh ParseMesh(const std::string& text);

// One rank's box of a tensor: offsets and sizes in each dimension.
struct Box {
  std::vector<int64_t> offsets, sizes;
};

// The dimension the mesh shards torchtitan's tensor `fqn` on: 0 (FSDP2; colwise TP), 1 (rowwise
// TP), -1 (replicated: the norms under TP).
int ShardDim(const Mesh& mesh, const std::string& fqn);

// Each rank's box of a tensor of `shape` sharded on `dim` (ShardDim), in rank order; for dim -1 one
// box, the whole tensor, which one rank writes.
std::vector<Box> BoxesOf(const Mesh& mesh, int dim, const std::vector<int64_t>& shape);

}  // namespace ucp::formats::dcp
