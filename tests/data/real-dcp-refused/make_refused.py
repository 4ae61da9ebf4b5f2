"""DCP checkpoints ucp-convert must refuse by name, each written by torch's own DCP writer (one process,
no process group), in the Debian trixie chroot of ../../../../shared/real-dcp/harness/README.md:

    python3 make_refused.py OUT_DIR     ->  OUT_DIR/<case>/checkpoint/ and OUT_DIR/<case>/expect.txt

expect.txt lists, one per line, what the refusal must name. The state dicts have the nesting
get_state_dict gives ({"model": ..., "optim": {"state": ..., "param_groups": ...}}).
"""
import os
import sys

import torch
import torch.distributed.checkpoint as dcp

SHAPES = {"tok_embeddings.weight": (10, 4), "layers.0.attention.wq.weight": (4, 4), "norm.weight": (4,)}


def state(dtype=torch.float32, extra=None, moments=True):
    g = torch.Generator().manual_seed(3)
    model = {n: torch.randn(s, generator=g).to(dtype) for n, s in SHAPES.items()}
    if not moments:
        return {"model": model}
    st = {}
    for n, s in SHAPES.items():
        st[n] = {"step": torch.tensor(5.0), "exp_avg": torch.randn(s, generator=g).to(dtype),
                 "exp_avg_sq": torch.rand(s, generator=g).to(dtype)}
        if extra:
            st[n][extra] = torch.rand(s, generator=g)
    groups = [{"lr": 1e-3, "params": list(SHAPES)}]
    return {"model": model, "optim": {"state": st, "param_groups": groups}}


CASES = {
    "amsgrad": (state(extra="max_exp_avg_sq"), ["max_exp_avg_sq", "not supported"]),
    "weights_only": (state(moments=False), ["no optimizer state", "weights only"]),
    "bf16": (state(dtype=torch.bfloat16), ["bfloat16", "not supported"]),
}

if __name__ == "__main__":
    out = sys.argv[1]
    for name, (sd, expect) in CASES.items():
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        dcp.save(sd, checkpoint_id=os.path.join(d, "checkpoint"))  # no process group: torch saves as one process
        with open(os.path.join(d, "expect.txt"), "w") as f:
            f.write("\n".join(expect) + "\n")
        print(f"{d}: {sorted(os.listdir(os.path.join(d, 'checkpoint')))}")
    print(f"torch {torch.__version__}")
