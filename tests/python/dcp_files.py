"""A PyTorch Distributed Checkpoint folder read without torch.distributed.checkpoint (torch 1.13 has
not its classes): .metadata through an unpickler that builds a plain stand-in for each class it
names (nothing imported or run), every storage range torch.load-ed as the torch.save file it is,
chunks placed at their offsets. Written here from DCP's file layout (../shared/real-dcp/README.md),
so that a test of ucp's DCP writer does not read its files with ucp's own reader alone.

    read_dcp(folder) -> (tensors {key: tensor}, objects {key: value}, metadata)
"""
import io
import os
import pickle

import torch


class Stand:  # an instance of any class the pickle names: its args and its fields
    def __init__(self, *args):
        self.args = args

    def __setstate__(self, state):
        if isinstance(state, dict):
            self.__dict__.update(state)
        else:
            self.state = state

    def __hash__(self):
        return id(self)


ALLOWED = {"torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem",
           "torch.serialization", "pathlib", "pathlib._local", "torch"}


class MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module not in ALLOWED:
            raise pickle.UnpicklingError(f"class {module}.{name} in .metadata")
        if (module, name) == ("torch", "Size"):
            return tuple
        if module == "torch":
            return f"torch.{name}"  # a dtype, by name
        return type(name, (Stand,), {"module": module})


DTYPES = {"torch.float32": torch.float32, "torch.bfloat16": torch.bfloat16, "torch.float16": torch.float16}


def read_metadata(folder):
    with open(os.path.join(folder, ".metadata"), "rb") as f:
        return MetadataUnpickler(f).load()


def read_dcp(folder):
    md = read_metadata(folder)
    tensors, objects, extents = {}, {}, {}
    for key, entry in md.state_dict_metadata.items():
        if type(entry).__name__ == "TensorStorageMetadata":
            dtype = DTYPES.get(entry.properties.state[0])
            assert dtype is not None, f"{key}: dtype {entry.properties.state[0]}"
            tensors[key] = torch.full(tuple(entry.size), float("nan"), dtype=dtype)
    data = {}
    for index, info in md.storage_data.items():
        path = os.path.join(folder, info.relative_path)
        if path not in data:
            with open(path, "rb") as f:
                data[path] = f.read()
        extents.setdefault(info.relative_path, []).append((info.offset, info.length))
        value = torch.load(io.BytesIO(data[path][info.offset:info.offset + info.length]))
        if getattr(index, "offset", None) is None:  # a bytes item's has none
            objects[index.fqn] = value
            continue
        target = tensors[index.fqn]
        chunk = md.state_dict_metadata[index.fqn].chunks[index.index]
        assert tuple(chunk.offsets) == tuple(index.offset), f"{index.fqn}: chunk {index.index} is at {chunk.offsets}, not {index.offset}"
        assert tuple(value.shape) == tuple(chunk.sizes), f"{index.fqn}: a chunk of {tuple(value.shape)}, the metadata says {chunk.sizes}"
        view = target
        for d, (o, s) in enumerate(zip(chunk.offsets, chunk.sizes)):
            view = view.narrow(d, o, s)
        view.copy_(value)
    for name, ranges in extents.items():  # the ranges tile each file exactly
        ranges.sort()
        at = 0
        for o, n in ranges:
            assert o == at, f"{name}: a gap or overlap at byte {at}"
            at += n
        assert at == os.path.getsize(os.path.join(folder, name)), f"{name}: {os.path.getsize(os.path.join(folder, name)) - at} bytes past its items"
    return tensors, objects, md
