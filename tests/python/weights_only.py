"""The weights-only form of an atomic checkpoint (issue 44's contract, /work/notes/i44/contract.md), as
`ucp-convert HF_FOLDER` writes one, made from any .pt-store atomic checkpoint for tests:

    weights_only.py SRC DST        (or: from weights_only import make_weights_only)

DST gets SRC's fp32 atoms and carried files (the model-states file kept) byte for byte; the Adam moments,
the steps and zero/optimizer_state.pt are left out. Its manifest is SRC's with source.weights_only true,
source.optimizer "none", source.iteration 0, source.tag "" (a model has none), each parameter's `files` holding fp32 alone, the file list
without the files left out (the others' sizes and XXH64s, those of unchanged bytes, as SRC's manifest
recorded them) and the totals recounted. SRC is refused unless it is a .pt store with every moment."""
import json
import os
import shutil
import sys

DROPPED_STATES = ("exp_avg", "exp_avg_sq", "step")


def make_weights_only(src, dst):
    m = json.load(open(os.path.join(src, "ucp_manifest.json")))
    if m.get("store", "pt") != "pt":
        raise SystemExit(f"{src}: a {m['store']} store; weights_only.py makes the .pt store's form")
    if m["source"].get("weights_only"):
        raise SystemExit(f"{src}: already weights only")
    dropped = {"zero/optimizer_state.pt"}
    for p in m["params"]:
        for state in DROPPED_STATES:
            if state in p["files"]:
                dropped.add(p["files"].pop(state))
            elif state != "step":
                raise SystemExit(f"{src}: parameter {p['name']} has no {state} file")
    m["files"] = [f for f in m["files"] if f["path"] not in dropped]
    m["source"].update(weights_only=True, optimizer="none", iteration=0, tag="")
    m["totals"].update(files=len(m["files"]), bytes=sum(f["bytes"] for f in m["files"]))
    os.makedirs(dst)
    for f in m["files"]:
        os.makedirs(os.path.dirname(os.path.join(dst, f["path"])), exist_ok=True)
        shutil.copyfile(os.path.join(src, f["path"]), os.path.join(dst, f["path"]))
    with open(os.path.join(dst, "ucp_manifest.json"), "w") as out:
        json.dump(m, out, indent=1)
    return m


if __name__ == "__main__":
    make_weights_only(sys.argv[1], sys.argv[2])
