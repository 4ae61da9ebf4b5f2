"""Trains, saves and resumes a real DeepSpeed AutoEP checkpoint (DeepSpeed 0.19's fused-expert MoE,
`"expert_parallel": {"enabled": true, "preset_model": "mixtral"}`) on CPU, for tests/data/real-autoep:
a small model shaped as AutoEP's mixtral preset expects (each MoE block a router `gate` and fused
`experts.gate_up_proj` [E, 2F, H] / `experts.down_proj` [E, H, F], which AutoEP replaces by its own
layer with experts.w1/w2/w3), trained with a global batch that is the same at every layout, so the
losses of runs at different EP / DP degrees compare step by step.

Runs under the real-DeepSpeed harness's launcher and its gloo patches (common.py), in the Debian
trixie chroot with DeepSpeed v0.19.5 (tests/data/real-ds0195/README.md), e.g. train, save at 6:
    chroot $ORACLE/trixie env -C $HARNESS PYTHONPATH=$ORACLE/ds0195 DS_ACCELERATOR=cpu HARNESS=$HARNESS \
        python3 launch.py 4 -- /work/main/scripts/autoep_train.py --out RUN/ckpt --steps 10 --save-step 6 \
        --ep 2 --zero 1 --log RUN/losses.jsonl
and resume from a universal checkpoint (ROOT/latest_universal names it) at another layout:
    ... launch.py N -- autoep_train.py --out TMP --steps 10 --ep E --zero 1 --load ROOT --universal --log F
"""
import argparse, json, os, sys
sys.path.insert(0, os.environ.get("HARNESS") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                                          "shared", "real-deepspeed", "harness"))
import common
import torch, torch.nn as nn
import torch.distributed as tdist

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True); ap.add_argument("--steps", type=int, default=10)
ap.add_argument("--save-step", type=int, default=0); ap.add_argument("--ep", type=int, default=2)
ap.add_argument("--zero", type=int, default=1); ap.add_argument("--load"); ap.add_argument("--universal", action="store_true")
ap.add_argument("--log", required=True); ap.add_argument("--batch", type=int, default=8)
a = ap.parse_args()
common.init_distributed()
import deepspeed

H, F, E, V, S = 64, 32, 4, 100, 8


class Cfg:  # what AutoEP's mixtral preset reads of an HF config
    model_type = "mixtral"; num_local_experts = E; num_experts_per_tok = 2; hidden_size = H; intermediate_size = F


class Experts(nn.Module):  # HF Mixtral-style fused experts: gate_up [E, 2F, H], down [E, H, F]
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(7)
        self.gate_up_proj = nn.Parameter(torch.randn(E, 2 * F, H, generator=g) * 0.1)
        self.down_proj = nn.Parameter(torch.randn(E, H, F, generator=g) * 0.1)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(H, E, bias=False)
        self.experts = Experts()
        self.top_k = 2


class Model(nn.Module):
    def __init__(self, layers=2):
        super().__init__()
        self.config = Cfg()
        self.embed = nn.Embedding(V, H)
        self.model = nn.Module()
        self.model.layers = nn.ModuleList()
        for _ in range(layers):
            layer = nn.Module()
            layer.dense = nn.Linear(H, H, bias=False)
            layer.mlp = Block()
            layer.input_layernorm = nn.LayerNorm(H)
            layer.post_attention_layernorm = nn.LayerNorm(H)
            self.model.layers.append(layer)
        self.lm_head = nn.Linear(H, V, bias=False)

    def forward(self, ids):
        x = self.embed(ids)
        for l in self.model.layers:
            x = x + l.dense(l.input_layernorm(x))
            x = x + l.mlp(l.post_attention_layernorm(x))
        return self.lm_head(x)


torch.manual_seed(1234)  # the same initial model on every rank and layout
model = Model()
world, rank = tdist.get_world_size(), tdist.get_rank()
assert a.batch % world == 0
cfg = {"train_micro_batch_size_per_gpu": a.batch // world, "gradient_accumulation_steps": 1,
       "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
       "expert_parallel": {"enabled": True, "autoep_size": a.ep, "preset_model": "mixtral", "use_grouped_mm": False},
       "zero_optimization": {"stage": a.zero}, "steps_per_print": 1000}
if a.universal:
    cfg["checkpoint"] = {"load_universal": True}
engine, _, _, _ = deepspeed.initialize(model=model, config=cfg)
start = 0
if a.load:
    engine.load_checkpoint(a.load)
    start = engine.global_steps
log = open(a.log, "w") if rank == 0 else None
for step in range(start + 1, a.steps + 1):
    g = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(0, V, (a.batch, S + 1), generator=g)
    per = a.batch // world
    mine = ids[rank * per:(rank + 1) * per]
    logits = engine(mine[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, V), mine[:, 1:].reshape(-1))
    engine.backward(loss)
    engine.step()
    l = loss.detach().clone(); tdist.all_reduce(l); l /= world
    if log:
        log.write(json.dumps({"step": step, "loss": l.item()}) + "\n"); log.flush()
    if step == a.save_step:
        engine.save_checkpoint(a.out, tag=f"global_step{step}")
