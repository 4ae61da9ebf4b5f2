// The DCP format's rows of the registry (formats/registry.h): its source driver (index.h) and its
// target (target.h).
#include "formats/dcp/index.h"
#include "formats/dcp/target.h"
#include "formats/driver.h"

namespace ucp::formats {

const SourceDriver& DcpSource() {
  static constexpr SourceDriver driver = {"dcp",
     "PyTorch Distributed Checkpoint (torch.distributed.checkpoint's FileSystemWriter: FSDP2, torchtitan, DTensor "
     "tensor parallelism; Megatron-Core's torch_dist, layers stacked, its optimizer's fp32 masters): every chunk of "
     "a tensor placed as a box of the global tensor; fp32 weights with Adam's exp_avg / exp_avg_sq and step per "
     "parameter, the param groups; or the model weights alone",
     ".metadata, __R_N.distcp (Megatron-Core: also metadata.json, common.pt)", dcp::LooksLikeCheckpoint, dcp::IndexCheckpoint, dcp::ReadWeightsOnlyParam, dcp::IsWeightsOnly};
  return driver;
}

const TargetDriver& DcpTarget() {
  static constexpr TargetDriver driver = {"dcp",
     "PyTorch Distributed Checkpoint for torchtitan's Llama (ucp-reshard --format dcp --mesh dp=N | tp=M | dp=N,tp=M): the files "
     "torch.distributed.checkpoint.save writes of get_state_dict(model, optimizer) on that mesh, FSDP2 Shard(0) over dp "
     "and / or torchtitan's tensor-parallel plan over tp; weights, Adam's exp_avg / exp_avg_sq and step per parameter, the "
     "param groups; Megatron-DeepSpeed's fused QKV and SwiGLU tensors split and renamed, q and k rows re-ordered to "
     "torchtitan's rotary; fp32; loaded by torch.distributed.checkpoint.load",
     "__R_0.distcp (one per mesh rank), .metadata (written last)", nullptr, dcp::PlanDcp, dcp::WriteDcpFile, dcp::CheckDcpSource, false,
     dcp::CheckDcpOptions};
  return driver;
}

}  // namespace ucp::formats
