"""Compare ucp's atomic output with the universal checkpoint DeepSpeed's own ds_to_universal.py wrote.

    real_universal.py UCP_DIR DS_DIR [--model-states]

Every file of DS_DIR/zero must exist in UCP_DIR/zero and load (torch.load) to the same pickled value:
the same keys in the same order, the same Python types (tuple / list / torch.Size / SubparamShape),
tensors byte for byte. With --model-states the carried-over model-states files are compared too.

Where ucp deliberately differs from DeepSpeed, the difference is allowed here and printed with its
reason, never silently:
- ZeRO-3: DeepSpeed writes each state as a bare 1-D tensor with the source's vocabulary padding
  rows kept; ucp writes the same form (DeepSpeed's ZeRO-3 loader reads nothing else) with those rows
  as zeros, since an atomic checkpoint keeps no padding values. Checked: every other byte equal.
- cat_dim of a row-parallel weight in a TP=1 checkpoint: DeepSpeed records 0 because a TP=1
  checkpoint's universal_checkpoint_info names no row-parallel weights, and its loader then splits the
  weight on the wrong dimension at TP=2 (the EXPECTED_MISMATCH resume in zero1_dp4_fp32/case.json);
  ucp takes the dimension from the model family's rules and records 1.
- partition_count in zero/optimizer_state.pt: DeepSpeed's merged ZeRO state sets every group's to
  the DP degree (zero_checkpoint._update_partition_count), an expert group's too; ucp keeps the
  first file's (an expert group's dp / ep). DeepSpeed's universal loader reads neither.
- AutoEP's expert_parameter_patterns in a model-states file's universal_checkpoint_info: DeepSpeed's
  converter rewrites the engine's r'.*\.experts\.w[123]$' to r'\.experts\.w[123]$' in its copy;
  ucp carries the file as it is. Nothing in DeepSpeed reads the key. Likewise its ds_autoep_layers
  there, which DeepSpeed's copy cuts to a few fields per layer (each equal to the engine's).
- ZeRO-3: ucp writes zero/<param>/step.pt (the group's step, as for every other source) where
  DeepSpeed's ZeRO-3 output has none and keeps the step in zero/optimizer_state.pt alone; its loader
  reads no step.pt. Any other file ucp writes that DeepSpeed's output lacks is a failure.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ds_stubs  # noqa: E402,F401  DeepSpeed's pickled classes, without DeepSpeed
from canonical import canonical  # noqa: E402

ROW_PARALLEL = ("self_attention.dense.weight", "mlp.dense_4h_to_h.weight")


def load(path):
    return torch.load(path, map_location="cpu", weights_only=False) if "weights_only" in \
        torch.load.__code__.co_varnames else torch.load(path, map_location="cpu")


def first_difference(a, b, where=""):
    """The path of the first difference of two canonical trees, or None."""
    if type(a) is not type(b):
        return f"{where}: {str(a)[:120]} vs {str(b)[:120]}"
    if isinstance(a, dict):
        if list(a.keys()) != list(b.keys()):
            return f"{where}: keys {list(a.keys())} vs {list(b.keys())}"
        for k in a:
            d = first_difference(a[k], b[k], f"{where}.{k}")
            if d:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{where}: length {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{where}[{i}]")
            if d:
                return d
        return None
    return None if a == b else f"{where}: {str(a)[:120]} vs {str(b)[:120]}"


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    ucp_dir, ds_dir = args
    model_states = "--model-states" in sys.argv
    failures, allowed, compared = [], [], 0
    ds_zero, ucp_zero = os.path.join(ds_dir, "zero"), os.path.join(ucp_dir, "zero")
    manifest = __import__("json").load(open(os.path.join(ucp_dir, "ucp_manifest.json")))
    tp = manifest["source"]["tp"]
    numel = {p["name"]: p["numel"] for p in manifest["params"]}
    for root, _, files in sorted(os.walk(ds_zero)):
        for f in sorted(files):
            ds_path = os.path.join(root, f)
            rel = os.path.relpath(ds_path, ds_zero)
            ucp_path = os.path.join(ucp_zero, rel)
            if not os.path.exists(ucp_path):
                failures.append(f"{rel}: missing in ucp's output")
                continue
            ds, ucp = load(ds_path), load(ucp_path)
            compared += 1
            param = os.path.dirname(rel)
            if isinstance(ds, torch.Tensor):
                # ZeRO-3: DeepSpeed's bare 1-D tensor, the parameter as the source held it.
                if not isinstance(ucp, torch.Tensor) or ucp.shape != ds.shape or ucp.dtype != ds.dtype:
                    failures.append(f"{rel}: {type(ucp).__name__} {getattr(ucp, 'shape', '')}, DeepSpeed wrote a "
                                    f"bare tensor {ds.dtype}{list(ds.shape)}")
                    continue
                ours, theirs = ucp.detach().numpy().tobytes(), ds.detach().numpy().tobytes()
                if ours != theirs:
                    n = 4 * numel[param]
                    if ours[:n] != theirs[:n] or any(ours[n:]):
                        failures.append(f"{rel}: tensor differs from DeepSpeed's (ZeRO-3 form)")
                        continue
                    allowed.append(f"{rel}: ZeRO-3 vocabulary padding rows are zeros; {(len(ours) - n) // 4} "
                                   f"elements DeepSpeed copied from the source's padding")
                continue
            if rel == "optimizer_state.pt" and isinstance(ds, dict) and ds.get("partition_count") != \
                    ucp.get("partition_count") and ds.get("partition_count") == [manifest["source"]["dp"] * manifest["source"].get("sp", 1)] * \
                    len(ucp.get("partition_count") or []):
                allowed.append(f"{rel}: partition_count {ucp['partition_count']} (the file's), DeepSpeed rewrites "
                               f"every group's to dp (DP x SP)")
                ucp = dict(ucp, partition_count=ds["partition_count"])
            a, b = canonical(ucp), canonical(ds)
            if isinstance(ds, dict) and tp == 1 and param.endswith(ROW_PARALLEL) and \
                    ds.get("cat_dim") == 0 and ucp.get("cat_dim") == 1:
                a = canonical({k: (0 if k == "cat_dim" else v) for k, v in ucp.items()})
                allowed.append(f"{rel}: cat_dim 1 (row-parallel), DeepSpeed records 0 at TP=1")
            d = first_difference(a, b)
            if d:
                failures.append(f"{rel}: {d}")
    if model_states:
        for f in sorted(os.listdir(ds_dir)):
            if f.endswith("_model_states.pt"):
                compared += 1
                ucp, ds = load(os.path.join(ucp_dir, f)), load(os.path.join(ds_dir, f))
                ours, theirs = (x.get("universal_checkpoint_info") or {} for x in (ucp, ds))
                if ours.get("expert_parameter_patterns") == [r".*\.experts\.w[123]$"] and \
                        theirs.get("expert_parameter_patterns") == [r"\.experts\.w[123]$"]:
                    allowed.append(f"{f}: expert_parameter_patterns as the engine saved them; DeepSpeed's copy "
                                   "rewrites them")
                    ours["expert_parameter_patterns"] = theirs["expert_parameter_patterns"]
                mine, cut = ours.get("ds_autoep_layers"), theirs.get("ds_autoep_layers")
                if isinstance(mine, list) and isinstance(cut, list) and len(mine) == len(cut) and mine != cut and \
                        all(set(c) < set(m) and all(m[k] == v for k, v in c.items()) for m, c in zip(mine, cut)):
                    allowed.append(f"{f}: ds_autoep_layers as the engine saved them; DeepSpeed's copy keeps "
                                   f"{len(cut[0])} of their fields")
                    ours["ds_autoep_layers"] = [{k: m[k] for k in c} for m, c in zip(mine, cut)]
                d = first_difference(canonical(ucp), canonical(ds))
                if d:
                    failures.append(f"{f}: {d}")
    # Files ucp writes that DeepSpeed does not: each one a deliberate difference, or a failure.
    for root, _, files in sorted(os.walk(ucp_zero)):
        for f in sorted(files):
            rel = os.path.relpath(os.path.join(root, f), ucp_zero)
            if os.path.exists(os.path.join(ds_zero, rel)):
                continue
            if f == "step.pt" and manifest["source"]["zero_stage"] == 3:
                allowed.append(f"{rel}: step.pt of a ZeRO-3 source; DeepSpeed keeps the step in optimizer_state.pt only")
            else:
                failures.append(f"{rel}: ucp writes it, DeepSpeed's universal output has no such file")
    kinds = sorted({a.split(": ", 1)[1].split(";")[0] for a in allowed})
    print(f"compared {compared} files with DeepSpeed's; {len(allowed)} deliberate differences ({', '.join(kinds) or 'none'})")
    for line in failures[:20]:
        print("DIFFERS:", line)
    if failures:
        print(f"{len(failures)} files differ from DeepSpeed's universal output")
        sys.exit(1)
    if compared == 0:
        print("nothing compared")
        sys.exit(1)


if __name__ == "__main__":
    main()
