// A torch optimizer's state in a DeepSpeed checkpoint without ZeRO: Adam's state per position, the
// positions matched to the model's parameters by shape in model order (TorchState). Where it lies:
// a model-states file's 'optimizer' (DeepSpeed 0.17.6+'s DDP bf16 wrapper) or a Mixture-of-Experts
// save's expp_rank files (experts.h).
#pragma once

#include <string>
#include <vector>

#include "formats/deepspeed/params.h"

namespace ucp::deepspeed {

// A parameter's weights in a file, in the model's order (TorchState).
struct Weight {
  std::string name;
  int file = -1;
  pt::TensorView tensor;
};

// The weights of a model-states file's module (its buffers left out), or an expert file's, in order.
void WeightsOf(const source::SourceIndex& L, int fi, const pt::Value& root, std::vector<Weight>& out);

// The torch state of a model-states or expp_rank file's 'optimizer': the state_dict itself (the
// model's own torch optimizer: fp32 training), or DeepSpeed 0.17.6+'s DDP bf16 wrapper around it,
// {optimizer_state_dict, fp32_groups: the masters per group and position, the loss scale}.
struct TorchOptimizer {
  const pt::Value* state_dict = nullptr;
  const pt::Value* fp32_groups = nullptr;  // null: the fp32 values are the weights themselves
};
TorchOptimizer TorchOptimizerOf(const pt::Value& optimizer);

// One torch optimizer state_dict, Adam's state per position, the positions listed by each param
// group in the order of the model's parameters. Positions carry no names: each group's positions are
// matched to the model's parameters of its kind (the module's; an expert group's, the experts') in
// model order by shape, every parameter to the one group whose next position fits it; where two
// would fit, which one holds it cannot be told and the checkpoint is refused. A position's slot in
// its data file holds its moments there, and its fp32 values: the masters the optimizer keeps
// (`fp32_groups`, per group and position, in the same file), or without them the weights themselves.
class TorchState {
 public:
  TorchState(source::SourceIndex& L, int file, const pt::Value& state_dict, const pt::Value* fp32_groups,
             const ParamIndex& index, const ParseFile& parse);

  // Matches `params` (the module's, or with `experts` an expert-parallel rank's experts) to the
  // positions of their groups; with `record`, each becomes a fragment of the file.
  void Match(const std::vector<Weight>& params, bool experts, bool record);

  // Every position taken; the file then holds data.
  void Finish();

  // How many positions the expert groups list (this rank's local experts' tensors).
  size_t ExpertPositions() const;

 private:
  // The group whose next position fits w; throws ucp::Error when none or two do.
  int GroupFitting(const Weight& w, bool experts) const;
  // Position `pos`, the k-th of group g, becomes w's fragment of the file.
  void Record(const Weight& w, int g, size_t k, int64_t pos);
  pt::TensorView Moment(int64_t pos, const char* key) const;

  struct Group {
    std::vector<int64_t> positions;
    size_t next = 0;  // how far its matching got
    bool experts = false;
  };
  source::SourceIndex& L_;
  const int fi_;
  const pt::Dict& state_;
  const pt::Value* fp32_groups_;
  const ParamIndex& index_;
  const ParseFile& parse_;
  std::vector<Group> gs_;
};

// DeepSpeed 0.17.6+ training bf16 without ZeRO in a model that is not a pipeline: the optimizer
// state inside every model-states file (TorchState), matched to its module.
void IndexDdpWrapper(source::SourceIndex& L, ParamIndex& index, const ParseFile& parse);

}  // namespace ucp::deepspeed
