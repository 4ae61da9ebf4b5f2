"""Loads every file ucp wrote into DIR with Python's torch.load and compares it with the canonical
JSON ucp recorded beside it. Exits non-zero on any difference."""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from canonical import canonical  # noqa: E402
import ds_stubs  # noqa: E402,F401 - DeepSpeed classes, for files that pickle them

d = sys.argv[1]
names = sorted(n[:-3] for n in os.listdir(d) if n.endswith(".pt"))
failed = 0
for n in names:
    expected = json.load(open(os.path.join(d, n + ".json")))
    actual = canonical(torch.load(os.path.join(d, n + ".pt"), map_location="cpu"))
    if actual != expected:
        failed += 1
        print(f"{n}: torch.load gives\n  {json.dumps(actual)[:2000]}\nucp recorded\n  {json.dumps(expected)[:2000]}")
print(f"{len(names) - failed} passed, {failed} failed")
sys.exit(1 if failed or not names else 0)
