"""A safetensors writer written here for the tests (the format's rules: u64 little-endian header length,
JSON header padded with spaces to 8 bytes, tensors contiguous from offset 0), so that ucp's reader
reads files that ucp did not write. `layout` may damage the header on purpose (see hf_import.py)."""
import json
import struct

import torch

NAMES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.int64: "I64"}


def tensor_bytes(t):
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def header_of(tensors, metadata=None):
    """(header dict, data bytes) of {name: tensor}, in the dict's order."""
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, t in tensors.items():
        b = tensor_bytes(t)
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [len(data), len(data) + len(b)]}
        data += b
    return header, data


def pack(header, data):
    """The file's bytes of a header dict and the data after it."""
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def write_safetensors(path, tensors, metadata=None):
    header, data = header_of(tensors, {"format": "pt"} if metadata is None else metadata)
    with open(path, "wb") as f:
        f.write(pack(header, data))
