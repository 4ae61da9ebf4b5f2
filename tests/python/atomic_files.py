"""Reading an atomic checkpoint's state files the way DeepSpeed's universal loader does."""
import math

import torch


def atomic_tensor(v, shape):
    """The tensor a state file holds: the dict form's 'param', or the ZeRO-3 form's bare 1-D tensor
    (vocabulary padding, if any, at its end), shaped `shape`."""
    if isinstance(v, dict):
        return v["param"].detach()
    return v.detach().reshape(-1)[: math.prod(shape)].reshape(shape)


def same_bytes(a, b):
    """Equal dtype, shape and bytes (any dtype; NaNs compare by their bits)."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.reshape(-1).contiguous().view(torch.uint8),
                                                                    b.reshape(-1).contiguous().view(torch.uint8))
