// ucp-reshard: an atomic checkpoint to the native DeepSpeed / Megatron-DeepSpeed shard files of a
// target layout (DESIGN.md section 1, "Plan (UcpInfo)" and "Load"). The work is cut into units,
// one per target model-parallel rank (pp stage, tp rank); a unit writes that rank's model-states
// file, its layer files and the optimizer files of every DP rank, reading each atomic slice it
// needs once. Units are spread over the MPI ranks by bytes.
#pragma once

#include <ostream>
#include <string>

#include "layout/export_plan.h"
#include "layout/planner.h"
#include "layout/target.h"
#include "shuffle/comm.h"

namespace ucp::reshard {

struct ReshardOptions {
  std::string atomic_dir, output;
  TargetLayout target;
  std::string format = "deepspeed";  // the target driver (formats/registry.h) that writes the files
  ExportOptions model;                // a model target's (--format hf): dtype, file size, --model-config
  // A weights-only source's fresh optimizer: the "optimizer" block of --optimizer-config (null: none
  // given), and the file it came from. target.no_optimizer (--no-optimizer) writes none.
  nlohmann::json optimizer_block;
  std::string optimizer_config;
  bool plan_only = false, json = false, quiet = false, force = false;
  bool progress = false;  // a live progress line on rank 0 (the app sets it when stderr is a terminal)
  // Pieces several units need (TP-replicated parameters, the tied embedding) are read once and
  // exchanged, as long as each rank holds at most this many bytes of them.
  int64_t share_bytes = int64_t{256} << 20;
  int64_t exchange_round_bytes = int64_t{8} << 20;  // per rank and round of that exchange
  std::string report_path;
  // planner.gpus > 0: the layout is chosen for that many GPUs (reshard/planner.h); `target` holds
  // the dtype and the degrees the user fixed (planner.fixed).
  PlannerRequest planner;
  // In place (reshard/in_place.h): `output` is the training run's checkpoint root, holding other
  // tags; the files go to output/<output_tag>, replaced if a killed run left it, then `marker` is
  // written there, and `latest` (and latest_checkpointed_iteration.txt where it exists) last.
  bool in_place = false;
  std::string output_tag;  // empty: the source's tag
  nlohmann::json marker;
};

// The planner's choice for an atomic checkpoint (reshard/planner.h); throws ucp::Error on a
// folder that is not one.
LayoutChoice ChooseLayoutFor(const std::string& atomic_dir, const PlannerRequest& request);

// Exit codes: 0 done, 1 failed or refused (the lowest failing rank prints why).
int RunReshard(const ReshardOptions& options, shuffle::Comm& comm, std::ostream& out, std::ostream& err);

}  // namespace ucp::reshard
