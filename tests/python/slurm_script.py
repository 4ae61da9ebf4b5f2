#!/usr/bin/env python3
"""scripts/slurm/train.sbatch without Slurm: `srun` is a stand-in that records its arguments and runs
the ucp step itself (the training command is only recorded), on a copy of a generator checkpoint
(dp=2 tp=2 pp=2 ZeRO-1 bf16, 8 GPUs).

  slurm_script.py BIN_DIR SOURCE_ROOT WORK

1. 1 node of 8 GPUs: the ucp step is a no-op (latest unchanged), training gets tp=2 pp=2 and a config
   with ZeRO stage 1.
2. The allocation halves to 1 node of 4 GPUs: the step reshards (latest names the new dp=1 tp=2 pp=2
   tag), training gets tp=2 pp=2, --load the same root.
3. 3 nodes of 2 GPUs: 6 GPUs, which tp=2 x pp=2 does not divide: the planner picks another layout
   (tp within a node of 2); training gets its degrees as ucp-inspect reads them from the files.
4. No checkpoint yet: no ucp step; training gets the config as given.
"""
import json
import os
import shutil
import stat
import subprocess
import sys

bin_dir, source, work = sys.argv[1:4]
here = os.path.dirname(os.path.abspath(__file__))
script = os.path.normpath(os.path.join(here, "..", "..", "scripts", "slurm", "train.sbatch"))
problems = []
shutil.rmtree(work, ignore_errors=True)
stand_ins = os.path.join(work, "bin")
os.makedirs(stand_ins)
log = os.path.join(work, "srun.log")
with open(os.path.join(stand_ins, "srun"), "w") as f:
    f.write(f"""#!/usr/bin/env bash
# Records its arguments; runs a ucp tool (without srun's own flags), not the training command.
echo "$*" >> {log}
while [ $# -gt 0 ] && [ "${{1#--}}" != "$1" ]; do shift; done
case "$(basename "$1")" in ucp-*) exec "$@" ;; esac
""")
os.chmod(os.path.join(stand_ins, "srun"), 0o755)
root = os.path.join(work, "ckpt")
shutil.copytree(source, root)
config = os.path.join(work, "ds_config.json")
json.dump({"train_batch_size": 16, "bf16": {"enabled": True}, "zero_optimization": {"stage": 1}}, open(config, "w"))


def job(nodes, gpus_per_node, ckpt=root):
    open(log, "w").close()
    env = dict(os.environ, PATH=stand_ins + os.pathsep + os.environ["PATH"], CKPT=ckpt, UCP_BIN=bin_dir,
               SLURM_JOB_NUM_NODES=str(nodes), SLURM_GPUS_ON_NODE=str(gpus_per_node), DS_CONFIG=config,
               TRAIN="python pretrain_gpt.py --num-layers 2", GPU_MEMORY="80G", SOURCE_DATE_EPOCH="1700000000")
    p = subprocess.run(["bash", script], capture_output=True, text=True, env=env, timeout=300)
    calls = [l.split() for l in open(log).read().splitlines()]
    return p, calls


def training(calls):
    train = [c for c in calls if "pretrain_gpt.py" in c]
    return train[-1] if train else []


def arg(call, flag):
    return call[call.index(flag) + 1] if flag in call else None


# 1. Unchanged: 8 GPUs.
p, calls = job(1, 8)
t = training(calls)
if p.returncode != 0 or "nothing to do" not in p.stderr or open(os.path.join(root, "latest")).read().strip() != "global_step12":
    problems.append(f"8 GPUs: expected a no-op, got exit {p.returncode}: {p.stderr[-400:]}")
if arg(t, "--tensor-model-parallel-size") != "2" or arg(t, "--pipeline-model-parallel-size") != "2" or arg(t, "--load") != root:
    problems.append(f"8 GPUs: training called as {t}")
if len(calls) != 2 or "--in-place" not in calls[0] or arg(calls[0], "--gpus") != "8":
    problems.append(f"8 GPUs: srun calls {calls}")
if json.load(open(os.path.join(work, "ds_config.ucp.json")))["zero_optimization"]["stage"] != 1:
    problems.append("8 GPUs: the config's ZeRO stage")
print("8 GPUs:", " ".join(t[t.index("pretrain_gpt.py"):]) if t else "no training call")

# 2. Halved: 4 GPUs.
p, calls = job(1, 4)
t = training(calls)
now = open(os.path.join(root, "latest")).read().strip()
if p.returncode != 0 or now != "global_step12_dp1_tp2_pp2_z1_bf16_gafp32":
    problems.append(f"4 GPUs: exit {p.returncode}, latest {now}: {p.stderr[-400:]}")
if arg(t, "--tensor-model-parallel-size") != "2" or arg(t, "--pipeline-model-parallel-size") != "2" or arg(t, "--load") != root:
    problems.append(f"4 GPUs: training called as {t}")
print("4 GPUs:", now, " ".join(t[t.index("pretrain_gpt.py"):]) if t else "no training call")

# 3. 3 nodes of 2 GPUs.
p, calls = job(3, 2)
t = training(calls)
now = open(os.path.join(root, "latest")).read().strip()
tp, pp = arg(t, "--tensor-model-parallel-size"), arg(t, "--pipeline-model-parallel-size")
if p.returncode != 0 or tp is None or int(tp) > 2 or 6 % (int(tp) * int(pp)) or f"_dp{6 // (int(tp) * int(pp))}_tp{tp}_pp{pp}_" not in now:
    problems.append(f"3x2 GPUs: exit {p.returncode}, latest {now}, training {t}: {p.stderr[-400:]}")
if arg(calls[0], "--gpus-per-node") != "2" or "--nodes=3" not in calls[0] or "--ntasks-per-node=1" not in calls[0]:
    problems.append(f"3x2 GPUs: the ucp step called as {calls[0]}")
kept = [d for d in os.listdir(root) if os.path.exists(os.path.join(root, d, "ucp_reshard.json"))]
if len(kept) > 2:
    problems.append(f"--keep 2: {kept}")
print("3x2 GPUs:", now, " ".join(t[t.index("pretrain_gpt.py"):]) if t else "no training call")

# 4. No checkpoint yet.
empty = os.path.join(work, "empty")
os.makedirs(empty)
p, calls = job(1, 8, empty)
t = training(calls)
if p.returncode != 0 or len(calls) != 1 or arg(t, "--deepspeed_config") != config:
    problems.append(f"first run: exit {p.returncode}, calls {calls}: {p.stderr[-300:]}")

for pr in problems:
    print("FAIL:", pr)
sys.exit(1 if problems else 0)
