"""benchmark.py --hf-import: a Hugging Face model imported and laid out for Megatron-DeepSpeed at TP=2 PP=2, and
for Megatron-LM at TP=2 (--format mcore), against copying the bytes each writes, in one run (see benchmark.py's help).

The model: scripts/make_hf_fixture.py's LlamaForCausalLM of about 2 GiB (bf16, 500 MB shards), made once
under --work. The import is the two commands a user runs:
  ucp-convert MODEL -o ATOMIC                          the weights-only atomic checkpoint (fp32)
  ucp-reshard ATOMIC -o OUT --tp 2 --pp 2 --dp 1 --zero-stage 1 --no-optimizer
                                                        Megatron-DeepSpeed's model files (bf16)
  ucp-reshard ATOMIC -o ROOT --format mcore --tp 2 --pp 1  Megatron-LM's release checkpoint (bf16; issue 53)
on 1 and on 2 MPI ranks, each against `cp -r && sync` of the bytes that command writes (the atomic checkpoint;
the layout; the Megatron-LM root), copied from a finished run of it. Each command runs --repeat times in an order that alternates
from round to round; the report gives medians and the ratios, and each rank's peak RSS from the tools'
--report, against the largest tensor: the bound of DESIGN.md section 5 is 2x the largest state tensor + 256 MiB,
whatever the model's size.
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import time


def main(a, root):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    convert, reshard = (os.path.join(a.build, "apps", t) for t in ("ucp-convert", "ucp-reshard"))
    src = os.path.join(a.work, "hf-llama-2g")
    if not os.path.exists(os.path.join(src, "config.json")):
        subprocess.run(["/usr/bin/python3", os.path.join(root, "scripts", "make_hf_fixture.py"), src, "--gib", "2"], check=True)
    layout = ["--tp", "2", "--pp", "2", "--dp", "1", "--zero-stage", "1", "--no-optimizer"]
    mcore = ["--format", "mcore", "--tp", "2", "--pp", "1"]
    atomic, out = os.path.join(a.work, "import-atomic"), os.path.join(a.work, "import-layout")
    mcore_out = os.path.join(a.work, "import-mcore")
    scratch = os.path.join(a.work, "import-out")

    def run(cmd, ranks):
        if ranks > 1:
            cmd = ["mpiexec", "--oversubscribe", "-np", str(ranks)] + cmd
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)

    def tree_bytes(d):
        return sum(os.path.getsize(os.path.join(p, f)) for p, _, fs in os.walk(d) for f in fs)

    # What each command writes, for its reference copy.
    for d in (atomic, out, mcore_out):
        shutil.rmtree(d, ignore_errors=True)
    run([convert, src, "-o", atomic, "-q"], 2)
    run([reshard, atomic, "-o", out, "-q"] + layout, 2)
    run([reshard, atomic, "-o", mcore_out, "-q"] + mcore, 2)
    reports = {}
    commands = {}
    for ranks in (1, 2):
        rc, rr = (os.path.join(a.work, f"import-{k}-np{ranks}.json") for k in ("convert", "reshard"))
        commands[f"ucp-convert MODEL ({ranks} rank{'s' if ranks > 1 else ''})"] = \
            lambda ranks=ranks, rc=rc: (run([convert, src, "-o", scratch, "-q", "--report", rc], ranks),
                                        reports.__setitem__(f"convert np{ranks}", rc))
        commands[f"ucp-reshard tp2pp2 ({ranks} rank{'s' if ranks > 1 else ''})"] = \
            lambda ranks=ranks, rr=rr: (run([reshard, atomic, "-o", scratch, "-q", "--report", rr] + layout, ranks),
                                        reports.__setitem__(f"reshard np{ranks}", rr))
        rm = os.path.join(a.work, f"import-mcore-np{ranks}.json")
        commands[f"ucp-reshard mcore tp2 ({ranks} rank{'s' if ranks > 1 else ''})"] = \
            lambda ranks=ranks, rm=rm: (run([reshard, atomic, "-o", scratch, "-q", "--report", rm] + mcore, ranks),
                                        reports.__setitem__(f"mcore np{ranks}", rm))
    commands["cp -r && sync of the atomic checkpoint"] = lambda: subprocess.run(
        f"cp -r '{atomic}' '{scratch}' && sync", shell=True, check=True)
    commands["cp -r && sync of the layout"] = lambda: subprocess.run(f"cp -r '{out}' '{scratch}' && sync", shell=True, check=True)
    commands["cp -r && sync of the Megatron-LM root"] = lambda: subprocess.run(f"cp -r '{mcore_out}' '{scratch}' && sync", shell=True,
                                                                               check=True)
    subprocess.run(["cat"] + [os.path.join(src, f) for f in os.listdir(src)], stdout=subprocess.DEVNULL)  # warm
    times = {k: [] for k in commands}
    names = list(commands)
    for r in range(a.repeat):
        for k in (names if r % 2 == 0 else names[::-1]):
            shutil.rmtree(scratch, ignore_errors=True)
            os.sync()
            t = time.perf_counter()
            commands[k]()
            times[k].append(time.perf_counter() - t)
        print(f"round {r + 1}/{a.repeat} done", file=sys.stderr, flush=True)
    shutil.rmtree(scratch, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\nmodel {src}: {tree_bytes(src) / 2**20:.0f} MiB; atomic checkpoint {tree_bytes(atomic) / 2**20:.0f} MiB; "
          f"TP=2 PP=2 layout {tree_bytes(out) / 2**20:.0f} MiB; Megatron-LM root {tree_bytes(mcore_out) / 2**20:.0f} MiB; "
          f"medians of {a.repeat} runs, order alternating")
    ref = {"ucp-convert": "cp -r && sync of the atomic checkpoint", "ucp-reshard": "cp -r && sync of the layout",
           "mcore": "cp -r && sync of the Megatron-LM root"}
    print(f"{'command':42s} {'median s':>9s} {'min-max':>13s} {'vs cp -r && sync of its output':>31s}")
    for k in names:
        tool = "mcore" if " mcore " in k else k.split()[0]
        ratio = f"{med[k] / med[ref[tool]]:.2f}" if tool in ref else ""
        print(f"{k:42s} {med[k]:9.3f} {min(times[k]):6.2f}-{max(times[k]):<6.2f} {ratio:>31s}")
    for ranks in (1, 2):
        both = med[f"ucp-convert MODEL ({ranks} rank{'s' if ranks > 1 else ''})"] + \
            med[f"ucp-reshard tp2pp2 ({ranks} rank{'s' if ranks > 1 else ''})"]
        copies = med[ref["ucp-convert"]] + med[ref["ucp-reshard"]]
        print(f"import on {ranks} rank{'s' if ranks > 1 else ''} (both commands): {both:.2f} s, {both / copies:.2f}x "
              f"cp -r && sync of the bytes they write")
    largest = max(4 * p["numel"] for p in json.load(open(os.path.join(atomic, "ucp_manifest.json")))["params"])
    print(f"\npeak RSS per rank (last run), against the largest tensor ({largest / 2**20:.0f} MiB fp32; "
          f"bound 2x that + 256 MiB = {2 * largest / 2**20 + 256:.0f} MiB):")
    for key, path in sorted(reports.items()):
        rep = json.load(open(path))
        print(f"  {key:12s} " + ", ".join(f"{p['peak_rss_bytes'] / 2**20:.0f}" for p in rep["per_rank"]) + " MiB")
