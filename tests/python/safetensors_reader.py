"""A safetensors reader written here for the tests (the format's rules, every field checked), so that an
export is read by something other than the code that wrote it."""
import json
import os
import struct

import torch

DTYPES = {"F32": (torch.float32, 4), "BF16": (torch.bfloat16, 2), "F16": (torch.float16, 2)}


def read_safetensors(path):
    """{name: tensor} of a safetensors file, every field of the container checked (the format's rules:
    u64 little-endian header length, JSON header, offsets contiguous from 0 to the end of the file)."""
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    meta = header.pop("__metadata__", None)
    assert meta == {"format": "pt"}, f"{path}: __metadata__ {meta}"
    assert (8 + n) % 8 == 0, f"{path}: data starts at {8 + n}, not 8-aligned"
    out, ends = {}, []
    for name, h in header.items():
        dtype, size = DTYPES[h["dtype"]]
        a, b = h["data_offsets"]
        numel = 1
        for d in h["shape"]:
            numel *= d
        assert b - a == numel * size, f"{path}: {name}: {b - a} bytes for shape {h['shape']}"
        ends.append((a, b))
        out[name] = torch.frombuffer(bytearray(body[a:b]), dtype=dtype).reshape(h["shape"]) if numel else \
            torch.empty(h["shape"], dtype=dtype)
    ends.sort()
    at = 0
    for a, b in ends:
        assert a == at, f"{path}: a gap or overlap at byte {a}"
        at = b
    assert at == len(body), f"{path}: {len(body) - at} bytes after the last tensor"
    return out


def read_model_folder(d):
    """{name: tensor} of every *.safetensors file in folder `d` (a model, one file or its shards)."""
    out = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            out.update(read_safetensors(os.path.join(d, f)))
    return out
