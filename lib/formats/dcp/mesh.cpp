#include "formats/dcp/mesh.h"

#include <algorithm>
#include <regex>

#include "core/error.h"

namespace ucp::formats::dcp {

std::string Mesh::text() const {
  if (dp > 1 && tp > 1) return "dp=" + std::to_string(dp) + ",tp=" + std::to_string(tp);
  return tp > 1 ? "tp=" + std::to_string(tp) : "dp=" + std::to_string(dp);
}

Mesh ParseMesh(const std::string& text) {
  Mesh m;
  if (text.empty()) return m;
  static const std::regex part(R"(^(dp|tp)=(\d{1,6})$)");
  bool dp = false, tp = false;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = text.find(',', at);
    const std::string p = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    std::smatch match;
    if (!std::regex_match(p, match, part))
      throw Error("--mesh '" + text + "': '" + p + "' is not dp=N or tp=M (the mesh dimensions torchtitan's FSDP2 and tensor parallelism use)");
    bool& seen = match[1] == "dp" ? dp : tp;
    if (seen) throw Error("--mesh '" + text + "': " + match[1].str() + " given twice");
    seen = true;
    const int64_t n = std::stoll(match[2]);
    if (n < 1) throw Error("--mesh '" + text + "': " + match[1].str() + " must be at least 1");
    (match[1] == "dp" ? m.dp : m.tp) = n;
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return m;
}

namespace {

// The dimension torchtitan's TP plan shards `fqn` on: 0 (colwise), 1 (rowwise: wo, w2), -1 (the norms).
int TpShardDim(const std::string& fqn) {
  static const std::regex rowwise(R"(^layers\.\d+\.(attention\.wo|feed_forward\.w2)\.weight$)"),
      norm(R"(^(norm|layers\.\d+\.(attention_norm|ffn_norm))\.weight$)");
  if (std::regex_match(fqn, rowwise)) return 1;
  if (std::regex_match(fqn, norm)) return -1;
  return 0;
}

// Piece k of `parts` of the box on `dim`, torch.chunk's: ceil-sized, the trailing ones fewer or none.
void TorchChunk(Box& b, size_t dim, int64_t parts, int64_t k) {
  const int64_t n = b.sizes.at(dim), chunk = (n + parts - 1) / parts, start = std::min(n, chunk * k);
  b.offsets[dim] += start;
  b.sizes[dim] = std::min(n, start + chunk) - start;
}

}  // namespace

std::vector<Box> BoxesOf(const Mesh& mesh, const std::string& fqn, const std::vector<int64_t>& shape) {
  const int tp_dim = TpShardDim(fqn);
  if (static_cast<size_t>(std::max(tp_dim, 0)) >= shape.size())
    throw Error("internal: " + fqn + ": a " + std::to_string(shape.size()) + "-d tensor sharded on dimension " + std::to_string(tp_dim));
  std::vector<Box> boxes;
  for (int64_t r = 0; r < mesh.ranks(); ++r) {
    Box b{std::vector<int64_t>(shape.size(), 0), shape};
    if (tp_dim >= 0) TorchChunk(b, static_cast<size_t>(tp_dim), mesh.tp, r % mesh.tp);
    TorchChunk(b, 0, mesh.dp, r / mesh.tp);  // FSDP2 over this rank's piece
    boxes.push_back(std::move(b));
  }
  return boxes;
}

}  // namespace ucp::formats::dcp
