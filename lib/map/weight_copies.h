// Redundancy is evidence: DeepSpeed keeps each weight twice, as the optimizer's fp32 master and as
// the module's weight (model-states or layer file) in the training dtype, the master rounded as
// torch's .to() rounds it. Files swapped between ranks or mixed in from another save or run pass
// every CRC-32 and agree on every shape; only the two copies disagree. Checked before anything is
// written, by the ranks sharing the data files, the bytes read by pread in bounded chunks.
#pragma once

#include <string>

#include "source/source_index.h"

namespace ucp::map {

// Compares every weight copy (SourceIndex::weight_copies) with the fp32 masters the data files that
// `rank` of `ranks` checks hold of it (data files dealt in turn), on `threads` threads. Returns "" when they agree, else
// one error naming the disagreeing files, their parameters and the largest difference. Before it
// says the copies disagree, it checks the CRC-32 of the records it read: a damaged byte is refused
// as damage (throws ucp::Error naming the file and the record).
std::string CheckWeightCopies(const source::SourceIndex& L, int rank, int ranks, int threads);

}  // namespace ucp::map
