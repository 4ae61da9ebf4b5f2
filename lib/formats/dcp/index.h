// The PyTorch Distributed Checkpoint (DCP) source driver: a folder with `.metadata` and the
// `__<rank>_<n>.distcp` files torch.distributed.checkpoint's FileSystemWriter wrote (FSDP2,
// torchtitan, DTensor tensor parallelism). Every chunk of a tensor is a box of the global tensor,
// kept as a whole torch.save archive at its storage offset: the index places each box's rows as
// runs of the global tensor, pointing straight at the chunk's bytes, with the archive's CRC-32.
#pragma once

#include <string>

#include "source/source_index.h"

namespace ucp::formats::dcp {

// Is `dir` a DCP checkpoint folder (a `.metadata` file and at least one `.distcp` file)? Names only.
bool LooksLikeCheckpoint(const std::string& dir);

// Throws ucp::Error when `dir` is not a DCP checkpoint at all (no readable .metadata); every other
// finding goes to the index's errors / problems / notes.
source::SourceIndex IndexCheckpoint(const std::string& dir, const source::IndexOptions& options = {});

}  // namespace ucp::formats::dcp
