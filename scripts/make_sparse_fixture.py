#!/usr/bin/python3
"""Writes a Megatron-DeepSpeed checkpoint of a large GPT shape, as it saves one with bf16 and ZeRO-1
(DeepSpeed's BF16 optimizer), whose tensor data are holes: every file has its real zip records (the
stored entries torch.save writes, payloads aligned to 64 bytes, zip64 where a size needs it, each
record's CRC-32 that of its zero bytes) and its real pickle (the keys, classes and shapes DeepSpeed
pickles), but no tensor byte takes disk space. BLOOM-176B as the Universal Checkpointing paper ran it
is 2.5 TB apparent and a few MB on disk; `ucp-convert --plan-only --ranks N --json` plans it as it
would the real one, and a small shape converts for real (every tensor zero).

    make_sparse_fixture.py OUT --model bloom-176b|gpt3-7b|1t   the paper's shapes and layouts (Table 3)
    make_sparse_fixture.py OUT --layers 4 --hidden 256 --heads 8 --vocab 1000 --tp 2 --pp 2 --dp 2
    make_sparse_fixture.py OUT --filled ...   every tensor byte written (each value 1.0 in its dtype):
                                              a real file of that size, for benchmarks (cp copies it all)

The model is GPT-style as BLOOM is: multi-head attention, a 4h GeLU MLP, LayerNorm with biases, the
embedding tied to the head and no learned positions (BLOOM's ALiBi; its embedding LayerNorm is left
out). The vocabulary is padded to a multiple of 128 x TP (Megatron's --make-vocab-size-divisible-by).
Files: per (pp, tp), mp_rank_XX_model_states.pt and the stage's layer_XX-model_YY-model_states.pt
(bf16 weights); per (pp, tp, dp), bf16_zero_pp_rank_D_mp_rank_XX_optim_states.pt (the fp32 flat
partitions of both param groups with their Adam moments). OUT/fixture.json records the shape, every
parameter's full shape and pattern, and the files' apparent bytes: what a test checks a plan against.
"""
import argparse
import collections
import functools
import io
import json
import math
import os
import pickle
import shutil
import struct
import sys
import zlib

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(here, "..", "tests", "python"))
import ds_stubs  # noqa: E402  (DeepSpeed classes under their real module paths)
from make_fixture import DS_VERSION, STEP, Model, no_weight_decay, stage_params  # noqa: E402

MODELS = {  # layers, hidden, heads, vocab; the paper's (tp, pp, dp)
    "gpt3-7b": (32, 4096, 32, 50257, (2, 2, 8)),
    "bloom-176b": (70, 14336, 112, 250880, (4, 12, 8)),
    "1t": (128, 25600, 160, 51200, (8, 64, 2)),
}

# --- CRC-32 of n zero bytes, without the bytes: zlib's GF(2) polynomial arithmetic ------------------
POLY = 0xEDB88320


def multmodp(a, b):
    m, p = 1 << 31, 0
    while True:
        if a & m:
            p ^= b
            if a & (m - 1) == 0:
                return p
        m >>= 1
        b = (b >> 1) ^ POLY if b & 1 else b >> 1


def crc32_zeros(n):
    """zlib.crc32(bytes(n)) for any n: the register 0xFFFFFFFF times x^(8n) mod P, conditioned."""
    p, x, k = 1 << 31, 1 << 30, 8 * n  # x^0 and x^1 in the reflected representation
    while k:
        if k & 1:
            p = multmodp(x, p)
        x = multmodp(x, x)
        k >>= 1
    return multmodp(p, 0xFFFFFFFF) ^ 0xFFFFFFFF


# --- torch.save's file, with holes for data ---------------------------------------------------------
class Hole:
    """A tensor of `shape` and `dtype` whose bytes are all zero and never written."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(int(s) for s in shape), dtype

    def nbytes(self):
        return math.prod(self.shape) * torch.empty(0, dtype=self.dtype).element_size()


class _Storage:
    def __init__(self, key, dtype, numel):
        self.key, self.dtype, self.numel = key, dtype, numel


STORAGE_TYPES = {torch.float32: torch.FloatStorage, torch.bfloat16: torch.BFloat16Storage,
                 torch.float16: torch.HalfStorage, torch.int64: torch.LongStorage, torch.uint8: torch.ByteStorage}


class Pickler(pickle.Pickler):
    """torch.save's pickle (protocol 2): a tensor is torch._utils._rebuild_tensor_v2 of a storage given
    by persistent id ('storage', <dtype>Storage, key, 'cpu', numel); storages are numbered in the order
    met. Records: (key, bytes, None) for real tensors, (key, n, dtype) for holes of n bytes."""

    def __init__(self, f):
        super().__init__(f, protocol=2)
        self.records = []

    def reducer_override(self, obj):
        if isinstance(obj, (Hole, torch.Tensor)):
            key = str(len(self.records))
            if isinstance(obj, Hole):
                self.records.append((key, obj.nbytes(), obj.dtype))
            else:
                t = obj.detach().contiguous()
                self.records.append((key, t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"", None))
            shape = tuple(obj.shape)
            stride = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
            return (torch._utils._rebuild_tensor_v2,
                    (_Storage(key, obj.dtype, math.prod(shape)), 0, torch.Size(shape), stride, False, collections.OrderedDict()))
        return NotImplemented

    def persistent_id(self, obj):
        if isinstance(obj, _Storage):
            return ("storage", STORAGE_TYPES[obj.dtype], obj.key, "cpu", obj.numel)
        return None


FILLED = False  # --filled: a hole's data written, each value 1.0 in its dtype


@functools.cache
def fill_of(dtype):
    """The bytes a filled hole of `dtype` repeats: 1.0 in that dtype, so that the bf16 weights and their
    fp32 masters agree (ucp-convert compares the copies a checkpoint stores twice)."""
    return torch.ones((2 << 20) // torch.empty(0, dtype=dtype).element_size(), dtype=dtype).view(torch.uint8).numpy().tobytes()


def save(obj, path):
    """Writes obj as torch.save would, the holes as holes (or filled); returns the file's apparent size."""
    buf = io.BytesIO()
    p = Pickler(buf)
    p.dump(obj)
    prefix = os.path.splitext(os.path.basename(path))[0]
    entries = [("data.pkl", buf.getvalue(), None)] + [(f"data/{k}", d, t) for k, d, t in p.records] + [("version", b"3\n", None)]
    central = []
    with open(path + ".tmp", "wb") as f:
        for name, data, dtype in entries:
            name = f"{prefix}/{name}".encode()
            size = data if isinstance(data, int) else len(data)
            fill = fill_of(dtype) if isinstance(data, int) and FILLED else None
            if fill:
                crc = 0
                for at in range(0, size, len(fill)):
                    crc = zlib.crc32(fill[:min(len(fill), size - at)], crc)
            else:
                crc = crc32_zeros(size) if isinstance(data, int) else zlib.crc32(data)
            offset = f.tell()
            big = size >= 0xFFFFFFFF or offset >= 0xFFFFFFFF
            z64 = struct.pack("<HHQQ", 1, 16, size, size) if big else b""
            at = offset + 30 + len(name) + len(z64)
            pad = (-(at + 4)) % 64  # an "FB" extra field pads the payload to 64 bytes, as torch's writer does
            extra = z64 + struct.pack("<HH", 0x4246, pad) + bytes(pad)
            f.write(struct.pack("<IHHHHHIIIHH", 0x04034B50, 45 if big else 20, 0, 0, 0, 0, crc,
                                0xFFFFFFFF if big else size, 0xFFFFFFFF if big else size, len(name), len(extra)))
            f.write(name + extra)
            if fill:
                for at in range(0, size, len(fill)):
                    f.write(fill[:min(len(fill), size - at)])
            elif isinstance(data, int):
                f.seek(size, os.SEEK_CUR)  # the hole
            else:
                f.write(data)
            central.append((name, crc, size, offset))
        cd_start = f.tell()
        for name, crc, size, offset in central:
            big = size >= 0xFFFFFFFF or offset >= 0xFFFFFFFF
            z64 = struct.pack("<HHQQQ", 1, 24, size, size, offset) if big else b""
            f.write(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 45 if big else 20, 45 if big else 20, 0, 0, 0, 0, crc,
                                0xFFFFFFFF if big else size, 0xFFFFFFFF if big else size, len(name), len(z64), 0, 0, 0, 0,
                                0xFFFFFFFF if big else offset))
            f.write(name + z64)
        cd_end = f.tell()
        n, cd_size = len(central), cd_end - cd_start
        f.write(struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, n, n, cd_size, cd_start))
        f.write(struct.pack("<IIQI", 0x07064B50, 0, cd_end, 1))
        f.write(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, min(n, 0xFFFF), min(n, 0xFFFF), min(cd_size, 0xFFFFFFFF),
                            min(cd_start, 0xFFFFFFFF), 0))
        apparent = f.tell()
    os.replace(path + ".tmp", path)
    return apparent


# --- the checkpoint ---------------------------------------------------------------------------------
def local_shape(pattern, shape, tp, padded_vocab):
    """A TP rank's shape of a parameter (make_fixture.tp_slice's cuts)."""
    if pattern == "vocab":
        return (padded_vocab // tp,) + tuple(shape[1:])
    if pattern == "row":
        return (shape[0], shape[1] // tp)
    if pattern == "col":
        return (shape[0] // tp,) + tuple(shape[1:])
    return tuple(shape)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--model", choices=sorted(MODELS), help="a shape of the paper's Table 3, with its (tp, pp, dp)")
    for k in ("layers", "hidden", "heads", "vocab", "tp", "pp", "dp"):
        ap.add_argument(f"--{k}", type=int, help="(overrides --model's)")
    ap.add_argument("--filled", action="store_true", help="write every tensor byte (float32 1.0) instead of holes")
    a = ap.parse_args()
    global FILLED
    FILLED = a.filled
    layers, hidden, heads, vocab, (tp, pp, dp) = MODELS[a.model] if a.model else (None,) * 4 + ((None,) * 3,)
    layers, hidden, heads, vocab = (a.layers or layers, a.hidden or hidden, a.heads or heads, a.vocab or vocab)
    tp, pp, dp = a.tp or tp or 1, a.pp or pp or 1, a.dp or dp or 1
    if None in (layers, hidden, heads, vocab):
        ap.error("give --model, or --layers, --hidden, --heads and --vocab")
    if hidden % heads or heads % tp or (4 * hidden) % tp or pp > layers:
        ap.error("tp must divide the heads and 4 x hidden, heads the hidden size; pp at most the layers")
    if os.path.isdir(a.out) and os.listdir(a.out):
        if not os.path.exists(os.path.join(a.out, "fixture.json")):
            ap.error(f"{a.out} exists, is not empty and is not a fixture: refusing to overwrite it")
        shutil.rmtree(a.out)

    model = Model("gpt", layers)
    model.hidden, model.heads, model.kv_heads, model.ffn, model.vocab, model.pos = hidden, heads, heads, 4 * hidden, vocab, 0
    model.head_dim = hidden // heads
    model.q = model.kv = hidden
    model.make_divisible_by = 128
    padded = model.padded_vocab(tp)
    shapes = {n: s for n, s, _, _ in model.params()}
    patterns = {n: p for n, _, p, _ in model.params()}
    info = model.universal_checkpoint_info(0.2, tp, "pipe")

    tag = f"global_step{STEP}"
    ckpt = os.path.join(a.out, tag)
    os.makedirs(ckpt)
    for name, text in (("latest", tag), ("latest_checkpointed_iteration.txt", str(STEP))):
        with open(os.path.join(a.out, name), "w") as f:
            f.write(text)
    ds_config = {"train_batch_size": 8 * dp, "train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1},
                 "bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"}}
    args = argparse.Namespace(
        num_layers=layers, hidden_size=hidden, ffn_hidden_size=4 * hidden, num_attention_heads=heads,
        num_key_value_heads=heads, kv_channels=hidden // heads, seq_length=2048, max_position_embeddings=2048,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, data_parallel_size=dp, world_size=tp * pp * dp,
        make_vocab_size_divisible_by=128, padded_vocab_size=padded, swiglu=False, untie_embeddings_and_output_weights=False,
        add_position_embedding=False, position_embedding_type="alibi", add_bias_linear=True, normalization="layernorm",
        bf16=True, fp16=False, params_dtype=torch.bfloat16, deepspeed=True, zero_stage=1, iteration=STEP,
        universal_checkpoint=False)
    files = {}

    def param_group(wd, idx):
        return {"lr": 6e-5, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": wd, "amsgrad": False, "params": [idx]}

    for stage in range(pp):
        names = stage_params(model, pp, stage)
        groups = [[n for n in names if not no_weight_decay(n, shapes[n])], [n for n in names if no_weight_decay(n, shapes[n])]]
        for t in range(tp):
            mp = stage * tp + t
            local = {n: local_shape(patterns[n], shapes[n], tp, padded) for n in names}
            param_shapes = [collections.OrderedDict((n, torch.Size(local[n])) for n in g) for g in groups]
            state = {"module": None, "buffer_names": [], "optimizer": None, "param_shapes": param_shapes,
                     "frozen_param_shapes": None, "shared_params": {}, "frozen_param_fragments": None,
                     "lr_scheduler": {}, "data_sampler": None, "random_ltd": None, "sparse_tensor_module_names": set(),
                     "skipped_steps": 0, "global_steps": STEP, "global_samples": STEP * 8 * dp, "dp_world_size": dp,
                     "mp_world_size": tp * pp, "ds_config": ds_config, "ds_version": DS_VERSION, "args": args,
                     "checkpoint_version": 3.0, "iteration": STEP, "universal_checkpoint_info": info}
            name = f"mp_rank_{mp:02d}_model_states.pt"
            files[name] = save(state, os.path.join(ckpt, name))
            by_layer = collections.OrderedDict()  # PipelineModule.save_state_dict: layer-local keys, bf16
            for n in names:
                idx = 1 if n.startswith("tied_modules.embed.") else int(n.split(".", 1)[0])
                if idx == 1 and stage != 0:
                    continue  # the tied head on the last stage writes no layer file
                key = n[len("tied_modules.embed."):] if idx == 1 else n.split(".", 1)[1]
                by_layer.setdefault(idx, collections.OrderedDict())[key] = Hole(local[n], torch.bfloat16)
            for idx, sd in by_layer.items():
                name = f"layer_{idx:02d}-model_{t:02d}-model_states.pt"
                files[name] = save(sd, os.path.join(ckpt, name))
            totals = [sum(math.prod(local[n]) for n in g) for g in groups]
            for d in range(dp):  # the BF16 optimizer's flat partitions: padding to 2 x dp at the end of the last
                single, paddings, mappings, adam = [], [], [], {}
                for gi, g in enumerate(groups):
                    padded_total = -(-totals[gi] // (2 * dp)) * 2 * dp
                    ps = padded_total // dp
                    lo, hi = d * ps, (d + 1) * ps
                    paddings.append(padded_total - totals[gi] if d == dp - 1 else 0)
                    single.append(Hole((ps,), torch.float32))
                    adam[gi] = {"step": torch.tensor(float(STEP)), "exp_avg": Hole((ps,), torch.float32),
                                "exp_avg_sq": Hole((ps,), torch.float32)}
                    m, start = collections.OrderedDict(), 0
                    for n in g:
                        numel = math.prod(local[n])
                        f0, f1 = max(start, lo), min(start + numel, hi)
                        if f0 < f1:
                            m[n] = ds_stubs.fragment_address(numel=f1 - f0, start=f0 - lo)
                        start += numel
                    mappings.append(m)
                osd = {"clip_grad": 1.0, "base_optimizer_state": {"state": adam, "param_groups": [param_group(0.1, 0), param_group(0.0, 1)]},
                       "single_partition_of_fp32_groups": single, "group_paddings": paddings,
                       "partition_count": [dp] * len(groups), "ds_version": DS_VERSION, "param_slice_mappings": mappings}
                name = f"bf16_zero_pp_rank_{d}_mp_rank_{mp:02d}_optim_states.pt"
                files[name] = save({"optimizer_state_dict": osd, "ds_config": ds_config, "ds_version": DS_VERSION},
                                   os.path.join(ckpt, name))

    pattern_names = {"vocab": "Shard-V", "replicate": "Replicate", "row": "Shard-H", "col": "Shard-V"}
    desc = {"model": a.model or "custom", "layers": layers, "hidden": hidden, "heads": heads, "vocab": vocab,
            "padded_vocab": padded, "tp": tp, "pp": pp, "dp": dp, "zero_stage": 1, "dtype": "bf16", "tag": tag,
            "params": {n: {"shape": list(s), "pattern": pattern_names[p]} for n, s, p, _ in model.params()},
            "files": files}
    with open(os.path.join(a.out, "fixture.json"), "w") as f:
        json.dump(desc, f, indent=1)
    numel = sum(math.prod(s) for s in shapes.values())
    disk = sum(os.stat(os.path.join(ckpt, n)).st_blocks * 512 for n in files)
    print(f"{a.out}: {a.model or 'custom'} ({numel / 1e6:,.1f} M parameters) tp={tp} pp={pp} dp={dp} ZeRO-1 bf16, "
          f"{len(files)} files, {sum(files.values()) / 2**30:,.2f} GiB apparent, {disk / 2**20:.1f} MiB on disk")


if __name__ == "__main__":
    main()
