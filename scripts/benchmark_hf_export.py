"""benchmark.py --hf-trainer: ucp's Hugging Face export of a Trainer + DeepSpeed checkpoint against
DeepSpeed's zero_to_fp32.py on the same checkpoint folder, in one run (see benchmark.py's help).

Each command runs --repeat times, one after the other in an order that alternates from round to round;
the report gives medians, ratios against zero_to_fp32.py measured in the same rounds (and the paired
ratios' range), and each command's peak RSS: the largest resident set of its process tree, as wait4
reports it (so a command run through chroot and bash counts the Python process inside). Linux carries a
process's peak over fork and exec, so this script keeps its own memory small (no torch imported here;
the exports are compared in a process of their own).
"""
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time


def timed(cmd, env, shell=False):
    """(seconds, peak RSS bytes) of a command run to its end; its output discarded, a failure fatal."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, shell=shell, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - t
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {cmd}\n{err.decode(errors='replace')[-3000:]}")
    return seconds, usage.ru_maxrss * 1024


def tensors_equal(a_dir, b_dir):
    """Whether two safetensors exports hold the same keys and bytes (read with the tests' own reader), in a
    process of its own: a child's peak RSS counts the parent's at fork time, which must stay small."""
    code = f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); " \
           f"import benchmark_hf_export as b; print(b.same_tensors({a_dir!r}, {b_dir!r}))"
    r = subprocess.run(["/usr/bin/python3", "-c", code], capture_output=True, text=True, check=True)
    return r.stdout.strip() == "True"


def same_tensors(a_dir, b_dir):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "python"))
    from safetensors_reader import read_model_folder  # noqa: E402
    a, b = read_model_folder(a_dir), read_model_folder(b_dir)
    import torch
    return sorted(a) == sorted(b) and all(torch.equal(a[k].view(torch.int32), b[k].view(torch.int32)) for k in a)


def main(a, root):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    reshard = os.path.join(a.build, "apps", "ucp-reshard")
    convert = os.path.join(a.build, "apps", "ucp-convert")
    if not os.path.exists(reshard):
        sys.exit(f"{reshard} not found: build first (scripts/build.sh)")
    os.makedirs(a.work, exist_ok=True)
    ckpt = a.checkpoint
    if not ckpt:
        ckpt = os.path.join(a.work, "hftrainer-zero3", "checkpoint-4")
        if not os.path.exists(os.path.join(ckpt, "latest")):
            print(f"generating the checkpoint in {ckpt} ...", flush=True)
            subprocess.run(["/usr/bin/python3", os.path.join(root, "scripts", "make_hftrainer_fixture.py"),
                            os.path.dirname(ckpt)], check=True)
    ckpt = os.path.abspath(ckpt)
    tag = os.path.join(ckpt, open(os.path.join(ckpt, "latest")).read().strip())
    tag_bytes = sum(os.path.getsize(os.path.join(tag, f)) for f in os.listdir(tag))
    out = os.path.join(os.path.abspath(a.work), "out")
    atomic = os.path.join(os.path.abspath(a.work), "hf-atomic")
    # The job's config.json: carried by the conversion where it carries it, else given.
    config = ["--model-config", os.path.join(ckpt, "config.json")]
    shutil.rmtree(atomic, ignore_errors=True)
    subprocess.run([convert, ckpt, "-o", atomic, "-q"], check=True, env=env)
    manifest = json.load(open(os.path.join(atomic, "ucp_manifest.json")))
    if any(f.get("path") == "job/config.json" for f in manifest.get("files", [])):
        config = []

    commands = {
        "ucp-reshard CKPT --format hf": [reshard, ckpt, "-o", out, "--format", "hf", "-q"] + config,
        "ucp-reshard ATOMIC --format hf": [reshard, atomic, "-o", out, "--format", "hf", "-q"] + config,
    }
    if a.zero_to_fp32_cmd:
        commands["zero_to_fp32.py"] = a.zero_to_fp32_cmd.format(checkpoint=shlex.quote(ckpt), output=shlex.quote(out))

    def clean():
        shutil.rmtree(out, ignore_errors=True)
        os.sync()

    # Once before the rounds: the page cache warm, and the two exports compared tensor for tensor.
    subprocess.run(["cat"] + [os.path.join(tag, f) for f in os.listdir(tag)], stdout=subprocess.DEVNULL)
    same = None
    if a.zero_to_fp32_cmd:
        clean()
        timed(commands["zero_to_fp32.py"], env, shell=True)
        shutil.rmtree(out + "-z2f", ignore_errors=True)
        os.rename(out, out + "-z2f")
        timed(commands["ucp-reshard ATOMIC --format hf"], env)
        same = tensors_equal(out, out + "-z2f")
        shutil.rmtree(out + "-z2f", ignore_errors=True)

    times = {k: [] for k in commands}
    rss = {k: [] for k in commands}
    names = list(commands)
    for r in range(a.repeat):
        for k in names if r % 2 == 0 else names[::-1]:
            clean()
            s, m = timed(commands[k], env, shell=isinstance(commands[k], str))
            times[k].append(s)
            rss[k].append(m)
        print(f"round {r + 1}/{a.repeat} done", file=sys.stderr, flush=True)
    clean()
    shutil.rmtree(atomic, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in times.items()}
    mrss = {k: statistics.median(v) for k, v in rss.items()}
    print(f"\ncheckpoint {ckpt}: {tag_bytes / 2**30:.2f} GiB in {tag}; 1 rank; medians of {a.repeat} paired runs, "
          f"order alternating")
    if same is not None:
        print(f"ucp's export and zero_to_fp32.py's: {'the same keys and bytes' if same else 'DIFFERENT'}")
    print(f"{'command':32s} {'median s':>9s} {'min-max':>15s} {'peak RSS MiB':>13s}")
    for k in names:
        print(f"{k:32s} {med[k]:9.2f} {min(times[k]):7.2f}-{max(times[k]):<7.2f} {mrss[k] / 2**20:13.0f}")
    if "zero_to_fp32.py" in med:
        z = "zero_to_fp32.py"
        for k in names[:-1]:
            pairs = sorted(zt / t for zt, t in zip(times[z], times[k]))
            print(f"zero_to_fp32.py / {k}: {med[z] / med[k]:.1f}x the time (paired {pairs[0]:.1f}-{pairs[-1]:.1f}; "
                  f"goal >= 5), peak RSS {mrss[k] / mrss[z]:.3f} of its (goal <= 0.125)")
