#!/usr/bin/python3
"""Predicted ucp-convert times for checkpoints too large to have here (BLOOM-176B-shaped, 1T-shaped) on
8 to 512 ranks, from per-byte costs measured on this machine and ucp-convert's own plan.

The plan. For a Megatron-DeepSpeed GPT model of a given shape, trained ZeRO-1 at TP x PP x DP, the
script lays the optimizer state out as DeepSpeed does (per (pp, tp): the stage's parameters, TP-local,
flattened in one group, padded to 2 x DP and cut into DP equal partitions, one file each; layers
spread evenly over stages, the embedding on the first and its tied copy on the last) and plans it
as ucp-convert does (lib/plan/convert_plan.cpp): files in (pp, tp, dp) order cut into runs of even
size, one per rank; (parameter, state) items, heaviest first, each on the rank mapping most of its
bytes while that rank stays within 5% of an even share, else on the lightest. `--check CKPT` first
checks this model of the plan against `ucp-convert --plan-only --ranks N --json` on a real
checkpoint: the same per-rank bytes out, from the checkpoint's own parameters. The model-states files
(the stage's bf16 weights, which DeepSpeed's universal loader reads) are copied over as they are:
spread over the ranks first, then the items balanced around them.

The costs. One single-rank `ucp-convert --report` on CKPT gives the CPU seconds per byte of the read
side (parsing, copying out of the page cache) and of the write side (assembling, CRC, writing into the
page cache). A rank's predicted time is its bytes in and out at those costs plus at its share of the
node's storage bandwidth, plus the bytes it receives at its share of the node's network bandwidth
(all of its non-local bytes crossing nodes: an upper bound); the run takes as long as its slowest rank.
MPI start-up at scale is not modelled. The storage floor is all bytes read and written at every
node's full bandwidth.

  scripts/scale_model.py --checkpoint CKPT [--node-bandwidth 2e9] [--network-bandwidth 12.5e9]
                         [--ranks-per-node 8] [--check]
"""
import argparse
import bisect
import json
import os
import subprocess
import sys
import tempfile

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--checkpoint", required=True, help="a DeepSpeed checkpoint root to measure the per-byte costs on")
ap.add_argument("--build", default=os.path.join(root, "build"))
ap.add_argument("--node-bandwidth", type=float, default=2e9, help="storage bytes/s per node, read or write (default 2e9)")
ap.add_argument("--network-bandwidth", type=float, default=12.5e9, help="network bytes/s per node (default 12.5e9: 100 Gb/s)")
ap.add_argument("--ranks-per-node", type=int, default=8)
ap.add_argument("--repeat", type=int, default=5, help="cost measurements; the median is used")
ap.add_argument("--check", action="store_true", help="check the plan model against --plan-only on the checkpoint first")
a = ap.parse_args()
convert = os.path.join(a.build, "apps", "ucp-convert")

# --- the plan, as lib/plan/convert_plan.cpp makes it ------------------------------------------------


def assign_lpt(weights, ranks):
    """AssignLpt: heaviest first, each to the lightest bin (the lowest on ties)."""
    load, out = [0] * ranks, [0] * len(weights)
    for k in sorted(range(len(weights)), key=lambda k: -weights[k]):
        out[k] = min(range(ranks), key=lambda b: (load[b], b))
        load[out[k]] += weights[k]
    return out


def assign_local(weights, ranks, affinity, start, slack=0.05):
    """AssignLocal: heaviest first, to the bin of most affinity within (1 + slack) x an even share."""
    total, heaviest = sum(weights) + sum(start), max(weights)
    cap = max(total / ranks * (1 + slack), heaviest)
    load, out = list(start), [0] * len(weights)
    for k in sorted(range(len(weights)), key=lambda k: -weights[k]):
        best, best_aff = -1, 0
        for b, aff in affinity(k).items():
            if aff > best_aff and load[b] + weights[k] <= cap:
                best, best_aff = b, aff
            elif aff == best_aff and aff > 0 and b < best and load[b] + weights[k] <= cap:
                best = b
        if best < 0:
            best = min(range(ranks), key=lambda b: (load[b], b))
        out[k] = best
        load[best] += weights[k]
    return out


def plan(params, files, ranks, carried=()):
    """params: [(full_numel, stream_numel, {file: elements})]; files: [bytes] in (pp, tp, dp) order;
    carried: the model-states files' bytes (copied over as they are, spread first).
    Returns per-rank (bytes in, bytes out, bytes received)."""
    total = sum(files)
    mapper, before, bytes_in = [], 0, [0] * ranks
    for size in files:
        r = min(ranks - 1, int((before + size / 2) / total * ranks))
        mapper.append(r)
        bytes_in[r] += size
        before += size
    local = []
    for full, stream, where in params:
        per_rank = {}
        for f, n in where.items():
            per_rank[mapper[f]] = per_rank.get(mapper[f], 0) + n
        local.append(per_rank)
    bytes_out, received, start = [0] * ranks, [0] * ranks, [0] * ranks
    for size, r in zip(carried, assign_lpt(list(carried), ranks)):
        bytes_in[r] += size
        bytes_out[r] += size
        start[r] += 2 * size
    weights = [4 * (stream + full) for full, stream, _ in params for _ in range(3)]
    bins = assign_local(weights, ranks, lambda k: local[k // 3], start)
    for k, r in enumerate(bins):
        full, stream, _ = params[k // 3]
        bytes_out[r] += 4 * full
        received[r] += 4 * (stream - local[k // 3].get(r, 0))
    return bytes_in, bytes_out, received


def megatron_gpt(layers, hidden, vocab, tp, pp, dp):
    """A Megatron GPT (learned positions off, as BLOOM's ALiBi; 4h MLP; tied embedding) saved by
    ZeRO-1 in bf16: its parameters as plan() wants them, its optimizer files' sizes and its
    model-states files' sizes (the stage's TP-local bf16 weights, one file per (pp, tp))."""
    padded = -(-vocab // (128 * tp)) * 128 * tp
    h = hidden
    layer = [("qkv.w", 3 * h * h, True), ("qkv.b", 3 * h, True), ("dense.w", h * h, True), ("dense.b", h, False),
             ("ln1.w", h, False), ("ln1.b", h, False), ("ln2.w", h, False), ("ln2.b", h, False),
             ("h4h.w", 4 * h * h, True), ("h4h.b", 4 * h, True), ("4hh.w", 4 * h * h, True), ("4hh.b", h, False)]
    stages = [[] for _ in range(pp)]  # per stage: (param index, split over TP)
    params = []

    def add(stage, numel, split, full=None):
        params.append([full if full is not None else numel, 0, {}])
        stages[stage].append((len(params) - 1, split, numel))
    add(0, padded * h, True, full=vocab * h)
    for l in range(layers):
        for _, n, split in layer:
            add(l * pp // layers, n, split)
    add(pp - 1, h, False)
    add(pp - 1, h, False)
    stages[pp - 1].append((0, True, padded * h))  # the tied head: a copy of the embedding, read and compared
    files, model_files = [], []
    for s in range(pp):
        for t in range(tp):
            group = [(p, n // tp if split else n) for p, split, n in stages[s]]
            total = sum(n for _, n in group)
            model_files.append(2 * total + 4096)
            padded_total = -(-total // (2 * dp)) * 2 * dp
            part = padded_total // dp
            first = len(files)
            files += [12 * part + 4096] * dp  # fp32, exp_avg, exp_avg_sq; a little pickle
            at = 0
            for p, n in group:
                params[p][1] += n
                for d in range(at // part, min(dp, -(-(at + n) // part))):
                    lo, hi = max(at, d * part), min(at + n, (d + 1) * part)
                    if hi > lo:
                        params[p][2][first + d] = params[p][2].get(first + d, 0) + hi - lo
                at += n
    return [tuple(p) for p in params], files, model_files


# --- checking the model of the plan against the real one --------------------------------------------

env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def check(ckpt):
    """The checkpoint's own parameters and files, planned here and by ucp-convert --plan-only: the
    per-rank bytes out must agree (bytes in too, up to the files' sizes, which the JSON gives)."""
    ok = True
    for ranks in (2, 3, 4, 8):
        j = json.loads(subprocess.run([convert, ckpt, "--plan-only", "--json", "--ranks", str(ranks)], env=env,
                                      capture_output=True, text=True, check=True).stdout)
        mine = sorted(r["bytes_out"] + r["bytes_carried"] for r in j["per_rank"])
        # The model gets what it can from the JSON: each item's bytes; affinity is not in the JSON, so
        # the check is of the balancing alone (all affinities equal: the lightest-bin rule).
        params = [(p["bytes"] // 12, p["bytes"] // 12, {}) for p in j["params"]]
        carried = [r["bytes_carried"] for r in j["per_rank"] if r["bytes_carried"]]
        _, out, _ = plan(params, [1] * ranks, ranks, carried)
        model = sorted(out)
        print(f"  {ranks} ranks: max bytes out, ucp-convert --plan-only {max(mine) / 2**20:.1f} MiB, "
              f"this model without affinity {max(model) / 2**20:.1f} MiB")
        ok &= max(model) <= max(mine) * 1.10 + 1
    return ok


# --- per-byte costs, measured ----------------------------------------------------------------------


def measure(ckpt):
    rows = []
    for _ in range(a.repeat):
        with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(ckpt))) as work:
            rep = os.path.join(work, "report.json")
            subprocess.run([convert, ckpt, "-o", os.path.join(work, "out"), "-q", "--report", rep], env=env, check=True)
            r = json.load(open(rep))["per_rank"][0]
            s = r["seconds"]
            rows.append((s["read"] / r["bytes_read"], (s["write_threads_sum"] + s["assemble"]) / r["bytes_written"],
                         s["sync"] / r["bytes_written"]))
    med = lambda i: sorted(x[i] for x in rows)[len(rows) // 2]
    return med(0), med(1), med(2)


if a.check:
    print(f"the plan model against ucp-convert --plan-only on {a.checkpoint}:")
    if not check(a.checkpoint):
        sys.exit("the plan model differs from ucp-convert's plan by more than 10%")
cpu_in, cpu_out, disk = measure(a.checkpoint)
print(f"measured on {a.checkpoint} (1 rank, median of {a.repeat}): read side {cpu_in * 1e9:.3f} ns/byte, "
      f"write side {cpu_out * 1e9:.3f} ns/byte of CPU; this disk's sync {1 / disk / 1e9:.2f} GB/s")
print(f"cluster assumed: {a.node_bandwidth / 1e9:g} GB/s storage and {a.network_bandwidth / 1e9:g} GB/s network per node, "
      f"{a.ranks_per_node} ranks per node\n")

models = [  # name, (layers, hidden, vocab), source (tp, pp, dp), paper's transform time (min) and nodes
    ("GPT-3 7B", (32, 4096, 50257), (2, 2, 8), (0.73, 4)),
    ("BLOOM-176B", (70, 14336, 250880), (4, 12, 8), (1.67, 48)),
    ("1T", (128, 25600, 51200), (8, 64, 2), (2.93, 128)),
]
print(f"{'model':11} {'ranks':>5} {'nodes':>5} {'TB in+out':>9} {'max rank in/out/recv GB':>25} {'predicted':>10} "
      f"{'storage floor':>13} {'pred/floor':>10}   paper (Table 3)")
for name, (layers, hidden, vocab), (tp, pp, dp), (paper_min, paper_nodes) in models:
    params, files, model_files = megatron_gpt(layers, hidden, vocab, tp, pp, dp)
    for ranks in sorted({8, 32, 128, 384, 512, paper_nodes * a.ranks_per_node}):
        nodes = -(-ranks // a.ranks_per_node)
        per_node = min(ranks, a.ranks_per_node)
        bin_, bout, recv = plan(params, files, ranks, model_files)
        io = a.node_bandwidth / per_node
        net = a.network_bandwidth / per_node
        times = [bi * (cpu_in + 1 / io) + bo * (cpu_out + 1 / io) + rc / net for bi, bo, rc in zip(bin_, bout, recv)]
        slow = max(range(ranks), key=lambda r: times[r])
        total = sum(bin_) + sum(bout)
        floor = total / (nodes * a.node_bandwidth)
        paper = f"{paper_min:.2f} min on {paper_nodes} nodes" if nodes == paper_nodes else ""
        print(f"{name:11} {ranks:5d} {nodes:5d} {total / 1e12:9.2f} "
              f"{bin_[slow] / 1e9:9.1f}/{bout[slow] / 1e9:.1f}/{recv[slow] / 1e9:.1f}".ljust(58) +
              f" {times[slow]:9.1f}s {floor:12.1f}s {times[slow] / floor:10.2f}   {paper}")
    print(f"{'':11} largest file {max(files) / 1e9:.1f} GB (mapped whole by one rank), largest (parameter, state) "
          f"item {4 * max(p[0] for p in params) / 1e9:.1f} GB (written whole by one rank)\n")
