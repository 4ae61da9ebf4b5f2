// ucp-reshard --in-place: the lazy reconfiguration step of a job script. Given the training run's
// checkpoint root (with `latest`) and a target layout (or a GPU count for the planner):
//   1. the checkpoint `latest` names already has that layout: nothing is read beyond its metadata,
//      nothing written;
//   1b. `latest` names a tag this step wrote and the target is the layout of the job's own tag it was
//      made from, that tag unchanged (the fingerprint the atomic checkpoint's manifest recorded):
//      `latest` names that tag again, nothing else written;
//   2. else its atomic checkpoint ROOT/<tag>_universal is reused when complete and converted from
//      what the tag folder holds now (the manifest's source fingerprint), or made by ucp-convert
//      (into <tag>_ucp_universal beside a <tag>_universal ucp did not write: DeepSpeed's own records
//      nothing of what it read, so it is never reused);
//   3. ucp-reshard writes ROOT/<tag>_<dp..>_<tp..>_<pp..>_<z..>_<dtype> beside the other tags, with a
//      marker (source::kReshardMarker) naming its source tag, atomic checkpoint and layout;
//   4. `latest` (and latest_checkpointed_iteration.txt where it exists) then names it, atomically,
//      so the unchanged training command (--load ROOT) resumes on the new layout;
//   5. --keep N: at most N tags written this way stay, the newest (the original tag always stays).
// A run killed anywhere leaves `latest` naming a complete checkpoint, the old or the new one; the
// same command again finishes the job, and once done is a no-op.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "reshard/reshard.h"
#include "shuffle/comm.h"

namespace ucp::reshard {

struct InPlaceOptions {
  std::string root;
  ReshardOptions reshard;      // target or planner, buffers, report, quiet (atomic_dir and output unused)
  std::vector<std::string> given;  // layout keys the user gave: an unnamed dtype stays the checkpoint's
  int keep = 0;                // tags written in place kept, the newest; 0: all
  std::string patterns_dir;    // for the conversion, when one is needed
  bool progress = false;
  bool strict = true;          // the conversion's: --no-strict converts despite layout or pattern problems
  bool plan_only = false;      // say what the step would do (nothing / point back / reuse / convert, then reshard), write nothing
  bool json = false;           // with plan_only: as JSON (schemas/in-place-plan.schema.json)
};

// The folder name of a layout's tag: "<source tag>_dp4_tp2_pp1_z1_bf16", and "_ep2" before the dtype
// with expert parallelism, "_gafp32" after it for bf16 at ZeRO-1 with fp32 gradient accumulation
// (DeepSpeed's BF16 optimizer rather than ZeRO's).
std::string InPlaceTag(const std::string& source_tag, const TargetLayout& layout);

// Whether `dir` is a training run's checkpoint root (a `latest`), not an atomic checkpoint or
// DeepSpeed's universal folder.
bool IsCheckpointRoot(const std::string& dir);

// ucp-reshard ROOT -o OUT for a target written from an atomic checkpoint elsewhere (--format hf): the
// atomic checkpoint of the tag ROOT/latest names, ucp's reused where it is as step 2 above reuses
// it, else converted into OUT/.ucp-scratch-atomic (reshard/claim.h), which goes when the run ends,
// whatever its outcome: -o writes only under OUT. Then o.reshard run from it into OUT. With
// plan_only and nothing to reuse: what would be converted, nothing written.
int RunFromRoot(const InPlaceOptions& options, shuffle::Comm& comm, std::ostream& out, std::ostream& err);

// Exit codes: 0 done or nothing to do, 1 failed or refused.
int RunInPlace(const InPlaceOptions& options, shuffle::Comm& comm, std::ostream& out, std::ostream& err);

}  // namespace ucp::reshard
