// Redundancy is evidence: DeepSpeed keeps each weight twice, as the optimizer's fp32 master and as
// the module's weight (model-states or layer file) in the training dtype, the master rounded as
// torch's .to() rounds it. Files swapped between ranks or mixed in from another save or run pass
// every CRC-32 and agree on every shape; only the two copies disagree. Checked before anything is
// written, by the ranks sharing the data files, the bytes read by pread in bounded chunks.
#pragma once

#include <string>
#include <vector>

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
//
// The masters it reads are the ones the mapper reads next, and a mapper reads every record whole for
// its CRC-32 before it uses a byte of it: so the check computes, as it reads, the CRC-32 of each
// master run, and of each record its runs lie in (its other bytes, the partitions' padding, read here
// too), the runs combined in byte order. `verified`, when given, gets per data file and checksummed
// record (SourceIndex::files[f].checksummed) 1 where that CRC-32 equals the record's, on every rank
// alike: the mapper need not read those records a second time (Mapper's `verified`). A record whose
// CRC-32 differs is left to the mapper, which refuses it as it always has.
std::string CheckWeightCopies(const source::SourceIndex& L, shuffle::Comm& comm, int threads,
                              std::vector<std::vector<char>>* verified = nullptr);

}  // namespace ucp::map
