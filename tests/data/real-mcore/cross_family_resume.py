"""Megatron-LM resuming a real Megatron-DeepSpeed-style DeepSpeed run, optimizer and all, from what ucp-reshard
--format mcore wrote of it (issue 53), against DeepSpeed's own uninterrupted run of the same job.

Each output is a Megatron-LM root at some TP x PP x DP, written from a case of ../../../../shared/real-deepspeed
(checkpoint at global step 6). For each, TP*PP*DP processes (gloo, CPU) do what pretrain_gpt.py does with the
flags a user gives for that model and job: Megatron-LM's parse_args and validate_args of the flags
(cross_family_check.flags: the model's, then the harness job's: --lr 0.01 --lr-decay-style constant --weight-decay
0.01 --adam-beta2 0.95 --clip-grad 1.0 --global-batch-size 12 --seq-length 32; and what ucp-reshard's note adds:
--override-opt_param-scheduler where the checkpoint's scheduler is not Megatron's, --use-distributed-optimizer), the GPTModel of gpt_builders (--transformer-impl local) in Megatron's DDP,
get_megatron_optimizer of get_megatron_optimizer_config(args) (torch's AdamW here: no Transformer Engine or
Apex) and get_optimizer_param_scheduler, then `megatron.training.checkpointing.load_checkpoint([ddp], optimizer,
scheduler)` with the job's default flags (no --finetune, --no-load-optim or --no-load-rng). It then trains
global steps 7-10 on the harness's own batches (common.batch_for of the case's global batch, each DP rank its
share; at PP=2 stage 0's hidden states sent to stage 1 and the gradient back by hand): forward with labels
(Megatron's loss per token, the real vocabulary's), backward, the DDP's gradient sync, optimizer.step() (its
gradient clipping) and scheduler.step(global batch), as train_step does. The losses (averaged over DP) are
compared with the case's uninterrupted run (case.json `losses`, steps 7-10). FRESH=1 in a spec: the same with
--no-load-optim (a fresh Adam from the same weights), to show the carried state is what makes the match.

Run inside the Debian trixie chroot (this file, cross_family_check.py, make_mcore.py and the outputs copied to
/tmp/cfr; the harness at /work/shared/real-deepspeed/harness):
  cd /tmp/cfr && PYTHONPATH=/opt/megatron OMP_NUM_THREADS=1 python3 cross_family_resume.py SPEC.json RECORD.json
SPEC.json: {label: {"root", "tp", "pp", "dp", "model": {facts}, "divisor", "bf16", "case": DS case dir, "fresh",
"schedule"}}; "schedule": the checkpoint carries Megatron's scheduler state (schedule_state's, made by
`cross_family_resume.py --schedule-state OUT.json`), so the job gives its schedule's flags (--lr-warmup-iters 3)
without --override-opt_param-scheduler, and Megatron-LM checks them against the state.
CPU-only workarounds as make_mcore.py's and mcore_load_check.py's (cuda_to_cpu, torch.compile off, validate_args'
GPU architecture answered; with the distributed optimizer step_kept_apart and the dummy states before the load, and
after it each parameter's 'step' its own tensor (the load leaves one shared by all, which torch's AdamW, used here
without Apex or Transformer Engine, advances once per parameter: a loss 0.02 off from step 8 on);
in bf16 --no-masked-softmax-fusion: the fused softmax is a CUDA kernel).
"""
import json
import os
import sys
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HARNESS = os.environ.get("HARNESS", "/work/shared/real-deepspeed/harness")
FIRST, LAST = 7, 10  # the global steps trained after the load (1-based, as the harness logs them)


def job_flags(spec, case):
    """The training flags of the harness's job, as Megatron-LM names them."""
    import cross_family_check as cfc
    args = case["train_args"]
    assert "--seq" not in args and "--global-batch" not in args, args  # the harness's defaults: seq 32, global batch 12
    f = cfc.flags(spec)
    i = f.index("--seq-length")
    f[i + 1] = "32"
    i = f.index("--micro-batch-size")
    f[i + 1] = str(12 // spec.get("dp", 1))
    i = f.index("--lr")
    f[i + 1] = str(case["lr"])
    f += ["--global-batch-size", "12", "--train-iters", str(LAST), "--lr-decay-style", "constant", "--min-lr", "0.0",
          "--weight-decay", "0.01", "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--adam-eps", "1e-8", "--clip-grad", "1.0",
          ] + (["--lr-warmup-iters", "3"] if spec.get("schedule") else ["--override-opt_param-scheduler"])
    if spec.get("distributed"):
        f += ["--use-distributed-optimizer"]
    if spec.get("bf16"):
        f += ["--no-masked-softmax-fusion"]  # CPU: the fused kernel is CUDA's (the unfused path's softmax is fp32 too)
    if spec.get("fresh"):
        f += ["--no-load-optim"]
    return f


def worker(rank, world, spec, port, out):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, HARNESS)
    import cross_family_check as cfc
    cfc.start(rank, world, port)
    result = {"rank": rank, "error": None, "iteration": None, "losses": {}, "scheduler_num_steps": None, "lrs": {}}
    try:
        import make_mcore as mm
        mm.cuda_to_cpu()
        import common as harness
        from megatron.core import parallel_state as ps
        import megatron.training.checkpointing as ckpt
        from megatron.training.training import get_optimizer_param_scheduler, get_megatron_optimizer_config
        from megatron.core.optimizer import get_megatron_optimizer
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        case = json.load(open(os.path.join(spec["case"], "case.json")))
        args, cfg, model = cfc.megatron_model(spec, job_flags(spec, case))
        if args.bf16:
            model = model.to(torch.bfloat16)
        ddp = DistributedDataParallel(cfg, DistributedDataParallelConfig(
            use_distributed_optimizer=args.use_distributed_optimizer, grad_reduce_in_fp32=args.bf16), model)
        ocfg, overrides = get_megatron_optimizer_config(args)
        opt = get_megatron_optimizer(ocfg, [ddp], config_overrides=overrides)
        sched = get_optimizer_param_scheduler(opt)
        if args.use_distributed_optimizer:  # CPU-only, as mcore_load_check.py: torch's Adam, not FusedAdam
            mm.step_kept_apart()
            for one in mm.distributed_optimizers(opt):
                one._init_optimizer_states_with_dummy_values()
        ckpt.update_num_microbatches = lambda *a, **k: None
        iteration, _ = ckpt.load_checkpoint([ddp], opt, sched, strict=True)
        if args.use_distributed_optimizer:  # CPU-only: the loaded per-parameter 'step' is one tensor shared by every
            for one in mm.distributed_optimizers(opt):  # parameter (torch's AdamW then counts it once per parameter, 6 -> 33
                for state in one.optimizer.state.values():  # in one step); FusedAdam keeps the step in the group
                    if "step" in state:
                        state["step"] = state["step"].clone()
        result["iteration"] = iteration
        result["scheduler_num_steps"] = sched.num_steps
        result["groups"] = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
        dp, dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
        seq, vocab = 32, spec["model"]["vocab"]  # the harness's sequence and (real) vocabulary
        ddp.train()
        dtype = torch.bfloat16 if args.bf16 else torch.float32
        for step in range(FIRST - 1, LAST):  # 0-based batches: global step FIRST is batch FIRST - 1
            ids, labels = harness.batch_for(step, 12, dp, dp_rank, seq, vocab)[0]
            b = ids.shape[0]
            pos = torch.arange(seq).unsqueeze(0).expand(b, seq)
            mask = torch.triu(torch.ones(1, 1, seq, seq), diagonal=1).bool()
            ddp.zero_grad_buffer()
            opt.zero_grad()
            loss_v = None
            if ps.get_pipeline_model_parallel_world_size() == 1:
                loss = ddp(ids, pos, mask, labels=labels).float().mean()
                loss.backward()
                loss_v = loss.detach()
            elif ps.is_pipeline_first_stage():
                h = ddp(ids, pos, mask)
                dist.send(h.detach().contiguous(), ps.get_pipeline_model_parallel_next_rank())
                grad = torch.empty_like(h)
                dist.recv(grad, ps.get_pipeline_model_parallel_next_rank())
                h.backward(grad)
            else:
                buf = torch.empty(seq, b, args.hidden_size, dtype=dtype)
                dist.recv(buf, ps.get_pipeline_model_parallel_prev_rank())
                buf.requires_grad_(True)
                model.set_input_tensor(buf)
                loss = ddp(ids, pos, mask, labels=labels).float().mean()
                loss.backward()
                dist.send(buf.grad.contiguous(), ps.get_pipeline_model_parallel_prev_rank())
                loss_v = loss.detach()
            ddp.finish_grad_sync()
            if ps.get_pipeline_model_parallel_world_size() > 1 and not args.untie_embeddings_and_output_weights:
                from megatron.core.distributed.finalize_model_grads import _allreduce_word_embedding_grads
                _allreduce_word_embedding_grads([ddp], cfg)
            result["lrs"][step + 1] = [g["lr"] for g in opt.param_groups]
            ok, _, _ = opt.step()
            assert ok, f"optimizer step {step + 1} skipped"
            sched.step(increment=12)
            if loss_v is not None:
                l = loss_v.clone()
                dist.all_reduce(l, group=ps.get_data_parallel_group())
                result["losses"][step + 1] = float(l) / dp
    except Exception:
        result["error"] = traceback.format_exc()[-3000:]
    torch.save(result, os.path.join(out, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


def schedule_state(out):
    """The state Megatron's OptimizerParamScheduler (Megatron-DeepSpeed's own, which Megatron-LM's continues) holds
    after the harness job's 6 steps of 12 samples, had its engine run it: --lr 0.01 --min-lr 0.0 --lr-warmup-iters 3
    --lr-decay-style constant --weight-decay 0.01 --train-iters 10 (steps counted in samples, as train_step steps it)."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    class Groups:  # the optimizer the scheduler sets lr and weight_decay on
        param_groups = [{"lr": 0.0, "weight_decay": 0.0}]
    s = OptimizerParamScheduler(Groups(), init_lr=0.0, max_lr=0.01, min_lr=0.0, lr_warmup_steps=3 * 12, lr_decay_steps=10 * 12,
                                lr_decay_style="constant", start_wd=0.01, end_wd=0.01, wd_incr_steps=10 * 12, wd_incr_style="constant")
    for _ in range(6):
        s.step(increment=12)
    with open(out, "w") as f:
        json.dump(s.state_dict(), f, indent=1)


def main():
    if sys.argv[1] == "--schedule-state":
        return schedule_state(sys.argv[2])
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import cross_family_check as cfc
    specs, record_path = json.load(open(sys.argv[1])), sys.argv[2]
    record = {"megatron": "core_v0.17.1", "torch": torch.__version__,
              "loader": "megatron.training.checkpointing.load_checkpoint([ddp], optimizer, opt_param_scheduler) after parse_args / "
                        "validate_args of the user's flags, get_megatron_optimizer(get_megatron_optimizer_config(args)) and "
                        "get_optimizer_param_scheduler, as setup_model_and_optimizer; then global steps 7-10 on the harness's batches",
              "outputs": {}}
    for n, (label, spec) in enumerate(specs.items()):
        world = spec["tp"] * spec["pp"] * spec.get("dp", 1)
        out = os.path.join("/tmp/cfr_results", label)
        os.makedirs(out, exist_ok=True)
        mp.spawn(worker, args=(world, spec, 29800 + n, out), nprocs=world, join=True)
        results = [torch.load(os.path.join(out, f"rank{r}.pt"), weights_only=False) for r in range(world)]
        errors = [r["error"] for r in results if r["error"]]
        case = json.load(open(os.path.join(spec["case"], "case.json")))
        want = {s: case["losses"][str(s)] for s in range(FIRST, LAST + 1)}
        got = next((r["losses"] for r in results if r["losses"]), {})
        diff = max((abs(got[s] - want[s]) for s in want if s in got), default=None)
        entry = {"sha256": cfc.sha256s(spec["root"]), "world": world, "flags": job_flags(spec, case)[1:],
                 "error": errors[0] if errors else None, "fresh_adam": bool(spec.get("fresh")),
                 "iterations": sorted({r["iteration"] for r in results if r["iteration"] is not None}),
                 "scheduler_num_steps": sorted({r["scheduler_num_steps"] for r in results if r["scheduler_num_steps"] is not None}),
                 "losses": {str(s): v for s, v in sorted(got.items())}, "deepspeed_uninterrupted": {str(s): v for s, v in want.items()},
                 "max_abs_loss_diff": diff, "lrs": {str(k): v for k, v in sorted(results[0]["lrs"].items())},
                 "param_groups": results[0].get("groups")}
        record["outputs"][label] = entry
        print(label, {k: v for k, v in entry.items() if k not in ("sha256", "flags", "param_groups")}, flush=True)
    with open(record_path, "w") as f:
        json.dump(record, f, indent=1, default=str)


if __name__ == "__main__":
    main()
