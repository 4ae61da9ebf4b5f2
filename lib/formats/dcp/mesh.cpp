#include "formats/dcp/mesh.h"

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
  if (m.dp > 1 && m.tp > 1)
    throw Error("--mesh '" + text + "': FSDP2 over tensor parallelism (dp and tp both above 1) is not written yet: "
                "its parameters are strided DTensor shards (_StridedShard) whose saved chunks ucp has not checked "
                "against torch's; give dp=N or tp=M");
  return m;
}

int ShardDim(const Mesh& mesh, const std::string& fqn) {
  if (mesh.tp == 1) return 0;  // FSDP2: every parameter on dimension 0 (one rank: the whole tensor)
  static const std::regex rowwise(R"(^layers\.\d+\.(attention\.wo|feed_forward\.w2)\.weight$)"),
      norm(R"(^(norm|layers\.\d+\.(attention_norm|ffn_norm))\.weight$)");
  if (std::regex_match(fqn, rowwise)) return 1;
  if (std::regex_match(fqn, norm)) return -1;
  return 0;
}

std::vector<Box> BoxesOf(const Mesh& mesh, int dim, const std::vector<int64_t>& shape) {
  const Box whole{std::vector<int64_t>(shape.size(), 0), shape};
  if (dim < 0) return {whole};
  if (static_cast<size_t>(dim) >= shape.size()) throw Error("internal: shard dimension " + std::to_string(dim) + " of a " + std::to_string(shape.size()) + "-d tensor");
  const int64_t parts = mesh.ranks(), n = shape[dim], chunk = (n + parts - 1) / parts;
  std::vector<Box> boxes(static_cast<size_t>(parts), whole);
  for (int64_t r = 0; r < parts; ++r) {
    const int64_t start = std::min(n, chunk * r);  // torch.chunk: ceil-sized, the trailing ranks fewer or none
    boxes[r].offsets[dim] = start;
    boxes[r].sizes[dim] = std::min(n, start + chunk) - start;
  }
  return boxes;
}

}  // namespace ucp::formats::dcp
