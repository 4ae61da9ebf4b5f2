// The two interfaces a format implements (ADIOS2's engines, TensorStore's drivers): a source driver
// turns a checkpoint folder into the neutral SourceIndex that plan, map, union and store work on; a
// target driver writes either the shard files of a training layout, unit by unit of the reshard plan,
// or a model of whole tensors, file by file of the export plan it makes (layout/export_plan.h). A
// format's folder (formats/<name>/) defines its rows in its driver.cpp; formats/registry.h lists them.
#pragma once

#include <string>

#include "core/buffer_pool.h"
#include "source/source_index.h"
#include "layout/export_plan.h"
#include "layout/reshard_plan.h"

namespace ucp::formats {

struct SourceDriver {
  const char* name;
  const char* description;  // what it reads, which writers and variants
  const char* files;        // the file names it recognises
  // Whether `dir` (or dir/<latest>) looks like this format; cheap: names only, no file read.
  bool (*probe)(const std::string& dir);
  // The neutral index; throws ucp::Error when `dir` is not this format at all, records every other
  // finding in the index's errors / problems / notes.
  source::SourceIndex (*index)(const std::string& dir, const source::IndexOptions& options);
  // A model of whole tensors (Hugging Face's safetensors), not flat optimizer partitions: parameter
  // `param` of the index (SourceIndex::params) read whole, as fp32, into dst (its full shape's
  // elements, each written: dst comes as it was left, not zeroed); ucp-convert writes them as they
  // are (convert/from_model.cpp), weights only. Null for a training checkpoint, whose index lists
  // fragments.
  void (*read_param)(const source::SourceIndex& L, int param, float* dst);
  // For a training format that also has weights-only saves (Megatron-LM's --no-save-optim): whether
  // `dir` is one, which ucp-convert then reads through read_param as a model; null: read_param (where
  // set) serves every folder of the format.
  bool (*weights_only)(const std::string& dir);
  // A model that holds its optimizer's state too (another family's atomic checkpoint under
  // Megatron-DeepSpeed's names): state `state` (plan::State: 0 the fp32 weights, as read_param, 1
  // exp_avg, 2 exp_avg_sq) of parameter `param` whole into dst; each parameter's step is
  // SourceIndex::steps at (0, 0, its group), the param groups SourceIndex::optimizer_state's. Null:
  // weights only.
  void (*read_state)(const source::SourceIndex& L, int param, int state, float* dst) = nullptr;
};

struct TargetDriver {
  const char* name;
  const char* description;
  const char* files;  // the file names it writes
  // A training layout (DeepSpeed): the files of one unit of the reshard plan (layout/reshard_plan.h)
  // into `dir`, values from `slices`; no fsync of its own (the caller syncs once, then commits with
  // `latest`). Null for a model target.
  reshard::UnitFiles (*write_unit)(const reshard::Source& S, const reshard::TargetLayout& T, const reshard::Plan& P,
                                   const reshard::Unit& U, reshard::SliceSource& slices, const std::string& dir,
                                   ScratchBytes& arena);
  // A model target (Hugging Face): the export plan of the atomic checkpoint (its tensors named and cut,
  // its files, side files and marker), throwing ucp::Error naming the parameter or the missing fact for
  // a model it does not describe; and file `f` of it written to `path` (a temporary name the caller
  // renames), values from `rows`. Both null for a training-layout target.
  reshard::ExportPlan (*plan_export)(const reshard::Source& S, const reshard::ExportOptions& options);
  void (*write_file)(const reshard::ExportPlan& P, size_t f, reshard::RowSource& rows, const std::string& path);
  // A model target's refusals that need no atomic checkpoint, from a source checkpoint's index (names,
  // shapes, args): a model it would refuse is refused before a conversion is made for it. May be null.
  void (*check_source)(const source::SourceIndex& L, const reshard::ExportOptions& options);
  // A model target of the weights alone (Hugging Face): the export reads no optimizer state, so the
  // atomic checkpoint's zero/optimizer_state.pt is neither read nor hashed (layout/reshard_plan.h, LoadAtomic).
  bool weights_only = false;
  // The target's own flags checked before anything is read (a malformed --mesh): throws ucp::Error,
  // which the command line reports as a bad command line. May be null.
  void (*check_options)(const reshard::ExportOptions& options) = nullptr;
};

// The rows, each defined in its format's folder (formats/<name>/driver.cpp); the registry's tables
// list them.
const SourceDriver& DeepSpeedSource();
const SourceDriver& DcpSource();
const SourceDriver& HuggingFaceSource();
const SourceDriver& MegatronSource();
// Not probed: an atomic checkpoint of another family (Megatron-Core, torchtitan) read as Megatron-DeepSpeed's
// GPTModel parameters, for a DeepSpeed target (ConvertOptions::as_deepspeed).
const SourceDriver& AtomicAsDeepSpeedSource();
const TargetDriver& DeepSpeedTarget();
const TargetDriver& HuggingFaceTarget();
const TargetDriver& DcpTarget();
const TargetDriver& McoreTarget();

}  // namespace ucp::formats
