#!/usr/bin/python3
"""Predicted ucp-convert times for checkpoints too large to have here (GPT-3 7B, BLOOM-176B, a 1T) on
8 to 1024 ranks, from per-byte costs measured on this machine and ucp-convert's own plan.

The plan. scripts/make_sparse_fixture.py writes each model as Megatron-DeepSpeed saves it with bf16
and ZeRO-1 at the paper's (tp, pp, dp): real zip and pickle headers, tensor data as holes (terabytes
apparent, megabytes on disk). `ucp-convert --plan-only --ranks N --json` plans it exactly as it
would the real one: per rank, the bytes it maps, the bytes it writes (items and carried files), the
bytes its items take from other ranks' files, and the shuffle's rounds.

The costs. One single-rank `ucp-convert --report` on CKPT gives the CPU seconds per byte of the read
side (parsing, copying out of the page cache) and of the write side (assembling, CRC, writing into the
page cache). A rank's predicted time is its bytes in and out at those costs plus at its share of the
node's storage bandwidth, plus the bytes it takes from other ranks at its share of the node's network
bandwidth (all of them crossing nodes: an upper bound), plus the rounds at --round-seconds each (a
collective's latency; 0 by default: not measured here); the run takes as long as its slowest rank.
MPI start-up is not modelled. The storage floor is all bytes read and written at every node's full
bandwidth.

Two prices per row. `serial` adds a rank's read, write and storage times, as if each waited for the
others. ucp overlaps them: writer threads write finished tensors while the main thread reads and
assembles the next round, and a background thread starts each file's writeback as soon as it is
written. The same runs measure how much: of the time the three would save if they overlapped fully
(their sum less the longest), the share they do save is the overlap O = (sum - wall) / (sum - max),
where sum is the read, write-side and sync seconds of the report, max the longest of them and wall
the seconds of the phases that do this work (shuffle_union_write and commit). O = 0: no overlap (the
serial price); O = 1: the longest alone. `overlapped` prices each rank's read, write and storage
times at sum - O x (sum - max), its network time and rounds added as before. CKPT must be filled
(make_sparse_fixture.py --filled): holes read and write at no cost and would measure nothing.

  scripts/scale_model.py --checkpoint CKPT [--node-bandwidth 2e9] [--network-bandwidth 12.5e9]
                         [--ranks-per-node 8] [--round-seconds 0] [--work DIR]
"""
import argparse
import json
import math
import os
import shutil
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
ap.add_argument("--round-seconds", type=float, default=0.0, help="seconds per shuffle round (a collective's latency)")
ap.add_argument("--work", default=None, help="where the sparse checkpoints go (default: a temporary folder)")
a = ap.parse_args()
convert = os.path.join(a.build, "apps", "ucp-convert")

env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def planned(ckpt, ranks):
    """ucp-convert's plan of ckpt for `ranks`: per rank (bytes in, bytes out, bytes from other ranks), rounds."""
    j = json.loads(subprocess.run([convert, ckpt, "--plan-only", "--json", "--ranks", str(ranks)], env=env,
                                  capture_output=True, text=True, check=True).stdout)
    per = j["per_rank"]
    return ([r["bytes_in"] + r["bytes_carried"] for r in per], [r["bytes_out"] + r["bytes_carried"] for r in per],
            [r["bytes_from_other_ranks"] for r in per], j["rounds"], j)


# --- per-byte costs, measured ----------------------------------------------------------------------


def measure(ckpt):
    # Read costs per byte of the plan's bytes_in (the checksummed bytes a rank reads, each checked and
    # then taken into place), the unit the plans below are priced in; the report's bytes_read counts
    # only the tensor bytes taken, not the padding and the records' other bytes checked.
    # The overlap per run (see the docstring): the read, write-side and sync seconds against the wall
    # seconds of the phases that spend them.
    checked = planned(ckpt, 1)[4]["bytes_in"]
    rows = []
    for _ in range(a.repeat):
        with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(ckpt))) as work:
            rep = os.path.join(work, "report.json")
            subprocess.run([convert, ckpt, "-o", os.path.join(work, "out"), "-q", "--report", rep], env=env, check=True)
            report = json.load(open(rep))
            r = report["per_rank"][0]
            s = r["seconds"]
            parts = (s["read"], s["write_threads_sum"] + s["assemble"], s["sync"])
            wall = report["phases_seconds"]["shuffle_union_write"] + report["phases_seconds"]["commit"]
            overlap = (sum(parts) - wall) / (sum(parts) - max(parts)) if sum(parts) > max(parts) else 0.0
            rows.append((parts[0] / checked, parts[1] / r["bytes_written"], parts[2] / r["bytes_written"],
                         *parts, wall, min(1.0, max(0.0, overlap))))
    med = lambda i: sorted(x[i] for x in rows)[len(rows) // 2]
    return [med(i) for i in range(len(rows[0]))]


def overlapped(parts, overlap):
    """The seconds of times that overlap by `overlap` (0: their sum, 1: the longest)."""
    return sum(parts) - overlap * (sum(parts) - max(parts))


cpu_in, cpu_out, disk, read_s, write_s, sync_s, wall_s, overlap = measure(a.checkpoint)
print(f"measured on {a.checkpoint} (1 rank, median of {a.repeat}): read side {cpu_in * 1e9:.3f} ns/byte, "
      f"write side {cpu_out * 1e9:.3f} ns/byte of CPU; this disk's sync {1 / disk / 1e9:.2f} GB/s")
print(f"overlap: read {read_s:.2f} s + write side {write_s:.2f} s + sync {sync_s:.2f} s = "
      f"{read_s + write_s + sync_s:.2f} s serial, {wall_s:.2f} s wall (medians): overlap {overlap:.2f} "
      f"(0: none, 1: the longest alone)")
print(f"cluster assumed: {a.node_bandwidth / 1e9:g} GB/s storage and {a.network_bandwidth / 1e9:g} GB/s network per node, "
      f"{a.ranks_per_node} ranks per node\n")

models = [  # name, make_sparse_fixture.py --model, paper's transform time (min) and nodes (Table 3)
    ("GPT-3 7B", "gpt3-7b", (0.73, 4)),
    ("BLOOM-176B", "bloom-176b", (1.67, 48)),
    ("1T", "1t", (2.93, 128)),
]
work = a.work or tempfile.mkdtemp(prefix="ucp-scale-")
print(f"{'model':11} {'ranks':>5} {'nodes':>5} {'TB in+out':>9} {'max rank in/out/net GB':>24} {'rounds':>6} "
      f"{'imbal.':>6} {'serial':>9} {'overlapped':>10} {'storage floor':>13} {'serial/floor':>12} {'overl./floor':>12}"
      f"   paper (Table 3)")
for name, key, (paper_min, paper_nodes) in models:
    ckpt = os.path.join(work, key)
    if not os.path.exists(os.path.join(ckpt, "fixture.json")):
        subprocess.run([sys.executable, os.path.join(root, "scripts", "make_sparse_fixture.py"), ckpt, "--model", key],
                       check=True, stdout=subprocess.DEVNULL)
    for ranks in sorted({8, 32, 128, 384, 512, paper_nodes * a.ranks_per_node}):
        nodes = -(-ranks // a.ranks_per_node)
        per_node = min(ranks, a.ranks_per_node)
        bin_, bout, recv, rounds, j = planned(ckpt, ranks)
        io = a.node_bandwidth / per_node
        net = a.network_bandwidth / per_node
        parts = [(bi * cpu_in, bo * cpu_out, (bi + bo) / io) for bi, bo in zip(bin_, bout)]
        rest = [rc / net + rounds * a.round_seconds for rc in recv]
        times = [sum(p) + r for p, r in zip(parts, rest)]
        times_overlapped = [overlapped(p, overlap) + r for p, r in zip(parts, rest)]
        slow = max(range(ranks), key=lambda r: times[r])
        slow_overlapped = max(times_overlapped)
        total = sum(bin_) + sum(bout)
        floor = total / (nodes * a.node_bandwidth)
        paper = f"{paper_min:.2f} min = {paper_min * 60:.0f} s on {paper_nodes} nodes" if nodes == paper_nodes else ""
        print(f"{name:11} {ranks:5d} {nodes:5d} {total / 1e12:9.2f} "
              f"{bin_[slow] / 1e9:9.1f}/{bout[slow] / 1e9:.1f}/{recv[slow] / 1e9:.1f}".ljust(57) +
              f" {rounds:6d} {j['imbalance']:6.2f} {times[slow]:8.1f}s {slow_overlapped:9.1f}s {floor:12.1f}s "
              f"{times[slow] / floor:12.2f} {slow_overlapped / floor:12.2f}   {paper}")
    fx = json.load(open(os.path.join(ckpt, "fixture.json")))
    print(f"{'':11} largest (parameter, state) item {4 * max(math.prod(p['shape']) for p in fx['params'].values()) / 1e9:.1f} GB "
          f"(written in parts of at most {j['split_above_bytes'] / 2**30:.2f} GiB at {ranks} ranks); largest file "
          f"{max(v for k, v in fx['files'].items() if 'optim' in k) / 1e9:.1f} GB (files above that size are cut between "
          f"ranks: {j.get('shared_records', 0)} records read in ranges, read imbalance {j.get('read_imbalance', 0):.3f})\n")
if not a.work:
    shutil.rmtree(work)
