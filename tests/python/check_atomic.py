"""Checks an atomic checkpoint that ucp-convert wrote from a fixture against the fixture's ground
truth: every tensor byte for byte, the dict keys DeepSpeed's universal loader reads, step.pt,
zero/optimizer_state.pt, the carried-over model-states files, latest_universal, and every checksum
of the manifest (recomputed with python3-xxhash, an implementation independent of ucp's).

  check_atomic.py FIXTURE_DIR ATOMIC_DIR
"""
import json
import os
import sys

import torch
import xxhash

sys.path.insert(0, os.path.dirname(__file__))
import ds_stubs  # noqa: E402  (SubparamShape, loss scalers, enums)

fixture, atomic = sys.argv[1], sys.argv[2]
desc = json.load(open(os.path.join(fixture, "fixture.json")))
truth = torch.load(os.path.join(fixture, "truth.pt"))
manifest = json.load(open(os.path.join(atomic, "ucp_manifest.json")))
errors = []


def fail(msg):
    errors.append(msg)


def same_bytes(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32),
                                                                        b.contiguous().view(torch.int32))


for name, states in truth["params"].items():
    info = desc["params"][name]
    pattern = info["pattern"]
    vocab = name.endswith("word_embeddings.weight")
    for state, expected in states.items():
        path = os.path.join(atomic, "zero", name, state + ".pt")
        if not os.path.exists(path):
            fail(f"{path}: missing")
            continue
        d = torch.load(path)
        if not isinstance(d, dict):
            fail(f"{path}: holds {type(d).__name__}, not a dict")
            continue
        keys = list(d.keys())
        if pattern in ("Replicate", "Partial"):
            want = ["param"]
        elif pattern == "Shard-NC" and "query_key_value" in name:
            want = ["sub_param_shape", "param"]
        elif pattern == "Shard-NC":
            want = ["cat_dim", "param_n_sub_params", "param"]
        else:
            want = ["cat_dim", "param"]
        if vocab:
            want.insert(-1, "vocab_tensor")
        if keys != want:
            fail(f"{path}: keys {keys}, DeepSpeed's layout for {pattern} is {want}")
        if "cat_dim" in d and d["cat_dim"] != (1 if pattern == "Shard-H" else 0):
            fail(f"{path}: cat_dim {d['cat_dim']} for a {pattern} parameter")
        if "param_n_sub_params" in d and d["param_n_sub_params"] != 2:
            fail(f"{path}: param_n_sub_params {d['param_n_sub_params']}")
        if "sub_param_shape" in d:
            sp = d["sub_param_shape"]
            if not isinstance(sp, ds_stubs.SubparamShape) or sp.partition_dim != 0 or \
                    sum(sp.shape[0]) != expected.shape[0] or sp.shape[1] != expected.shape[1]:
                fail(f"{path}: sub_param_shape {sp!r}")
        if vocab and d.get("vocab_tensor") is not True:
            fail(f"{path}: vocab_tensor is not True")
        got = d.get("param")
        if not torch.is_tensor(got) or not same_bytes(got, expected):
            fail(f"{path}: param {getattr(got, 'dtype', None)} {tuple(getattr(got, 'shape', ()))} differs from the "
                 f"ground truth {expected.dtype} {tuple(expected.shape)}")
    step = torch.load(os.path.join(atomic, "zero", name, "step.pt"))
    if not torch.is_tensor(step) or step.dim() != 0 or float(step) != float(truth["step"]):
        fail(f"{name}/step.pt: {step!r}, expected a 0-dim tensor {truth['step']}")

extra = sorted(set(os.listdir(os.path.join(atomic, "zero"))) - set(truth["params"]) - {"optimizer_state.pt"})
if extra:
    fail(f"zero/ holds entries that are no parameter: {extra[:5]}")

osd = torch.load(os.path.join(atomic, "zero", "optimizer_state.pt"))
for k in ("param_groups",) + (("ds_version",) if desc["zero_stage"] < 3 else ("optimizer_state_dict",)):
    if k not in osd:
        fail(f"zero/optimizer_state.pt: no '{k}' (keys {list(osd)})")
for k in ("base_optimizer_state", "single_partition_of_fp32_groups", "param_slice_mappings", "fp32_flat_groups"):
    if k in osd:
        fail(f"zero/optimizer_state.pt: still holds the sharded '{k}'")
if desc["zero_stage"] < 3:
    if osd.get("group_paddings") != [0] * len(osd["param_groups"]):
        fail(f"zero/optimizer_state.pt: group_paddings {osd.get('group_paddings')}")
    if osd.get("partition_count") != [desc["dp"]] * len(osd["param_groups"]):
        fail(f"zero/optimizer_state.pt: partition_count {osd.get('partition_count')}")
    if desc["optimizer"] == "zero" and "loss_scaler" not in osd:
        fail("zero/optimizer_state.pt: no loss_scaler")

# Model-states files: carried over byte for byte.
tagdir = os.path.join(fixture, desc["tag"])
carried = [f for f in desc["files"] if f.startswith("mp_rank_") or f.endswith("_model_states.pt") and f.startswith("zero_pp")]
for f in carried:
    a, b = os.path.join(tagdir, f), os.path.join(atomic, f)
    if not os.path.exists(b) or open(a, "rb").read() != open(b, "rb").read():
        fail(f"{f}: not carried over unchanged")

# Manifest: every file listed with its true size and xxh64, nothing unlisted, nothing left over.
listed = {e["path"]: e for e in manifest["files"]}
on_disk = set()
for dirpath, _, names in os.walk(atomic):
    for n in names:
        rel = os.path.relpath(os.path.join(dirpath, n), atomic)
        if rel != "ucp_manifest.json":
            on_disk.add(rel)
if on_disk != set(listed):
    fail(f"manifest lists {len(listed)} files, the folder holds {len(on_disk)}: "
         f"unlisted {sorted(on_disk - set(listed))[:5]}, missing {sorted(set(listed) - on_disk)[:5]}")
for rel, e in listed.items():
    p = os.path.join(atomic, rel)
    if os.path.exists(p):
        data = open(p, "rb").read()
        if len(data) != e["bytes"] or xxhash.xxh64(data).hexdigest() != e["xxh64"]:
            fail(f"{rel}: manifest says {e['bytes']} bytes xxh64 {e['xxh64']}, file has {len(data)} bytes "
                 f"xxh64 {xxhash.xxh64(data).hexdigest()}")
m_params = {p["name"]: p for p in manifest["params"]}
if set(m_params) != set(truth["params"]):
    fail("manifest parameters differ from the model's")
for name, p in m_params.items():
    if name in desc["params"]:
        if p["shape"] != desc["params"][name]["shape"] or p["pattern"] != desc["params"][name]["pattern"]:
            fail(f"manifest: {name}: shape {p['shape']} pattern {p['pattern']}, fixture says "
                 f"{desc['params'][name]}")
src = manifest["source"]
for k in ("dp", "tp", "pp", "zero_stage", "dtype", "optimizer"):
    if src[k] != desc[k]:
        fail(f"manifest source {k} = {src[k]}, fixture {desc[k]}")

lu = os.path.join(os.path.dirname(os.path.abspath(atomic)), "latest_universal")
if not os.path.exists(lu) or open(lu).read() != os.path.basename(os.path.abspath(atomic)):
    fail(f"{lu}: does not name {os.path.basename(atomic)}")

for e in errors[:30]:
    print("FAIL", e)
print(f"{atomic}: {len(truth['params'])} parameters checked against {fixture}/truth.pt: "
      f"{'OK' if not errors else str(len(errors)) + ' problems'}")
sys.exit(1 if errors else 0)
