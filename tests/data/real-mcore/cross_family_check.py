"""Megatron-LM's own load of what ucp-reshard --format mcore wrote from a Llama under another family's names
(issue 53: Hugging Face imports, a real DeepSpeed checkpoint), and the loaded model's logits against the
source family's own (transformers' for the Hugging Face models, the DeepSpeed harness model's for the
DeepSpeed cases: a Llama, and GPTs with LayerNorm, learned positions, SwiGLU, GQA and biases).

For each output (a Megatron-LM root whose tracker says 'release') it spawns TP*PP*DP processes (gloo, CPU) and,
in each, does what pretrain_gpt.py does with the flags a user gives for that model: Megatron-LM's parse_args,
validate_args and build_tokenizer (a NullTokenizer of the model's vocabulary, --make-vocab-size-divisible-by as
ucp-reshard said), the model gpt_builders builds (--transformer-impl local: the TransformerConfig of
core_transformer_config_from_args, the local layer spec), then
`megatron.training.checkpointing.load_checkpoint([model], None, None)` with --load ROOT and the job's default
flags (no --finetune, no --no-load-optim, no --no-load-rng). The forward runs on the reference's ids (at PP=2
stage 0's hidden states sent to stage 1), the TP pieces of the logits gathered; the real vocabulary's columns
are compared with the reference. Records, per output: the sha256 of every file, the iteration load_checkpoint
returned, a strict load_state_dict failure (load_checkpoint retries non-strict and swallows it), the logits'
largest difference. Writes RECORD (mcore_cross_family_readers.json).

Run inside the Debian trixie chroot (this file, make_mcore.py and the outputs copied to /tmp/cfc):
  cd /tmp/cfc && PYTHONPATH=/opt/megatron OMP_NUM_THREADS=1 python3 cross_family_check.py SPEC.json RECORD.json

SPEC.json: {label: {"root": ..., "tp": T, "pp": P, "dp": D, "model": {facts}, "reference": logits JSON, "divisor": d,
"bf16": bool}}. CPU-only workarounds, as make_mcore.py's: torch.compile off (no C++ compiler here), cuda calls
answered on the CPU, validate_args' GPU architecture answered 9, update_num_microbatches a no-op.
"""
import contextlib
import hashlib
import json
import os
import sys
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def flags(spec):
    m = spec["model"]
    f = ["pretrain_gpt.py", "--num-layers", str(m["layers"]), "--hidden-size", str(m["hidden"]),
         "--num-attention-heads", str(m["heads"]), "--group-query-attention", "--num-query-groups", str(m["groups"]),
         "--ffn-hidden-size", str(m["ffn"]), "--swiglu", "--normalization", m.get("norm", "RMSNorm"), "--norm-epsilon", str(m["eps"]),
         "--max-position-embeddings", str(m["positions"]), "--seq-length", "16", "--micro-batch-size", "2",
         "--tokenizer-type", "NullTokenizer", "--vocab-size", str(m["vocab"] - 1),
         "--make-vocab-size-divisible-by", str(spec["divisor"]),
         "--transformer-impl", "local", "--no-gradient-accumulation-fusion", "--no-persist-layer-norm", "--use-cpu-initialization",
         "--tensor-model-parallel-size", str(spec["tp"]), "--pipeline-model-parallel-size", str(spec["pp"]),
         "--hidden-dropout", "0", "--attention-dropout", "0", "--lr", "1e-4",
         "--ckpt-format", "torch_dist", "--load", spec["root"], "--exit-on-missing-checkpoint"]
    if m.get("position", "rope") == "rope":
        f += ["--position-embedding-type", "rope", "--rotary-base", str(m["rope_base"]), "--no-rope-fusion"]
    else:
        f += ["--position-embedding-type", m["position"]]
    if not m.get("bias", False):
        f += ["--disable-bias-linear"]
    if not m["tied"]:
        f += ["--untie-embeddings-and-output-weights"]
    if spec.get("bf16"):
        f += ["--bf16"]
    return f


def start(rank, world, port):
    """This process's gloo group, CPU-only: torch.compile off, the CUDA calls Megatron makes answered."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), USE_LIBUV="0", WORLD_SIZE=str(world), RANK=str(rank),
                      CUDA_DEVICE_MAX_CONNECTIONS="1")
    import torch._dynamo as dynamo
    dynamo.config.disable = True
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: "cpu"


def megatron_model(spec, argv):
    """Megatron-LM's args of `argv` (parse_args, validate_args) at the spec's TP x PP, and the GPTModel
    gpt_builders builds of them (--transformer-impl local); returns (args, cfg, model)."""
    from megatron.core import parallel_state as ps, tensor_parallel
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import make_mcore as mm  # its CPU-only validate_args
    import megatron.training.arguments as arguments
    from megatron.training import global_vars
    from megatron.training.utils import update_use_dist_ckpt
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    ps.initialize_model_parallel(tensor_model_parallel_size=spec["tp"], pipeline_model_parallel_size=spec["pp"])
    torch.manual_seed(1234)
    with contextlib.suppress(Exception):
        tensor_parallel.model_parallel_cuda_manual_seed(123)
    tensor_parallel.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    sys.argv = argv
    args = mm.validated(arguments.parse_args())
    update_use_dist_ckpt(args)
    global_vars.set_args(args)
    if not args.untie_embeddings_and_output_weights and spec["pp"] > 1:  # GPTModel's setup_embeddings_and_output_layer moves
        torch.Tensor.cuda = lambda self, *a, **k: self  # the shared weight .cuda() before its all-reduce (gloo: on the CPU)
    cfg = arguments.core_transformer_config_from_args(args)
    layer_spec = get_gpt_layer_local_spec(cfg.num_moe_experts, cfg.moe_grouped_gemm, cfg.qk_layernorm, cfg.multi_latent_attention,
                                          cfg.experimental_attention_variant, normalization=cfg.normalization)
    model = GPTModel(config=cfg, transformer_layer_spec=layer_spec, vocab_size=args.padded_vocab_size,
                     max_sequence_length=args.max_position_embeddings, pre_process=ps.is_pipeline_first_stage(),
                     post_process=ps.is_pipeline_last_stage(), parallel_output=True,
                     share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
                     position_embedding_type=args.position_embedding_type, rotary_percent=args.rotary_percent,
                     rotary_base=args.rotary_base)
    return args, cfg, model


def worker(rank, world, spec, port, out):
    start(rank, world, port)
    result = {"rank": rank, "error": None, "strict_load_error": None, "iteration": None, "logits": None}
    try:
        from megatron.core import parallel_state as ps
        import make_mcore as mm  # its strict-load record (megatron_model put this folder on the path)
        import megatron.training.checkpointing as ckpt
        args, _, model = megatron_model(spec, flags(spec))
        if args.bf16:
            model = model.to(torch.bfloat16)
        ckpt.update_num_microbatches = lambda *a, **k: None
        real_tensor = torch.tensor  # read_metadata all-reduces the iteration in a torch.tensor(device='cuda')
        torch.tensor = lambda *a, **k: real_tensor(*a, **({**k, "device": "cpu"} if "cuda" in str(k.get("device", "")) else k))
        mm.record_strict_load(model, result)
        iteration, _ = ckpt.load_checkpoint([model], None, None, strict=True)
        torch.tensor = real_tensor
        result["iteration"] = iteration
        ref = json.load(open(spec["reference"]))
        ids = torch.tensor(ref["ids"])
        b, s = ids.shape
        pos = torch.arange(s).unsqueeze(0).expand(b, s)
        mask = torch.triu(torch.ones(1, 1, s, s), diagonal=1).bool()
        model.eval()
        dtype = torch.bfloat16 if args.bf16 else torch.float32
        with torch.no_grad():
            if ps.get_pipeline_model_parallel_world_size() == 1:
                local = model(ids, pos, mask)
            elif ps.is_pipeline_first_stage():
                hidden = model(ids, pos, mask)
                dist.send(hidden.contiguous(), ps.get_pipeline_model_parallel_next_rank())
                local = None
            else:
                buf = torch.empty(s, b, args.hidden_size, dtype=dtype)
                dist.recv(buf, ps.get_pipeline_model_parallel_prev_rank())
                model.set_input_tensor(buf)
                local = model(ids, pos, mask)
        if local is not None:
            local = local.float()
            parts = [torch.empty_like(local) for _ in range(ps.get_tensor_model_parallel_world_size())]
            dist.all_gather(parts, local.contiguous(), group=ps.get_tensor_model_parallel_group())
            result["logits"] = torch.cat(parts, dim=-1)
    except Exception:
        result["error"] = traceback.format_exc()[-3000:]
    torch.save(result, os.path.join(out, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


def sha256s(root):
    out = {}
    for d, _, names in os.walk(root):
        for n in sorted(names):
            p = os.path.join(d, n)
            rel = os.path.relpath(p, root)
            if rel.startswith(".ucp"):
                continue
            out[rel] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return dict(sorted(out.items()))


def main():
    specs, record_path = json.load(open(sys.argv[1])), sys.argv[2]
    record = {"megatron": "core_v0.17.1", "torch": torch.__version__,
              "loader": "megatron.training.checkpointing.load_checkpoint([model], None, None) after Megatron-LM's parse_args, "
                        "validate_args and build_tokenizer of the user's flags (the job's defaults: no --finetune, --no-load-optim "
                        "or --no-load-rng); GPTModel as gpt_builders builds it with --transformer-impl local",
              "outputs": {}}
    for n, (label, spec) in enumerate(specs.items()):
        world = spec["tp"] * spec["pp"] * spec.get("dp", 1)
        out = os.path.join("/tmp/cfc_results", label)
        os.makedirs(out, exist_ok=True)
        mp.spawn(worker, args=(world, spec, 29700 + n, out), nprocs=world, join=True)
        results = [torch.load(os.path.join(out, f"rank{r}.pt"), weights_only=False) for r in range(world)]
        errors = [r["error"] for r in results if r["error"]]
        strict = [r["strict_load_error"] for r in results if r["strict_load_error"]]
        ref = json.load(open(spec["reference"]))
        want = torch.tensor(ref["logits"], dtype=torch.float32)
        got = next((r["logits"] for r in results if r["logits"] is not None), None)
        diff = None
        if got is not None:
            diff = (got[..., :want.shape[-1]] - want).abs().max().item()
        entry = {"sha256": sha256s(spec["root"]), "world": world, "flags": flags(spec)[1:], "error": errors[0] if errors else None,
                 "strict_load_error": strict[0] if strict else None,
                 "iterations": sorted({r["iteration"] for r in results if r["iteration"] is not None}),
                 "reference": ref.get("reader", spec["reference"]), "max_abs_logit_diff": diff,
                 "max_abs_logit": want.abs().max().item()}
        record["outputs"][label] = entry
        print(label, {k: v for k, v in entry.items() if k not in ("sha256", "flags")}, flush=True)
    with open(record_path, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
