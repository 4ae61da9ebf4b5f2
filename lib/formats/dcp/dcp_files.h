// The files of a DCP a target writes (target.h's torchtitan state dict, formats/megatron's torch_dist):
// each rank's write items laid out in its `__<rank>_0.distcp` (bytes items first, then tensors, in the
// order given), each a complete torch.save file, and recorded for `.metadata` (metadata_writer.h).
#pragma once

#include <string>
#include <vector>

#include "formats/dcp/metadata_writer.h"
#include "layout/export_plan.h"
#include "layout/reshard_plan.h"

namespace ucp::formats::dcp {

// One write item: where `.metadata` says it is (key, global shape, chunk offsets and sizes) and the
// export tensor of its bytes (a tensor's box set, or a ready-made payload).
struct PlannedItem {
  SavedItem saved;
  reshard::ExportTensor data;
};

// Rank `rank`'s file, `folder` + "__<rank>_0.distcp" in the plan (folder empty or ending in '/';
// `.metadata` names it without the folder): its items appended to P's tensors and files, and to c.
void LayDcpFile(int rank, const std::string& folder, std::vector<PlannedItem> items, reshard::ExportPlan& P, SavedCheckpoint& c);

// A save_id in the form of a UUID, from the atomic checkpoint's files (the manifest's list: relative
// paths, sizes, checksums) and the layout's text: the same bytes each run, wherever the folders are.
std::string SaveIdOf(const reshard::Source& S, const std::string& layout);

}  // namespace ucp::formats::dcp
