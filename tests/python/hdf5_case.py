"""The HDF5 store, end to end for one fixture, checked with tools independent of ucp (h5py, h5ls,
python3-xxhash, torch):

  1. ucp-convert FIXTURE --format hdf5 (RANKS ranks): every dataset read with h5py equals the
     fixture's ground truth truth.pt byte for byte; the attributes say what the manifest says (and
     what DeepSpeed's keys in the .pt store's files say); the file validates against
     schemas/atoms-h5.schema.json, the manifest against schemas/manifest.schema.json; `h5ls -r`
     lists every parameter's group and datasets with their shapes; ucp-inspect --verify passes.
  2. ucp-convert FIXTURE (the .pt store), then --from-atomic to hdf5 (RANKS ranks): the same checks.
  3. --from-atomic back to pt from both HDF5 folders: every file of zero/ byte-identical to the
     .pt store's conversion (pt -> hdf5 -> pt and source -> hdf5 -> pt).

  hdf5_case.py UCP_CONVERT UCP_INSPECT FIXTURE_DIR WORK_DIR RANKS [MPIEXEC]
"""
import json
import os
import re
import shutil
import subprocess
import sys

import h5py
import jsonschema
import numpy as np
import torch
import xxhash

sys.path.insert(0, os.path.dirname(__file__))
import ds_stubs  # noqa: E402,F401  (SubparamShape for torch.load of the .pt store)
from torch_zygote import python_command  # noqa: E402

convert, inspect, fixture, work, ranks = sys.argv[1:6]
ranks = int(ranks)
mpiexec = sys.argv[6] if len(sys.argv) > 6 else None
root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STATES = ("fp32", "exp_avg", "exp_avg_sq")
errors = []


def fail(msg):
    errors.append(msg)


def run(args, n=1):
    cmd = [convert] + args + ["--force", "-q"]
    if n > 1:
        cmd = [mpiexec, "--oversubscribe", "-np", str(n)] + cmd
    print(" ".join(cmd), flush=True)
    p = subprocess.run(cmd, timeout=600, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stdout}{p.stderr}")


def py(v):
    """An attribute as a Python value (atoms.h5 strings are fixed-length: h5py gives bytes)."""
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, np.ndarray):
        return [py(x) for x in v]
    if isinstance(v, np.generic):
        return v.item()
    return v


def as_json_tree(f):
    """atoms.h5 as the JSON document schemas/atoms-h5.schema.json describes."""
    def attrs(o):
        return {k: py(v) for k, v in o.attrs.items()}
    tree = {"attributes": attrs(f), "groups": {}}
    for name, g in f.items():
        if not isinstance(g, h5py.Group):
            tree["groups"][name] = "not a group"
            continue
        tree["groups"][name] = {"attributes": attrs(g), "datasets": {
            k: {"dtype": d.dtype.str, "shape": list(d.shape), "chunks": list(d.chunks) if d.chunks else None,
                "attributes": attrs(d)} for k, d in g.items()}}
    return tree


def expected_attributes(entry):
    """The manifest entry's fields as atoms.h5 keeps them (schemas/atoms-h5.schema.json)."""
    out = {}
    for k, v in entry.items():
        if k in ("name", "hdf5") or v is None:
            continue
        if isinstance(v, bool):
            out[k] = int(v)
        elif isinstance(v, dict):
            for kk, vv in v.items():
                out[f"{k}.{kk}"] = vv
        else:
            out[k] = v
    return out


def check_hdf5(folder, pt_folder, what):
    desc = json.load(open(os.path.join(fixture, "fixture.json")))
    truth = torch.load(os.path.join(fixture, "truth.pt"))
    manifest = json.load(open(os.path.join(folder, "ucp_manifest.json")))
    jsonschema.validate(manifest, json.load(open(os.path.join(root, "schemas", "manifest.schema.json"))))
    if manifest.get("store") != "hdf5":
        fail(f"{what}: manifest store {manifest.get('store')!r}")
    h5path = os.path.join(folder, "atoms.h5")
    listed = {e["path"]: e for e in manifest["files"]}
    data = open(h5path, "rb").read()
    if listed.get("atoms.h5", {}).get("bytes") != len(data) or listed["atoms.h5"]["xxh64"] != xxhash.xxh64(data).hexdigest():
        fail(f"{what}: atoms.h5 size / xxh64 differ from the manifest's")
    if os.path.exists(os.path.join(folder, "zero")) and set(os.listdir(os.path.join(folder, "zero"))) != {"optimizer_state.pt"}:
        fail(f"{what}: zero/ holds {sorted(os.listdir(os.path.join(folder, 'zero')))[:5]}, expected only optimizer_state.pt")
    on_disk = {os.path.relpath(os.path.join(dp, n), folder) for dp, _, ns in os.walk(folder) for n in ns} - {"ucp_manifest.json"}
    if on_disk != set(listed):
        fail(f"{what}: files on disk {sorted(on_disk ^ set(listed))[:5]} differ from the manifest's list")
    for rel in listed:
        if rel != "atoms.h5" and open(os.path.join(folder, rel), "rb").read() != open(os.path.join(pt_folder, rel), "rb").read():
            fail(f"{what}: {rel} differs from the .pt store's conversion")
    with h5py.File(h5path, "r") as f:
        jsonschema.validate(as_json_tree(f), json.load(open(os.path.join(root, "schemas", "atoms-h5.schema.json"))))
        m_params = {p["name"]: p for p in manifest["params"]}
        if set(f.keys()) != set(truth["params"]) or set(m_params) != set(truth["params"]):
            fail(f"{what}: groups {sorted(f.keys())[:4]}..., manifest {len(m_params)}, truth {len(truth['params'])}")
        for name, states in truth["params"].items():
            g, entry = f[name], m_params[name]
            for state, expected in states.items():
                d = g[state]
                got = d[()]
                want = expected.contiguous().numpy()
                if d.dtype != np.dtype("<f4") or got.shape != want.shape or got.tobytes() != want.tobytes():
                    fail(f"{what}: /{name}/{state}: {d.dtype} {got.shape} differs from the ground truth {tuple(want.shape)}")
                digest = xxhash.xxh64(want.tobytes()).hexdigest()
                if py(d.attrs["xxh64"]) != digest or entry["hdf5"]["xxh64"][state] != digest:
                    fail(f"{what}: /{name}/{state}: xxh64 attribute {py(d.attrs['xxh64'])}, manifest "
                         f"{entry['hdf5']['xxh64'][state]}, bytes {digest}")
                if d.chunks and entry["split_dim"] is not None and entry["split_dim"] > 0:
                    dim = entry["split_dim"]
                    if d.shape[dim] % d.chunks[dim] or d.chunks[dim] == d.shape[dim] and d.shape[dim] % 2 == 0:
                        fail(f"{what}: /{name}/{state}: chunks {d.chunks} do not cut split dim {dim} of {d.shape}")
            attrs = {k: py(v) for k, v in g.attrs.items()}
            for k, v in expected_attributes(entry).items():
                if attrs.get(k) != v:
                    fail(f"{what}: /{name} attribute {k} = {attrs.get(k)!r}, the manifest says {v!r}")
            if attrs.get("step_kind") != "tensor" or float(attrs.get("step", -1)) != float(truth["step"]) or \
                    g.attrs["step"].dtype != np.float32:
                fail(f"{what}: /{name} step {attrs.get('step')!r} ({attrs.get('step_kind')}), expected float32 {truth['step']}")
            # DeepSpeed's keys: what the .pt store's file of the same parameter holds.
            ptd = torch.load(os.path.join(pt_folder, "zero", name, "fp32.pt"))
            if torch.is_tensor(ptd):  # DeepSpeed's ZeRO-3 form: a bare 1-D tensor
                ptd = {"zero3_numel": ptd.numel()}
            want = {"universal.vocab_tensor": int(bool(ptd.get("vocab_tensor", False)))}
            if "zero3_numel" in ptd:
                want["universal.zero3_numel"] = ptd["zero3_numel"]
            if "cat_dim" in ptd:
                want["universal.cat_dim"] = ptd["cat_dim"]
            if "param_n_sub_params" in ptd:
                want["universal.param_n_sub_params"] = ptd["param_n_sub_params"]
            if "sub_param_shape" in ptd:
                sp = ptd["sub_param_shape"]
                want["universal.sub_param_shape.patterns"] = list(sp.patterns)
                want["universal.sub_param_shape.sizes"] = list(sp.shape[sp.partition_dim])
                want["universal.sub_param_shape.partition_dim"] = sp.partition_dim
            have = {k: v for k, v in attrs.items() if k.startswith("universal.")}
            if have != want:
                fail(f"{what}: /{name} universal attributes {have}, the .pt file says {want}")
        if py(f.attrs["ucp_layout"]) != "ucp-atoms-h5" or int(f.attrs["ucp_layout_version"]) != 1:
            fail(f"{what}: root attributes {dict(f.attrs)}")
    # h5ls -r: every group and dataset, with the manifest's shapes.
    out = subprocess.run(["h5ls", "-r", h5path], capture_output=True, text=True, check=True).stdout
    seen = {}
    for line in out.splitlines():
        m = re.match(r"^(/\S+)\s+(Group|Dataset \{([^}]*)\})$", line)
        if m:
            seen[m.group(1)] = [] if m.group(2) == "Group" else [int(x) for x in m.group(3).replace("SCALAR", "").split(",") if x.strip()]
    want = {}
    for p in manifest["params"]:
        want["/" + p["name"]] = []
        for s in STATES:
            want[f"/{p['name']}/{s}"] = p["shape"]
    if seen != want:
        fail(f"{what}: h5ls -r: missing or extra {sorted(set(seen) ^ set(want))[:4]}, other shapes "
             f"{[k for k in want if k in seen and seen[k] != want[k]][:4]}")
    p = subprocess.run([inspect, folder, "--verify"], capture_output=True, text=True)
    if p.returncode != 0 or "all files match" not in p.stdout or "datasets of atoms.h5" not in p.stdout:
        fail(f"{what}: ucp-inspect --verify exit {p.returncode}\n{p.stdout[-800:]}{p.stderr}")
    print(f"{what}: {folder}: {len(truth['params'])} parameters x {len(STATES)} datasets checked with h5py, "
          f"{len(seen)} h5ls entries", flush=True)


def same_pt_stores(a, b, what):
    for dp, _, ns in os.walk(os.path.join(a, "zero")):
        for n in ns:
            rel = os.path.relpath(os.path.join(dp, n), a)
            pb = os.path.join(b, rel)
            if not os.path.exists(pb) or open(os.path.join(a, rel), "rb").read() != open(pb, "rb").read():
                fail(f"{what}: {rel} is not byte-identical")
    na = sum(len(ns) for _, _, ns in os.walk(os.path.join(a, "zero")))
    nb = sum(len(ns) for _, _, ns in os.walk(os.path.join(b, "zero")))
    if na != nb:
        fail(f"{what}: {na} files under zero/ against {nb}")
    print(f"{what}: {na} files under zero/ compared", flush=True)


shutil.rmtree(work, ignore_errors=True)
pt = os.path.join(work, "pt", "universal")
h5 = os.path.join(work, "h5", "universal")
pt2h5 = os.path.join(work, "pt2h5", "universal")
run([fixture, "-o", pt])
# On 3 ranks, --split-above 4K cuts the optimizer files between the ranks that read them (the HDF5
# store writes every tensor whole; the size still cuts the reading).
cut = ["--split-above", "4K"] if ranks >= 3 else []
run([fixture, "-o", h5, "--format", "hdf5"] + cut, ranks)
if os.path.exists(os.path.join(work, "h5", "latest_universal")):
    fail("source -> hdf5 wrote latest_universal (DeepSpeed cannot read the HDF5 store)")
check_hdf5(h5, pt, "source -> hdf5")
run(["--from-atomic", pt, "-o", pt2h5, "--format", "hdf5"], ranks)
check_hdf5(pt2h5, pt, "pt -> hdf5")
for src, name in ((h5, "source -> hdf5 -> pt"), (pt2h5, "pt -> hdf5 -> pt")):
    back = os.path.join(work, name.replace(" ", "").replace(">", ""), "universal")
    run(["--from-atomic", src, "-o", back, "--format", "pt"], ranks)
    same_pt_stores(pt, back, name)
    check = os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_atomic.py")
    if subprocess.run(python_command(check, fixture, back)).returncode != 0:
        fail(f"{name}: check_atomic.py failed")

for e in errors[:30]:
    print("FAIL", e)
print(f"{fixture}: {'OK' if not errors else str(len(errors)) + ' problems'}")
sys.exit(1 if errors else 0)
