"""A DCP checkpoint whose chunks are uneven, 2-D and 3-D boxes, written by torch's own DCP writer on a
2 x 2 CPU mesh (4 processes, gloo), with torch's dcp_to_torch_save output as reference.pt. Run where
torch >= 2.4 is (the Debian trixie chroot of ../../../../shared/real-dcp/harness/README.md):

    python3 make_boxes.py OUT_CASE_DIR        ->  OUT_CASE_DIR/checkpoint/, OUT_CASE_DIR/reference.pt

Each tensor is a full tensor from a seeded generator, distributed with DTensor placements over the
mesh ("a", "b"); torch splits uneven dimensions as torch.chunk does. Moments have their weight's
placements; every parameter has a 0-d step. Nothing here is ucp's.
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# name -> (shape, placements over mesh dims (a, b)): S(d) Shard(d), R Replicate
TENSORS = {
    "experts.w1.weight": ((4, 6, 10), ("S1", "S2")),   # 3-D, both mesh dims split it
    "blocks.0.proj.weight": ((7, 9), ("S0", "S1")),    # uneven on both dims: 4 + 3 rows, 5 + 4 columns
    "blocks.0.norm.weight": ((5,), ("S0", "R")),       # uneven 1-D, replicated over b
    "head.weight": ((3, 8), ("R", "S1")),              # split along columns only
    "gate.weight": ((2, 3, 4, 5), ("S3", "S1")),       # 4-D, uneven on dims 3 and 1
}


def placements(spec):
    from torch.distributed.tensor import Replicate, Shard
    return [Replicate() if p == "R" else Shard(int(p[1:])) for p in spec]


def worker(rank, out):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor
    import torch.distributed.checkpoint as dcp
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29531", USE_LIBUV="0")
    dist.init_process_group("gloo", rank=rank, world_size=4)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("a", "b"))
    g = torch.Generator().manual_seed(7)  # the same full tensors on every rank
    model, state = {}, {}
    for name, (shape, spec) in TENSORS.items():
        full = [torch.randn(shape, generator=g) for _ in range(3)]
        model[name] = distribute_tensor(full[0], mesh, placements(spec))
        state[name] = {"step": torch.tensor(7.0), "exp_avg": distribute_tensor(full[1], mesh, placements(spec)),
                       "exp_avg_sq": distribute_tensor(full[2].abs(), mesh, placements(spec))}
    groups = [{"lr": 1e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.0, "params": list(TENSORS)}]
    dcp.save({"model": model, "optim": {"state": state, "param_groups": groups}}, checkpoint_id=os.path.join(out, "checkpoint"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    mp.spawn(worker, args=(out,), nprocs=4, join=True)
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    dcp_to_torch_save(os.path.join(out, "checkpoint"), os.path.join(out, "reference.pt"))
    print(f"{out}: checkpoint/ and reference.pt (torch {torch.__version__})")
