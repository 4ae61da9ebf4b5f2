"""Two atomic checkpoints of one Megatron-Core state compared (real_mcore.py, real_mcore_legacy.py)."""
import json
import os

import torch

from atomic_files import same_bytes


def jsonable(v):
    return json.loads(json.dumps(v))


def same_atomic(check, label, a, b):
    """Atomic checkpoints a and b hold the same parameters, each state byte for byte, and the same param groups."""
    za, zb = os.path.join(a, "zero"), os.path.join(b, "zero")
    names = sorted(d for d in os.listdir(za) if os.path.isdir(os.path.join(za, d)))
    check(f"{label}: the same parameters", names == sorted(d for d in os.listdir(zb) if os.path.isdir(os.path.join(zb, d))), str(names))
    bad = []
    for name in names:
        for state in ("fp32", "exp_avg", "exp_avg_sq", "step"):
            x, y = (torch.load(os.path.join(z, name, state + ".pt"), map_location="cpu") for z in (za, zb))
            x, y = (v["param"] if isinstance(v, dict) else v for v in (x, y))
            if type(x) is not type(y) or (torch.is_tensor(x) and not same_bytes(x, y)) or (not torch.is_tensor(x) and x != y):
                bad.append(f"{name}/{state}")
    check(f"{label}: every weight, exp_avg, exp_avg_sq and step equal byte for byte ({len(names)} x 4)", not bad, str(bad[:5]))
    ga, gb = (jsonable(torch.load(os.path.join(z, "optimizer_state.pt"), map_location="cpu").get("param_groups")) for z in (za, zb))
    check(f"{label}: the same param groups", ga == gb, f"{ga} vs {gb}")
