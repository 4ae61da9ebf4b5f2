"""Stand-ins for the DeepSpeed classes real checkpoints pickle, under their real module paths, so
fixtures written here carry the same GLOBAL references as DeepSpeed's own files and Python can load
them back without DeepSpeed installed."""
import dataclasses
import enum
import sys
import types


def _module(name):
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        sub = ".".join(parts[:i])
        if sub not in sys.modules:
            sys.modules[sub] = types.ModuleType(sub)
            if i > 1:
                setattr(sys.modules[".".join(parts[:i - 1])], parts[i - 1], sys.modules[sub])
    return sys.modules[name]


class ZeroStageEnum(int, enum.Enum):
    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3
    max_stage = 3


ZeroStageEnum.__module__ = "deepspeed.runtime.zero.config"
_module("deepspeed.runtime.zero.config").ZeroStageEnum = ZeroStageEnum


@dataclasses.dataclass
class fragment_address:  # noqa: N801 - DeepSpeed's name
    numel: int
    start: int


fragment_address.__module__ = "deepspeed.utils.tensor_fragment"
_module("deepspeed.utils.tensor_fragment").fragment_address = fragment_address


class LossScaler:
    def __init__(self, scale=1):
        self.cur_scale = scale
        self.dynamic = False


class DynamicLossScaler:
    def __init__(self, init_scale=2 ** 16, scale_factor=2.0, scale_window=1000, min_scale=1,
                 delayed_shift=1, consecutive_hysteresis=False, raise_error_at_min_scale=True, dtype=None):
        import torch
        self.cur_scale = float(init_scale)
        self.cur_iter = 0
        self.last_overflow_iter = -1
        self.scale_factor = scale_factor
        self.scale_window = scale_window
        self.min_scale = min_scale
        self.delayed_shift = delayed_shift
        self.cur_hysteresis = delayed_shift
        self.consecutive_hysteresis = consecutive_hysteresis
        self.raise_error_at_min_scale = raise_error_at_min_scale
        self.dynamic = True
        self.dtype = dtype if dtype is not None else torch.half


for _cls in (LossScaler, DynamicLossScaler):
    _cls.__module__ = "deepspeed.runtime.fp16.loss_scaler"
    setattr(_module("deepspeed.runtime.fp16.loss_scaler"), _cls.__name__, _cls)


@dataclasses.dataclass
class SubparamShape:
    patterns: list
    shape: list
    partition_dim: int


SubparamShape.__module__ = "deepspeed.checkpoint.universal_checkpoint"
_module("deepspeed.checkpoint.universal_checkpoint").SubparamShape = SubparamShape


# Files written with numpy 2 (DeepSpeed 0.19 on torch 2) name numpy's scalars and arrays under
# numpy._core; numpy 1 (Debian bookworm) has the same objects under numpy.core.
try:
    import numpy
    import numpy.core.multiarray
    if not hasattr(numpy, "_core") or "numpy._core.multiarray" not in sys.modules:
        sys.modules.setdefault("numpy._core", numpy.core)
        sys.modules.setdefault("numpy._core.multiarray", numpy.core.multiarray)
except ImportError:
    pass
