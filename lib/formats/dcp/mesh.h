// The mesh a DCP target is written for, and the box of each tensor every rank of it holds, as
// torchtitan's Llama lays its parameters out: DTensor tensor parallelism over tp, torchtitan's plan:
// Shard(0) for tok_embeddings, wq, wk, wv, w1, w3 and output (colwise), Shard(1) for wo and w2
// (rowwise), the norms replicated; then FSDP2 (`fully_shard`) over dp shards each rank's piece on
// its dimension 0 (on a dp x tp mesh a Shard(0) piece is cut again: _StridedShard, rows t * R/tp +
// d * R/(tp dp) of rank (d, t), as torch 2.6's own files of the real-dcp harness's tp2_fsdp2 run
// record them). A shard is torch.chunk's: ceil(n / parts) rows each, the trailing ranks holding fewer
// or none (an empty box at offset n). Rank r is (d, t) = (r / tp, r % tp), as init_device_mesh
// numbers ("dp", "tp").
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
// another dimension or a degree below 1.
Mesh ParseMesh(const std::string& text);

// One rank's box of a tensor: offsets and sizes in each dimension.
struct Box {
  std::vector<int64_t> offsets, sizes;
};

// Each rank's box of torchtitan's tensor `fqn` of `shape`, in rank order; ranks holding the same box
// (a norm on the ranks of a TP group) save it once (target.h).
std::vector<Box> BoxesOf(const Mesh& mesh, const std::string& fqn, const std::vector<int64_t>& shape);

}  // namespace ucp::formats::dcp
