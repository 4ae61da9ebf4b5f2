# Derives a weights-only legacy save (what Megatron-LM's save_checkpoint writes with --no-save-optim: the
# same state_dict without 'optimizer' and 'opt_param_scheduler', and no distrib_optim.pt) from legacy/.
import os, shutil, sys, torch
src, dst = sys.argv[1], sys.argv[2]
shutil.rmtree(dst, ignore_errors=True)
for root, dirs, files in os.walk(src):
    rel = os.path.relpath(root, src)
    os.makedirs(os.path.join(dst, rel), exist_ok=True)
    for f in files:
        if f == "distrib_optim.pt":
            continue
        if f == "model_optim_rng.pt":
            sd = torch.load(os.path.join(root, f), weights_only=False)
            sd.pop("optimizer"); sd.pop("opt_param_scheduler", None)
            torch.save(sd, os.path.join(dst, rel, f))
        else:
            shutil.copy(os.path.join(root, f), os.path.join(dst, rel, f))
print("ok", dst)
