"""Writes a real Megatron-Core `torch_dist` training checkpoint on CPU (2 processes, gloo): a tiny
GPTModel trained a few Adam steps, saved by Megatron-Core's own `dist_checkpointing.save` with the
state dict Megatron-LM's `generate_state_dict` builds (model, optimizer.sharded_state_dict of an
FP32Optimizer, iteration, checkpoint_version, args, scheduler, RNG state). Then torch's own DCP
loader reads the checkpoint's global tensors into reference.pt (the tests' ground truth), and what
`torch.load` finds in common.pt goes to common.json (REFERENCES_ONLY=1 redoes only these two).

Run inside the Debian trixie chroot with Megatron-LM core_v0.17.1 on PYTHONPATH:
  CASE=llama_tp2 OUT=/tmp/mcore python3 make_mcore.py
Cases: gpt_tp2 (LayerNorm, GeLU, biases, MHA; TP=2), llama_tp2 (RMSNorm, SwiGLU, GQA 4 heads / 2
groups, rotary, no biases; TP=2), llama_pp2 (the same model, PP=2: each stage saves its own layers
of the stacked tensors), moe_ep2 (the same block with 4 experts, top-2, EP=2), llama_dp2_distopt_bf16 (the same model in bf16, DP=2, Megatron's
DistributedOptimizer over its DDP, state saved fully_reshardable), llama_dp2_distopt_dp_reshardable
(the same, state saved in the bucket-flat dp_reshardable form, for tests/data/real-dcp-refused).
The flattened fully_sharded_model_space form cannot be saved by 0.17.1 itself ("ShardedTensor.
flattened_range is not supported"): only older releases wrote it.

CPU-only workarounds, in this process only: Megatron-Core's save calls torch.cuda.synchronize() and
torch.cuda.current_device(); FP32Optimizer makes its loss scale with device='cuda'; the default causal
mask is made on cuda (a mask is given); the RNG tracker's fork needs a CUDA generator (a no-op fork:
dropout is 0).
"""
import contextlib, os, sys, json, traceback
import torch, torch.distributed as dist, torch.multiprocessing as mp
import torch.nn.functional as F

CASE = os.environ.get("CASE", "llama_tp2")
OUT = os.environ.get("OUT", "/tmp/mcore")
CKPT = os.path.join(OUT, CASE, "checkpoint")
STEPS = int(os.environ.get("STEPS", "3"))
DISTOPT = "distopt" in CASE  # Megatron's DistributedOptimizer over DDP, bf16 weights, DP=2
FORM = "dp_reshardable" if "dp_reshardable" in CASE else "fully_reshardable"  # its state's form
TP = 1 if CASE.endswith("pp2") or DISTOPT or CASE.startswith("moe") else 2
EP = 2 if CASE.startswith("moe") else 1  # experts over the 2 ranks: the global-expert axis
PP = 2 if CASE.endswith("pp2") else 1


def cuda_to_cpu():
    """For the distributed optimizer on CPU only: Megatron's DDP buffers and DistributedOptimizer allocate
    on 'cuda', use CUDA streams and accept only 'torch.cuda.*Tensor' types. In this process, allocations
    asking for cuda get the CPU, streams are no-ops, and a CPU tensor's type() answers as its CUDA twin."""
    def fix(kw):
        if "cuda" in str(kw.get("device", "")):
            kw["device"] = "cpu"
        return kw
    for name in ("zeros", "empty", "ones", "tensor", "full", "arange", "zeros_like", "empty_like", "ones_like"):
        setattr(torch, name, (lambda orig: lambda *a, **k: orig(*a, **fix(k)))(getattr(torch, name)))
    to = torch.Tensor.to
    torch.Tensor.to = lambda self, *a, **k: to(self, *("cpu" if "cuda" in str(x) else x for x in a), **fix(k))
    torch.Tensor.cuda = lambda self, *a, **k: self
    kind = torch.Tensor.type
    torch.Tensor.type = lambda self, *a, **k: (kind(self).replace("torch.", "torch.cuda.", 1) if not a and not k else kind(self, *a, **k))

    class Stream:
        def __init__(self, *a, **k): pass
        def wait_stream(self, *a, **k): pass
    torch.cuda.Stream = Stream
    torch.cuda.current_stream = torch.cuda.default_stream = lambda *a, **k: Stream()
    torch.cuda.stream = lambda *a, **k: contextlib.nullcontext()


def config():
    from megatron.core.transformer.transformer_config import TransformerConfig
    common = dict(num_layers=4, hidden_size=64, num_attention_heads=4, use_cpu_initialization=True,
                  pipeline_dtype=torch.float32, hidden_dropout=0.0, attention_dropout=0.0,
                  tensor_model_parallel_size=TP, pipeline_model_parallel_size=PP)
    if CASE.startswith("gpt"):
        return TransformerConfig(**common), "learned_absolute"
    if CASE.startswith("moe"):  # Mixture of Experts: 4 experts, top-2, on the Llama-style block
        common.update(num_moe_experts=4, moe_router_topk=2, moe_aux_loss_coeff=0.0, expert_model_parallel_size=EP)
    if DISTOPT:
        common.update(bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16)
    return TransformerConfig(**common, num_query_groups=2, normalization="RMSNorm", gated_linear_unit=True,
                             activation_func=F.silu, add_bias_linear=False, ffn_hidden_size=96), "rope"


def worker(rank, world):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29541", USE_LIBUV="0")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: "cpu"
    if DISTOPT:
        cuda_to_cpu()
    try:
        from megatron.core import parallel_state, dist_checkpointing, tensor_parallel
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.optimizer import OptimizerConfig
        from megatron.core.optimizer.optimizer import FP32Optimizer
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=TP, pipeline_model_parallel_size=PP,
                                                 expert_model_parallel_size=EP)
        torch.manual_seed(1234)
        try:
            tensor_parallel.model_parallel_cuda_manual_seed(123)
        except Exception as e:
            print(f"[{rank}] model_parallel_cuda_manual_seed: {type(e).__name__}", flush=True)
        tracker = tensor_parallel.get_cuda_rng_tracker()  # its CUDA generator cannot be made on CPU; dropout is 0
        tracker.fork = lambda *a, **k: contextlib.nullcontext()
        cfg, pos = config()
        pre = parallel_state.is_pipeline_first_stage()
        post = parallel_state.is_pipeline_last_stage()
        spec = get_gpt_layer_local_spec(normalization=cfg.normalization,
                                        **({"num_experts": 4, "moe_grouped_gemm": False} if CASE.startswith("moe") else {}))
        model = GPTModel(config=cfg, transformer_layer_spec=spec,
                         vocab_size=128, max_sequence_length=32, position_embedding_type=pos,
                         pre_process=pre, post_process=post, share_embeddings_and_output_weights=False)
        from megatron.core.optimizer import _get_param_groups, get_megatron_optimizer
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.dist_checkpointing import ShardedObject
        ocfg = OptimizerConfig(optimizer="adam", lr=1e-3, min_lr=1e-5, weight_decay=0.01, adam_beta2=0.95, clip_grad=0.0,
                               use_distributed_optimizer=DISTOPT, bf16=DISTOPT,
                               params_dtype=torch.bfloat16 if DISTOPT else torch.float32)
        if DISTOPT:  # as Megatron-LM builds it: DDP with its grad buffers, then get_megatron_optimizer
            model = model.to(torch.bfloat16)
            ddp = DistributedDataParallel(cfg, DistributedDataParallelConfig(use_distributed_optimizer=True,
                                                                             grad_reduce_in_fp32=True), model)
            opt = get_megatron_optimizer(ocfg, [ddp])
            forward = ddp
        else:
            groups = _get_param_groups([model], ocfg, None)  # Megatron's own: no weight decay on biases and 1-D tensors
            adam = torch.optim.Adam(groups, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)
            real_tensor = torch.tensor
            torch.tensor = lambda *a, **k: real_tensor(*a, **{**k, "device": "cpu"} if k.get("device") == "cuda" else k)
            opt = FP32Optimizer(adam, ocfg, lambda o, c: None)
            torch.tensor = real_tensor
            forward = model
        g = torch.Generator().manual_seed(7 + (parallel_state.get_data_parallel_rank() if DISTOPT else 0))
        for step in range(STEPS):
            tokens = torch.randint(0, 128, (2, 16), generator=g)
            labels = torch.randint(0, 128, (2, 16), generator=g)
            opt.zero_grad()
            if DISTOPT:
                ddp.zero_grad_buffer()
            if PP == 1:
                pos_ids = torch.arange(16).unsqueeze(0).expand(2, 16)
                mask = torch.triu(torch.ones(1, 1, 16, 16), diagonal=1).bool()  # causal, given: the default is made on cuda
                loss = forward(tokens, pos_ids, mask, labels=labels).float().mean()
                loss.backward()
                if DISTOPT:
                    ddp.finish_grad_sync()
            else:  # no pipeline schedule on CPU here: every parameter gets a seeded gradient
                for p in model.parameters():
                    p.grad = torch.randn(p.shape, generator=g) * 1e-2
                loss = torch.tensor(0.0)
            if DISTOPT:
                opt.step()
            else:
                adam.step()
            print(f"[{rank}] step {step + 1} loss {loss.item():.6f}", flush=True)
        if PP == 1 and not DISTOPT:  # the training model's own logits on a fixed batch: what a Hugging Face export must give
            model.eval()
            ids = (torch.arange(2 * 16).view(2, 16) * 37 + 11) % 128
            mask = torch.triu(torch.ones(1, 1, 16, 16), diagonal=1).bool()
            with torch.no_grad():
                local = model(ids, torch.arange(16).unsqueeze(0).expand(2, 16), mask).float()  # [b, s, vocab / TP]
            parts = [torch.empty_like(local) for _ in range(TP)]
            dist.all_gather(parts, local.contiguous(), group=parallel_state.get_tensor_model_parallel_group())
            if rank == 0:
                with open(os.path.join(OUT, CASE, "megatron_logits.json"), "w") as f:
                    json.dump({"case": CASE, "torch": torch.__version__, "reader": "Megatron-Core 0.17.1 GPTModel",
                               "ids": ids.tolist(), "logits": torch.cat(parts, dim=-1).tolist()}, f)
            model.train()
        model_sd = model.sharded_state_dict()
        # What Megatron-LM's generate_state_dict saves besides: its parsed args, the schedule, and the
        # RNG states as a ShardedObject per (pp, tp) rank (here without CUDA's).
        # The args Megatron-LM's pretrain_gpt.py would parse for this model (its parse_args, unvalidated).
        sys.argv = ["pretrain_gpt.py", "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
                    "--seq-length", "16", "--max-position-embeddings", "32", "--micro-batch-size", "2",
                    "--lr", "1e-3", "--min-lr", "1e-5", "--weight-decay", "0.01", "--adam-beta2", "0.95",
                    "--ckpt-format", "torch_dist", "--tensor-model-parallel-size", str(TP),
                    "--pipeline-model-parallel-size", str(PP), "--untie-embeddings-and-output-weights",
                    "--hidden-dropout", "0", "--attention-dropout", "0"]
        if DISTOPT:
            sys.argv += ["--use-distributed-optimizer", "--bf16"] + (["--dist-ckpt-optim-fully-reshardable"] if FORM == "fully_reshardable" else [])
        if CASE.startswith("moe"):
            sys.argv += ["--num-experts", "4", "--moe-router-topk", "2", "--moe-aux-loss-coeff", "0",
                         "--expert-model-parallel-size", str(EP)]
        if not CASE.startswith("gpt"):
            sys.argv += ["--group-query-attention", "--num-query-groups", "2", "--swiglu", "--normalization", "RMSNorm",
                         "--ffn-hidden-size", "96", "--disable-bias-linear", "--position-embedding-type", "rope"]
        from megatron.training.arguments import parse_args
        import random, numpy
        rng = [{"random_rng_state": random.getstate(), "np_rng_state": numpy.random.get_state(),
                "torch_rng_state": torch.get_rng_state()}]
        pp_rank, tp_rank = parallel_state.get_pipeline_model_parallel_rank(), parallel_state.get_tensor_model_parallel_rank()
        state = {"args": parse_args(), "checkpoint_version": 3.0, "iteration": STEPS, "model": model_sd,
                 "optimizer": opt.sharded_state_dict(model_sd, **({"metadata": {"distrib_optim_sharding_type": FORM}}
                                                                  if DISTOPT else {})),
                 "opt_param_scheduler": {"max_lr": 1e-3, "min_lr": 1e-5, "num_steps": STEPS * 2},
                 "rng_state": ShardedObject("rng_state", rng, (PP, TP), (pp_rank, tp_rank),
                                           replica_id=parallel_state.get_data_parallel_rank()),
                 "num_floating_point_operations_so_far": 0}
        dist_checkpointing.save(state, CKPT)
        print(f"[{rank}] SAVE OK", flush=True)
    except Exception:
        traceback.print_exc()
        raise
    finally:
        dist.destroy_process_group()


def references():
    """torch's own DCP loader fills a state dict of every tensor key at its global size: reference.pt
    (torch's dcp_to_torch_save stops on Megatron's metadata, whose planner_data is None). What
    common.pt holds, read by torch.load here (its args need Megatron's classes): common.json."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    reader = dcp.FileSystemReader(CKPT)
    meta = reader.read_metadata()
    full = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in meta.state_dict_metadata.items()
            if isinstance(m, TensorStorageMetadata)}
    dcp.load(full, storage_reader=reader)  # no process group: one process reads all
    torch.save(full, os.path.join(OUT, CASE, "reference.pt"))
    common = torch.load(os.path.join(CKPT, "common.pt"), weights_only=False)
    optimizer = common["optimizer"]
    if "param_state_sharding_type" in optimizer:  # the distributed optimizer: the step in each param group
        groups = optimizer["optimizer"]["param_groups"]
        step = {"step": groups[0]["step"], "step_type": type(groups[0]["step"]).__name__,
                "param_state_sharding_type": optimizer["param_state_sharding_type"]}
    else:  # a common step for every parameter
        groups, s = optimizer["param_groups"], optimizer["state"]["common_step"]
        step = {"common_step": s.item(), "common_step_dtype": str(s.dtype)}
    with open(os.path.join(OUT, CASE, "common.json"), "w") as f:
        json.dump({"keys": list(common), "iteration": common["iteration"], **step, "param_groups": groups}, f, indent=1)
    for k, v in full.items():
        print(k, tuple(v.shape), v.dtype)


if __name__ == "__main__":
    if os.environ.get("REFERENCES_ONLY") != "1":
        os.makedirs(CKPT, exist_ok=True)
        mp.spawn(worker, args=(2,), nprocs=2)
    if FORM != "dp_reshardable":  # a checkpoint ucp refuses needs no reference
        references()
