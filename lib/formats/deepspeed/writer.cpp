#include "formats/deepspeed/writer.h"

#include "formats/deepspeed/names.h"
#include "formats/deepspeed/writer_files.h"
#include "formats/deepspeed/writer_unit.h"

namespace ucp::deepspeed {
using namespace reshard;

// The files of a unit, in the order they read its values: under ZeRO-3 its DP rank's optimizer
// file, then its model-states file; else the optimizer files of every DP rank (or, without ZeRO,
// the torch optimizer's), which fill the training-dtype weights on the way (--no-optimizer: those
// weights alone), then the files those weights go in: expert files and a plain module's model-states file, or a pipeline's layer files
// and its model-states file.
UnitFiles WriteUnit(const Source& S, const TargetLayout& T, const Plan& P, const Unit& U, SliceSource& slices,
                    const std::string& dir, ScratchBytes& arena) {
  const TargetUnit unit{S, T, P, U};
  UnitWeights weights(unit, slices);
  ShardFiles files(dir);
  if (T.zero_stage == 3) {
    WriteZero3OptimizerFile(unit, weights, files);
    WriteModelStatesFile(unit, files, Zero3ModelStatesFileName(U.dp, unit.Mp()), Zero3Module(unit), nullptr);
    return files.written();
  }
  weights.ReserveTrainingDtype(arena);
  pt::ValuePtr torch_optimizer;
  if (T.no_optimizer) weights.FillTrainingDtype();  // (ZeRO-3 is refused: its weights are in the optimizer files)
  else if (unit.TorchOptimizer()) torch_optimizer = WriteTorchOptimizerFiles(unit, weights, files);
  else
    for (int d = 0; d < T.SeqDp(); ++d) WriteZeroOptimizerFile(unit, weights, files, d);
  if (NamingOf(T) == Naming::Plain) {
    if (S.moe) WriteExpertFiles(unit, weights, files);
    WriteModelStatesFile(unit, files, ModelStatesFileName(unit.Mp()), PlainModule(unit, weights), torch_optimizer);
  } else {
    WriteLayerFiles(unit, weights, files);
    WriteModelStatesFile(unit, files, ModelStatesFileName(unit.Mp()), pt::Value::None(), torch_optimizer);
  }
  return files.written();
}

}  // namespace ucp::deepspeed
