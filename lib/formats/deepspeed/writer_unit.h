// One unit of a reshard plan as the DeepSpeed writer sees it: where its parameters go
// (`TargetUnit`: the model-parallel and expert-parallel geometry, each group's members, the names
// and the model's order), where their values come from (`UnitWeights`: the fp32 slices, the
// training-dtype weights made from them, the groups' steps), and the folder its files go to
// (`ShardFiles`). Each file kind (writer_files.h) takes what it needs of the three.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/buffer_pool.h"
#include "pt/value.h"
#include "layout/naming.h"
#include "layout/reshard_plan.h"

namespace ucp::deepspeed {

// The model's order of parameters: layer spec, then the key's place in its module.
bool InModelOrder(const reshard::LayerPlace& a, const reshard::LayerPlace& b);

struct TargetUnit {
  const reshard::Source& S;
  const reshard::TargetLayout& T;
  const reshard::Plan& P;
  const reshard::Unit& U;

  int Mp() const;
  // A job without ZeRO that runs the model's own torch optimizer: Mixture of Experts in fp32, its
  // state per position in one expp_rank file per expert-parallel rank; bf16 inside DeepSpeed's DDP
  // bf16 wrapper (DdpBf16Wrapper), in the model-states files (and expp_rank files).
  bool TorchOptimizer() const;

  // Mixture of Experts: the expert-parallel degree, the target's expert-parallel groups, and whether
  // optimizer group g holds experts.
  int Ep() const;
  reshard::ExpertGroups Groups() const;
  // Whether this unit's TP rank saves the expert files (and, without ZeRO, the expp_rank file) of
  // expert-parallel rank r: the TP rank of global rank r (ExpertGroups).
  bool SavesEpRank(int r) const;
  bool ExpertGroup(size_t g) const;

  // The parameters of group g on a rank of expert-parallel rank `ep_rank`, in the group's flat order.
  // An expert group holds the experts of that expert-parallel rank only, layer by layer, expert by
  // expert (the order of the model's parameters on that rank).
  std::vector<int> GroupMembers(size_t g, int ep_rank) const;
  // Unit parameter k's name in an optimizer file: an expert by its id on its expert-parallel rank.
  std::string OptimizerName(int k) const;
  // The unit's parameters in the model's order: a module's own (Naming::Module), else layer spec,
  // then the key's place in its module: the order of a model's state_dict and of its layer files.
  std::vector<size_t> ModelOrder() const;
};

// Elements [at, at + n) of a flat ZeRO tensor are unit parameter k's local elements [local, local + n).
struct Segment {
  int k;
  int64_t local, at, n;
};

// The unit's values, read from the slice source in the order the files need them.
class UnitWeights {
 public:
  UnitWeights(const TargetUnit& u, reshard::SliceSource& slices);

  // Room in `arena` for the training-dtype weights of the layer files (or plain module, expert
  // files), which Fill makes from the fp32 weights. The caller keeps `arena` from unit to unit, so
  // that its pages are faulted in (and zeroed by the kernel) once per run, not once per unit.
  void ReserveTrainingDtype(ScratchBytes& arena);
  // Without ZeRO the weights are read whole, before any file: into the training-dtype weights, which
  // in fp32 are the master weights; under the DDP bf16 wrapper, into fp32 masters, whose bf16
  // copies (Fill) are the model's weights.
  void ReadWhole(bool fp32_masters);

  // Without optimizer files (TargetLayout::no_optimizer): the training-dtype weights made from the
  // fp32 weights, read a run at a time, with nothing else.
  void FillTrainingDtype();
  // Local elements [a, b) of unit param k, state s, into dst (float32), from the slice source; fp32
  // also to the layer files' weights.
  void Fill(size_t k, int s, int64_t a, int64_t b, float* dst);
  // A flat float32 ZeRO tensor of `len` elements, produced while its file is written: the segments'
  // elements of state `s`, zeros elsewhere (alignment padding). Nothing of it is held in memory.
  pt::ValuePtr FlatState(std::vector<Segment> segs, int64_t len, int s);
  // Group g's step, read once from the first of its parameters that has one; 0 for a weights-only
  // source's fresh optimizer.
  pt::ValuePtr GroupStep(int g);

  // Unit param k's training-dtype weights (ReserveTrainingDtype), in its shape.
  pt::ValuePtr TrainingDtypeTensor(size_t k) const;
  // Unit param k's fp32 master (ReadWhole), in its shape.
  pt::ValuePtr MasterTensor(size_t k) const;

 private:
  const TargetUnit& u_;
  reshard::SliceSource& slices_;
  std::vector<std::shared_ptr<uint8_t[]>> lp_;
  std::vector<std::shared_ptr<uint8_t[]>> masters_;  // the DDP bf16 wrapper's fp32 masters, per unit parameter
  std::map<int, pt::ValuePtr> steps_;
  const double expert_moment_ratio_;  // target's expert gradient scale / the source's (ExpertMomentRatio)
};

// The folder a unit's files go to, and what they weigh.
class ShardFiles {
 public:
  explicit ShardFiles(std::string dir) : dir_(std::move(dir)) {}
  // One file of the target, written without an fsync of its own (the run syncs the file system
  // once before `latest` names the folder) and without a digest (nothing records one).
  void Write(const std::string& name, const pt::Value& root);
  reshard::UnitFiles written() const { return written_; }

 private:
  std::string dir_;
  reshard::UnitFiles written_;
};

}  // namespace ucp::deepspeed
