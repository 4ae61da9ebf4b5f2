"""Reference logits of a real DCP case, computed by the training model's own code.

    python3 tests/python/dcp_logits.py CASE_DIR --out OUT.json [--harness DIR]

CASE_DIR is one of ../shared/real-dcp/cases/<case>/. The model is the harness's `tiny_llama.Transformer`
(torchtitan names, interleaved-pair rotary), its weights loaded strictly (every key, nothing else) from the
case's reference.pt: what torch's own dcp_to_torch_save made of the checkpoint, no ucp involved. The forward
runs on IDS = (arange(2*16).view(2, 16) * 37 + 11) % 300, transformers_check.py's batch.

Debian bookworm's torch 1.13 has no F.scaled_dot_product_attention (torch 2.0): there, the causal softmax
attention it computes is supplied in its place (softmax(q k^T / sqrt(d) + causal mask) v, in float32).
"""
import argparse
import importlib.util
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.dont_write_bytecode = True  # the harness folder is shared ground truth: no __pycache__ left in it
IDS = (torch.arange(2 * 16).view(2, 16) * 37 + 11) % 300


def causal_attention(q, k, v, is_causal=False):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if is_causal:
        n = q.shape[-2]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def logits(case_dir, harness):
    if not hasattr(F, "scaled_dot_product_attention"):
        F.scaled_dot_product_attention = causal_attention
    spec = importlib.util.spec_from_file_location("tiny_llama", os.path.join(harness, "tiny_llama.py"))
    tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny)
    ref = torch.load(os.path.join(case_dir, "reference.pt"), map_location="cpu")
    model = tiny.Transformer(tiny.ModelArgs())
    model.load_state_dict(ref["model"], strict=True)
    model.eval()
    with torch.no_grad():
        return model(IDS).float()


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser()
    p.add_argument("case_dir")
    p.add_argument("--out", required=True)
    p.add_argument("--harness", default=os.path.join(here, "..", "..", "..", "shared", "real-dcp", "harness"))
    a = p.parse_args()
    out = logits(a.case_dir, a.harness)
    with open(a.out, "w") as f:
        json.dump({"case": os.path.basename(os.path.normpath(a.case_dir)), "torch": torch.__version__,
                   "ids": IDS.tolist(), "logits": out.tolist()}, f)
    print(f"{a.out}: logits {list(out.shape)} of {a.case_dir}")


if __name__ == "__main__":
    main()
