"""Checks an atomic checkpoint that ucp-convert wrote from a fixture against the fixture's ground
truth: every tensor byte for byte, the dict keys DeepSpeed's universal loader reads, step.pt,
zero/optimizer_state.pt, the carried-over model-states files, latest_universal, and every checksum
of the manifest (recomputed with python3-xxhash, an implementation independent of ucp's).

  check_atomic.py FIXTURE_DIR ATOMIC_DIR
"""
import json
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from canonical import canonical  # noqa: E402
import xxhash

sys.path.insert(0, os.path.dirname(__file__))
import ds_stubs  # noqa: E402  (SubparamShape, loss scalers, enums)
from atomic_files import same_bytes  # noqa: E402

fixture, atomic = sys.argv[1], sys.argv[2]
desc = json.load(open(os.path.join(fixture, "fixture.json")))
truth = torch.load(os.path.join(fixture, "truth.pt"))
manifest = json.load(open(os.path.join(atomic, "ucp_manifest.json")))
errors = []


def fail(msg):
    errors.append(msg)




# The keys ds_to_universal.py writes beside 'param', decided as it decides them: by the checkpoint's own
# universal_checkpoint_info, in its precedence; a parameter no rule names gets cat_dim 0. ucp's one
# deliberate difference: a row-parallel weight (Shard-H in the model) the checkpoint does not name gets
# cat_dim 1, or DeepSpeed's loader would split it on the wrong dimension at TP > 1.
first_model = sorted(f for f in desc["files"] if f.endswith("model_states.pt") and "layer_" not in f)[0]
ckpt_info = torch.load(os.path.join(fixture, desc["tag"], first_model)).get("universal_checkpoint_info") or {}


def ds_keys(name, pattern):
    def named(key):
        return any(re.match(p, name) for p in ckpt_info.get(key, []))
    sub = any(re.match(p, name) for r in ckpt_info.get("parameter_with_sub_params", []) for p in r["patterns"])
    if named("tp_replicated_parameter_patterns") or named("parameter_to_average_patterns"):
        want, cat_dim = ["param"], None
    elif named("parameter_with_2_sub_params_cat_dim_0"):
        want, cat_dim = ["cat_dim", "param_n_sub_params", "param"], 0
    elif sub:
        want, cat_dim = ["sub_param_shape", "param"], None
    else:
        want = ["cat_dim", "param"]
        cat_dim = 1 if named("parameter_with_row_parallelism_patterns") or pattern == "Shard-H" else 0
    if named("vocabulary_parameter_patterns"):
        want.insert(-1, "vocab_tensor")
    return want, cat_dim


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
        if desc["zero_stage"] == 3:
            # DeepSpeed's ZeRO-3 form: a bare 1-D tensor of the parameter as the source held it (the
            # padded vocabulary), the ground truth first and zeros in the padding rows.
            rows = desc["padded_vocab_size"] if vocab else expected.shape[0] if expected.dim() else 1
            numel = rows * (expected[0].numel() if expected.dim() else 1)
            ok = torch.is_tensor(d) and d.dim() == 1 and d.numel() == numel and d.dtype == torch.float32
            if not ok or not same_bytes(d[: expected.numel()].reshape(expected.shape), expected) or \
                    torch.any(d[expected.numel():].view(torch.int32) != 0):
                fail(f"{path}: not the ZeRO-3 form of the ground truth ({type(d).__name__} "
                     f"{tuple(getattr(d, 'shape', ()))}, expected {numel} float32 elements)")
            continue
        if not isinstance(d, dict):
            fail(f"{path}: holds {type(d).__name__}, not a dict")
            continue
        keys = list(d.keys())
        want, cat_dim = ds_keys(name, pattern)
        if keys != want:
            fail(f"{path}: keys {keys}, ds_to_universal.py writes {want} (by the checkpoint's rules)")
        if "cat_dim" in d and d["cat_dim"] != cat_dim:
            fail(f"{path}: cat_dim {d['cat_dim']} for a {pattern} parameter, expected {cat_dim}")
        if "param_n_sub_params" in d and d["param_n_sub_params"] != 2:
            fail(f"{path}: param_n_sub_params {d['param_n_sub_params']}")
        if "sub_param_shape" in d:
            # The checkpoint's own SubparamShape, tuples and all (DeepSpeed's loader tests isinstance tuple).
            sp = d["sub_param_shape"]
            rule = [r for r in ckpt_info.get("parameter_with_sub_params", []) if any(re.match(p, name) for p in r["patterns"])]
            if not isinstance(sp, ds_stubs.SubparamShape) or not rule or sp.patterns != list(rule[0]["patterns"]) or \
                    sp.shape != rule[0]["shape"] or type(sp.shape) is not tuple or \
                    type(sp.shape[0]) is not tuple or sp.partition_dim != rule[0]["partition_dim"]:
                fail(f"{path}: sub_param_shape {sp!r}, the checkpoint's rule is {rule[:1]}")
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

# zero/optimizer_state.pt: what ds_to_universal.py derives from the first optimizer file (natural
# order: dp=0, mp=00): ZeRO 0-2 drop the sharded keys and take base_optimizer_state's param_groups;
# ZeRO-3 keep the whole optimizer_state_dict and add its inner param_groups.
osd = torch.load(os.path.join(atomic, "zero", "optimizer_state.pt"))
first = sorted(f for f in desc["files"] if f.endswith("optim_states.pt") and "zero_pp_rank_0_mp_rank_00_" in f)[0]
src = torch.load(os.path.join(fixture, desc["tag"], first))["optimizer_state_dict"]
if desc["zero_stage"] < 3:
    want = {k: v for k, v in src.items() if k not in ("base_optimizer_state", "param_slice_mappings",
                                                      "single_partition_of_fp32_groups")}
    want["param_groups"] = src["base_optimizer_state"]["param_groups"]
else:
    want = dict(src)
    want["param_groups"] = src["optimizer_state_dict"]["param_groups"]
if canonical(osd) != canonical(want):
    fail(f"zero/optimizer_state.pt differs from DeepSpeed's derivation from {first} (keys {list(osd)} vs {list(want)})")

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
        if "parts" in e:  # written in parts by several ranks: each part's XXH64, the parts tiling the file
            at = 0
            for part in e["parts"]:
                piece = data[part["offset"]:part["offset"] + part["bytes"]]
                if part["offset"] != at or xxhash.xxh64(piece).hexdigest() != part["xxh64"]:
                    fail(f"{rel}: part at byte {part['offset']} ({part['bytes']} bytes): manifest says xxh64 {part['xxh64']}, "
                         f"file has {xxhash.xxh64(piece).hexdigest()} (parts so far end at byte {at})")
                at = part["offset"] + part["bytes"]
            if len(data) != e["bytes"] or at != len(data):
                fail(f"{rel}: manifest says {e['bytes']} bytes in parts ending at byte {at}, file has {len(data)} bytes")
        elif len(data) != e["bytes"] or xxhash.xxh64(data).hexdigest() != e["xxh64"]:
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

# latest_universal beside the atomic folder only in its tag's own checkpoint root (DeepSpeed's
# convention: the parent holds `latest` and the tag's folder); elsewhere nothing outside the folder.
parent = os.path.dirname(os.path.abspath(atomic))
lu = os.path.join(parent, "latest_universal")
if os.path.isfile(os.path.join(parent, "latest")) and os.path.isdir(os.path.join(parent, src["tag"])):
    if not os.path.exists(lu) or open(lu).read() != os.path.basename(os.path.abspath(atomic)):
        fail(f"{lu}: does not name {os.path.basename(atomic)}")
elif os.path.exists(lu):
    fail(f"{lu}: written outside the tag's checkpoint root")

for e in errors[:30]:
    print("FAIL", e)
print(f"{atomic}: {len(truth['params'])} parameters checked against {fixture}/truth.pt: "
      f"{'OK' if not errors else str(len(errors)) + ' problems'}")
sys.exit(1 if errors else 0)
