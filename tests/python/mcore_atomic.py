"""Atomic checkpoints of Megatron-Core states checked (real_mcore.py, real_mcore_legacy.py): two of one state
compared, and a weights-only one against the model's own tensors."""
import json
import os

import torch

from atomic_files import same_bytes


def jsonable(v):
    return json.loads(json.dumps(v))


def same_atomic(check, label, a, b, groups_of=None):
    """Atomic checkpoints a and b hold the same parameters, each state byte for byte, and the same param groups
    (or b the groups groups_of(a's groups) gives: a layout at which the job builds other groups)."""
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
    if groups_of is not None:
        ga = groups_of(ga)
    check(f"{label}: the same param groups" + (" (as the new layout's job builds them)" if groups_of else ""), ga == gb, f"{ga} vs {gb}")


def weights_only_converts(run, check, label, folder, ref, work):
    """ucp-convert of a weights-only save at 1 and 2 ranks: its parameters are the model keys of reference.pt
    `ref`, each the model's tensor widened to fp32, with no optimizer state. Returns the 2-rank atomic folder."""
    for np in (1, 2):
        atomic = os.path.join(work, f"weights-only-np{np}")
        r = run("ucp-convert", [folder, "-o", atomic], ranks=np)
        check(f"{label}: converts at {np} rank(s)", r.returncode == 0, r.stderr[-1200:])
        if r.returncode != 0:
            continue
        zero = os.path.join(atomic, "zero")
        names = sorted(d for d in os.listdir(zero) if os.path.isdir(os.path.join(zero, d)))

        def fp32(n):
            v = torch.load(os.path.join(zero, n, "fp32.pt"), map_location="cpu")
            return v["param"] if isinstance(v, dict) else v
        bad = [n for n in names if not same_bytes(fp32(n), ref[n].float())]
        check(f"{label} np{np}: the model keys, each the model's tensor widened to fp32, no optimizer state",
              names == sorted(k for k in ref if not k.startswith("optimizer.")) and not bad and
              not any(os.path.exists(os.path.join(zero, n, "exp_avg.pt")) for n in names), str(bad[:5]))
    return os.path.join(work, "weights-only-np2")
