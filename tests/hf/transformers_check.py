"""Loads Hugging Face exports with transformers itself and compares their logits with references.

Runs where `transformers` is installed (the Debian trixie chroot of ../shared/real-readers/transformers,
not CI):  python transformers_check.py [--pair EXPORT_DIR REFERENCE.json ...] [--record EXPORT_DIR OUT.json ...]
                                      [--ids-from REFERENCE.json] [--tolerance 1e-5] [--json OUT]
--record writes what transformers made of an export (its class, dtype, loading problems, and its logits on
the fixed token batch IDS) for tests/data/hf/<case>/transformers_logits.json, which CI compares with the
training model's own logits (tests/python/hf_export.py).

For each pair: AutoModelForCausalLM.from_pretrained(EXPORT_DIR, output_loading_info=True) must report
no missing, unexpected or mismatched keys (a missing tensor would be filled with random values), and
its logits on the reference's token ids must equal the reference's (the training model's own forward
pass, tests/python/harness_logits.py) within the tolerance. Prints one row per pair; exit 1 if any fails.
"""
import argparse
import json
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM


def check(export, reference, tolerance):
    with open(reference) as f:
        ref = json.load(f)
    ids = torch.tensor(ref["ids"] if "ids" in ref else ref["batch"])  # (scripts/hf_classes_oracle.py's models say "batch")
    want = torch.tensor(ref["logits"], dtype=torch.float32)
    model, info = AutoModelForCausalLM.from_pretrained(export, output_loading_info=True)
    model.eval()
    problems = {k: sorted(v) for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")}
    with torch.no_grad():
        got = model(input_ids=ids).logits.float()
    diff = (got[..., : want.shape[-1]] - want).abs().max().item() if got.shape[:-1] == want.shape[:-1] else float("inf")
    ok = not problems and got.shape == want.shape and diff <= tolerance
    return {"export": export, "reference": ref.get("case", reference), "class": type(model).__name__,
            "dtype": str(model.dtype).replace("torch.", ""), "loading_problems": problems or None,
            "shape_ok": got.shape == want.shape, "max_abs_diff": diff, "ok": ok}


IDS = (torch.arange(2 * 16).view(2, 16) * 37 + 11) % 300  # harness_logits.py's batch


def record(export, out, ids_from=None):
    ids = torch.tensor(json.load(open(ids_from))["ids"]) if ids_from else IDS
    model, info = AutoModelForCausalLM.from_pretrained(export, output_loading_info=True)
    model.eval()
    problems = {k: sorted(v) for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")}
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    with open(out, "w") as f:
        json.dump({"reader": f"transformers {transformers.__version__}, torch {torch.__version__}",
                   "class": type(model).__name__, "dtype": str(model.dtype).replace("torch.", ""),
                   "loading_problems": problems or None, "ids": ids.tolist(), "logits": logits.tolist()}, f)
    print(f"recorded {export}: {type(model).__name__} {model.dtype}, loading problems {problems or 'none'} -> {out}")
    return not problems


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--pair", nargs=2, action="append", default=[], metavar=("EXPORT", "REFERENCE"))
    p.add_argument("--record", nargs=2, action="append", default=[], metavar=("EXPORT", "OUT"))
    p.add_argument("--ids-from", metavar="REFERENCE", help="--record on this reference's token ids (a model of a smaller vocabulary)")
    p.add_argument("--tolerance", type=float, default=1e-5)
    p.add_argument("--json")
    a = p.parse_args()
    recorded = all([record(e, o, a.ids_from) for e, o in a.record])
    rows = [check(e, r, a.tolerance) for e, r in a.pair]
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    print("| export | reference | class | dtype | loading problems | max abs logit diff | ok |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['export']} | {r['reference']} | {r['class']} | {r['dtype']} | {r['loading_problems'] or 'none'} | "
              f"{r['max_abs_diff']:.2e} | {'yes' if r['ok'] else 'NO'} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    sys.exit(0 if recorded and all(r["ok"] for r in rows) else 1)


if __name__ == "__main__":
    main()
