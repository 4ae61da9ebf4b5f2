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

// A weights-only DCP (no optimizer key: Megatron-LM's --no-save-optim, a model's state dict saved alone),
// which ucp-convert reads as a model (formats/driver.h: SourceDriver::weights_only).
bool IsWeightsOnly(const std::string& dir);
// Such a checkpoint's parameter `param` (IndexCheckpoint's order) whole, as fp32 (bf16 / fp16 widened
// exactly), every chunk's archive checked against its CRC-32s.
void ReadWeightsOnlyParam(const source::SourceIndex& L, int param, float* dst);

}  // namespace ucp::formats::dcp
