"""A DCP checkpoint of a Llama-shaped model at a chosen size, written by torch's own DCP writer, for the
benchmark (scripts/benchmark.py --dcp). Runs where torch >= 2.4 is (the Debian trixie chroot of
../shared/real-dcp/harness/README.md), on CPU with gloo.

    python3 make_dcp_fixture.py OUT [--ranks 2] [--dim 1536] [--layers 4] [--ffn 4096] [--vocab 32000]

Each rank builds its own shard of every tensor (FSDP2's placement: Shard(0) on a 1-D mesh) from a
seeded generator, as DTensors, and the state dict get_state_dict gives (model weights; Adam's step,
exp_avg and exp_avg_sq per parameter; the param groups) is saved with torch.distributed.checkpoint.save
(FileSystemWriter defaults). The values are random: only the layout and the bytes matter here. Default
size: 202M parameters, 2.4 GB.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def shapes(a):
    kv = a.dim // 2
    out = [("tok_embeddings.weight", (a.vocab, a.dim))]
    for i in range(a.layers):
        p = f"layers.{i}."
        out += [(p + "attention.wq.weight", (a.dim, a.dim)), (p + "attention.wk.weight", (kv, a.dim)),
                (p + "attention.wv.weight", (kv, a.dim)), (p + "attention.wo.weight", (a.dim, a.dim)),
                (p + "feed_forward.w1.weight", (a.ffn, a.dim)), (p + "feed_forward.w2.weight", (a.dim, a.ffn)),
                (p + "feed_forward.w3.weight", (a.ffn, a.dim)), (p + "attention_norm.weight", (a.dim,)),
                (p + "ffn_norm.weight", (a.dim,))]
    return out + [("norm.weight", (a.dim,)), ("output.weight", (a.vocab, a.dim))]


def worker(rank, a):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    import torch.distributed.checkpoint as dcp

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a.port), USE_LIBUV="0")
    dist.init_process_group("gloo", rank=rank, world_size=a.ranks)
    mesh = init_device_mesh("cpu", (a.ranks,), mesh_dim_names=("dp",))
    g = torch.Generator().manual_seed(1000 + rank)

    def shard(shape, scale):
        local = (shape[0] // a.ranks,) + tuple(shape[1:])
        return DTensor.from_local(torch.randn(local, generator=g) * scale, mesh, [Shard(0)], run_check=False,
                                  shape=torch.Size(shape), stride=torch.empty(shape, device="meta").stride())

    model, state = {}, {}
    for name, shape in shapes(a):
        model[name] = shard(shape, 0.02)
        state[name] = {"step": torch.tensor(100.0), "exp_avg": shard(shape, 1e-3), "exp_avg_sq": shard(shape, 1e-6).abs()}
    groups = [{"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1, "amsgrad": False,
               "params": [n for n, _ in shapes(a)]}]
    dcp.save({"model": model, "optim": {"state": state, "param_groups": groups}}, checkpoint_id=a.out)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--dim", type=int, default=1536)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--port", type=int, default=29517)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    mp.spawn(worker, args=(a,), nprocs=a.ranks, join=True)
    n = sum(os.path.getsize(os.path.join(a.out, f)) for f in os.listdir(a.out))
    print(f"{a.out}: {n / 1e9:.2f} GB in {len(os.listdir(a.out))} files")


if __name__ == "__main__":
    main()
