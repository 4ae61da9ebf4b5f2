"""Writes torch.save files covering what ucp's reader must read, each with its expected canonical
JSON (canonical.py) beside it: OUT/<case>.pt and OUT/<case>.json."""
import argparse
import collections
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
from canonical import canonical  # noqa: E402
import ds_stubs  # noqa: E402


def cases():
    g = torch.Generator().manual_seed(1234)
    out = {}
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32,
                  torch.int16, torch.int8, torch.uint8, torch.bool):
        if dtype.is_floating_point:
            t = torch.randn(3, 5, generator=g).to(dtype)
        elif dtype == torch.bool:
            t = torch.randint(0, 2, (3, 5), generator=g).bool()
        else:
            t = torch.randint(-100 if dtype != torch.uint8 else 0, 100, (3, 5), generator=g).to(dtype)
        out[f"dtype_{str(dtype).replace('torch.', '')}"] = {"t": t}
    base = torch.arange(60, dtype=torch.float32).reshape(6, 10)
    out["views"] = {
        "transposed": base.t(),                 # non-contiguous
        "offset_slice": base[2:4, 3:7],         # storage offset + strides
        "column": base[:, 5],                   # stride 10
        "narrow_flat": base.view(-1)[7:19],     # offset, contiguous
        "expanded": torch.tensor([1.0, 2.0]).expand(3, 2),  # stride 0
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 4),
    }
    shared = torch.randn(8, 4, generator=g)
    out["shared_storage"] = {"a": shared, "b": shared[2:5], "c": shared.view(32)[1::3]}
    out["nested"] = {
        "list": [1, 2.5, "three", None, True, False, b"\x00\xffbytes", [torch.ones(2)], (4, (5, 6))],
        "od": collections.OrderedDict([("z", 1), ("a", 2), (3, "int key"), ((1, 2), "tuple key")]),
        "big": 2 ** 70, "neg": -(2 ** 40), "small_neg": -5, "i32": 2 ** 31 - 1, "i33": 2 ** 31,
        "floats": [0.1, -0.0, float("inf"), 1e300], "set": {1, 2, 3}, "unicode": "päräm ∑",
        "size": torch.Size([3, 4]), "param": torch.nn.Parameter(torch.randn(2, 2, generator=g)),
    }
    ns = argparse.Namespace(tensor_model_parallel_size=2, pipeline_model_parallel_size=1, num_layers=4,
                            hidden_size=64, bf16=True, fp16=False, lr=1.5e-4, data_path=["a", "b"],
                            params_dtype=torch.bfloat16, padded_vocab_size=512)
    out["objects"] = {
        "args": ns,
        "zero_stage": ds_stubs.ZeroStageEnum.gradients,
        "fragment": ds_stubs.fragment_address(numel=12, start=30),
        "mappings": [collections.OrderedDict([("w", ds_stubs.fragment_address(numel=6, start=0))])],
        "loss_scaler": ds_stubs.DynamicLossScaler(),
        "dtype": torch.float16,
        "rng": np.random.RandomState(3).get_state(),
        "np_array": np.arange(6, dtype=np.uint32).reshape(2, 3),
    }
    # torch.save's default protocol is 2; newer protocols must read as well.
    out["protocol4"] = {"w": torch.randn(4, 3, generator=g), "s": "x" * 300, "nested": {"k": [1, 2]}}
    return out


class _Storage:
    """Stands for a storage in a hand-made pickle (see bad_cases)."""
    def __init__(self, key, numel):
        self.key, self.numel = key, numel


class _Tensor:
    def __init__(self, storage, offset, size):
        self.storage, self.offset, self.size = storage, offset, size

    def __reduce__(self):
        return (torch._utils._rebuild_tensor_v2,
                (self.storage, self.offset, self.size, (1,) * len(self.size), False, collections.OrderedDict()))


def write_archive(path, obj, records):
    """A torch.save-shaped zip whose pickle we control: storages become persistent ids."""
    import io
    import pickle
    import zipfile

    class P(pickle.Pickler):
        def persistent_id(self, o):
            if isinstance(o, _Storage):
                return ("storage", torch.FloatStorage, o.key, "cpu", o.numel)
            return None

    buf = io.BytesIO()
    P(buf, protocol=2).dump(obj)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", buf.getvalue())
        for key, data in records.items():
            z.writestr(f"archive/data/{key}", data)
        z.writestr("archive/version", "3\n")


def bad_cases(out):
    """Archives that are well-formed zips with lying pickles, and the error each must produce."""
    sixteen = bytes(16)  # 4 float32 elements
    cases = {
        "absurd_numel": ({"t": _Tensor(_Storage("0", 2 ** 40), 0, (2 ** 40,))}, {"0": sixteen}, "declares 1099511627776"),
        "view_out_of_bounds": ({"t": _Tensor(_Storage("0", 4), 2, (4,))}, {"0": sixteen}, "needs storage '0'"),
        "missing_record": ({"t": _Tensor(_Storage("7", 4), 0, (4,))}, {"0": sixteen}, "has no record"),
        "huge_shape": ({"t": _Tensor(_Storage("0", 4), 0, (2 ** 40, 2 ** 40))}, {"0": sixteen}, "absurd"),
    }
    for name, (obj, records, message) in cases.items():
        write_archive(os.path.join(out, f"bad_{name}.pt"), obj, records)
        with open(os.path.join(out, f"bad_{name}.error"), "w") as f:
            f.write(message)
    return len(cases)


def rewritten(src_bytes, path, change=lambda name, data: data):
    """The records of a torch.save archive written again by Python's zipfile, which aligns nothing (torch
    aligns each record to 64 bytes), each record passed through change(name, data). Returns the data offsets."""
    import io
    import zipfile

    src = zipfile.ZipFile(io.BytesIO(src_bytes))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for info in src.infolist():
            z.writestr(info.filename, change(info.filename, src.read(info)))
    with zipfile.ZipFile(path) as z:
        return {i.filename: i.header_offset + 30 + len(i.filename.encode()) + len(i.extra) for i in z.infolist()}


def unaligned_case(out):
    """A torch.save archive whose tensor records lie at offsets that are not multiples of their element size
    (as a zip tool repacking a checkpoint leaves them): read like any other, equal to torch.load's values."""
    import io

    g = torch.Generator().manual_seed(99)
    obj = {"f32": torch.randn(3, 5, generator=g), "f16": torch.randn(7, generator=g).half(),
           "bf16": torch.randn(2, 3, generator=g).bfloat16(), "f64": torch.randn(4, generator=g).double(),
           "i64": torch.arange(-3, 3)}
    buf = io.BytesIO()
    torch.save(obj, buf)
    path = os.path.join(out, "unaligned_records.pt")
    offsets = rewritten(buf.getvalue(), path)
    data = [o for name, o in offsets.items() if "/data/" in name]
    assert any(o % 8 for o in data) and any(o % 4 for o in data), f"the records happen to be aligned: {offsets}"
    again = torch.load(path)
    assert all(torch.equal(again[k], obj[k]) for k in obj), "torch.load reads the rewritten archive otherwise"
    with open(os.path.join(out, "unaligned_records.json"), "w") as f:
        json.dump(canonical(obj), f)


def big_endian_case(out):
    """What torch.save (2.1 and later, which records the byte order) writes on a big-endian machine: a
    'byteorder' record holding 'big', storages in that order. ucp must refuse it, not read other numbers."""
    import io

    buf = io.BytesIO()
    torch.save({"t": torch.arange(6, dtype=torch.float32).reshape(2, 3) / 4}, buf)

    def to_big_endian(name, data):
        if "/data/" in name:
            return np.frombuffer(data, dtype="<f4").astype(">f4").tobytes()
        return data

    prefix = "archive/"
    rewritten(buf.getvalue(), os.path.join(out, "bad_big_endian.pt"), to_big_endian)
    import zipfile
    with zipfile.ZipFile(os.path.join(out, "bad_big_endian.pt"), "a") as z:
        z.writestr(prefix + "byteorder", b"big")
    with open(os.path.join(out, "bad_big_endian.error"), "w") as f:
        f.write("record 'archive/byteorder' says 'big': saved on a big-endian machine")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for name, obj in cases().items():
        path = os.path.join(a.out, name + ".pt")
        if name == "protocol4":
            torch.save(obj, path, pickle_protocol=4)
        else:
            torch.save(obj, path)
        with open(os.path.join(a.out, name + ".json"), "w") as f:
            json.dump(canonical(obj), f)
    unaligned_case(a.out)
    big_endian_case(a.out)
    n_bad = bad_cases(a.out) + 1
    print(f"wrote {len(cases()) + 1} reader cases and {n_bad} bad archives to {a.out}")


if __name__ == "__main__":
    main()
