// The DCP format's row of the registry (formats/registry.h): its source driver (index.h).
#include "formats/dcp/index.h"
#include "formats/driver.h"

namespace ucp::formats {

const SourceDriver& DcpSource() {
  static constexpr SourceDriver driver = {"dcp",
     "PyTorch Distributed Checkpoint (torch.distributed.checkpoint's FileSystemWriter: FSDP2, torchtitan, DTensor "
     "tensor parallelism; Megatron-Core's torch_dist, layers stacked, its optimizer's fp32 masters): every chunk of "
     "a tensor placed as a box of the global tensor; fp32 weights with Adam's exp_avg / exp_avg_sq and step per "
     "parameter, the param groups",
     ".metadata, __R_N.distcp (Megatron-Core: also metadata.json, common.pt)", dcp::LooksLikeCheckpoint, dcp::IndexCheckpoint, nullptr};
  return driver;
}

}  // namespace ucp::formats
