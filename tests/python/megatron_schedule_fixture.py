"""A real DeepSpeed checkpoint as a Megatron-DeepSpeed job saves it, whose engine ran Megatron's learning-rate
scheduler: the case's own files, the model-states files' `lr_scheduler` replaced by the state Megatron's
OptimizerParamScheduler gave (made by real Megatron-LM: scripts/mcore_cross_family_resume.py records it), every
other value as DeepSpeed wrote it. Megatron-DeepSpeed passes its OptimizerParamScheduler to deepspeed.initialize,
so its checkpoints hold that state where the harness's (a DeepSpeed WarmupLR) hold {'last_batch_iteration': N}."""
import glob
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ds_stubs  # noqa: E402,F401  (DeepSpeed's pickled classes)


def with_megatron_schedule(case_ckpt, out, state):
    """Copies the checkpoint root `case_ckpt` (its `latest` tag) to `out` with `state` as every model-states
    file's lr_scheduler."""
    tag = open(os.path.join(case_ckpt, "latest")).read().strip()
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    shutil.copy(os.path.join(case_ckpt, "latest"), out)
    shutil.copytree(os.path.join(case_ckpt, tag), os.path.join(out, tag), copy_function=shutil.copyfile)
    os.chmod(os.path.join(out, tag), 0o755)
    for path in sorted(glob.glob(os.path.join(out, tag, "mp_rank_*_model_states.pt"))):
        sd = torch.load(path, map_location="cpu")
        sd["lr_scheduler"] = dict(state)
        torch.save(sd, path)
    return out
