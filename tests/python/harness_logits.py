"""Reference logits of a real DeepSpeed checkpoint, computed with the training harness's own model code.

    /usr/bin/python3 tests/python/harness_logits.py CASE_DIR --out OUT.json [--harness DIR] [--loss-check]

CASE_DIR is one of /work/shared/real-deepspeed/cases/<case>/. The model is the harness's non-pipeline
`models.GPTModel` built at TP=1, PP=1 (single process, no torch.distributed, no DeepSpeed import) from the
case's model_config.json; every weight is read from DeepSpeed's own universal output
(ckpt/global_step6_universal/zero/<name>/fp32.pt, as written by ds_to_universal). Pipeline names are mapped
to the non-pipeline ones; vocabulary rows are re-padded with zeros to the TP=1 padded vocabulary. Every
model parameter must be loaded exactly once, and every universal parameter folder must be used.

The forward is the model's logits path (language_model, then output_layer (llama, untied) or the tied head
(GPT)), on IDS = (arange(2*16).view(2, 16) * 37 + 11) % 300. The JSON holds the logits of the real
vocabulary (first vocab_size columns).

--loss-check additionally recomputes the loss DeepSpeed logged at the step after the saved one (the loss of
the saved weights on that step's training batch, all DP ranks) and compares it with case.json.
"""
import argparse
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import re
import sys
import time
import types

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_HARNESS = os.path.normpath(os.path.join(HERE, "..", "..", "..", "shared", "real-deepspeed", "harness"))
IDS = (torch.arange(2 * 16).view(2, 16) * 37 + 11) % 300


# ---------------------------------------------------------------- torch.load without DeepSpeed installed
class _Stub:
    """Stand-in for any DeepSpeed class pickled in a checkpoint (e.g. SubparamShape); keeps its state."""

    def __init__(self, *a, **k):
        self._args, self._kwargs = a, k

    def __setstate__(self, state):
        self._state = state


class _StubModule(types.ModuleType):
    """deepspeed.* module stand-in: any attribute is a _Stub subclass of that name (PEP 562 style)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        cls = type(name, (_Stub, ), {"__module__": self.__name__})
        setattr(self, name, cls)
        return cls


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes `deepspeed` and its submodules importable as stubs (only installed if DeepSpeed is not importable).
    (torch 1.13's torch.load ignores its pickle_module argument, so a custom Unpickler cannot be used.)"""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "deepspeed" or fullname.startswith("deepspeed."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return _StubModule(spec.name)

    def exec_module(self, module):
        module.__path__ = []


def load_pt(path):
    if "deepspeed" not in sys.modules and importlib.util.find_spec("deepspeed") is None:  # (ds_stubs' stand-ins, where imported)
        sys.meta_path.append(_StubFinder())
    return torch.load(path, map_location="cpu")


# ---------------------------------------------------------------- names
def non_pipeline_name(name, num_layers):
    """Map a PipelineModule parameter name (GPTModelPipe-like layout of the harness: 0 = cast function,
    1 = embedding, 2..L+1 = transformer layers, L+2 = final norm, L+3 = LM head (llama); GPT: the embedding
    is the tied module 'embed') to the non-pipeline GPTModel name. Non-pipeline names pass through."""
    if name.startswith("language_model."):
        return name
    m = re.fullmatch(r"tied_modules\.embed\.(word_embeddings|position_embeddings)\.weight", name)
    if m:
        return f"language_model.embedding.{m.group(1)}.weight"
    m = re.fullmatch(r"(\d+)\.(.+)", name)
    if not m:
        raise SystemExit(f"harness_logits: cannot map universal parameter name {name!r}")
    idx, rest = int(m.group(1)), m.group(2)
    first_layer, final_norm, head = 2, 2 + num_layers, 3 + num_layers
    if idx == 1 and rest in ("word_embeddings.weight", "position_embeddings.weight"):
        return f"language_model.embedding.{rest}"
    if first_layer <= idx < final_norm:
        return f"language_model.encoder.layers.{idx - first_layer}.{rest}"
    if idx == final_norm and rest in ("weight", "bias"):
        return f"language_model.encoder.final_layernorm.{rest}"
    if idx == head and rest == "lm_head.weight":
        return "language_model.output_layer.weight"
    raise SystemExit(f"harness_logits: cannot map pipeline parameter name {name!r} (num_layers {num_layers})")


def to_param_shape(t, p, name, vocab_size):
    """DeepSpeed's universal tensor -> the TP=1 parameter's shape. Vocabulary tensors: copy the real rows,
    zero the padding rows (ds_to_universal strips the padding; ZeRO-3 output keeps it, possibly for another
    TP degree). ZeRO-3 output is flat (1-D): reshape by the parameter's trailing dimensions."""
    if t.dim() == 1 and p.dim() > 1:
        inner = 1
        for d in p.shape[1:]:
            inner *= d
        if t.numel() % inner:
            raise SystemExit(f"harness_logits: {name}: flat tensor of {t.numel()} elements does not fit {tuple(p.shape)}")
        t = t.view(-1, *p.shape[1:])
    if tuple(t.shape) == tuple(p.shape):
        return t
    vocab_param = name in ("language_model.embedding.word_embeddings.weight", "language_model.output_layer.weight")
    if vocab_param and tuple(t.shape[1:]) == tuple(p.shape[1:]) and t.shape[0] >= vocab_size and p.shape[0] >= vocab_size:
        out = torch.zeros_like(p)
        out[:vocab_size] = t[:vocab_size]
        return out
    raise SystemExit(f"harness_logits: {name}: universal shape {tuple(t.shape)} != model shape {tuple(p.shape)}")


# ---------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("case_dir")
    ap.add_argument("--out", required=True)
    ap.add_argument("--harness", default=DEFAULT_HARNESS)
    ap.add_argument("--universal", default=None,
                    help="universal checkpoint folder (default: CASE_DIR/ckpt/<latest_universal>)")
    ap.add_argument("--loss-check", action="store_true",
                    help="also recompute the next step's training loss and compare it with case.json")
    args = ap.parse_args()
    t0 = time.time()

    sys.path.insert(0, os.path.abspath(args.harness))
    import models  # the harness's model code (imports only torch at module level)

    case_dir = os.path.abspath(args.case_dir)
    case = os.path.basename(case_dir.rstrip("/"))
    with open(os.path.join(case_dir, "model_config.json")) as f:
        cfgd = json.load(f)
    universal = args.universal
    if universal is None:
        ckpt = os.path.join(case_dir, "ckpt")
        tag = "global_step6_universal"
        lu = os.path.join(ckpt, "latest_universal")
        if os.path.exists(lu):
            with open(lu) as f:
                tag = f.read().strip()
        universal = os.path.join(ckpt, tag)
    zero = os.path.join(universal, "zero")
    if not os.path.isdir(zero):
        raise SystemExit(f"harness_logits: no universal 'zero' folder at {zero}")

    # TP=1, PP=1 model from the case's config (padded vocab as Megatron/the harness computes it for TP=1)
    vocab = cfgd["vocab_size"]
    div = cfgd.get("make_vocab_size_divisible_by", 128)
    padded = -(-vocab // div) * div
    cfgd = dict(cfgd, tensor_model_parallel_size=1, pipeline_model_parallel_size=1, padded_vocab_size=padded)
    if cfgd.get("moe_layers"):
        raise SystemExit("harness_logits: MoE models are not supported")
    cfg = models.Cfg(cfgd)
    torch.manual_seed(cfgd.get("seed", 0))
    model = models.GPTModel(cfg, models.TP(1, 0, None))
    model.eval()
    params = dict(model.named_parameters())

    # load every weight from the universal folder
    loaded = {}
    for entry in sorted(os.listdir(zero)):
        pdir = os.path.join(zero, entry)
        if not os.path.isdir(pdir):
            continue  # optimizer_state.pt
        fp32 = os.path.join(pdir, "fp32.pt")
        if not os.path.exists(fp32):
            raise SystemExit(f"harness_logits: {pdir} has no fp32.pt")
        obj = load_pt(fp32)
        t = obj["param"] if isinstance(obj, dict) else obj
        if not torch.is_tensor(t):
            raise SystemExit(f"harness_logits: {fp32}: no tensor (got {type(t).__name__})")
        name = non_pipeline_name(entry, cfg.num_layers)
        if name not in params:
            raise SystemExit(f"harness_logits: universal parameter {entry!r} -> {name!r} is not in the model")
        if name in loaded:
            raise SystemExit(f"harness_logits: {name!r} loaded twice ({loaded[name]!r}, {entry!r})")
        with torch.no_grad():
            params[name].copy_(to_param_shape(t.float(), params[name], name, vocab))
        loaded[name] = entry
    missing = sorted(set(params) - set(loaded))
    if missing:
        raise SystemExit(f"harness_logits: {len(missing)} model parameters not in {zero}: {missing}")

    # forward: the model's own logits path
    with torch.no_grad():

        def logits_of(ids):
            h = model.language_model(ids)
            return model.language_model.output_layer(h) if model.untied else model.head(h)

        logits = logits_of(IDS)[..., :vocab].float().contiguous()
    if not torch.isfinite(logits).all():
        raise SystemExit("harness_logits: non-finite logits")

    result = {
        "case": case,
        "ids": IDS.tolist(),
        "logits": logits.tolist(),
        "shape": list(logits.shape),
        "source": "harness models.py + DeepSpeed universal fp32",
    }
    report = {
        "params": len(params),
        "logit_std_over_vocab_mean": float(logits.std(-1).mean()),
        "logit_min_max": [float(logits.min()), float(logits.max())],
    }

    if args.loss_check:
        import common  # harness helpers (batch_for); imports numpy, no DeepSpeed
        with open(os.path.join(case_dir, "case.json")) as f:
            cj = json.load(f)
        ta = cj.get("train_args", "")

        def arg(flag, default):
            m = re.search(r"--" + flag + r"[ =](\S+)", ta)
            return int(m.group(1)) if m else default

        step = int(re.search(r"global_step(\d+)", os.path.basename(universal.rstrip("/"))).group(1))
        gb, seq = arg("global-batch", 12), arg("seq", cfgd.get("seq_length", 32))
        (ids, labels), = common.batch_for(step, gb, 1, 0, seq, vocab, 1)
        with torch.no_grad():
            loss = float(models.lm_loss(logits_of(ids), labels, vocab))
        ref = cj["losses"].get(str(step + 1))
        report["loss_check"] = {"step": step + 1, "recomputed": loss, "deepspeed": ref,
                                "abs_diff": None if ref is None else abs(loss - ref)}

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f)
    report["seconds"] = round(time.time() - t0, 2)
    print(f"harness_logits: {case}: {len(loaded)} parameters from {zero}; logits {result['shape']} -> {args.out}; "
          + json.dumps(report))


if __name__ == "__main__":
    main()
