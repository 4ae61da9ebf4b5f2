#!/usr/bin/env python3
"""Two builds of ucp, the same checkpoints through both: every output byte, message and exit code compared.

    compare_builds.py --baseline BUILD_A --build BUILD_B [--work DIR] [--quick] [--json] [--jobs N] [--case REGEX]
                      [--keep] [--raw]

For issue 45 ("every output byte the same, before and after"): a restructuring must leave what the tools
write and say unchanged. Each BUILD is a build folder with apps/ucp-convert, apps/ucp-reshard and
apps/ucp-inspect. For every real case we have (../shared/real-deepspeed/cases/*, ../shared/real-dcp/cases/*,
../shared/real-hftrainer/cases/* from the project root; tests/data/real-*/* and tests/data/sample_*):
- `ucp-inspect` of the source (text, --json, --verify);
- `ucp-convert` on 1 and on 2 MPI ranks, and `ucp-inspect` of each atomic checkpoint;
- `ucp-reshard` of the 2-rank atomic checkpoint to targets that fit its manifest's layout: its own,
  another DP, another TP, another PP (not MoE), another ZeRO stage, ZeRO-3 (PP=1, not MoE), another
  EP (MoE) and `--format hf`; alternately on 1 and 2 ranks; then `ucp-inspect` of what it wrote.
A step a tool refuses is compared like any other: the same exit code and the same message.

Both builds run each case in the same folder (WORK/run/CASE, then moved to WORK/<a|b>/CASE), so paths the
tools write into files are the same bytes. What varies between two runs of the SAME build, found by
running one build against itself, and is masked (only there):
- in stdout/stderr: the seconds and peak RSS of ucp-convert's and ucp-reshard's summary line; an atomic
  checkpoint's creation time, as ucp-inspect prints it; mpirun's job id and which rank it saw fail
  first (`Process name: [[31632,1],1]`, when a tool refuses on 2 ranks);
- in `ucp_manifest.json`: `created` (the time of the conversion) and `ucp_commit` (each build's own commit);
- by construction: the work folder (the same for both builds, masked in messages anyway), each build's
  own folder and its default patterns folder (its source folder's, compiled in: messages and the
  manifest name the pattern file used), found by `ucp-inspect --list-patterns`.
Nothing else varied between two runs of one build over every case (`--raw` masks none of it, to look
again); everything else is compared byte for byte. The cases are read from the checkout this script lies
in, the same files for both builds.

Prints one line per case and step (`same`, or `DIFFERENT:` the first differing file, for a text file
with its first differing line), then a summary (`--json`: the same as one object); exits 1 on any
difference, 2 when no case or no build's app is found. Both builds take the same steps: the targets come
from the first build's manifest (a manifest that differs is itself reported). The outputs of a case that differs are
kept under WORK/a and WORK/b. On this 2-core machine, loaded: about 9 minutes for every case (46),
2 minutes with `--quick` (one case of each kind).
"""
import argparse
import concurrent.futures
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.normpath(os.path.join(ROOT, "..", "shared"))
DATA = os.path.join(ROOT, "tests", "data")
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_rmaps_base_oversubscribe": "1"}
TIMEOUT = 600

# One case of each kind: DeepSpeed with TP x PP, a Llama (--format hf), ZeRO-3, SP, bf16 without ZeRO,
# Mixture of Experts, DCP, Megatron-Core, Hugging Face Trainer, a refused source, the bundled sample.
QUICK = {"shared/real-deepspeed/tp2_pp2_dp2_zero1_fp32", "shared/real-deepspeed/llama_tp2_dp2_zero1_fp32",
         "shared/real-deepspeed/zero3_dp4_fp32", "shared/real-deepspeed/sp2_dp2_zero1_fp32",
         "data/real-ds0195/v0195_tp2_dp2_bf16_zero0", "data/real-moe/v0195_moe_ep2_dp2_zero2_top1_fp32",
         "shared/real-dcp/tp2", "data/real-mcore/llama_tp2", "shared/real-hftrainer/zero2_dp2_fp32",
         "data/real-dcp-refused/weights_only", "data/sample_llama_tp2_pp2_dp2_bf16"}

# What varies between two runs of one build, in the tools' stdout and stderr (found with --raw).
VARYING_TEXT = [
    (re.compile(r"\bin \d+(\.\d+)?s\b"), "in <seconds>s"),  # ucp-convert's and ucp-reshard's summary
    (re.compile(r"peak RSS \d+(\.\d+)? \w+"), "peak RSS <rss>"),
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"), "<created>"),  # an atomic checkpoint's, as ucp-inspect shows it
    (re.compile(r"Process name: \[\[\d+,\d+\],\d+\]"), "Process name: <mpirun job, first rank to fail>"),
]
# What varies in the files they write, by file name: JSON fields holding a time.
VARYING_FIELDS = {"ucp_manifest.json": ("created", "ucp_commit")}


def patterns_dir_of(build):
    """A build's default patterns folder (its source folder's patterns/, compiled in)."""
    r = subprocess.run([os.path.join(build, "apps", "ucp-inspect"), "--list-patterns"], capture_output=True, text=True)
    m = re.search(r"model-family rule files in (.*):", r.stdout)
    return m.group(1) if m else None


def find_cases(quick, pattern):
    """(name, source folder) of every real case, in a stable order."""
    roots = [("shared/real-deepspeed", os.path.join(SHARED, "real-deepspeed", "cases", "*")),
             ("shared/real-dcp", os.path.join(SHARED, "real-dcp", "cases", "*")),
             ("shared/real-hftrainer", os.path.join(SHARED, "real-hftrainer", "cases", "*")),
             (None, os.path.join(DATA, "real-*", "*")),
             ("data", os.path.join(DATA, "sample_*"))]
    cases = []
    for prefix, pattern_path in roots:
        for case in sorted(glob.glob(pattern_path)):
            source = checkpoint_in(case)
            if source is None:
                continue
            kind = prefix or "data/" + os.path.basename(os.path.dirname(case))
            name = f"{kind}/{os.path.basename(case)}"
            if (quick and name not in QUICK) or (pattern and not re.search(pattern, name)):
                continue
            cases.append((name, source))
    return cases


def checkpoint_in(case):
    """The checkpoint folder of a case folder (ckpt/, checkpoint/, checkpoint-N/, or the case itself)."""
    if not os.path.isdir(case):
        return None
    for sub in ["ckpt", "checkpoint"] + sorted(glob.glob(os.path.join(case, "checkpoint-*"))):
        path = os.path.join(case, sub)
        if os.path.isdir(path):
            return path
    if os.path.exists(os.path.join(case, "latest")) or glob.glob(os.path.join(case, "global_step*")):
        return case
    return None


class Build:
    """One build's apps, and what to mask in their messages."""

    def __init__(self, folder, work, raw=False):
        self.folder, self.raw = os.path.abspath(folder), raw
        self.patterns = patterns_dir_of(self.folder)
        self.masks = [(re.escape(os.path.join(work, "run")), "<work>"), (re.escape(self.folder), "<build>")]
        if self.patterns:
            self.masks.append((re.escape(self.patterns), "<patterns>"))

    def app(self, name):
        return os.path.join(self.folder, "apps", name)

    def run(self, log, app, args, ranks=1):
        """Runs one tool, writing its exit code, stdout and stderr (masked) to LOG."""
        cmd = [self.app(app)] + args
        if ranks > 1:
            cmd = ["mpirun", "--oversubscribe", "-np", str(ranks)] + cmd
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=TIMEOUT,
                               env={**os.environ, **MPI_ENV})
            code, out, err = r.returncode, r.stdout, r.stderr
        except subprocess.TimeoutExpired as e:
            code, out, err = "timeout", str(e.stdout or ""), str(e.stderr or "")
        os.makedirs(os.path.dirname(log), exist_ok=True)
        with open(log, "w") as f:
            f.write(f"$ {app} {' '.join(self.mask(a) for a in args)} (ranks {ranks})\nexit {code}\n"
                    f"--- stdout\n{self.mask(out)}--- stderr\n{self.mask(err)}")
        return code == 0

    def mask(self, text):
        for pattern, label in self.masks:
            text = re.sub(pattern, label, text)
        for pattern, label in [] if self.raw else VARYING_TEXT:
            text = pattern.sub(label, text)
        return text


def missing_app(build):
    """Which of a build's apps is not there, said; or None."""
    for app in ("ucp-convert", "ucp-reshard", "ucp-inspect"):
        path = os.path.join(build, "apps", app)
        if not os.access(path, os.X_OK):
            return f"compare_builds.py: {path}: not an executable (build {build} first)"
    return None


def inspect_all(build, step_dir, folder):
    """ucp-inspect of FOLDER as text, as JSON and with --verify."""
    for name, flags in (("inspect", []), ("inspect-json", ["--json"]), ("inspect-verify", ["--verify"])):
        build.run(os.path.join(step_dir, name + ".log"), "ucp-inspect", [folder] + flags)


def reshard_targets(manifest, case):
    """(name, ucp-reshard flags) of the targets that fit an atomic checkpoint's source layout."""
    s = manifest.get("source", {})
    dp, tp, pp, zero = s.get("dp", 1), s.get("tp", 1), s.get("pp", 1), s.get("zero_stage", 1)
    moe, ep = s.get("moe", False), s.get("ep", 1)

    def layout(**change):
        d = {"dp": dp, "tp": tp, "pp": pp, "zero-stage": zero, **({"ep": ep} if moe else {}), **change}
        return [x for k, v in d.items() for x in (f"--{k}", str(v))]

    other = lambda n: 1 if n > 1 else 2  # noqa: E731
    # MoE: ep must keep dividing dp x tp.
    targets = [("own", layout()), ("dp", layout(dp=2 * dp if moe else other(dp))), ("tp", layout(tp=other(tp)))]
    if not moe:
        targets.append(("pp", layout(pp=other(pp))))
    if zero != 1:
        targets.append(("zero", layout(**{"zero-stage": 1})))
    else:  # ZeRO-2 has no pipeline; ZeRO-0 of an fp32 job is DeepSpeed's BF16 optimizer
        targets.append(("zero", layout(**{"zero-stage": 2}) if pp == 1 else layout(**{"zero-stage": 0}) + ["--dtype", "bf16"]))
    if pp == 1 and zero != 3 and not moe:
        targets.append(("zero3", layout(**{"zero-stage": 3})))
    if moe:
        targets.append(("ep", layout(ep=other(ep))))
    # A DCP holds no model facts: the tests give them (tests/data/hf/dcp_<case>/model_config.json).
    config = os.path.join(DATA, "hf", "dcp_" + os.path.basename(case), "model_config.json")
    targets.append(("hf", ["--format", "hf"] + (["--model-config", config] if "real-dcp/" in case and
                                                 os.path.exists(config) else [])))
    return targets


def run_case(build, work, name, source, targets):
    """Every step of one case with one build, into WORK/run/NAME. Returns the reshard targets run (the
    first build's, so both builds take the same steps)."""
    case_dir = os.path.join(work, "run", name)
    shutil.rmtree(case_dir, ignore_errors=True)
    inspect_all(build, os.path.join(case_dir, "source"), source)
    for ranks in (1, 2):
        step = os.path.join(case_dir, f"convert-np{ranks}")
        out = os.path.join(step, "out")
        if build.run(os.path.join(step, "convert.log"), "ucp-convert", [source, "-o", out], ranks):
            inspect_all(build, step, out)
    atomic = os.path.join(case_dir, "convert-np2", "out")
    if targets is None:
        try:
            targets = reshard_targets(json.load(open(os.path.join(atomic, "ucp_manifest.json"))), name)
        except (OSError, ValueError):
            targets = []
    for i, (target, flags) in enumerate(targets):
        step = os.path.join(case_dir, f"reshard-{target}")
        out = os.path.join(step, "out")
        if build.run(os.path.join(step, "reshard.log"), "ucp-reshard", [atomic, "-o", out] + flags, 1 + i % 2):
            inspect_all(build, step, out)
    return targets


def masked_bytes(path, build):
    """A file's bytes, with the fields that vary between runs of one build blanked, and the build's
    patterns folder (the manifest names the pattern file it used) as <patterns>."""
    data = open(path, "rb").read()
    if build.patterns:
        data = data.replace(build.patterns.encode(), b"<patterns>")
    for field in () if build.raw else VARYING_FIELDS.get(os.path.basename(path), ()):
        data = re.sub(rb'("' + field.encode() + rb'"\s*:\s*)("[^"]*"|-?\d+)', rb"\1<varies>", data)
    return data


def tree(folder):
    """Relative paths of everything under FOLDER: files, folders (ending in /) and links (ending in @)."""
    out = []
    for parent, dirs, files in os.walk(folder):
        for d in dirs:
            rel = os.path.relpath(os.path.join(parent, d), folder)
            out.append(rel + ("@" if os.path.islink(os.path.join(parent, d)) else "/"))
        for f in files:
            rel = os.path.relpath(os.path.join(parent, f), folder)
            out.append(rel + ("@" if os.path.islink(os.path.join(parent, f)) else ""))
    return sorted(out)


def first_difference(a, b, builds):
    """The first path under A and B that differs (only in one, or other bytes), with a hint; or None."""
    ta, tb = tree(a), tree(b)
    if ta != tb:
        only = sorted(set(ta) ^ set(tb))[0]
        return f"{only} (only in {'baseline' if only in ta else 'build'})"
    for rel in ta:
        pa, pb = os.path.join(a, rel.rstrip("@")), os.path.join(b, rel.rstrip("@"))
        if rel.endswith("@"):
            if os.readlink(pa) != os.readlink(pb):
                return f"{rel} (link target)"
        elif not rel.endswith("/") and masked_bytes(pa, builds[0]) != masked_bytes(pb, builds[1]):
            return rel + line_hint(pa, pb)
    return None


def line_hint(a, b):
    """For a text file, its first differing line in each build."""
    try:
        la, lb = open(a).read().splitlines(), open(b).read().splitlines()
    except (UnicodeDecodeError, OSError):
        return ""
    for x, y in zip(la + [""] * len(lb), lb + [""] * len(la)):
        if x != y:
            return f": baseline {x[:160]!r} / build {y[:160]!r}"
    return ""


def compare_case(builds, work, name, source, keep):
    """Runs one case with both builds and compares step by step: [(step, difference or None)]."""
    targets = None
    for label, build in zip("ab", builds):
        targets = run_case(build, work, name, source, targets)
        dest = os.path.join(work, label, name)
        shutil.rmtree(dest, ignore_errors=True)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        os.rename(os.path.join(work, "run", name), dest)
    a, b = (os.path.join(work, label, name) for label in "ab")
    steps = sorted(set(os.listdir(a)) | set(os.listdir(b)))
    results = []
    for step in steps:
        if not (os.path.isdir(os.path.join(a, step)) and os.path.isdir(os.path.join(b, step))):
            results.append((step, f"{step} (only in {'baseline' if os.path.isdir(os.path.join(a, step)) else 'build'})"))
        else:
            results.append((step, first_difference(os.path.join(a, step), os.path.join(b, step), builds)))
    if not keep and all(d is None for _, d in results):
        for label in "ab":
            shutil.rmtree(os.path.join(work, label, name), ignore_errors=True)
    return results


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", required=True, help="the build to compare against (its apps/)")
    p.add_argument("--build", required=True, help="the build under test")
    p.add_argument("--work", help="scratch folder (default: a new one under $TMPDIR, removed at the end)")
    p.add_argument("--quick", action="store_true", help="one case of each kind")
    p.add_argument("--case", help="only cases whose name matches this regex")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--jobs", type=int, default=2, help="cases run at once (default 2)")
    p.add_argument("--keep", action="store_true", help="keep the outputs of cases that compare the same")
    p.add_argument("--raw", action="store_true", help="mask nothing that varies between runs (to find what does: "
                   "give one build twice)")
    args = p.parse_args()
    cases = find_cases(args.quick, args.case)
    if not cases:
        print("compare_builds.py: no case found", file=sys.stderr)
        return 2
    for build in (args.baseline, args.build):
        if missing_app(build):
            print(missing_app(build), file=sys.stderr)
            return 2
    work = os.path.abspath(args.work) if args.work else tempfile.mkdtemp(prefix="ucp-compare-")
    os.makedirs(work, exist_ok=True)
    builds = [Build(args.baseline, work, args.raw), Build(args.build, work, args.raw)]
    rows = []
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futures = [pool.submit(compare_case, builds, work, name, source, args.keep) for name, source in cases]
        for (name, _), future in zip(cases, futures):
            for step, diff in future.result():
                rows.append({"case": name, "step": step, "same": diff is None, "first_difference": diff})
                if not args.json:
                    print(f"{name} {step}: " + ("same" if diff is None else f"DIFFERENT: {diff}"), flush=True)
    different = [r for r in rows if not r["same"]]
    summary = {"cases": len(cases), "steps": len(rows), "different": len(different), "work": work}
    if args.json:
        print(json.dumps({"results": rows, "summary": summary}, indent=1))
    else:
        print(f"{len(cases)} cases, {len(rows)} steps: " +
              (f"{len(different)} DIFFERENT (outputs kept under {work})" if different else "all the same"))
    if not args.work and not different and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if different else 0


if __name__ == "__main__":
    sys.exit(main())
