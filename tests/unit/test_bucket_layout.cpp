// Megatron-Core's dp_reshardable buckets (formats/dcp/bucket_layout.h): each way the files can
// disagree with the layout rebuilt from the model's tensors is refused naming the domain, the
// bucket and the parameter. (The layout itself is checked against Megatron's own files: the
// real_mcore test converts each dp_reshardable case and compares it with the fully_reshardable save
// of the same state.)
#include <catch2/catch.hpp>

#include <functional>
#include <map>
#include <tuple>
#include <string>

#include "core/error.h"
#include "formats/dcp/bucket_layout.h"

using namespace ucp;
using namespace ucp::formats::dcp;

namespace {

// A model tensor of `size`, saved whole (one chunk), in bf16.
Item Whole(const std::string& fqn, std::vector<int64_t> size) {
  Item i;
  i.fqn = fqn, i.tensor = true, i.dtype = "bfloat16", i.size = size;
  i.chunks.push_back({std::vector<int64_t>(size.size(), 0), size});
  return i;
}

// A bucket tensor of `numel` elements saved in chunks of the given [offset, size) ranges.
Item Bucket(int64_t numel, std::vector<std::pair<int64_t, int64_t>> ranges) {
  Item i;
  i.fqn = "optimizer.distributed.dp_group_idx_0.gbuf_idx_0.dtype_(torch.bfloat16, torch.float32).bucket_idx_0.param";
  i.tensor = true, i.dtype = "float32", i.size = {numel};
  for (auto [o, n] : ranges) i.chunks.push_back({{o}, {n}});
  return i;
}

std::string Refusal(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

GradBuffer Buffer(std::vector<int64_t> unpadded) {
  GradBuffer b;
  b.param_dtype = "bfloat16", b.grad_dtype = "float32", b.unpadded = unpadded;
  for (int64_t n : unpadded) b.padded.push_back((n + 127) / 128 * 128);
  return b;
}

}  // namespace

TEST_CASE("bucket layout: a parameter starts at a multiple of 64, in reverse order", "[reader]") {
  // named_parameters order: a (48), b (100); DDP walks b first: b at 0, a at pad64(100) = 128.
  Item a = Whole("embedding.a", {48}), b = Whole("output.b", {10, 10});
  BucketGrid g;
  g.stage_of_layer = {};
  auto pieces = LayOutBuckets({&a, &b}, g, {{{-1, 0}, {Buffer({176})}}});
  REQUIRE(pieces.size() == 2);
  CHECK(pieces[0].fqn == "output.b");
  CHECK(pieces[0].start == 0);
  CHECK(pieces[1].fqn == "embedding.a");
  CHECK(pieces[1].start == 128);
}

TEST_CASE("bucket layout: sizes that disagree with per_bucket_numel_unpadded are refused by name", "[reader]") {
  Item a = Whole("embedding.a", {48}), b = Whole("output.b", {10, 10});
  BucketGrid g;
  std::string e = Refusal([&] { LayOutBuckets({&a, &b}, g, {{{-1, 0}, {Buffer({240})}}}); });
  CHECK(e.find("dp_group_idx_0") != std::string::npos);
  CHECK(e.find("fill 176 elements of bucket_idx_0, recorded 240") != std::string::npos);
  e = Refusal([&] { LayOutBuckets({&a, &b}, g, {{{-1, 0}, {Buffer({160})}}}); });
  CHECK(e.find("'embedding.a'") != std::string::npos);
  CHECK(e.find("past the bucket's recorded 160") != std::string::npos);
}

TEST_CASE("bucket layout: a missing model-parallel domain is refused by name", "[reader]") {
  Item a = Whole("embedding.a", {64});
  BucketGrid g;
  g.tp = 2;
  std::string e = Refusal([&] { LayOutBuckets({&a}, g, {{{-1, 0}, {Buffer({64})}}}); });
  CHECK(e.find("dp_group_idx_1 (tp=1, pp=0)") != std::string::npos);
  CHECK(e.find("missing") != std::string::npos);
}

TEST_CASE("bucket layout: a chunk crossing a parameter's edge is refused; a gap left uncovered too", "[reader]") {
  BucketPiece p;
  p.fqn = "output.b", p.boxes = {{{0, 0}, {10, 10}}}, p.numel = 100, p.start = 128;
  Item fits = Bucket(228, {{0, 100}, {128, 50}, {178, 50}});
  auto runs = PieceChunks(p, fits);
  REQUIRE(runs.size() == 2);
  CHECK(runs[0].box_flat == 0);
  CHECK(runs[1].box_flat == 50);
  Item crosses = Bucket(228, {{0, 150}, {150, 78}});
  CHECK(Refusal([&] { PieceChunks(p, crosses); }).find("crosses the edge of 'output.b'") != std::string::npos);
  Item gap = Bucket(228, {{0, 100}, {128, 50}});
  CHECK(Refusal([&] { PieceChunks(p, gap); }).find("elements from 178 on are in no chunk") != std::string::npos);
}

TEST_CASE("bucket keys parse as Megatron-Core 0.17 names them", "[reader]") {
  auto k = ParseBucketKey("optimizer.distributed.dp_group_idx_3.gbuf_idx_1.dtype_(torch.bfloat16, torch.float32).bucket_idx_2.exp_avg");
  REQUIRE(k);
  CHECK(k->domain == 3);
  CHECK(k->gbuf == 1);
  CHECK(k->bucket == 2);
  CHECK(k->param_dtype == "bfloat16");
  CHECK(k->state == "exp_avg");
  CHECK(!ParseBucketKey("optimizer.distributed.dp_group_idx_0.per_bucket_numel/shard_0_1"));
}

TEST_CASE("bucket keys of a chained optimizer carry its place in the chain", "[reader]") {
  auto k = ParseBucketKey("chained_1.optimizer.distributed.dp_group_idx_1.gbuf_idx_0.dtype_(torch.bfloat16, torch.float32).bucket_idx_0.param");
  REQUIRE(k);
  CHECK(k->chain == 1);
  CHECK(k->domain == 1);
  CHECK(ParseBucketKey("optimizer.distributed.dp_group_idx_1.gbuf_idx_0.dtype_(torch.bfloat16, torch.float32).bucket_idx_0.param")->chain == -1);
  CHECK(DomainName({1, 2}) == "chained_1.optimizer.distributed.dp_group_idx_2");
}

namespace {

// Stacked SequentialMLP experts [1 layer, 4 experts, rows, cols], each expert of the layer its own chunk.
Item Experts(const std::string& fqn, int64_t rows, int64_t cols) {
  Item i;
  i.fqn = fqn, i.tensor = true, i.dtype = "bfloat16", i.size = {1, 4, rows, cols};
  for (int64_t e = 0; e < 4; ++e) i.chunks.push_back({{0, e, 0, 0}, {1, 1, rows, cols}});
  return i;
}

}  // namespace

TEST_CASE("bucket layout: a chain's expert optimizer holds its EP rank's experts, each expert's parameters together", "[reader]") {
  // A layer of 4 experts at EP 2: the experts' domain 1 holds experts 2 and 3. DDP's named_parameters:
  // local_experts.0.linear_fc1 (2x3 = 6), .0.linear_fc2 (3x2 = 6), .1.linear_fc1, .1.linear_fc2, walked in
  // reverse: expert 3's fc2 at 0, its fc1 at 64, expert 2's fc2 at 128, fc1 at 192 (each at a multiple of 64).
  Item router = Whole("decoder.layers.mlp.router.weight", {1, 4, 2});
  router.chunks = {{{0, 0, 0}, {1, 4, 2}}};
  Item fc1 = Experts("decoder.layers.mlp.experts.experts.linear_fc1.weight", 2, 3);
  Item fc2 = Experts("decoder.layers.mlp.experts.experts.linear_fc2.weight", 3, 2);
  BucketGrid g;
  g.stage_of_layer = {0}, g.experts = 4, g.ep = 2;
  std::map<BucketDomain, std::vector<GradBuffer>> buffers{
      {{0, 0}, {Buffer({8})}}, {{1, 0}, {Buffer({198})}}, {{1, 1}, {Buffer({198})}}};
  auto pieces = LayOutBuckets({&router, &fc1, &fc2}, g, buffers);
  std::vector<std::tuple<int, int, std::string, int64_t, int64_t>> got;  // chain, domain, key, expert, start
  for (const BucketPiece& p : pieces)
    got.emplace_back(p.chain, p.domain, p.fqn.substr(p.fqn.rfind('.', p.fqn.size() - 8) + 1), p.fqn.find("experts") != std::string::npos ? p.boxes[0].offsets[1] : -1, p.start);
  using T = std::tuple<int, int, std::string, int64_t, int64_t>;
  CHECK(got == std::vector<T>{{0, 0, "router.weight", -1, 0},
                              {1, 0, "linear_fc2.weight", 1, 0}, {1, 0, "linear_fc1.weight", 1, 64},
                              {1, 0, "linear_fc2.weight", 0, 128}, {1, 0, "linear_fc1.weight", 0, 192},
                              {1, 1, "linear_fc2.weight", 3, 0}, {1, 1, "linear_fc1.weight", 3, 64},
                              {1, 1, "linear_fc2.weight", 2, 128}, {1, 1, "linear_fc1.weight", 2, 192}});
  // One optimizer's buckets where the args give EP 2 (Megatron-LM chains the experts' own): refused.
  std::string e = Refusal([&] { LayOutBuckets({&router, &fc1, &fc2}, g, {{{-1, 0}, {Buffer({8})}}}); });
  CHECK(e.find("chains a dense and an expert distributed optimizer") != std::string::npos);
  // The expert domain of EP rank 1 missing: refused naming it.
  buffers.erase({1, 1});
  e = Refusal([&] { LayOutBuckets({&router, &fc1, &fc2}, g, buffers); });
  CHECK(e.find("chained_1.optimizer.distributed.dp_group_idx_1 (the experts' optimizer: expert tp=0, ep=1, pp=0)") != std::string::npos);
}

TEST_CASE("bucket layout: expert TP 2 takes each expert's gate and up rows of its rank; experts at PP 2 by stage", "[reader]") {
  // 2 layers of 4 experts, EP 2, expert TP 2, PP 2 (a layer a stage): the experts' domain etp + 2 (ep + 2 pp).
  // linear_fc1 [2, 4, 8, 3] saved per (layer, expert) as gate and up halves, each cut in 2 by expert TP:
  // row chunks 0, 2, 4, 6 of 2 rows; expert TP rank 1 holds rows 2-3 (gate) and 6-7 (up).
  Item fc1;
  fc1.fqn = "decoder.layers.mlp.experts.experts.linear_fc1.weight", fc1.tensor = true, fc1.dtype = "bfloat16", fc1.size = {2, 4, 8, 3};
  for (int64_t l = 0; l < 2; ++l)
    for (int64_t e = 0; e < 4; ++e)
      for (int64_t r = 0; r < 8; r += 2) fc1.chunks.push_back({{l, e, r, 0}, {1, 1, 2, 3}});
  BucketGrid g;
  g.stage_of_layer = {0, 1}, g.pp = 2, g.tp = 2, g.experts = 4, g.ep = 2, g.etp = 2;
  std::map<BucketDomain, std::vector<GradBuffer>> buffers;
  for (int d = 0; d < 4; ++d) buffers[{0, d}] = {Buffer({})};  // the dense domains: no dense parameter here
  // each expert's part: 12 elements at a multiple of 64, 2 experts a domain: 64 + 12
  for (int d = 0; d < 8; ++d) buffers[{1, d}] = {Buffer({76})};
  auto pieces = LayOutBuckets({&fc1}, g, buffers);
  // domain 7 = etp 1, ep 1, pp 1: layer 1, experts 3 then 2 (reverse), rows 2 and 6 of each
  std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>> got;  // layer, expert, first box row, second box row, start
  for (const BucketPiece& p : pieces)
    if (p.chain == 1 && p.domain == 7) got.emplace_back(p.boxes.at(0).offsets[0], p.boxes[0].offsets[1], p.boxes[0].offsets[2], p.boxes.at(1).offsets[2], p.start);
  using T = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>;
  CHECK(got == std::vector<T>{{1, 3, 2, 6, 0}, {1, 2, 2, 6, 64}});
  CHECK(pieces.size() == 16);  // 2 layers x 4 experts x 2 expert TP ranks
}
