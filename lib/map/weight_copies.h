// Redundancy is evidence: DeepSpeed keeps each weight twice, as the optimizer's fp32 master and as
// the module's weight (model-states or layer file) in the training dtype, the master rounded as
// torch's .to() rounds it. Files swapped between ranks or mixed in from another save or run pass
// every CRC-32 and agree on every shape; only the two copies disagree. Checked before anything is
// written, by the ranks sharing the data files, the bytes read by pread in bounded chunks.
#pragma once

#include <string>

#include "shuffle/comm.h"
#include "source/source_index.h"

namespace ucp::map {

// Compares every weight copy (SourceIndex::weight_copies) with the fp32 masters of it the data
// files hold, the data files dealt over the ranks of `comm` in turn, on `threads` threads each.
// Collective. Returns "" when they agree, else, on every rank alike, the fault in one line: the odd
// files (a weight file every optimizer file holding its masters disagrees with, or the optimizer files
// that disagree), a parameter and the largest difference. Before it says the copies disagree, a rank
// checks the CRC-32 of the records it read: a damaged byte is refused as damage (throws ucp::Error
// naming the file and the record, on that rank; the others return "").
std::string CheckWeightCopies(const source::SourceIndex& L, shuffle::Comm& comm, int threads);

}  // namespace ucp::map
