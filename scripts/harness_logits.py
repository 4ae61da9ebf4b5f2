"""Logits of a DeepSpeed checkpoint as real DeepSpeed loads it: the real-DeepSpeed harness's model
(/work/shared/real-deepspeed/harness, built as its train.py builds it for a layout) loaded with
engine.load_checkpoint, then the logits of a fixed batch at fp32, and optionally a few more training steps.

Run from the HOST as root (it calls chroot; the Debian trixie chroot /work/oracle-hf/trixie holds torch 2.6
and DeepSpeed 0.19.5 at /opt/ds0195):

    scripts/harness_logits.py CKPT_DIR --tp 2 --pp 1 --dp 2 --zero 1 --dtype fp32 --arch llama \\
        [--hidden 64 --layers 4 --heads 4 --kv-heads 2 --ffn 128 --vocab 300 --seq 32] \\
        [--no-load-optimizer-states] [--no-load-lr-scheduler-states] [--load-module-only] [--train-steps 3] [--out OUT.json]

CKPT_DIR (with `latest`) must be visible inside the chroot at the same path (this script bind-mounts the
folder holding it, read-only, and the harness's /work/shared). tp x pp x dp processes run under
the harness's launch.py (gloo, CPU). The batch: token ids of shape [2, seq] drawn from torch.Generator(--seed),
the same on every DP rank; the logits are the model's over the real vocabulary (the first --vocab columns),
as fp32, written (with the batch, the layout and the load flags) by the rank that holds the last stage's
TP rank 0 of DP rank 0. --train-steps N then trains N steps as train.py does (the harness's batch_for from
step 0, 2 samples per DP rank; its WarmupLR schedule and clipping) and reports the DP-mean loss of each.
The bind mounts it makes under the chroot stay (umount them when done).

The JSON: {"layout": ..., "load": ..., "ids": [[...]], "logits": [[[...]]], "losses": [...], "ckpt_sha256": {file: sha256}}
(the sha256 of every file of the loaded tag, which DeepSpeed read).
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys

CHROOT = "/work/oracle-hf/trixie"
HARNESS = "/work/shared/real-deepspeed/harness"
ENV = ("export PATH=/opt/hf/venv/bin:/usr/local/bin:/usr/bin:/bin HOME=/root DS_ACCELERATOR=cpu "
       "PYTHONPATH=/opt/ds0195:" + HARNESS + "/shims:" + HARNESS + " OMP_NUM_THREADS=1")


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("ckpt")
    for flag, default in (("tp", 1), ("pp", 1), ("dp", 1), ("zero", 1), ("hidden", 64), ("layers", 4), ("heads", 4),
                          ("kv-heads", 2), ("ffn", 128), ("vocab", 300), ("seq", 32), ("make-vocab-divisible-by", 128),
                          ("train-steps", 0), ("seed", 7), ("lr", 2e-3)):
        p.add_argument("--" + flag, type=type(default), default=default)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--arch", choices=["gpt", "llama"], default="llama")
    p.add_argument("--grad-accum-dtype", choices=["fp32", "bf16"], default=None)
    p.add_argument("--no-load-optimizer-states", action="store_true")
    p.add_argument("--no-load-lr-scheduler-states", action="store_true",
                   help="a checkpoint with no scheduler state (a weights-only import's): the job's scheduler starts afresh")
    p.add_argument("--load-module-only", action="store_true")
    p.add_argument("--out", default=None)
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ---------------------------------------------------------------- host side
def mounted(path):
    with open("/proc/mounts") as f:
        return any(line.split()[1] == path for line in f)


def bind(src, ro=True):
    dst = CHROOT + src
    if mounted(dst):
        return
    os.makedirs(dst, exist_ok=True)
    subprocess.run(["mount", "--bind", src, dst], check=True)
    if ro:
        subprocess.run(["mount", "-o", "remount,bind,ro", dst], check=True)


def host(args):
    if not mounted(CHROOT + "/proc"):
        subprocess.run(["mount", "-t", "proc", "proc", CHROOT + "/proc"], check=True)
    ckpt = os.path.abspath(args.ckpt)
    for src, ro in (("/work/shared", True), (os.path.dirname(ckpt), True), (os.path.dirname(os.path.abspath(__file__)), True)):
        bind(src, ro)
    out = os.path.abspath(args.out) if args.out else None
    if out:
        os.makedirs(os.path.dirname(out), exist_ok=True)
        bind(os.path.dirname(out), ro=False)
    argv = [a for a in sys.argv[1:]]
    argv[argv.index(args.ckpt)] = ckpt
    if args.out:
        argv[argv.index(args.out)] = out
    nproc = args.tp * args.pp * args.dp
    # (the harness's launch.py starts the ranks: Debian's torch.distributed.run wants libuv)
    inner = (f"{ENV}; cd /tmp && python {HARNESS}/launch.py {nproc} -- {os.path.abspath(__file__)} --inner " +
             " ".join(argv))
    r = subprocess.run(["chroot", CHROOT, "env", "-i", "bash", "-c", inner], capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stdout[-3000:] + r.stderr[-5000:])
        sys.exit(r.returncode)
    for line in r.stdout.splitlines():
        if line.startswith("[harness_logits]"):
            print(line)
    return 0


# ---------------------------------------------------------------- inside the chroot (one rank)
def model_config(args, common, dp, world):
    """The model's config as train.py makes it (llama: the keys its --arch llama adds)."""
    padded = common.vocab_size_with_padding(args.vocab, args.make_vocab_divisible_by, args.tp)
    cfgd = dict(hidden_size=args.hidden, num_layers=args.layers, num_attention_heads=args.heads,
                num_key_value_heads=args.kv_heads, ffn_hidden_size=args.ffn, vocab_size=args.vocab,
                padded_vocab_size=padded, make_vocab_size_divisible_by=args.make_vocab_divisible_by,
                max_position_embeddings=args.seq, seq_length=args.seq, seed=42, swiglu=True, add_bias_linear=True,
                normalization="layernorm", position_embedding_type="learned_absolute",
                untie_embeddings_and_output_weights=False, tensor_model_parallel_size=args.tp,
                pipeline_model_parallel_size=args.pp, data_parallel_size=dp, world_size=world)
    if args.arch == "llama":
        cfgd.update(arch="llama", swiglu=True, add_bias_linear=False, normalization="rmsnorm", layernorm_epsilon=1e-5,
                    position_embedding_type="rope", use_rotary_position_embeddings=True, add_position_embedding=False,
                    rope_theta=10000.0, untie_embeddings_and_output_weights=True)
    return cfgd


def ds_config(args, dp, micro):
    """train.py's ds_config: micro-batches of 2 samples per DP rank, no gradient accumulation."""
    cfg = {"train_batch_size": micro * dp, "train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": 1,
           "steps_per_print": 1000, "gradient_clipping": 1.0, "zero_optimization": {"stage": args.zero},
           "bf16": {"enabled": args.dtype == "bf16"}, "fp16": {"enabled": False},
           "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": args.lr,
                                                        "warmup_num_steps": 3, "warmup_type": "linear"}},
           "checkpoint": {"load_universal": False}, "wall_clock_breakdown": False}
    if args.grad_accum_dtype:
        cfg["data_types"] = {"grad_accum_dtype": args.grad_accum_dtype}
    if args.zero in (1, 2):
        cfg["zero_optimization"].update({"reduce_bucket_size": 20000, "allgather_bucket_size": 20000})
    return cfg


def build_engine(args, common, models, ps, dp, world):
    import torch
    cfg = models.Cfg(model_config(args, common, dp, world))
    tp = models.TP(args.tp, ps.tp_rank, ps.tp_group)
    config = ds_config(args, dp, 2)
    if args.pp > 1:
        from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology
        module = models.build_pipe_module(cfg, tp, PipeModelDataParallelTopology(num_pp=args.pp, num_mp=args.tp, num_dp=dp),
                                          args.dtype)
        mpu = None
    else:
        module, mpu = models.GPTModel(cfg, tp, zero3=(args.zero == 3)), ps
    decay, no_decay = [], []  # train.py's two Megatron groups
    for n, p in module.named_parameters():
        ndim = len(p.ds_shape) if hasattr(p, "ds_shape") else p.dim()
        (no_decay if (n.endswith(".bias") or "layernorm" in n or ndim == 1) else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    import deepspeed
    engine, _, _, _ = deepspeed.initialize(model=module, optimizer=opt, config=config, mpu=mpu)
    return engine, cfg


def forward_logits(args, models, engine, ids, labels):
    """The model's own forward (the training loss path), its logits caught where the loss takes them."""
    import torch
    caught = []
    original = models.lm_loss

    def catching(logits, lab, vocab_size, sp=None):
        caught.append(logits[..., :vocab_size].detach().float().clone())
        return original(logits, lab, vocab_size, sp)

    models.lm_loss = catching
    try:
        with torch.no_grad():
            if args.pp > 1:
                engine.eval_batch(iter([(ids, labels)]), return_logits=False)
            else:
                engine.eval()
                engine(ids, labels)
                engine.train()
    finally:
        models.lm_loss = original
    return caught[-1] if caught else None


def train_on(args, common, engine, ps, dp):
    import torch
    import torch.distributed as tdist
    losses = []
    for step in range(args.train_steps):
        ids, labels = common.batch_for(step, 2 * dp, dp, ps.dp_rank, args.seq, args.vocab)[0]
        if args.pp > 1:
            loss = engine.train_batch(data_iter=iter([(ids, labels)]))
            losses.append(float(loss))
            continue
        loss = engine(ids, labels)
        engine.backward(loss)
        engine.step()
        value = loss.detach().float().clone()
        tdist.all_reduce(value, group=ps.dp_group)
        losses.append(float(value) / dp)
    return losses


def sha256_of(folder):
    out = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


def files_differing(root, recorded):
    """The files of the tag root/latest names whose sha256 is not `recorded`'s ({file: sha256}), and those
    only one side has: what a CI test reports when ucp no longer writes the bytes a real reader read."""
    got = sha256_of(os.path.join(root, open(os.path.join(root, "latest")).read().strip()))
    return sorted(set(got) ^ set(recorded)) + [f for f in got if got[f] != recorded.get(f, got[f])], len(got)


def inner(args):
    sys.path.insert(0, HARNESS)
    import common  # noqa: E402  (the harness's: env defaults, gloo patches)
    import models  # noqa: E402
    import torch
    import torch.distributed as tdist
    common.init_distributed()
    world = tdist.get_world_size()
    ps = common.make_parallel_state(tp=args.tp, pp=args.pp)
    dp = ps.dp
    torch.manual_seed(1234)  # the initial weights are overwritten by the load
    engine, cfg = build_engine(args, common, models, ps, dp, world)
    path, _ = engine.load_checkpoint(args.ckpt, load_optimizer_states=not args.no_load_optimizer_states,
                                     load_lr_scheduler_states=not args.no_load_lr_scheduler_states,
                                     load_module_only=args.load_module_only)
    assert path is not None, f"nothing loaded from {args.ckpt}"
    ids = torch.randint(0, args.vocab, (2, args.seq), generator=torch.Generator().manual_seed(args.seed))
    labels = torch.roll(ids, -1, dims=1)
    logits = forward_logits(args, models, engine, ids, labels)
    losses = train_on(args, common, engine, ps, dp) if args.train_steps else []
    last_stage = args.pp == 1 or ps.pp_rank == args.pp - 1
    if last_stage and ps.tp_rank == 0 and ps.dp_rank == 0 and logits is not None:
        tag = open(os.path.join(args.ckpt, "latest")).read().strip()
        report = {"layout": {k: getattr(args, k) for k in ("tp", "pp", "dp", "zero", "dtype", "arch")},
                  "load": {"load_optimizer_states": not args.no_load_optimizer_states,
                           "load_lr_scheduler_states": not args.no_load_lr_scheduler_states,
                           "load_module_only": args.load_module_only, "path": path, "global_steps": engine.global_steps},
                  "ids": ids.tolist(), "logits": logits.tolist(), "losses": losses,
                  "ckpt_sha256": sha256_of(os.path.join(args.ckpt, tag))}
        if args.out:
            with open(args.out, "w") as f:
                json.dump(report, f)
        print(f"[harness_logits] {args.ckpt}: logits {list(logits.shape)} sum {float(logits.sum()):.6f} "
              f"losses {losses} global_steps {engine.global_steps}", flush=True)
    tdist.barrier()


if __name__ == "__main__":
    a = parse()
    sys.exit(inner(a) if a.inner else host(a))
