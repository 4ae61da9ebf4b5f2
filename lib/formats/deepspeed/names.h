// DeepSpeed's checkpoint file names, both ways: the one place that knows how its engine names the
// files of a (pp, tp, dp) rank (engine.py's _get_ckpt_name, _get_zero_ckpt_name and the pipeline
// module's layer files), for the index that reads them and the writer of ucp-reshard.
#pragma once

#include <optional>
#include <string>

namespace ucp::deepspeed {

// ExpertStates: one expert of one MoE layer (layer_{L}_expert_{E}_mp_rank_{MP}_model_states.pt, L the
// MoE layer's ordinal, E the global expert id); ExpertOptimizer: an expert-parallel rank's
// expp_rank_{R}_mp_rank_{MP}_optim_states.pt (the optimizer's state without ZeRO, else None).
enum class FileKind { ModelStates, LayerStates, ZeroOptimizer, Zero3ModelStates, ExpertStates, ExpertOptimizer };

// What a file name says. mp = pp * TP + tp, the model-parallel rank DeepSpeed puts in names.
struct FileName {
  FileKind kind = FileKind::ModelStates;
  int mp = 0, dp = 0;  // expert optimizer files: dp is the expert-parallel rank
  int layer = -1, tp = 0;  // layer files: the layer spec and TP rank (tp_known false: a name without it)
  int expert = -1;         // expert files: the global expert id (layer: the MoE layer's ordinal)
  bool tp_known = true;
  std::string prefix;      // optimizer files: "bf16_", "fp16_" or ""
};

// The name's kind and numbers; nullopt for a name DeepSpeed's engine does not write.
std::optional<FileName> ParseFileName(const std::string& name);
// A name of a Mixture-of-Experts layout (layer_L_expert_E_mp_rank_XX_*, expp_rank_R_mp_rank_XX_*).
bool IsMoeFileName(const std::string& name);

// The model-parallel rank of (pp, tp) under TP degree `tp_degree`, as DeepSpeed numbers its files.
inline int MpRank(int pp, int tp, int tp_degree) { return pp * tp_degree + tp; }
std::string MpRankName(int mp);                                                  // "07"
std::string ModelStatesFileName(int mp);                                         // mp_rank_07_model_states.pt
std::string Zero3ModelStatesFileName(int dp, int mp);                            // zero_pp_rank_3_mp_rank_07_model_states.pt
std::string OptimStatesFileName(const std::string& prefix, int dp, int mp);      // bf16_zero_pp_rank_3_mp_rank_07_optim_states.pt
std::string LayerStatesFileName(int layer, int tp);                              // layer_05-model_01-model_states.pt
std::string ExpertStatesFileName(int moe_layer, int expert, int mp);             // layer_1_expert_5_mp_rank_00_model_states.pt
std::string ExpertOptimFileName(int ep_rank, int mp);                            // expp_rank_1_mp_rank_00_optim_states.pt
// The name `f` describes (the inverse of ParseFileName).
std::string FormatFileName(const FileName& f);

}  // namespace ucp::deepspeed
