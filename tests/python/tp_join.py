"""A full tensor from its TP pieces, by a checkpoint's own universal_checkpoint_info rules, in the
order DeepSpeed's ds_to_universal.py merges them (vocabulary padding rows dropped): the tests'
reading of DeepSpeed's TP layout, independent of ucp's."""
import re

import torch


def matches(info, key, name):
    return any(re.match(p, name) for p in info.get(key, []))


def join(info, name, pieces):
    tp = len(pieces)
    if matches(info, "tp_replicated_parameter_patterns", name):
        for p in pieces[1:]:
            assert torch.equal(p, pieces[0]), f"{name}: replicated copies differ"
        full = pieces[0]
    elif matches(info, "parameter_with_2_sub_params_cat_dim_0", name):
        halves = [p.chunk(2, 0) for p in pieces]
        full = torch.cat([torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])])
    elif any(any(re.match(p, name) for p in sp["patterns"]) for sp in info.get("parameter_with_sub_params", [])):
        sp = next(sp for sp in info["parameter_with_sub_params"] if any(re.match(p, name) for p in sp["patterns"]))
        sizes = sp["shape"][sp["partition_dim"]]
        widths = [[s // tp] * tp for s in sizes]
        for pat, w in info.get("sub_param_shard_widths", {}).items():
            if re.match(pat, name):
                widths = w
        subs = [[] for _ in sizes]
        for t, p in enumerate(pieces):
            for i, part in enumerate(p.split([w[t] for w in widths], sp["partition_dim"])):
                subs[i].append(part)
        full = torch.cat([torch.cat(s, sp["partition_dim"]) for s in subs], sp["partition_dim"])
    else:
        full = torch.cat(pieces, 1 if matches(info, "parameter_with_row_parallelism_patterns", name) else 0)
    if matches(info, "vocabulary_parameter_patterns", name):
        full = full[:info["original_vocab_size"]]
    return full
