#!/usr/bin/env python3
"""Resume the REAL Hugging Face Trainer (transformers 5.3.0 + accelerate 1.14.0 + DeepSpeed 0.19.5, CPU/gloo)
from a `checkpoint-N` folder and report the losses of the steps after it (steps 5-8 for a checkpoint-4).

Run from the HOST as root (it calls `chroot`):

    scripts/trainer_resume_one.py --checkpoint DIR --world W --stage S --dtype fp32|bf16 \
        [--gather16 0|1] --result OUT.json [--reference CASE.json] [--port P] [--keep] [--timeout SEC]

  --checkpoint  a Trainer checkpoint folder (checkpoint-N: trainer_state.json, rng_state*.pth, scheduler.pt,
                `latest`, global_stepN/ ...), anywhere on the host (e.g. written by ucp). It is COPIED first;
                the original is never touched.
  --world       number of processes (data-parallel world size) for the resume.
  --stage       ZeRO stage of the TARGET layout (= the checkpoint's stage); train_hf.py builds the ds_config
                from --stage/--dtype/--gather16 (ordinary config, NO "checkpoint": {"load_universal": true}).
  --dtype       fp32 or bf16 (bf16 turns on Trainer bf16 -> DeepSpeed bf16.enabled).
  --gather16    ZeRO-3 stage3_gather_16bit_weights_on_model_save (default 1; the corpus case zero3_dp2_bf16 used 0).
  --result      JSON written on the host: rc, seconds, losses {step: loss}, losses_5_8, error (last error
                lines if the run failed), log path, command. A summary is printed too. Exit code = the run's rc.
  --reference   optional case.json: compare with its uninterrupted losses (steps.full.losses), print |diff|.
  --keep        keep the copied checkpoint and the run's output folder (default: only the log and r.json stay).

What it runs (inside the chroot, exactly the harness of /work/shared/real-hftrainer/harness):
    . /shared/real-hftrainer/harness/env.sh
    python /shared/real-deepspeed/harness/launch.py W --port P -- $HFT/train_hf.py --out RUN/out \
        --stage S --dtype D --gather16 G --resume RUN/checkpoint-N --result RUN/r.json
i.e. Trainer(...).train(resume_from_checkpoint=RUN/checkpoint-N): DeepSpeed's own engine.load_checkpoint
(via transformers' deepspeed_load_checkpoint) at world size W. A mismatched world size is refused by DeepSpeed
itself, e.g. "ZeRORuntimeException: The checkpoint being loaded used a DP world size of 2 but the current
world size is 1" (checked: shared zero2_dp2_fp32 checkpoint-4 at --world 1).
Scratch: /work/oracle-hf/scratch/<run-id>/ (visible inside the chroot at the same path).

What it needs ($ORACLE_HF, default /work/oracle-hf; set up on 2026-11-28 in 12 minutes, in this order):
  * chroot  /work/oracle-hf/trixie: `debootstrap --variant=minbase trixie /work/oracle-hf/trixie
    http://deb.debian.org/debian` (host: `apt-get install -y debootstrap`), host resolv.conf copied in.
  * transformers 5.3.0 (aad13b87ed59) + huggingface_hub 1.5.0 (2b2072642d8e) + tokenizers import stub in
    /opt/hf/venv: /work/shared/real-readers/transformers/setup_hf_chroot.sh with TF_GIT=/work/.mirror/8b-is+transformers/repo,
    HUB_GIT=/work/.mirror/huggingface+huggingface_hub/repo, HF_SRC=/work/oracle-hf/src (Debian trixie python3-torch 2.6 etc.).
  * accelerate 1.14.0 (beb0672aa844): /work/shared/real-hftrainer/harness/setup_accelerate.sh with
    ACC_GIT=/work/.mirror/huggingface+accelerate/repo.
  * DeepSpeed 0.19.5 (cf44300453eb) source tree /opt/ds0195 in the chroot: `git archive` of accelerator bin csrc
    deepspeed op_builder requirements setup.py setup.cfg version.txt LICENSE README.md from
    /work/.mirror/deepspeedai+DeepSpeed/repo + deepspeed/git_version_info_installed.py (version 0.19.5);
    its Debian deps: apt-get install --no-install-recommends python3-pydantic python3-cpuinfo python3-msgpack
    python3-einops (hjson: the harness shim on PYTHONPATH; no ops are built).
  * mounts (re-done by this script if missing, e.g. after a reboot): proc on $CHROOT/proc,
    /work/shared -> $CHROOT/shared (bind, read-only), /work/oracle-hf -> $CHROOT/work/oracle-hf (bind).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

ORACLE = os.environ.get("ORACLE_HF", "/work/oracle-hf")  # the set-up folder below
CHROOT = os.path.join(ORACLE, "trixie")
SHARED = os.environ.get("UCP_SHARED", "/work/shared")
SCRATCH = os.path.join(ORACLE, "scratch")
ENV_SH = "/shared/real-hftrainer/harness/env.sh"
LAUNCH = "/shared/real-deepspeed/harness/launch.py"
TRAIN = "/shared/real-hftrainer/harness/train_hf.py"


def mounted(path):
    path = os.path.realpath(path)
    with open("/proc/mounts") as f:
        return any(line.split()[1] == path for line in f)


def ensure_mounts():
    binds = [("proc", os.path.join(CHROOT, "proc"), ["mount", "-t", "proc", "proc"]),
             (SHARED, os.path.join(CHROOT, "shared"), ["mount", "--bind", SHARED]),
             (ORACLE, CHROOT + ORACLE, ["mount", "--bind", ORACLE])]
    for src, dst, cmd in binds:
        if not mounted(dst):
            os.makedirs(dst, exist_ok=True)
            subprocess.run(cmd + [dst], check=True)
            if src == SHARED:
                subprocess.run(["mount", "-o", "remount,bind,ro", dst], check=True)


def error_text(lines):
    """Last exception line (+ the last traceback frame before it), else the log's last lines."""
    idx = [i for i, l in enumerate(lines) if ("Error" in l or "Exception" in l or "assert" in l.lower())
           and not l.startswith("[W") and "Warning" not in l]
    if not idx:
        return "\n".join(lines[-10:])
    i = idx[-1]
    frame = [l for l in lines[max(0, i - 12):i] if l.strip().startswith("File ")]
    return "\n".join(([frame[-1].strip()] if frame else []) + [lines[i].strip()])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", default=None, help="the folder to resume from; none: train from scratch (the uninterrupted run of this layout)")
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--stage", type=int, required=True, choices=[0, 1, 2, 3])
    ap.add_argument("--dtype", required=True, choices=["fp32", "bf16"])
    ap.add_argument("--gather16", type=int, default=1, choices=[0, 1])
    ap.add_argument("--result", required=True)
    ap.add_argument("--reference", default=None, help="case.json whose steps.full.losses to compare with")
    ap.add_argument("--port", type=int, default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--timeout", type=int, default=1200)
    ap.add_argument("--sub-group-size", type=int, default=None,
                    help="ZeRO-3 sub_group_size of the job (the harness's is 1e9): run a copy of train_hf.py with it")
    a = ap.parse_args()

    src = os.path.abspath(a.checkpoint.rstrip("/")) if a.checkpoint else None
    if src and not os.path.isdir(src):
        sys.exit(f"not a directory: {src}")
    if 4 % a.world:
        sys.exit("train_hf.py uses global batch 4: --world must be 1, 2 or 4")
    ensure_mounts()

    run_id = time.strftime("%Y%m%dT%H%M%S") + f"-{os.getpid()}"
    rdir = os.path.join(SCRATCH, run_id)
    os.makedirs(rdir)
    ck = os.path.join(rdir, os.path.basename(src)) if src else None
    if src:
        shutil.copytree(src, ck, symlinks=True)
    out = os.path.join(rdir, "out")
    rjson = os.path.join(rdir, "r.json")
    log = os.path.join(rdir, "run.log")
    port = a.port or 31000 + os.getpid() % 2000

    train = TRAIN
    if a.sub_group_size:  # the harness with another sub_group_size: a copy in the run folder
        text = open(SHARED + TRAIN[len("/shared"):]).read()
        assert '"sub_group_size": 1e9' in text, "train_hf.py no longer sets sub_group_size 1e9"
        text = text.replace('"sub_group_size": 1e9', f'"sub_group_size": {a.sub_group_size}')
        text = text.replace('os.path.join(os.path.dirname(os.path.dirname(HERE)), "real-deepspeed", "harness")',
                            '"/shared/real-deepspeed/harness"')
        train = os.path.join(rdir, "train_hf.py")
        open(train, "w").write(text)
    inner = (f"python {LAUNCH} {a.world} --port {port} -- {train} --out {out} --stage {a.stage} "
             f"--dtype {a.dtype} --gather16 {a.gather16} {f'--resume {ck} ' if ck else ''}--result {rjson}")
    cmd = ["chroot", CHROOT, "env", "-i", "bash", "-c", f". {ENV_SH}; cd {rdir}; {inner}"]
    t0 = time.time()
    with open(log, "w") as f:
        f.write("$ " + inner + "\n")
        f.flush()
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=a.timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    secs = round(time.time() - t0, 1)

    lines = open(log, errors="replace").read().splitlines()
    res = {"checkpoint": src, "copy": ck, "world": a.world, "stage": a.stage, "dtype": a.dtype,
           "gather16": a.gather16, "rc": rc, "seconds": secs, "log": log, "cmd": inner}
    losses = {}
    if os.path.exists(rjson):
        r = json.load(open(rjson))
        losses = r.get("losses", {})
        res["ds_config_final"] = r.get("ds_config_final")
        res["versions"] = r.get("versions")
    res["losses"] = losses
    res["losses_5_8"] = [losses.get(str(s)) for s in range(5, 9)]
    if rc != 0:
        res["error"] = error_text(lines)
        res["log_tail"] = lines[-25:]
    if a.reference:
        ref = json.load(open(a.reference))["steps"]["full"]["losses"]
        res["reference"] = {"file": a.reference, "losses": {s: ref.get(s) for s in map(str, range(5, 9))},
                            "abs_diff": {s: (abs(losses[s] - ref[s]) if s in losses and s in ref else None)
                                         for s in map(str, range(5, 9))}}
        res["reference"]["bit_identical"] = all(v == 0.0 for v in res["reference"]["abs_diff"].values())
    if not a.keep:
        if ck:
            shutil.rmtree(ck, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
    os.makedirs(os.path.dirname(os.path.abspath(a.result)), exist_ok=True)
    with open(a.result, "w") as f:
        json.dump(res, f, indent=1)

    print(f"rc={rc} seconds={secs} world={a.world} stage={a.stage} dtype={a.dtype} log={log}")
    for s in range(5, 9):
        v = losses.get(str(s))
        extra = ""
        if a.reference:
            d = res["reference"]["abs_diff"][str(s)]
            extra = f"  ref={res['reference']['losses'][str(s)]!r} |diff|={d!r}"
        print(f"  step {s}: {v!r}{extra}")
    if rc != 0:
        print("error:\n" + res["error"])
    print(f"result -> {a.result}")
    sys.exit(rc if isinstance(rc, int) else 124)


if __name__ == "__main__":
    main()
