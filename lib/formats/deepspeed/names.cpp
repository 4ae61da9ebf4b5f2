#include "formats/deepspeed/names.h"

#include <cstdio>
#include <regex>

namespace ucp::deepspeed {

std::optional<FileName> ParseFileName(const std::string& name) {
  static const std::regex model_re(R"(mp_rank_(\d+)_model_states\.pt)");
  static const std::regex layer_re(R"(layer_(\d+)-model_(\d+)-model_states\.pt)");
  static const std::regex layer_notp_re(R"(layer_(\d+)-model_states\.pt)");
  static const std::regex optim_re(R"((bf16_|fp16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt)");
  static const std::regex zero3_model_re(R"(zero_pp_rank_(\d+)_mp_rank_(\d+)_model_states\.pt)");
  static const std::regex expert_re(R"(layer_(\d+)_expert_(\d+)_mp_rank_(\d+)_model_states\.pt)");
  static const std::regex expert_optim_re(R"(expp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt)");
  std::smatch m;
  FileName f;
  if (std::regex_match(name, m, model_re)) {
    f.mp = std::stoi(m[1]);
  } else if (std::regex_match(name, m, layer_re)) {
    f.kind = FileKind::LayerStates, f.layer = std::stoi(m[1]), f.tp = std::stoi(m[2]);
  } else if (std::regex_match(name, m, layer_notp_re)) {
    f.kind = FileKind::LayerStates, f.layer = std::stoi(m[1]), f.tp_known = false;
  } else if (std::regex_match(name, m, optim_re)) {
    f.kind = FileKind::ZeroOptimizer, f.prefix = m[1], f.dp = std::stoi(m[2]), f.mp = std::stoi(m[3]);
  } else if (std::regex_match(name, m, zero3_model_re)) {
    f.kind = FileKind::Zero3ModelStates, f.dp = std::stoi(m[1]), f.mp = std::stoi(m[2]);
  } else if (std::regex_match(name, m, expert_re)) {
    f.kind = FileKind::ExpertStates, f.layer = std::stoi(m[1]), f.expert = std::stoi(m[2]), f.mp = std::stoi(m[3]);
  } else if (std::regex_match(name, m, expert_optim_re)) {
    f.kind = FileKind::ExpertOptimizer, f.dp = std::stoi(m[1]), f.mp = std::stoi(m[2]);
  } else {
    return std::nullopt;
  }
  return f;
}

bool IsMoeFileName(const std::string& name) {
  static const std::regex moe_re(R"((layer_\d+_expert_\d+_mp_rank_\d+|expp_rank_\d+_mp_rank_\d+)_.*\.pt)");
  return std::regex_match(name, moe_re);
}

std::string MpRankName(int mp) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%02d", mp);
  return buf;
}

std::string ModelStatesFileName(int mp) { return "mp_rank_" + MpRankName(mp) + "_model_states.pt"; }

std::string Zero3ModelStatesFileName(int dp, int mp) {
  return "zero_pp_rank_" + std::to_string(dp) + "_mp_rank_" + MpRankName(mp) + "_model_states.pt";
}

std::string OptimStatesFileName(const std::string& prefix, int dp, int mp) {
  return prefix + "zero_pp_rank_" + std::to_string(dp) + "_mp_rank_" + MpRankName(mp) + "_optim_states.pt";
}

std::string LayerStatesFileName(int layer, int tp) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "layer_%02d-model_%02d-model_states.pt", layer, tp);
  return buf;
}

std::string ExpertStatesFileName(int moe_layer, int expert, int mp) {
  return "layer_" + std::to_string(moe_layer) + "_expert_" + std::to_string(expert) + "_mp_rank_" + MpRankName(mp) +
         "_model_states.pt";
}

std::string ExpertOptimFileName(int ep_rank, int mp) {
  return "expp_rank_" + std::to_string(ep_rank) + "_mp_rank_" + MpRankName(mp) + "_optim_states.pt";
}

std::string FormatFileName(const FileName& f) {
  switch (f.kind) {
    case FileKind::ModelStates: return ModelStatesFileName(f.mp);
    case FileKind::Zero3ModelStates: return Zero3ModelStatesFileName(f.dp, f.mp);
    case FileKind::ZeroOptimizer: return OptimStatesFileName(f.prefix, f.dp, f.mp);
    case FileKind::ExpertStates: return ExpertStatesFileName(f.layer, f.expert, f.mp);
    case FileKind::ExpertOptimizer: return ExpertOptimFileName(f.dp, f.mp);
    case FileKind::LayerStates: {
      if (f.tp_known) return LayerStatesFileName(f.layer, f.tp);
      char buf[48];
      std::snprintf(buf, sizeof buf, "layer_%02d-model_states.pt", f.layer);
      return buf;
    }
  }
  return {};
}

}  // namespace ucp::deepspeed
