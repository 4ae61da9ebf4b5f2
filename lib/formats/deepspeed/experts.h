// Experts in a DeepSpeed checkpoint. Mixture of Experts (engine._save_moe_checkpoint): each expert in
// an expert file of its own under its global id, at the TP rank of the rank that saves it
// (ExpertGroups); the optimizer state in the ZeRO files' expert groups, or without ZeRO in one
// expp_rank file per expert-parallel rank. AutoEP (DeepSpeed 0.19): each MoE layer's experts fused
// into tensors [local experts, ...] in the ZeRO files' expert groups, whole in the atomic checkpoint.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "formats/deepspeed/params.h"

namespace ucp::deepspeed {

// What a Mixture-of-Experts checkpoint says of its parameters instead of param_shapes.
struct MoeShapes {
  std::map<std::string, std::set<int>> experts;  // expert prefix -> the global ids of its expert files
  std::map<std::string, int> layer_of;           // expert prefix -> its MoE layer's ordinal (file names)
  std::vector<int64_t> num_experts;              // per MoE layer ordinal, from the model-states file

  void Add(const std::string& name, const source::ShardFile& f, const std::vector<int64_t>& shape,
           source::SourceIndex& L, ParamIndex& index);

  // How many experts the MoE layer of `prefix` has: the model-states file's num_experts, else its
  // expert files (0: none).
  int ExpertsOf(const std::string& prefix) const;

  // The global name of an expert parameter that expert-parallel rank `ep_rank` of `ep` names by
  // its local index. Throws ucp::Error saying what does not fit.
  std::string Global(const std::string& name, int ep_rank, int ep) const;
};

// The shapes of a Mixture-of-Experts checkpoint: the module's tensors (the model-states file holds
// every parameter but the experts) and the expert files' (each expert under its global id).
void ReadMoeShapes(source::SourceIndex& L, const pt::Value& model_root,
                   const std::vector<source::ShardFile*>& model_files, const ParseFile& parse, ParamIndex& index,
                   MoeShapes& moe);

// Whether optimizer param group g holds experts ('moe': True, DeepSpeed's
// split_params_into_different_moe_groups_for_optimizer).
bool IsExpertGroup(const pt::Value& osd, size_t g);

// A Mixture-of-Experts checkpoint without ZeRO: the optimizer state of each expert-parallel rank's
// expp_rank file, matched to the module's and the experts' weights (TorchState).
void IndexMoeWithoutZero(source::SourceIndex& L, const MoeShapes& moe, const ParamIndex& index,
                         const ParseFile& parse);

// A Mixture-of-Experts index, after every optimizer file: the fragments placed (PlaceByFragments),
// each expert's expert-parallel rank, and what is not supported.
void FinishMoe(source::SourceIndex& L, const MoeShapes& moe, GroupParams& group_params, const pt::Value& model_root);

// DeepSpeed 0.19's AutoEP (module_inject/auto_ep*): each MoE layer keeps its local experts in fused
// tensors, <expert_key_prefix>.w1 / .w2 / .w3 of shape [local experts, ...], in the expert param
// groups, and the model-states file lists the layers in ds_autoep_layers. Its expert files (each
// global expert's slice of the fused tensors) are carried, not read: the ZeRO files hold the values.
struct AutoEpLayer {
  std::string prefix;  // expert_key_prefix: the fused tensors are <prefix>.<name>
  int64_t experts = 0, local = 0, ep = 1;
};

// The layers a model-states file's ds_autoep_layers lists (none: not AutoEP). Throws ucp::Error for
// an AutoEP save ucp does not read yet.
std::vector<AutoEpLayer> AutoEpLayersOf(const pt::Value& root);

// An AutoEP index, after every optimizer file: each parameter of an expert group is a fused tensor of
// its layer's experts, its shape and its numel in the group lists made those of all the experts.
void FinishAutoEp(source::SourceIndex& L, const std::vector<AutoEpLayer>& layers, const std::set<int>& expert_groups,
                  GroupParams& group_params);

}  // namespace ucp::deepspeed
