#!/usr/bin/python3
"""ucp-convert and ucp-reshard against copying the same bytes on the same disk, measured in one run.

The machine is shared and noisy: every command runs --repeat times (at least 5), the commands of a
round one after the other in an order that alternates from round to round, and the report gives
medians and ratios against references measured in the same rounds:
  cp -r SRC/TAG DST                  the plain copy (data left in the page cache)
  cp -r SRC/TAG DST && sync          the durable copy (ucp makes its output durable too)
                                     (TAG: the checkpoint folder `latest` names, what the tools read)
  read-write+sync                    every file read and written through user space in 8 MiB
                                     chunks, then sync: the honest floor for a tool that must
                                     transform the data it moves
  ucp-convert SRC -o OUT             1 rank and 2 MPI ranks
  ucp-reshard OUT -o NEW             to two layouts, 1 rank and 2 MPI ranks, each against a
                                     cp -r && sync and a read-write+sync of the bytes it writes
  ucp-reshard OUT --format hf        with --targets ...,hf: the Hugging Face export (safetensors in the
                                     source's dtype, files of at most 100 MB), the same way
  ucp-reshard OUT --format mcore     with --dcp MCORE --targets mcore: Megatron-LM's torch_dist root at TP=2 PP=2
                                     from a Megatron-Core source, the same way
  ds_to_universal.py                 DeepSpeed's converter, when --deepspeed DIR (a DeepSpeed source
                                     tree, see shared/real-deepspeed/harness/README.md) is given
  dcp_to_torch_save                  with --dcp DIR --chroot CH: a PyTorch Distributed Checkpoint instead,
                                     against torch's own converter (run in the Debian trixie chroot CH,
                                     torch 2.6, by ../shared/real-dcp/harness/convert.py: its in-process
                                     time and peak RSS are reported beside the command's wall time);
                                     scripts/make_dcp_fixture.py makes a DCP of a few GB with torch's writer.
                                     A Megatron-Core torch_dist folder (metadata.json beside .metadata) needs
                                     no --chroot: torch's converter cannot read Megatron's metadata, and
                                     Megatron has no converter of its own; e.g. the >= 1.1 GB dp_reshardable
                                     checkpoint of tests/data/real-mcore/make_mcore.py's bench case
  --hf-trainer                       the Hugging Face export of a Trainer + DeepSpeed checkpoint (its
                                     checkpoint-N/, Hugging Face parameter names) against DeepSpeed's
                                     zero_to_fp32.py on the same folder: ucp-reshard CKPT -o OUT --format hf
                                     (convert and export in one command) and ucp-reshard ATOMIC --format hf
                                     (the export alone), on 1 rank, each command's wall time and peak RSS
                                     (the process tree's, from wait4) against zero_to_fp32.py's. Without
                                     --checkpoint, scripts/make_hftrainer_fixture.py's 2.65 GB ZeRO-3
                                     checkpoint. zero_to_fp32.py needs `import deepspeed`: give the command
                                     as --zero-to-fp32-cmd, a template with {checkpoint} and {output}, e.g.
                                     for the Debian trixie chroot of ../shared/real-hftrainer/harness (with
                                     --work bind-mounted at the same path inside it):
                                       --zero-to-fp32-cmd "chroot /work/oracle-hf/trixie env -i bash -c '.
                                       /shared/real-hftrainer/harness/env.sh; python3 {checkpoint}/zero_to_fp32.py
                                       {checkpoint} {output} --safe_serialization'"
                                     (goal, issue 43: ucp at least 5x faster, at most 1/8 of its peak RSS)
  --hf-import                        a generated 2 GiB Hugging Face Llama (scripts/make_hf_fixture.py) imported:
                                     ucp-convert MODEL, then ucp-reshard to TP=2 PP=2 (--no-optimizer) and to
                                     Megatron-LM's TP=2 (--format mcore), on 1 and 2 ranks, each against
                                     cp -r && sync of the bytes it writes, and each
                                     rank's peak RSS against the largest tensor (benchmark_hf_import.py)
Page cache warm (the source is read once before the rounds). Peak RSS per rank and bytes read and
written come from each tool's --report.

  scripts/benchmark.py [--checkpoint DIR] [--repeat 5] [--work DIR] [--build DIR] [--deepspeed DIR]
                       [--baseline-build DIR]

--baseline-build DIR times every ucp command of another build too, in the same rounds, and prints
the ratio of this build to it: the cost of a change (e.g. the checksums checked while reading).

Without --checkpoint it generates (once) the generator's 2 GB checkpoint (ZeRO-2, TP=2, PP=2, DP=2,
bf16); with it, any DeepSpeed checkpoint folder (its root, with `latest`), e.g. the 565 MB real case
that shared/real-deepspeed/harness/large_case.sh makes.
"""
import argparse
import atexit
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--checkpoint", help="a DeepSpeed checkpoint root (default: the generated 2 GB one)")
ap.add_argument("--work", default=os.path.join(root, "build", "bench"), help="folder on the disk to measure")
ap.add_argument("--build", default=os.path.join(root, "build"))
ap.add_argument("--repeat", type=int, default=5)
ap.add_argument("--deepspeed", help="DeepSpeed source tree: also time its ds_to_universal.py")
ap.add_argument("--baseline-build", help="another build folder: its ucp commands timed in the same rounds, for a ratio")
ap.add_argument("--targets", default="tp2pp2,z3dp2", help="reshard targets: tp2pp2 (DP=1 ZeRO-1), z3dp2 (ZeRO-3 DP=2), "
                "hf (ucp-reshard --format hf: a Llama-shaped checkpoint's Hugging Face export), mcore (with a Megatron-Core "
                "--dcp: ucp-reshard --format mcore --tp 2 --pp 2)")
ap.add_argument("--dcp", help="a PyTorch Distributed Checkpoint folder (.metadata, *.distcp) instead of a DeepSpeed one")
ap.add_argument("--chroot", help="with --dcp: the Debian trixie chroot with python3-torch >= 2.4, for dcp_to_torch_save")
ap.add_argument("--mpiexec-args", default="", help="extra mpiexec options for the 2-rank runs, e.g. '--mca pml ucx' (on one node the tools "
                "choose Open MPI's ob1 themselves unless told otherwise)")
ap.add_argument("--hf-trainer", action="store_true", help="the Hugging Face export of a Trainer checkpoint against "
                "zero_to_fp32.py (see above)")
ap.add_argument("--zero-to-fp32-cmd", help="with --hf-trainer: zero_to_fp32.py's command, {checkpoint} and {output} "
                "filled in; without it only ucp's side is timed")
ap.add_argument("--hf-import", action="store_true", help="a generated 2 GiB Hugging Face model imported to TP=2 PP=2 "
                "(see benchmark_hf_import.py)")
a = ap.parse_args()
if a.repeat < 5:
    sys.exit("--repeat must be at least 5 (medians of at least 5 paired runs)")
if a.hf_import:
    sys.path.insert(0, os.path.join(root, "scripts"))
    import benchmark_hf_import  # noqa: E402
    benchmark_hf_import.main(a, root)
    sys.exit(0)
if a.hf_trainer:
    sys.path.insert(0, os.path.join(root, "scripts"))
    import benchmark_hf_export  # noqa: E402
    benchmark_hf_export.main(a, root)
    sys.exit(0)

env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
convert = os.path.join(a.build, "apps", "ucp-convert")
reshard = os.path.join(a.build, "apps", "ucp-reshard")
if not os.path.exists(convert):
    sys.exit(f"{convert} not found: build first (scripts/build.sh)")
os.makedirs(a.work, exist_ok=True)
src = a.dcp or a.checkpoint
mcore = bool(a.dcp) and os.path.exists(os.path.join(a.dcp, "metadata.json"))  # Megatron-Core's torch_dist
if a.dcp:
    if not a.chroot and not mcore:
        sys.exit("--dcp needs --chroot CH: dcp_to_torch_save runs in the trixie chroot (torch 2.6)")
    # A DCP has no DeepSpeed layouts to reshard to; Megatron-Core's may be written at another of its own
    a.targets = "mcore" if mcore and "mcore" in a.targets.split(",") else ""
elif not src:
    src = os.path.join(a.work, "src-scale65-l4")
    if not os.path.exists(os.path.join(src, "fixture.json")):
        print(f"generating the checkpoint in {src} ...", flush=True)
        subprocess.run([sys.executable, os.path.join(root, "scripts", "make_fixture.py"), src, "--zero-stage", "2",
                        "--tp", "2", "--pp", "2", "--dp", "2", "--dtype", "bf16", "--scale", "65", "--layers", "4"],
                       check=True)
tag = src if a.dcp else os.path.join(src, open(os.path.join(src, "latest")).read().strip())


def tree_bytes(d):
    return sum(os.path.getsize(os.path.join(p, f)) for p, _, fs in os.walk(d) for f in fs)


def read_write_sync(from_dir, to_dir):
    """Every file of from_dir read and written under to_dir through user space, then sync."""
    for p, _, fs in os.walk(from_dir):
        rel = os.path.relpath(p, from_dir)
        os.makedirs(os.path.join(to_dir, rel), exist_ok=True)
        for f in fs:
            with open(os.path.join(p, f), "rb", buffering=0) as i, open(os.path.join(to_dir, rel, f), "wb", buffering=0) as o:
                while True:
                    b = i.read(8 << 20)
                    if not b:
                        break
                    o.write(b)
    os.sync()


def run(cmd, ranks=1):
    if ranks > 1:
        cmd = ["mpiexec", "--oversubscribe"] + a.mpiexec_args.split() + ["-np", str(ranks)] + cmd
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)


out_dir = os.path.join(a.work, "out")
atomic = os.path.join(a.work, "atomic", "universal")
src_bytes = tree_bytes(tag)
# The generated checkpoint's args do not name its rotary position embeddings: the export is told.
model_config = os.path.join(a.work, "rope.json")
with open(model_config, "w") as f:
    json.dump({"position_embedding_type": "rope"}, f)
targets = {"tp2pp2": ["--dp", "1", "--tp", "2", "--pp", "2", "--zero-stage", "1"],
           "z3dp2": ["--dp", "2", "--tp", "1", "--pp", "1", "--zero-stage", "3"],
           "hf": ["--format", "hf", "--max-shard-size", "100MB"] + ([] if a.checkpoint else ["--model-config", model_config]),
           "mcore": ["--format", "mcore", "--tp", "2", "--pp", "2"]}
targets = {k: targets[k] for k in a.targets.split(",") if k}
# The atomic checkpoint the reshards read, and what each reshard writes (for its own reference).
shutil.rmtree(os.path.dirname(atomic), ignore_errors=True)
run([convert, src, "-o", atomic, "-q"], 2)
dtype = json.load(open(os.path.join(atomic, "ucp_manifest.json")))["source"]["dtype"]
reshard_out = {}
for name, flags in targets.items():
    d = os.path.join(a.work, f"reshard-{name}")
    shutil.rmtree(d, ignore_errors=True)
    run([reshard, atomic, "-o", d, "-q", "--dtype", dtype] + flags, 2)
    reshard_out[name] = d

reports = {}
check_shares = {}  # "convert<ranks>": per run, the weight-copy check's seconds over the run's others


def note_check_share(key, rep):
    """The weight-copy check's share of a conversion, from its --report's phases: the run's time against
    the same run without that phase (what the check adds; each run measures itself)."""
    phases = json.load(open(rep)).get("phases_seconds", {})
    if "weight_copies" in phases and phases.get("total", 0) > phases["weight_copies"]:
        check_shares.setdefault(key, []).append(phases["total"] / (phases["total"] - phases["weight_copies"]))


def clean():
    shutil.rmtree(out_dir, ignore_errors=True)
    os.sync()


# The references copy the checkpoint folder `latest` names, the bytes the tools read: the root may
# hold other checkpoints (DeepSpeed's own universal output, older steps) that ucp never touches.
commands = {
    "cp -r": lambda: subprocess.run(["cp", "-r", tag, out_dir], check=True),
    "cp -r && sync": lambda: subprocess.run(f"cp -r '{tag}' '{out_dir}' && sync", shell=True, check=True),
    "read-write+sync": lambda: read_write_sync(tag, out_dir),
}
builds = {"": a.build}
if a.baseline_build:
    builds[" (baseline)"] = a.baseline_build
for suffix, build in builds.items():
    conv, resh = os.path.join(build, "apps", "ucp-convert"), os.path.join(build, "apps", "ucp-reshard")
    for ranks in (1, 2):
        rep = os.path.join(a.work, f"convert-np{ranks}{suffix.strip()}.json")
        commands[f"ucp-convert {ranks} rank{'s' if ranks > 1 else ''}{suffix}"] = \
            lambda ranks=ranks, rep=rep, conv=conv, suffix=suffix: (
                run([conv, src, "-o", out_dir + "/u", "-q", "--report", rep], ranks),
                reports.__setitem__(f"convert{ranks}{suffix}", rep), note_check_share(f"convert{ranks}{suffix}", rep))
    for name, flags in targets.items():
        for ranks in (1, 2):
            rep = os.path.join(a.work, f"reshard-{name}-np{ranks}{suffix.strip()}.json")
            commands[f"ucp-reshard {name} {ranks} rank{'s' if ranks > 1 else ''}{suffix}"] = \
                lambda flags=flags, rep=rep, name=name, ranks=ranks, resh=resh, suffix=suffix: (
                    run([resh, atomic, "-o", out_dir, "-q", "--dtype", dtype, "--report", rep] + flags, ranks),
                    reports.__setitem__(f"reshard-{name}{ranks}{suffix}", rep))
for name in targets:
    commands[f"cp -r && sync of {name}'s output"] = lambda name=name: subprocess.run(
        f"cp -r '{reshard_out[name]}' '{out_dir}' && sync", shell=True, check=True)
    commands[f"read-write+sync of {name}'s output"] = lambda name=name: read_write_sync(reshard_out[name], out_dir)
if a.deepspeed:
    shims = os.path.join(root, "..", "shared", "real-deepspeed", "harness", "shims")
    ds_env = dict(env, PYTHONPATH=a.deepspeed + ":" + shims, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    commands["ds_to_universal.py"] = lambda: subprocess.run(
        ["/usr/bin/python3", os.path.join(a.deepspeed, "deepspeed", "checkpoint", "ds_to_universal.py"),
         "--input_folder", tag, "--output_folder", out_dir], check=True, env=ds_env, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)

dcp_runs = []  # dcp_to_torch_save's own report per run: in-process seconds, peak RSS
if a.dcp and not mcore:
    # torch's converter inside the chroot: the checkpoint and the work folder bind-mounted there (the
    # work folder whole, as clean() removes and remakes the output folder inside it).
    mnt = os.path.join(a.chroot, "mnt", "ucp-bench")
    mounts = [(os.path.abspath(src), os.path.join(mnt, "src")), (os.path.abspath(a.work), os.path.join(mnt, "work"))]
    for host, inside in mounts:
        os.makedirs(inside, exist_ok=True)
        subprocess.run(["mount", "--bind", host, inside], check=True)
    atexit.register(lambda: [subprocess.run(["umount", inside]) for _, inside in mounts])
    os.makedirs(os.path.join(a.chroot, "opt", "ucp-bench"), exist_ok=True)
    shutil.copy(os.path.join(root, "..", "shared", "real-dcp", "harness", "convert.py"),
                os.path.join(a.chroot, "opt", "ucp-bench", "convert.py"))
    rel_out = os.path.relpath(out_dir, a.work)

    def dcp_to_torch_save():
        os.makedirs(out_dir, exist_ok=True)
        r = subprocess.run(["chroot", a.chroot, "python3", "/opt/ucp-bench/convert.py",
                            "/mnt/ucp-bench/src", f"/mnt/ucp-bench/work/{rel_out}/reference.pt"],
                           check=True, capture_output=True, text=True)
        dcp_runs.append(json.loads([line for line in r.stdout.splitlines() if line.startswith("{")][-1]))

    commands["dcp_to_torch_save"] = dcp_to_torch_save

subprocess.run(["cat"] + [os.path.join(tag, f) for f in os.listdir(tag)], stdout=subprocess.DEVNULL)  # warm
times = {k: [] for k in commands}
names = list(commands)
for r in range(a.repeat):
    order = names if r % 2 == 0 else names[::-1]
    for k in order:
        clean()
        t = time.perf_counter()
        commands[k]()
        times[k].append(time.perf_counter() - t)
    print(f"round {r + 1}/{a.repeat} done", file=sys.stderr, flush=True)
clean()

med = {k: statistics.median(v) for k, v in times.items()}
print(f"\ncheckpoint {src}: {src_bytes / 2**20:.0f} MiB in {len(os.listdir(tag))} files; medians of {a.repeat} "
      f"paired runs, order alternating")
print(f"{'command':34s} {'median s':>9s} {'min-max':>13s} {'vs cp -r':>9s} {'vs cp+sync':>11s} {'vs rw+sync':>11s}")
for k in names:
    lo, hi = min(times[k]), max(times[k])
    print(f"{k:34s} {med[k]:9.3f} {lo:6.2f}-{hi:<6.2f} {med[k] / med['cp -r']:9.2f} {med[k] / med['cp -r && sync']:11.2f} "
          f"{med[k] / med['read-write+sync']:11.2f}")
for name in targets:
    cp, rw = med[f"cp -r && sync of {name}'s output"], med[f"read-write+sync of {name}'s output"]
    for ranks in ("1 rank", "2 ranks"):
        k = f"ucp-reshard {name} {ranks}"
        print(f"{k} vs the {tree_bytes(reshard_out[name]) / 2**20:.0f} MiB it writes: {med[k] / cp:.2f}x cp -r && sync, "
              f"{med[k] / rw:.2f}x read-write+sync")
if a.baseline_build:
    print(f"\nthis build ({a.build}) against the baseline ({a.baseline_build}), medians, same rounds:")
    for k in names:
        if k.endswith(" (baseline)"):
            mine, base = times[k[:-len(" (baseline)")]], times[k]
            pairs = sorted(x / y for x, y in zip(mine, base))
            print(f"  {k[:-len(' (baseline)')]:30s} {med[k[:-len(' (baseline)')]] / med[k]:.3f}x "
                  f"(paired ratios {pairs[0]:.2f}-{pairs[-1]:.2f})")
if dcp_runs:
    inner = statistics.median(r["dcp_to_torch_save_seconds"] for r in dcp_runs)
    rss = statistics.median(r["peak_rss_kb"] for r in dcp_runs) * 1024
    print(f"dcp_to_torch_save: {inner:.3f} s inside the process (median; the command above adds python and the torch "
          f"import), peak RSS {rss / 2**20:.0f} MiB")
    for ranks in ("1 rank", "2 ranks"):
        k = "ucp-convert " + ranks
        print(f"dcp_to_torch_save / {k}: {med['dcp_to_torch_save'] / med[k]:.2f}x the command, {inner / med[k]:.2f}x its "
              f"in-process time")
if "ds_to_universal.py" in med:
    for ranks in ("1 rank", "2 ranks"):
        print(f"ds_to_universal.py / ucp-convert {ranks}: {med['ds_to_universal.py'] / med['ucp-convert ' + ranks]:.1f}x")
for key, shares in sorted(check_shares.items()):
    print(f"weight-copy check ({key}): the conversion takes {statistics.median(shares):.3f}x its time without the check "
          f"(median of {len(shares)} runs, {min(shares):.3f}-{max(shares):.3f}; the report's weight_copies phase)")
if a.mpiexec_args:
    print(f"2-rank runs: mpiexec {a.mpiexec_args}")
print("\nper rank (last run):")
for key, path in sorted(reports.items()):
    rep = json.load(open(path))
    rss = ", ".join(f"{p['peak_rss_bytes'] / 2**20:.0f}" for p in rep["per_rank"])
    extra = f", read {rep['read_ratio']:.3f}x the atomic tensors" if "read_ratio" in rep else ""
    phases = rep.get("phases_seconds", {})
    print(f"  {key:14s} peak RSS {rss} MiB; read {rep['bytes_read'] / 2**20:.0f} MiB, written "
          f"{rep.get('bytes_written', 0) / 2**20:.0f} MiB{extra}; phases " +
          json.dumps({k: round(v, 3) for k, v in phases.items()}))
    for p in rep["per_rank"]:
        if "seconds" in p:  # where each rank's time went (convert's write: the writer threads' sum, overlapping)
            moved = (f"; shuffled {p['bytes_received'] / 2**20:.0f} MiB, read in place {p['bytes_read_in_place'] / 2**20:.0f} MiB"
                     if "bytes_read_in_place" in p else "")
            print(f"    rank {p['rank']}: " + ", ".join(f"{k} {v:.3f}" for k, v in p["seconds"].items()) + moved)
largest = max(4 * p["numel"] for p in json.load(open(os.path.join(atomic, "ucp_manifest.json")))["params"])
print(f"largest state tensor {largest / 2**20:.1f} MiB: the bound 2x that + 256 MiB is {(2 * largest) / 2**20 + 256:.0f} MiB")
