"""Compares the shard files ucp-reshard wrote with the files the fixture generator writes for the
same layout from the ground truth (two independent paths to the same bytes).

Every file the generator wrote must exist. Tensors must be equal byte for byte (dtype, shape and
bytes; padding included). Every non-tensor key the generator writes must be present with the same
type. The values that define the layout must be equal too: param_shapes, param_slice_mappings,
group_paddings, partition_count, world sizes, the ZeRO stage.

  compare_shards.py GENERATED_ROOT RESHARDED_ROOT
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import ds_stubs  # noqa: E402,F401

EXACT = {"param_shapes", "param_slice_mappings", "group_paddings", "partition_count", "dp_world_size",
         "mp_world_size", "zero_stage", "padded_vocab_size", "tensor_model_parallel_size",
         "pipeline_model_parallel_size", "sub_param_shard_widths"}
problems = []


def compare(a, b, path, exact=False):
    if torch.is_tensor(a):
        if not torch.is_tensor(b):
            problems.append(f"{path}: a tensor in the generator's file, {type(b).__name__} in ours")
        elif a.dtype != b.dtype or a.shape != b.shape:
            problems.append(f"{path}: {a.dtype} {tuple(a.shape)} vs ours {b.dtype} {tuple(b.shape)}")
        elif a.numel() and not torch.equal(a.reshape(-1).contiguous().view(torch.uint8),
                                           b.reshape(-1).contiguous().view(torch.uint8)):
            diff = (a.float() != b.float()).nonzero()
            problems.append(f"{path}: bytes differ ({len(diff)} elements, first at {diff[0].tolist() if len(diff) else '?'})")
        return
    if type(a) is not type(b):
        problems.append(f"{path}: {type(a).__name__} in the generator's file, {type(b).__name__} in ours")
        return
    if isinstance(a, dict):
        for k, v in a.items():
            if k not in b:
                problems.append(f"{path}: key {k!r} missing")
            else:
                compare(v, b[k], f"{path}/{k}", exact or k in EXACT)
        if exact and list(a) != list(b):
            problems.append(f"{path}: keys {list(b)} in ours, {list(a)} in the generator's")
    elif isinstance(a, (list, tuple)):
        if len(a) != len(b):
            problems.append(f"{path}: {len(a)} items in the generator's, {len(b)} in ours")
        for k, (x, y) in enumerate(zip(a, b)):
            compare(x, y, f"{path}[{k}]", exact)
    elif hasattr(a, "__dict__") and not isinstance(a, type):
        compare(vars(a), vars(b), path + "." + type(a).__name__, exact)
    elif exact and a != b:
        problems.append(f"{path}: {b!r} in ours, {a!r} in the generator's")


def compare_roots(gen_root, ours_root):
    """The problems found between the generator's checkpoint root and ours (empty: the same)."""
    del problems[:]
    tag = open(os.path.join(gen_root, "latest")).read().strip()
    if not os.path.exists(os.path.join(ours_root, "latest")) or open(os.path.join(ours_root, "latest")).read().strip() != tag:
        problems.append(f"{ours_root}/latest does not name {tag}")
    gen_dir, our_dir = os.path.join(gen_root, tag), os.path.join(ours_root, tag)
    names = sorted(os.listdir(gen_dir))
    extra = sorted(set(os.listdir(our_dir)) - set(names)) if os.path.isdir(our_dir) else []
    if extra:
        problems.append(f"files the generator does not write: {extra}")
    for n in names:
        p = os.path.join(our_dir, n)
        if not os.path.exists(p):
            problems.append(f"{n}: missing")
            continue
        compare(torch.load(os.path.join(gen_dir, n)), torch.load(p), n)
    return list(problems), len(names)


if __name__ == "__main__":
    gen_root, ours_root = sys.argv[1], sys.argv[2]
    found, compared = compare_roots(gen_root, ours_root)
    for m in found[:40]:
        print("FAIL", m)
    print(f"{ours_root}: {compared} files compared with {gen_root}: {'OK' if not found else str(len(found)) + ' problems'}")
    sys.exit(1 if found else 0)
