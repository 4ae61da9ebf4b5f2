"""Loads checkpoints that ucp wrote in Megatron-LM's torch_dist form with the real Megatron-LM (core_v0.17.1):
for each output (a Megatron-LM checkpoint root at a new TP/PP/DP layout) it spawns TP*PP*DP processes (gloo, CPU),
builds a fresh model (and DDP + optimizer of the source case's kind) exactly as make_mcore.py builds it for the
source case, but at the new layout, and calls Megatron-LM's own
`megatron.training.checkpointing.load_checkpoint([model], optimizer, opt_param_scheduler)` with the global args
of make_mcore.megatron_args() at the new TP/PP plus --load <root>. Every rank then saves the model parameters and
the optimizer's fp32 main params / exp_avg / exp_avg_sq it holds, placed by the model's sharded_state_dict (key,
global shape, global offset); the parent process assembles the global tensors and compares them bitwise (and by
dtype) with the source case's reference.pt (reference_trained.pt's entries override), and checks the iteration
and the optimizer's step. Writes mcore_target_readers.json.

Run inside the Debian trixie chroot (make_mcore.py and the references copied to /tmp/mlc):
  cd /tmp/mlc && PYTHONPATH=/opt/megatron OMP_NUM_THREADS=1 python3 mcore_load_check.py [label:layout ...]

CPU-only workarounds, beyond make_mcore.py's own (worker's, cuda_to_cpu, step_kept_apart, the
distributed optimizer's _init_optimizer_states_with_dummy_values): torch.tensor(device='cuda') gives a CPU
tensor (read_metadata all-reduces the iteration on cuda; cuda_to_cpu does it for the other cases), no --no-load-rng for
ucp's outputs (their args say no_save_rng: load_checkpoint must skip the RNG state itself; NO_LOAD_RNG=1 only for
Megatron's own source checkpoint resumed at its own layout, whose RNG state's CUDA parts cannot be restored on CPU),
TRAIN=1 trains steps 4 and 5 after the load (make_mcore's batches) and records the losses, update_num_microbatches is a no-op (no microbatch calculator is set up), the
tied output layer's weight.cuda() in setup_embeddings_and_output_layer is a no-op (gpt_tp2_tied at PP > 1), the
FP32Optimizer gets the init_state_fn get_megatron_optimizer gives Adam (make_mcore's build passes a no-op), and
a dummy scheduler takes the saved opt_param_scheduler. A model.load_state_dict(strict=True) failure, which
load_checkpoint swallows (it retries with strict=False), is recorded as an error.
"""
import contextlib, hashlib, json, os, subprocess, sys, traceback

HERE = os.path.dirname(os.path.abspath(__file__))
MT = os.environ.get("MT", "/tmp/mt")
REF = os.environ.get("REF", os.path.join(HERE, "ref"))
WORK = os.environ.get("WORK", os.path.join(HERE, "out"))
# label -> (source case, weights only, layouts)
OUTPUTS = {
    "llama_tp2": ("llama_tp2", False, ["tp1_pp2_dp1", "tp2_pp2_dp1", "tp1_pp1_dp2"]),
    "llama_tp2_dp2_distopt_bf16": ("llama_tp2_dp2_distopt_bf16", False, ["tp1_pp2_dp1", "tp2_pp1_dp2"]),
    "llama_tp2_src": ("llama_tp2", False, ["tp2_pp1_dp1"]),  # MT=srcmt: Megatron's own source checkpoint
    "gpt_tp2_pp2_bf16_legacy": ("gpt_tp2_pp2_bf16_legacy", False, ["tp1_pp1_dp1", "tp2_pp1_dp1"]),
    "gpt_weights_only": ("gpt_tp2_pp2_bf16_legacy", True, ["tp1_pp2_dp1"]),
    "gpt_tp2_tied": ("gpt_tp2_tied", False, ["tp1_pp2_dp1"]),
    # Mixture of Experts (SequentialMLP, FP32Optimizer over Megatron's 3 groups): layouts with _epN put the experts
    # over N of the DP ranks (expert TP = TP)
    "moe_tp2_ep2_logits": ("moe_tp2_ep2_logits", False, ["tp1_pp1_dp1", "tp1_pp2_dp2_ep2", "tp2_pp1_dp2_ep2", "tp1_pp1_dp4_ep4"]),
    "moe_ep2": ("moe_ep2", False, ["tp2_pp2_dp1"]),
    # Megatron-LM's own optimizer at EP > 1 (get_megatron_optimizer: a ChainedOptimizer of a dense and an expert FP32Optimizer)
    "moe_ep2_chained": ("moe_ep2_chained", False, ["tp1_pp1_dp1", "tp1_pp2_dp2_ep2", "tp2_pp1_dp2_ep2", "tp1_pp1_dp4_ep4"]),
    # Megatron-LM's own optimizer at EP 1 (one FP32Optimizer, 2 groups), written at EP > 1 as the chain Megatron-LM builds there
    "moe_ep1_dp2": ("moe_ep1_dp2", False, ["tp1_pp1_dp2_ep2", "tp2_pp1_dp2_ep2", "tp1_pp2_dp4_ep4"]),
    # Megatron-LM's default bf16 MoE run (the distributed optimizer; a chain of two at EP > 1), converted from its
    # dp_reshardable save: the chain of distributed optimizers again at EP > 1, one at EP 1
    "moe_ep2_dp4_distopt_bf16": ("moe_ep2_dp4_distopt_bf16", False, ["tp1_pp1_dp2_ep2", "tp2_pp1_dp2_ep2", "tp1_pp1_dp2", "tp1_pp2_dp2_ep2",
                                                                     "tp1_pp1_dp4_ep2"]),  # the last at the source's layout: TRAIN=1
    "moe_ep1_dp2_distopt_bf16": ("moe_ep1_dp2_distopt_bf16", False, ["tp1_pp1_dp2_ep2", "tp1_pp2_dp4_ep4"]),
    # Megatron's own dp_reshardable save of moe_ep2_dp4_distopt_bf16, resumed at its layout (MT_SRC, NO_LOAD_RNG=1, TRAIN=1):
    # the losses ucp's output at that layout must give
    "moe_ep2_dp4_distopt_bf16_src": ("moe_ep2_dp4_distopt_bf16", False, ["tp1_pp1_dp4_ep2"]),
    # Megatron-LM's own --no-save-optim save (gpt_tp2_pp2_bf16_legacy/checkpoint_weights_only as
    # <root>/iter_0000003), loaded with the job's default flags: recorded under the top-level key, not "outputs"
    "megatron_own_weights_only": ("gpt_tp2_pp2_bf16_legacy", True, ["tp1_pp2_dp1"]),
}
# label -> its roots' parent folder, when not MT
ROOTS = {"moe_ep2_dp4_distopt_bf16_src": os.environ.get("MT_SRC", "/tmp/mt_src"), "gpt_tp2_tied": os.environ.get("MT2", "/tmp/mt2"), "megatron_own_weights_only": os.environ.get("MT_OWN", "/tmp/mt_own")}
# label -> the job's flags beyond the default (what a user of a weights-only save passes)
FLAGS = {"gpt_weights_only": ["--no-load-optim"]}
# label -> the label of Megatron's own save of its source resumed at the same layout (TRAIN=1): in bf16 the losses'
# reference, as the issue asks ("against the same layout's own run on this CPU"): on CPU, torch's Adam keeps a
# per-parameter step the load's dummy step sets, which neither checkpoint carries, so both part from the
# uninterrupted run at step 5 alike
OWN_RESUME = {"moe_ep2_dp4_distopt_bf16": "moe_ep2_dp4_distopt_bf16_src"}
# label -> the top-level key of the JSON its result goes to (instead of "outputs" -> "<label>:<layout>")
TOP_LEVEL = {"megatron_own_weights_only": "megatron_own_weights_only"}


def root_of(label, layout):
    return os.path.join(ROOTS.get(label, MT), label, layout)


def parse_layout(layout):
    """tpT_ppP_dpD (the world), without the _epE of a MoE layout (expert_parallel)."""
    t, p, d = layout.split("_")[:3]
    return int(t[2:]), int(p[2:]), int(d[2:])


def expert_parallel(layout):
    parts = layout.split("_")
    return int(parts[3][2:]) if len(parts) > 3 else 1


class Scheduler:
    """Takes the saved opt_param_scheduler (what load_checkpoint gives it)."""
    loaded = None

    def state_dict(self):
        return {"max_lr": 1e-3, "min_lr": 1e-5, "num_steps": 6}

    def load_state_dict(self, sd):
        Scheduler.loaded = sd


def boxes_of(model, whole, prefix):
    """Global-tensor boxes of the local tensors `whole[(param name, kind)]`, placed as the model's
    ShardedTensor (or ShardedTensorFactory) places the parameter. kind None: the model's own parameter."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    names = {p: n for n, p in model.named_parameters()}
    out = []
    for sh in model.sharded_state_dict().values():
        if not isinstance(sh, (ShardedTensor, ShardedTensorFactory)) or sh.data not in names:
            continue
        for kind in sorted({k for (n, k) in whole if n == names[sh.data]}, key=str):
            data = whole[(names[sh.data], kind)].view(sh.data.shape)
            built = [sh] if isinstance(sh, ShardedTensor) else list(nested_values(sh.build_fn(sh.key, data, sh.replica_id, None)))
            for st in built:
                box = data if st is sh else st.data
                key = st.key if kind is None else f"{prefix}.{kind}.{st.key}"
                out.append((key, tuple(st.global_shape), tuple(st.global_offset),
                            (1,) * st.prepend_axis_num + tuple(box.shape), box.detach().contiguous().clone()))
    return out


def fwd_bwd(mm, model, ddp, tokens, labels):
    """make_mcore's forward and backward (PP == 1), and at PP == 2 the same by hand: stage 0's hidden states
    sent to the next stage, whose loss's backward sends the input's gradient back. The loss on the last stage."""
    import torch, torch.distributed as dist
    from megatron.core import parallel_state as ps
    forward = ddp if ddp is not None else model
    pos_ids = torch.arange(16).unsqueeze(0).expand(2, 16)
    mask = torch.triu(torch.ones(1, 1, 16, 16), diagonal=1).bool()
    if ps.get_pipeline_model_parallel_world_size() == 1:
        loss = forward(tokens, pos_ids, mask, labels=labels).float().mean()
        loss.backward()
        return loss.item()
    assert ps.get_pipeline_model_parallel_world_size() == 2
    dtype = torch.bfloat16 if mm.BF16 else torch.float32
    if ps.is_pipeline_first_stage():
        out = forward(tokens, pos_ids, mask)
        dist.send(out.detach().contiguous(), ps.get_pipeline_model_parallel_next_rank())
        grad = torch.empty_like(out)
        dist.recv(grad, ps.get_pipeline_model_parallel_next_rank())
        out.backward(grad)
        return None
    buf = torch.empty(16, 2, model.config.hidden_size, dtype=dtype)
    dist.recv(buf, ps.get_pipeline_model_parallel_prev_rank())
    buf.requires_grad_(True)
    model.set_input_tensor(buf)
    loss = forward(tokens, pos_ids, mask, labels=labels).float().mean()
    loss.backward()
    dist.send(buf.grad.contiguous(), ps.get_pipeline_model_parallel_prev_rank())
    return loss.item()


def train_steps(mm, model, ddp, opt, adam, first, last):
    """make_mcore's training steps first..last (1-based): its generator (seed 7, + dp_rank + 10 pp_rank with the
    distributed optimizer) drawn for every step before, so that the batches are the same as an uninterrupted
    run's; a real loss (forward and backward) at every layout (make_mcore seeds gradients at PP > 1)."""
    import torch
    from megatron.core import parallel_state as ps
    model.train()
    g = torch.Generator().manual_seed(7 + (ps.get_data_parallel_rank() + 10 * ps.get_pipeline_model_parallel_rank()
                                           if mm.DISTOPT else 0))
    losses = []
    for step in range(1, last + 1):
        tokens = torch.randint(0, mm.VOCAB, (2, 16), generator=g)
        labels = torch.randint(0, mm.VOCAB, (2, 16), generator=g)
        if step < first:
            continue
        opt.zero_grad()
        if ddp is not None:
            ddp.zero_grad_buffer()
        loss = fwd_bwd(mm, model, ddp, tokens, labels)
        if ddp is not None:
            ddp.finish_grad_sync()
            opt.step()
        else:
            adam.step()
        losses.append(loss)
    return losses


def reference_worker(rank, world, port):
    """The uninterrupted run at the source layout: make_mcore's build(1234) and its seeds, 5 steps of its training
    (fwd_bwd, train_steps); after step 3 the parameters are compared with reference.pt (does the run reproduce the
    checkpoint?)."""
    import torch, torch.distributed as dist
    import make_mcore as mm
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), USE_LIBUV="0",
                      WORLD_SIZE=str(world), RANK=str(rank), CUDA_DEVICE_MAX_CONNECTIONS="1")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: "cpu"
    if mm.DISTOPT or mm.FLOAT16 or mm.MEGATRON_OPT:
        mm.cuda_to_cpu()
    from megatron.core import parallel_state, tensor_parallel
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=mm.TP, pipeline_model_parallel_size=mm.PP,
                                             expert_model_parallel_size=mm.EP)
    torch.manual_seed(1234)
    try:
        tensor_parallel.model_parallel_cuda_manual_seed(123)
    except Exception:
        pass
    tensor_parallel.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    model, ddp, opt, adam = mm.build(1234)
    losses = train_steps(mm, model, ddp, opt, adam, 1, 3)
    whole = {(n, None): p.detach().clone() for n, p in model.named_parameters()}
    boxes = boxes_of(model, whole, "optimizer.state")
    losses += train_steps(mm, model, ddp, opt, adam, 4, 5)
    torch.save({"rank": rank, "losses": losses, "boxes": boxes, "layout": [mm.TP, mm.PP, mm.DP, mm.EP]},
               os.path.join(WORK, f"reference_{mm.CASE}", f"rank{rank}.pt"))
    dist.destroy_process_group()


def worker(rank, world, label, layout, root, port):
    import torch, torch.distributed as dist
    import make_mcore as mm
    tp, pp, dp = parse_layout(layout)
    ep = expert_parallel(layout)
    mm.TP, mm.PP, mm.DP, mm.EP, mm.WORLD = tp, pp, dp, ep, world
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), USE_LIBUV="0",
                      WORLD_SIZE=str(world), RANK=str(rank), CUDA_DEVICE_MAX_CONNECTIONS="1")
    if mm.FROM_ARGS:
        import torch._dynamo as dynamo
        dynamo.config.disable = True
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: "cpu"
    if mm.DISTOPT or mm.FLOAT16 or mm.MEGATRON_OPT:
        mm.cuda_to_cpu()
    elif mm.TIED:  # GPTModel's setup_embeddings_and_output_layer moves the shared weight .cuda() before its
        # all-reduce over the embedding group (PP > 1): it stays on the CPU (gloo)
        torch.Tensor.cuda = lambda self, *a, **k: self
    result = {"rank": rank, "error": None, "iteration": None, "steps": [], "boxes": [], "strict_load_error": None,
              "scheduler": None, "rng_state_requested": False, "losses": None}
    try:
        from megatron.core import parallel_state, tensor_parallel
        import megatron.training.checkpointing as ckpt
        from megatron.training import global_vars
        from megatron.training.utils import update_use_dist_ckpt
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                                 expert_model_parallel_size=ep)
        torch.manual_seed(1234)
        try:
            tensor_parallel.model_parallel_cuda_manual_seed(123)
        except Exception:
            pass
        tensor_parallel.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
        model, ddp, opt, adam = mm.build(4321)
        if not (mm.DISTOPT or mm.FLOAT16 or mm.MEGATRON_OPT):  # FP32Optimizer: the init_state_fn get_megatron_optimizer gives Adam
            def init_state_fn(o, config=None):
                for group in o.param_groups:
                    for p in group["params"]:
                        if len(o.state[p]) == 0:
                            o.state[p]["exp_avg"] = torch.zeros_like(p.data)
                            o.state[p]["exp_avg_sq"] = torch.zeros_like(p.data)
            opt.init_state_fn = init_state_fn
        if mm.DISTOPT:
            mm.step_kept_apart()
            for one in mm.distributed_optimizers(opt):
                one._init_optimizer_states_with_dummy_values()
        # the job's default flags: no --dist-ckpt-optim-fully-reshardable (the form comes from the checkpoint's
        # content_metadata), no --no-load-rng (the checkpoint's args say no_save_rng: load_checkpoint must ignore
        # the RNG state itself); NO_LOAD_RNG=1 only for Megatron's own source checkpoint resumed at its own TP/PP
        args = mm.megatron_args(False)
        args.load = root
        args.exit_on_missing_checkpoint = True
        if os.environ.get("NO_LOAD_RNG") == "1":
            args.no_load_rng = True
        for flag in FLAGS.get(label, []):
            assert flag == "--no-load-optim", flag
            args.no_load_optim = True
        real_get_rng_state = ckpt.get_rng_state

        def get_rng_state(*a, **k):  # load_checkpoint asks it only when it means to load the RNG state
            result["rng_state_requested"] = True
            return real_get_rng_state(*a, **k)
        ckpt.get_rng_state = get_rng_state
        update_use_dist_ckpt(args)
        global_vars.set_args(args)
        ckpt.update_num_microbatches = lambda *a, **k: None
        if not (mm.DISTOPT or mm.FLOAT16 or mm.MEGATRON_OPT):  # read_metadata all-reduces the iteration in a torch.tensor(device='cuda')
            real_tensor = torch.tensor
            torch.tensor = lambda *a, **k: real_tensor(*a, **({**k, "device": "cpu"} if "cuda" in str(k.get("device", "")) else k))
        wrapped = ddp if ddp is not None else model
        mm.record_strict_load(wrapped, result)
        if os.environ.get("DEBUG_KEYS"):
            import megatron.core.dist_checkpointing.strategies.torch as st
            orig = st._replace_sharded_keys_with_state_dict_keys
            def dbg(sd, fm, rm):
                print(f"[{rank}] DEBUG None-valued keys: {[(k, rm.get(k)) for k, v in sd.items() if v is None]}", flush=True)
                return orig(sd, fm, rm)
            st._replace_sharded_keys_with_state_dict_keys = dbg
        iteration, _ = ckpt.load_checkpoint([wrapped], opt, Scheduler())
        result["iteration"] = iteration
        result["scheduler"] = Scheduler.loaded
        names = {p: n for n, p in model.named_parameters()}
        whole = {(n, None): p.detach().clone() for n, p in model.named_parameters()}
        result["boxes"] = boxes_of(model, whole, "optimizer.state")
        # the last stage's copy of the word embedding (output layer tied, not the first stage): its boxes land on
        # the embedding's key; check() compares every box that overlaps another one bitwise
        result["tied_copy"] = bool(getattr(model, "share_embeddings_and_output_weights", False) and not model.pre_process
                                   and getattr(model, "post_process", False))
        if mm.DISTOPT:
            result["boxes"] += mm.trained_boxes(model, opt)  # gathers over DP (every rank takes part)
            result["steps"] = sorted({float(g["step"]) for one in mm.distributed_optimizers(opt)
                                      for g in one.state_dict()["optimizer"]["param_groups"]})
        else:
            if mm.FLOAT16:
                f16 = mm.distributed_optimizers(opt)[0]
                pairs = [(mp_, main) for g16, g32 in zip(f16.float16_groups, f16.fp32_from_float16_groups)
                         for mp_, main in zip(g16, g32)]
                pairs += [(p, p) for g in f16.fp32_from_fp32_groups for p in g]
                kind = "fp32_param"
            else:
                pairs, kind = [(p, p) for p in model.parameters()], None
            # moe_ep2_chained: get_megatron_optimizer's FP32Optimizers (a dense and an expert one at EP > 1), their torch Adams' state
            chained_state = {p: st for one in mm.distributed_optimizers(opt) for p, st in one.optimizer.state.items()} if mm.MEGATRON_OPT else None
            state = {}
            for mp_, main in pairs:
                s = (adam.state if adam is not None else chained_state).get(main, {})
                if kind is not None:
                    state[(names[mp_], kind)] = main.detach().clone()
                for k in ("exp_avg", "exp_avg_sq"):
                    if k in s:
                        state[(names[mp_], k)] = s[k].detach().clone()
                if "step" in s:
                    result["steps"].append(float(s["step"]))
            result["steps"] = sorted(set(result["steps"]))
            result["boxes"] += boxes_of(model, state, "optimizer.state")
        if os.environ.get("TRAIN") == "1":  # continued training: steps 4 and 5 with make_mcore's batches
            result["losses"] = train_steps(mm, model, ddp, opt, adam, first=iteration + 1, last=iteration + 2)
    except BaseException as e:
        tb = traceback.format_exc()
        result["error"] = f"{type(e).__name__}: {e}"
        result["traceback"] = "\n".join(tb.strip().splitlines()[-12:])
        print(f"[{rank}] LOAD FAILED\n{tb}", flush=True)
    torch.save(result, os.path.join(WORK, f"{label}__{layout}", f"rank{rank}.pt"))
    try:
        dist.destroy_process_group()
    except Exception:
        pass


def child(label, layout, port):
    import torch.multiprocessing as mp
    tp, pp, dp = parse_layout(layout)
    os.makedirs(os.path.join(WORK, f"{label}__{layout}"), exist_ok=True)
    mp.spawn(worker, args=(tp * pp * dp, label, layout, root_of(label, layout), port), nprocs=tp * pp * dp, join=True)


def sha256s(root):
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            rel = os.path.relpath(os.path.join(d, f), root)
            if f == ".ucp-reshard.json":
                continue
            with open(os.path.join(d, f), "rb") as fh:
                out[rel] = hashlib.sha256(fh.read()).hexdigest()
    return dict(sorted(out.items()))


def check(label, layout, port):
    import torch
    case, weights_only, _ = OUTPUTS[label]
    root = root_of(label, layout)
    entry = {"sha256": sha256s(root) if os.path.isdir(root) else {}, "tensors": 0, "tensors_equal": 0,
             "iteration": None, "step": None, "error": None}
    if not os.path.isdir(root):
        entry["error"] = f"output missing: {root}"
        return entry
    tp, pp, dp = parse_layout(layout)
    folder = os.path.join(WORK, f"{label}__{layout}")
    for f in os.listdir(folder) if os.path.isdir(folder) else []:
        os.remove(os.path.join(folder, f))
    env = dict(os.environ, CASE=case)
    log = os.path.join(WORK, f"{label}__{layout}.log")
    with open(log, "w") as fh:
        rc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", label, layout, str(port)],
                            env=env, stdout=fh, stderr=subprocess.STDOUT).returncode
    results = []
    for r in range(tp * pp * dp):
        name = os.path.join(folder, f"rank{r}.pt")
        results.append(torch.load(name, weights_only=False) if os.path.exists(name) else None)
    errors = [(r["rank"], r["error"], r.get("traceback")) for r in results if r and r["error"]]
    strict = [(r["rank"], r["strict_load_error"]) for r in results if r and r["strict_load_error"]]
    if errors:
        rk, msg, tb = errors[0]
        entry["error"] = f"rank {rk}: {msg}\n--- traceback (last lines) ---\n{tb}"
        if len({e[1] for e in errors}) > 1:
            entry["error"] += "\n--- other ranks ---\n" + "\n".join(f"rank {e[0]}: {e[1]}" for e in errors[1:])
    elif strict:
        entry["error"] = ("model.load_state_dict(strict=True) failed inside load_checkpoint (it then retried with "
                          f"strict=False): rank {strict[0][0]}: {strict[0][1]}")
    elif rc != 0 or any(r is None for r in results):
        entry["error"] = f"processes exited {rc}, missing rank results; see {log}: " + open(log).read()[-2000:]
    ok = [r for r in results if r and not r["error"]]
    if ok:
        entry["iteration"] = sorted({r["iteration"] for r in ok})[0] if len({r["iteration"] for r in ok}) == 1 else sorted({r["iteration"] for r in ok})
        steps = sorted({s for r in ok for s in r["steps"]})
        entry["step"] = None if weights_only else (steps[0] if len(steps) == 1 else steps)
        if os.environ.get("TRAIN") == "1":
            by_rank = {r["rank"]: r["losses"] for r in ok if r["losses"] and r["losses"][0] is not None}
            distinct = {tuple(v) for v in by_rank.values()}
            entry["losses"] = list(distinct.pop()) if len(distinct) == 1 else {str(k): v for k, v in by_rank.items()}
            # At the source's own layout: each rank's steps 4-5 against the same rank's in the uninterrupted run
            # (--reference, run before into WORK/reference_<case>), which draws the same batches
            ref_dir = os.path.join(WORK, f"reference_{case}")
            refs = {}
            for r in range(tp * pp * dp):
                name = os.path.join(ref_dir, f"rank{r}.pt")
                saved = torch.load(name, weights_only=False) if os.path.exists(name) else {}
                if saved.get("layout") == [tp, pp, dp, expert_parallel(layout)]:
                    refs[r] = saved["losses"][3:5]
            if refs and len(refs) == tp * pp * dp and set(by_rank) <= set(refs):
                diffs = [abs(a - b) for r, v in by_rank.items() for a, b in zip(v, refs[r]) if a is not None and b is not None]
                if diffs:
                    entry["max_loss_diff"] = max(diffs)
                    entry["loss_reference"] = "the uninterrupted run at this layout (mcore_load_check.py --reference), rank by rank"
    rng = sorted(r["rank"] for r in results if r and r.get("rng_state_requested"))
    if rng:
        entry["rng_state_requested_on_ranks"] = rng
    # the reference
    ref = torch.load(os.path.join(REF, case, "reference.pt"))
    trained = os.path.join(REF, case, "reference_trained.pt")
    if os.path.exists(trained):
        ref.update(torch.load(trained))
    if weights_only:
        ref = {k: v for k, v in ref.items() if not k.startswith("optimizer.")}
    got, filled, overlaps, overlap_bad = {}, {}, set(), set()
    if not errors:
        for r in ok:
            for key, gshape, goffset, shape, v in r["boxes"]:
                t = got.setdefault(key, torch.full(gshape, float("nan"), dtype=v.dtype))
                m = filled.setdefault(key, torch.zeros(gshape, dtype=torch.bool))
                idx = tuple(slice(o, o + n) for o, n in zip(goffset, shape))
                if m[idx].any():  # a box another rank holds too (a replica, or the last stage's tied copy)
                    overlaps.add(key)
                    if not m[idx].all() or t[idx].dtype != v.dtype or not torch.equal(t[idx], v.view(shape)):
                        overlap_bad.add(key)
                t[idx] = v.view(shape)
                m[idx] = True
    if any(r.get("tied_copy") for r in ok):
        entry["tied_copy_ranks"] = sorted(r["rank"] for r in ok if r.get("tied_copy"))
    if overlaps:  # keys some box of which two ranks hold, compared bitwise with each other
        entry["overlapping_keys"] = sorted(overlaps)
        entry["overlapping_equal"] = len(overlaps) - len(overlap_bad)
        if overlap_bad:
            entry["overlapping_differing"] = sorted(overlap_bad)
    bad = sorted(overlap_bad) + [k for k in sorted(ref) if k not in overlap_bad and (k not in got or got[k].dtype != ref[k].dtype or got[k].shape != ref[k].shape
           or not torch.equal(got[k], ref[k]))]
    entry["tensors"] = len(ref)
    entry["tensors_equal"] = len(ref) - len(bad)
    if bad and not errors:
        entry["differing"] = bad
    extra = sorted(k for k in got if k not in ref)
    if extra:
        entry["not_in_reference"] = extra
    print(f"{label}:{layout}: {entry['tensors_equal']}/{entry['tensors']} equal, iteration {entry['iteration']}, "
          f"step {entry['step']}, error {entry['error']!r}" + (f", differ {bad[:8]}" if bad and not errors else ""), flush=True)
    return entry


def main(selected):
    import torch
    out_json = os.environ.get("OUT_JSON", os.path.join(HERE, "mcore_target_readers.json"))
    doc = {"megatron": "core_v0.17.1", "torch": torch.__version__,
           "loader": "megatron.training.checkpointing.load_checkpoint([model], optimizer, opt_param_scheduler) "
                     "(Megatron-LM's own, torch_dist)", "outputs": {}}
    if os.path.exists(out_json):  # every existing key kept
        with open(out_json) as f:
            old = json.load(f)
        doc = {**old, **{k: v for k, v in doc.items() if k not in old}}
        doc.setdefault("outputs", {})
    port = int(os.environ.get("PORT_BASE", "29600"))
    for label, (case, wo, layouts) in OUTPUTS.items():
        for layout in layouts:
            name = f"{label}:{layout}"
            if selected and name not in selected:
                continue
            port += 7
            entry = check(label, layout, port)
            if FLAGS.get(label):
                entry["flags"] = FLAGS[label]
            if label in TOP_LEVEL:
                doc[TOP_LEVEL[label]] = {"root": root_of(label, layout), "layout": layout, "flags": FLAGS.get(label, []), **entry}
            else:
                doc["outputs"][name] = entry
            with open(out_json, "w") as f:
                json.dump(doc, f, indent=1)
    against_own_resume(doc["outputs"])
    with open(out_json, "w") as f:
        json.dump(doc, f, indent=1)


def against_own_resume(outputs):
    """Each OWN_RESUME output's steps 4-5, rank by rank, against Megatron's own save resumed at its layout: max_loss_diff
    (the uninterrupted run's difference kept as uninterrupted_max_loss_diff)."""
    for label, own in OWN_RESUME.items():
        for name, entry in outputs.items():
            if not name.startswith(label + ":") or not isinstance(entry.get("losses"), dict):
                continue
            theirs = outputs.get(own + ":" + name.split(":", 1)[1], {}).get("losses")
            if not isinstance(theirs, dict) or set(theirs) != set(entry["losses"]):
                continue
            if "loss_reference" in entry and entry["loss_reference"].startswith("Megatron's own"):
                continue  # compared already
            if "max_loss_diff" in entry:
                entry["uninterrupted_max_loss_diff"] = entry.pop("max_loss_diff")
            entry["max_loss_diff"] = max(abs(a - b) for r in theirs for a, b in zip(entry["losses"][r], theirs[r]))
            entry["megatron_own_losses"] = theirs
            entry["loss_reference"] = ("Megatron's own save of the source resumed at this layout (" + own + "), rank by rank (bf16: "
                                       "the same layout's own run on this CPU)")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--reference":  # CASE=... : the uninterrupted run at the source layout
        import torch.multiprocessing as mp
        sys.path.insert(0, HERE)
        import make_mcore as mm
        os.makedirs(os.path.join(WORK, f"reference_{mm.CASE}"), exist_ok=True)
        mp.spawn(reference_worker, args=(mm.WORLD, int(sys.argv[2])), nprocs=mm.WORLD, join=True)
    elif len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.path.insert(0, HERE)
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        main(sys.argv[1:])
