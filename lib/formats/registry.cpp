#include "formats/registry.h"

#include "formats/deepspeed/index.h"

namespace ucp::formats {
namespace {

constexpr SourceDriver kSources[] = {
    {"deepspeed",
     "DeepSpeed and Megatron-DeepSpeed native checkpoints: ZeRO stages 0-3, the BF16 optimizer, TP, PP and DP "
     "(DeepSpeed 0.12 and later); the pipeline's layer files or a plain module",
     "mp_rank_XX_model_states.pt, [bf16_]zero_pp_rank_D_mp_rank_XX_optim_states.pt, "
     "zero_pp_rank_D_mp_rank_XX_model_states.pt, layer_LL-model_TT-model_states.pt",
     deepspeed::LooksLikeCheckpoint, deepspeed::IndexCheckpoint},
};

}  // namespace

std::span<const SourceDriver> SourceDrivers() { return kSources; }

source::SourceIndex IndexSource(const std::string& dir, const source::IndexOptions& options) {
  for (const auto& d : kSources)
    if (d.probe(dir)) return d.index(dir, options);
  return kSources[0].index(dir, options);
}

nlohmann::json FormatsJson() {
  nlohmann::json sources = nlohmann::json::array();
  for (const auto& d : kSources) sources.push_back({{"name", d.name}, {"description", d.description}, {"files", d.files}});
  return {{"sources", sources}};
}

void PrintFormats(std::ostream& out) {
  out << "sources (ucp-convert, ucp-inspect):\n";
  for (const auto& d : kSources) out << "  " << d.name << "\n    " << d.description << "\n    files: " << d.files << "\n";
}

}  // namespace ucp::formats
