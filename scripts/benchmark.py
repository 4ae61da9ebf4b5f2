#!/usr/bin/python3
"""Benchmark of ucp-convert against `cp -r` of the same checkpoint on the same disk, measured in the
same run (the machine is shared and noisy: compare ratios, not seconds).

Generates (once) a checkpoint of about 2 GB with scripts/make_fixture.py (ZeRO-2, TP=2, PP=2, DP=2,
bf16, Llama-like, hidden scaled up), then for each of `--repeat` rounds times:
  cp -r SRC COPY            the plain copy (data left in the page cache, like most tools)
  cp -r SRC COPY && sync    the durable copy (ucp fsyncs every file it commits)
  ucp-convert SRC -o OUT    with 1 rank and with 2 MPI ranks
  ucp-reshard OUT -o NEW    to dp=4 tp=1 pp=2 ZeRO-1 bf16, with 1 rank and with 2 MPI ranks
and prints the best time of each, the ratios, peak RSS per rank (from --report), the largest state
tensor, the DESIGN.md section 5 targets, and that no temporary fragment file was written.

  scripts/benchmark.py [--work DIR] [--build DIR] [--scale 65] [--layers 4] [--repeat 2]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--work", default=os.path.join(root, "build", "bench"), help="folder on the disk to measure")
ap.add_argument("--build", default=os.path.join(root, "build"))
ap.add_argument("--scale", type=int, default=65, help="hidden-size multiplier of the fixture model (65: ~2 GB)")
ap.add_argument("--layers", type=int, default=4)
ap.add_argument("--repeat", type=int, default=2)
a = ap.parse_args()

env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
src = os.path.join(a.work, f"src-scale{a.scale}-l{a.layers}")
convert = os.path.join(a.build, "apps", "ucp-convert")
reshard = os.path.join(a.build, "apps", "ucp-reshard")
if not os.path.exists(convert):
    sys.exit(f"{convert} not found: build first (scripts/build.sh)")
os.makedirs(a.work, exist_ok=True)
if not os.path.exists(os.path.join(src, "fixture.json")):
    print(f"generating the checkpoint in {src} ...", flush=True)
    subprocess.run([sys.executable, os.path.join(root, "scripts", "make_fixture.py"), src, "--zero-stage", "2",
                    "--tp", "2", "--pp", "2", "--dp", "2", "--dtype", "bf16", "--scale", str(a.scale),
                    "--layers", str(a.layers)], check=True)
tag = os.path.join(src, open(os.path.join(src, "latest")).read().strip())
src_bytes = sum(os.path.getsize(os.path.join(tag, f)) for f in os.listdir(tag))
desc = json.load(open(os.path.join(src, "fixture.json")))
largest = max(4 * eval("*".join(map(str, p["shape"])) or "1") for p in desc["params"].values())


def timed(cmd, shell=False):
    t = time.perf_counter()
    subprocess.run(cmd, shell=shell, check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


copy_dir = os.path.join(a.work, "copy")
results = {"cp -r": [], "cp -r + sync": [], "ucp-convert 1 rank": [], "ucp-convert 2 ranks": [],
           "ucp-reshard 1 rank": [], "ucp-reshard 2 ranks": []}
reports, reshard_reports = {}, {}
target = ["--dp", "4", "--tp", "1", "--pp", "2", "--zero-stage", "1", "--dtype", "bf16"]
subprocess.run(["cat"] + [os.path.join(tag, f) for f in os.listdir(tag)], stdout=subprocess.DEVNULL)  # warm
for r in range(a.repeat):
    shutil.rmtree(copy_dir, ignore_errors=True)
    subprocess.run(["sync"])
    results["cp -r"].append(timed(["cp", "-r", src, copy_dir]))
    shutil.rmtree(copy_dir, ignore_errors=True)
    subprocess.run(["sync"])
    results["cp -r + sync"].append(timed(f"cp -r '{src}' '{copy_dir}' && sync", shell=True))
    shutil.rmtree(copy_dir, ignore_errors=True)
    for ranks in (1, 2):
        out = os.path.join(a.work, f"atomic-np{ranks}", "universal")
        report = os.path.join(a.work, f"report-np{ranks}.json")
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run(["sync"])
        cmd = [convert, src, "-o", out, "-q", "--report", report]
        if ranks > 1:
            cmd = ["mpiexec", "--oversubscribe", "-np", str(ranks)] + cmd
        results[f"ucp-convert {ranks} rank{'s' if ranks > 1 else ''}"].append(timed(cmd))
        reports[ranks] = json.load(open(report))
    for ranks in (1, 2):
        new = os.path.join(a.work, f"resharded-np{ranks}")
        report = os.path.join(a.work, f"reshard-report-np{ranks}.json")
        shutil.rmtree(new, ignore_errors=True)
        subprocess.run(["sync"])
        cmd = [reshard, os.path.join(a.work, "atomic-np2", "universal"), "-o", new, "-q", "--report", report] + target
        if ranks > 1:
            cmd = ["mpiexec", "--oversubscribe", "-np", str(ranks)] + cmd
        results[f"ucp-reshard {ranks} rank{'s' if ranks > 1 else ''}"].append(timed(cmd))
        reshard_reports[ranks] = json.load(open(report))

best = {k: min(v) for k, v in results.items()}
print(f"\ncheckpoint: {src_bytes / 2**30:.2f} GiB in {len(os.listdir(tag))} files "
      f"(ZeRO-2 bf16, dp=2 tp=2 pp=2, {len(desc['params'])} parameters); largest state tensor "
      f"{largest / 2**20:.1f} MiB; best of {a.repeat}")
print(f"{'run':24s} {'seconds':>8s} {'GiB/s':>7s} {'vs cp -r':>9s} {'vs cp+sync':>11s}")
for k, t in best.items():
    print(f"{k:24s} {t:8.2f} {src_bytes / 2**30 / t:7.2f} {t / best['cp -r']:9.2f} {t / best['cp -r + sync']:11.2f}")
limit = 2 * largest + 256 * 2**20
print(f"\npeak RSS per rank (target < 2 x largest tensor + 256 MiB = {limit / 2**20:.0f} MiB):")
for ranks, rep in reports.items():
    rss = [p["peak_rss_bytes"] for p in rep["per_rank"]]
    print(f"  {ranks} rank(s): " + ", ".join(f"{x / 2**20:.0f} MiB" for x in rss) +
          ("  OK" if max(rss) < limit else "  OVER"))
    print(f"    bytes read {rep['bytes_read'] / 2**30:.2f} GiB, written {rep['bytes_written'] / 2**30:.2f} GiB, "
          f"phases {json.dumps({k: round(v, 2) for k, v in rep['phases_seconds'].items()})}")
print("reshard to " + " ".join(target) + ":")
for ranks, rep in reshard_reports.items():
    rss = [p["peak_rss_bytes"] for p in rep["per_rank"]]
    print(f"  {ranks} rank(s): peak RSS " + ", ".join(f"{x / 2**20:.0f} MiB" for x in rss) +
          f"; read {rep['bytes_read'] / 2**30:.2f} GiB = {rep['read_ratio']:.3f}x the atomic tensors "
          f"({rep['atomic_bytes'] / 2**30:.2f} GiB)")
for ranks in reports:
    out = os.path.join(a.work, f"atomic-np{ranks}", "universal")
    listed = {e["path"] for e in json.load(open(os.path.join(out, "ucp_manifest.json")))["files"]}
    stray = [os.path.relpath(os.path.join(d, n), out) for d, _, ns in os.walk(out) for n in ns
             if os.path.relpath(os.path.join(d, n), out) not in listed | {"ucp_manifest.json"}]
    print(f"  {ranks} rank(s): {len(listed)} files in the manifest, {len(stray)} other files (temporary fragments: none "
          f"expected)" + (f": {stray[:3]}" if stray else ""))
t2 = best["ucp-convert 2 ranks"]
print(f"\nDESIGN.md 5: 2-rank conversion within 1.5x of cp -r: {t2 / best['cp -r']:.2f}x "
      f"({'met' if t2 <= 1.5 * best['cp -r'] else 'not met'}); of cp -r + sync: {t2 / best['cp -r + sync']:.2f}x")

# The two atomic stores: conversion to each (1 and 2 ranks), conversion between them (--from-atomic),
# file counts, and what reading every tensor's TP=2 slices through the store costs (ucp-inspect
# --verify reads whole datasets; the slab cost is AtomReader::storage_bytes_read, see the unit tests).
stores = {}
for fmt in ("pt", "hdf5"):
    for ranks in (1, 2):
        out = os.path.join(a.work, f"store-{fmt}-np{ranks}", "universal")
        times = []
        for r in range(a.repeat):
            shutil.rmtree(out, ignore_errors=True)
            subprocess.run(["sync"])
            cmd = [convert, src, "-o", out, "-q", "--format", fmt]
            if ranks > 1:
                cmd = ["mpiexec", "--oversubscribe", "-np", str(ranks)] + cmd
            times.append(timed(cmd))
        stores[(fmt, ranks)] = (min(times), out)
between = {}
for fmt, other in (("pt", "hdf5"), ("hdf5", "pt")):
    out = os.path.join(a.work, f"from-{fmt}-to-{other}", "universal")
    times = []
    for r in range(a.repeat):
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run(["sync"])
        times.append(timed(["mpiexec", "--oversubscribe", "-np", "2", convert, "--from-atomic",
                            stores[(fmt, 2)][1], "-o", out, "-q", "--format", other]))
    between[(fmt, other)] = min(times)
print("\natomic stores (best of %d):" % a.repeat)
for (fmt, ranks), (t, out) in stores.items():
    n = sum(len(ns) for _, _, ns in os.walk(out))
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, ns in os.walk(out) for f in ns)
    print(f"  ucp-convert --format {fmt:4s} {ranks} rank(s): {t:6.2f} s, {n} files, {size / 2**30:.2f} GiB")
for (fmt, other), t in between.items():
    print(f"  ucp-convert --from-atomic ({fmt} -> {other}), 2 ranks: {t:6.2f} s")

# Reshard from each store to a TP=2 x PP=2 target (dp=4, ZeRO-1): time, bytes storage delivered
# (HDF5 reads whole chunks) against the atomic bytes, peak RSS, files written; the two outputs must
# be byte-identical.
import filecmp  # noqa: E402

tp2pp2 = ["--dp", "4", "--tp", "2", "--pp", "2", "--zero-stage", "1", "--dtype", "bf16"]
print("\nreshard to " + " ".join(tp2pp2) + " from each store (best of %d):" % a.repeat)
outs = {}
for fmt in ("pt", "hdf5"):
    for ranks in (1, 2):
        new = os.path.join(a.work, f"reshard-from-{fmt}-np{ranks}")
        report = new + ".json"
        times = []
        for r in range(a.repeat):
            shutil.rmtree(new, ignore_errors=True)
            subprocess.run(["sync"])
            cmd = [reshard, stores[(fmt, 2)][1], "-o", new, "-q", "--report", report] + tp2pp2
            if ranks > 1:
                cmd = ["mpiexec", "--oversubscribe", "-np", str(ranks)] + cmd
            times.append(timed(cmd))
        rep = json.load(open(report))
        n = sum(len(ns) for _, _, ns in os.walk(new))
        rss = max(p["peak_rss_bytes"] for p in rep["per_rank"])
        t = min(times)
        print(f"  from {fmt:4s} {ranks} rank(s): {t:6.2f} s ({t / best['cp -r']:.2f}x cp -r, "
              f"{t / best['cp -r + sync']:.2f}x cp -r + sync), read {rep['bytes_read'] / 2**30:.2f} GiB = "
              f"{rep['read_ratio']:.3f}x the atomic tensors, peak RSS {rss / 2**20:.0f} MiB, {n} files written")
        outs[(fmt, ranks)] = new
ref = outs[("pt", 1)]
tag_dir = open(os.path.join(ref, "latest")).read().strip()
names = sorted(os.listdir(os.path.join(ref, tag_dir)))
for key, new in outs.items():
    _, mismatch, errors = filecmp.cmpfiles(os.path.join(ref, tag_dir), os.path.join(new, tag_dir), names, shallow=False)
    if mismatch or errors:
        sys.exit(f"reshard from {key[0]} with {key[1]} rank(s) differs from the .pt store's: {(mismatch + errors)[:3]}")
print(f"  all four outputs byte-identical ({len(names)} files each)")

# The outputs are large (about 25 GB in all): only the generated checkpoint is kept for the next run.
for name in os.listdir(a.work):
    path = os.path.join(a.work, name)
    if path != src and os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
