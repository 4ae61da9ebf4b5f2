// ucp-reshard to a model of whole tensors (--format hf): the target driver's export plan
// (layout/export_plan.h) carried out. Files are spread over the MPI ranks by bytes, each written
// whole by one rank, tensor by tensor in runs of rows read from the atomic store (memory per rank:
// one run); then one sync, the side files (config.json), and the driver's marker last (the index),
// the commit point. The folder is claimed like every -o folder (reshard/claim.h).
#pragma once

#include <ostream>

#include "formats/driver.h"
#include "reshard/reshard.h"
#include "shuffle/comm.h"

namespace ucp::reshard {

// The files to ranks: largest first, each to the rank with the fewest bytes so far.
std::vector<int> AssignFiles(const ExportPlan& P, int ranks);

// Exit codes as RunReshard's.
int RunExport(const ReshardOptions& options, const formats::TargetDriver& driver, shuffle::Comm& comm, std::ostream& out,
              std::ostream& err);

}  // namespace ucp::reshard
