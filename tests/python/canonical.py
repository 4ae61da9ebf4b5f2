"""The canonical JSON form of a Python object, as lib/pt/value_json.h describes it.

Built from what torch.load returns, independently of ucp's reader: objects are described by
__reduce_ex__(2), which is exactly what pickle wrote for them."""
import copyreg
import struct

import torch


def _hex(b):
    return bytes(b).hex()


def _global(obj):
    return {"global": f"{obj.__module__}.{obj.__qualname__}"}


def canonical(obj, max_tensor_bytes=1 << 20):
    c = lambda o: canonical(o, max_tensor_bytes)  # noqa: E731
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if type(obj) is int:
        if -(1 << 63) <= obj < (1 << 63):
            return obj
        n = (obj.bit_length() + 8) // 8
        return {"bigint": _hex(obj.to_bytes(n, "little", signed=True))}
    if type(obj) is float:
        return {"float": struct.pack(">d", obj).hex()}
    if isinstance(obj, (bytes, bytearray)):
        return {"bytes": _hex(obj)}
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        out = {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape)}
        nbytes = t.numel() * t.element_size()
        if nbytes <= max_tensor_bytes:
            flat = t.contiguous().reshape(-1)
            out["hex"] = _hex(flat.view(torch.uint8).numpy().tobytes()) if flat.numel() else ""
        return {"tensor": out}
    if isinstance(obj, torch.Size) or type(obj) is tuple:
        return {"tuple": [c(x) for x in obj]}
    if type(obj) is list:
        return {"list": [c(x) for x in obj]}
    if type(obj) in (set, frozenset):
        items = [c(x) for x in obj]
        import json
        return {"set": sorted(items, key=lambda j: json.dumps(j, separators=(",", ":"), sort_keys=True))}
    if type(obj).__name__ == "OrderedDict" or type(obj) is dict:
        return {"dict": [[c(k), c(v)] for k, v in obj.items()]}
    if isinstance(obj, type) or callable(obj) and hasattr(obj, "__qualname__") and not hasattr(obj, "__dict__"):
        return _global(obj)
    if isinstance(obj, torch.dtype):
        return {"global": f"torch.{str(obj).replace('torch.', '')}"}
    reduced = obj.__reduce_ex__(2)
    if isinstance(reduced, str):
        return {"global": f"{type(obj).__module__}.{reduced}"}
    func, args = reduced[0], reduced[1]
    state = reduced[2] if len(reduced) > 2 else None
    listitems = list(reduced[3]) if len(reduced) > 3 and reduced[3] is not None else []
    dictitems = list(reduced[4]) if len(reduced) > 4 and reduced[4] is not None else []
    if func is copyreg.__newobj__:
        cls, args = args[0], args[1:]
    else:
        cls = func
    out = {"object": f"{cls.__module__}.{cls.__qualname__}", "args": [c(a) for a in args], "state": c(state)}
    if listitems:
        out["items"] = [c(x) for x in listitems]
    if dictitems:
        out["dict_items"] = [[c(k), c(v)] for k, v in dictitems]
    return out
