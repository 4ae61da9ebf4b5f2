"""A real Mixture-of-Experts checkpoint trained without ZeRO (the model's torch optimizer, its state by
position in expp_rank files), made wrong in the ways that matter to reading it: ucp-inspect and
ucp-convert exit non-zero with a message naming the file and what is wrong, and ucp-convert leaves no
output behind.

    moe_torch_state_errors.py INSPECT CONVERT CASE_DIR WORK

- expp_rank_1 missing: named as a missing rank file;
- the no-decay group split in two groups taking its parameters in turn (a valid torch state, but the
  positions carry no names and two groups' next positions have the same shape): refused, naming
  both groups, rather than guessed;
- the decay group one position short: the parameter left over is named;
- a moment stored in bf16: the position and the dtype are named.
"""
import os
import shutil
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ds_stubs  # noqa: E402,F401  DeepSpeed's pickled classes, without DeepSpeed

EXPP = "expp_rank_{}_mp_rank_00_optim_states.pt"


def load(path):
    return torch.load(path, map_location="cpu", weights_only=False) if "weights_only" in \
        torch.load.__code__.co_varnames else torch.load(path, map_location="cpu")


def rewrite(shard, change):
    """Applies change(optimizer state_dict) to every expp_rank file of `shard`."""
    r = 0
    while os.path.exists(os.path.join(shard, EXPP.format(r))):
        path = os.path.join(shard, EXPP.format(r))
        root = load(path)
        change(root["optimizer"])
        torch.save(root, path)
        r += 1


def split_no_decay(osd):
    groups = osd["param_groups"]
    k = next(i for i, g in enumerate(groups) if g["weight_decay"] == 0.0 and not g.get("moe", False))
    g = groups[k]
    a, b = dict(g), dict(g)
    a["params"], b["params"] = g["params"][0::2], g["params"][1::2]
    groups[k:k + 1] = [a, b]


def drop_last_decay(osd):
    g = next(g for g in osd["param_groups"] if g["weight_decay"] > 0 and not g.get("moe", False))
    del osd["state"][g["params"].pop()]


def bf16_moment(osd):
    st = osd["state"][osd["param_groups"][0]["params"][0]]
    st["exp_avg"] = st["exp_avg"].to(torch.bfloat16)


CASES = [
    # (name, what is done to the shard, what the messages must say)
    ("missing_expp_rank_1", lambda shard: os.remove(os.path.join(shard, EXPP.format(1))), ["expp_rank_1_mp_rank_00"]),
    ("groups_tie", lambda shard: rewrite(shard, split_no_decay), ["expp_rank_0_mp_rank_00", "cannot be told"]),
    ("position_missing", lambda shard: rewrite(shard, drop_last_decay), ["expp_rank_0_mp_rank_00", "fits the next position of no"]),
    ("bf16_moment", lambda shard: rewrite(shard, bf16_moment), ["expp_rank_0_mp_rank_00", "exp_avg is bfloat16"]),
]


def main():
    inspect, convert, case, work = sys.argv[1:5]
    src = os.path.join(case, "ckpt")
    tag = open(os.path.join(src, "latest")).read().strip()
    failed = 0
    for name, damage, needles in CASES:
        root = os.path.join(work, name)
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(src, os.path.join(root, "ckpt"))
        damage(os.path.join(root, "ckpt", tag))
        r = subprocess.run([inspect, os.path.join(root, "ckpt")], capture_output=True, text=True)
        out = os.path.join(root, "out")
        c = subprocess.run([convert, os.path.join(root, "ckpt"), "-o", out, "-q"], capture_output=True, text=True)
        said = [r.stdout + r.stderr, c.stderr]
        ok = r.returncode != 0 and c.returncode != 0 and not os.path.exists(os.path.join(out, "ucp_manifest.json")) and \
            all(n in text for n in needles for text in said)
        line = [l for l in c.stderr.splitlines() if needles[-1] in l]
        print(f"{name}: ucp-inspect exit {r.returncode}, ucp-convert exit {c.returncode}: "
              f"{line[0][-170:] if line else '(not named)'}")
        if not ok:
            failed += 1
            print(f"  FAILED: inspect said:\n{said[0][-800:]}\n  convert said:\n{said[1][-800:]}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
