// Megatron-Core's dp_reshardable buckets (formats/dcp/bucket_layout.h): each way the files can
// disagree with the layout rebuilt from the model's tensors is refused naming the domain, the
// bucket and the parameter. (The layout itself is checked against Megatron's own files: the
// real_mcore test converts each dp_reshardable case and compares it with the fully_reshardable save
// of the same state.)
#include <catch2/catch.hpp>

#include <functional>
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
  auto pieces = LayOutBuckets({&a, &b}, g, {{0, {Buffer({176})}}});
  REQUIRE(pieces.size() == 2);
  CHECK(pieces[0].fqn == "output.b");
  CHECK(pieces[0].start == 0);
  CHECK(pieces[1].fqn == "embedding.a");
  CHECK(pieces[1].start == 128);
}

TEST_CASE("bucket layout: sizes that disagree with per_bucket_numel_unpadded are refused by name", "[reader]") {
  Item a = Whole("embedding.a", {48}), b = Whole("output.b", {10, 10});
  BucketGrid g;
  std::string e = Refusal([&] { LayOutBuckets({&a, &b}, g, {{0, {Buffer({240})}}}); });
  CHECK(e.find("dp_group_idx_0") != std::string::npos);
  CHECK(e.find("fill 176 elements of bucket_idx_0, recorded 240") != std::string::npos);
  e = Refusal([&] { LayOutBuckets({&a, &b}, g, {{0, {Buffer({160})}}}); });
  CHECK(e.find("'embedding.a'") != std::string::npos);
  CHECK(e.find("past the bucket's recorded 160") != std::string::npos);
}

TEST_CASE("bucket layout: a missing model-parallel domain is refused by name", "[reader]") {
  Item a = Whole("embedding.a", {64});
  BucketGrid g;
  g.tp = 2;
  std::string e = Refusal([&] { LayOutBuckets({&a}, g, {{0, {Buffer({64})}}}); });
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
