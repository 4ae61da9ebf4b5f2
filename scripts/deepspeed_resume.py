#!/usr/bin/env python3
"""DeepSpeed itself resumes from what ucp writes: the check before a format change is called done.

For every real case (shared/real-deepspeed/cases/*) and every layout its case.json resumed on, the
real DeepSpeed harness trains steps 7-10 twice:
  universal  from ucp-convert's atomic checkpoint ("checkpoint": {"load_universal": true});
  native     from ucp-reshard's files for that layout (DeepSpeed's ordinary --load);
  in-place   from a copy of the case's own checkpoint root after `ucp-reshard ROOT --in-place` to that
             layout (the job-script step: `latest` then names the resharded tag; --load ROOT);
and the losses are compared with the uninterrupted run. A resume passes when its largest loss
difference is within 2x what DeepSpeed's own universal resume got (case.json), and, where DeepSpeed's
own path is known wrong (TP=1 -> TP=2: it splits row-parallel weights on the wrong dimension),
within 1e-5 of the uninterrupted run.

Needs DeepSpeed v0.14.5 set up as shared/real-deepspeed/harness/README.md says (CI has none):
    ORACLE=/work/oracle scripts/deepspeed_resume.py [--case NAME] [--work DIR] [--markdown FILE]
The Mixture-of-Experts cases (where DeepSpeed's converter failed, the bound is the fp32 noise
between layouts; --ep-size in a resume's arguments becomes ucp-reshard's --ep):
    ORACLE=/work/oracle scripts/deepspeed_resume.py --cases tests/data/real-moe --kinds native,universal
and the same cases trained without gradient clipping (a harness copy whose train.py has
"gradient_clipping": 0.0; tests/data/real-moe/README.md says why and how):
    ORACLE=/work/oracle scripts/deepspeed_resume.py --harness HARNESS_COPY --cases RUNS --kinds native
Cases written by another DeepSpeed (the harness's --set ds0195 / moe: v0.19.5 on torch 2.6, in a
Debian trixie chroot whose /work is this machine's): --chroot ROOT runs the training there, with
--deepspeed the source tree it imports; --work must then lie under /work too:
    ORACLE=/work/oracle scripts/deepspeed_resume.py --chroot $ORACLE/trixie --deepspeed $ORACLE/ds0195 \
        --cases $ORACLE/runs-ds0195 --work $ORACLE/resume195
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, env=None, what=""):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{what or cmd[0]}: exit {r.returncode}\n{r.stdout[-1500:]}\n{r.stderr[-3000:]}")
    return r


def losses_of(log):
    out = {}
    with open(log) as f:
        for line in f:
            j = json.loads(line)
            if "loss" in j and "step" in j:
                out[str(j["step"])] = j["loss"]
    return out


def layout_flags(args, nproc):
    tok = {k: int(v) for k, v in re.findall(r"--(tp|pp|zero|ep-size) (\d+)", args)}
    tp, pp, zero = tok.get("tp", 1), tok.get("pp", 1), tok.get("zero", 1)
    dtype = "bf16" if "--dtype bf16" in args else "fp32"
    model = "pipe" if pp > 1 else "plain"
    accum = re.search(r"--grad-accum-dtype (\w+)", args)  # else DeepSpeed's default under ZeRO: the training dtype
    return ["--dp", str(nproc // (tp * pp)), "--tp", str(tp), "--pp", str(pp), "--zero-stage", str(zero),
            "--dtype", dtype, "--model", model, "--make-vocab-size-divisible-by", "128",
            "--grad-accum-dtype", accum.group(1) if accum else dtype] + \
        (["--ep", str(tok["ep-size"])] if "ep-size" in tok else [])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=os.path.join(ROOT, "..", "shared", "real-deepspeed", "cases"))
    ap.add_argument("--harness", default=os.path.join(ROOT, "..", "shared", "real-deepspeed", "harness"))
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "apps"))
    ap.add_argument("--work", default="/tmp/ucp-deepspeed-resume")
    ap.add_argument("--case", action="append", help="only these cases")
    ap.add_argument("--markdown", help="write the table here too")
    ap.add_argument("--kinds", default="universal,native,in-place",
                    help="which loads to try (universal: DeepSpeed's universal load of ucp-convert's output; native: "
                         "ucp-reshard's files; in-place: ucp-reshard --in-place)")
    ap.add_argument("--also", action="append", default=[], metavar="ZERO:EP:NPROC",
                    help="resume on this layout too (ZeRO stage, expert-parallel degree, ranks), the case's first "
                         "resume's arguments otherwise: a layout DeepSpeed's own resumes did not try (its bound is "
                         "then the fp32 noise between layouts)")
    ap.add_argument("--resume", action="append", default=[], metavar="NPROC=ARGS",
                    help="resume on this layout too, given whole: ranks and train.py's arguments (\"4=--pp 2 --zero 1 "
                         "--dtype bf16 --grad-accum-dtype fp32\")")
    ap.add_argument("--deepspeed", help="the DeepSpeed source tree to import (default $ORACLE/deepspeed)")
    ap.add_argument("--chroot", help="train inside this root file system (its /work being this machine's)")
    a = ap.parse_args()
    oracle = os.environ.get("ORACLE")
    ds_root = a.deepspeed or os.path.join(oracle or "", "deepspeed")
    if not os.path.isdir(os.path.join(ds_root, "deepspeed")):
        sys.exit("set ORACLE to the folder holding deepspeed/, or give --deepspeed (shared/real-deepspeed/harness/README.md, section 1)")
    env = dict(os.environ, PYTHONPATH=ds_root, DS_ACCELERATOR="cpu", DS_BUILD_OPS="0", OMP_NUM_THREADS="1")
    rows, failed, port = [], 0, 29700
    for case in sorted(a.case or os.listdir(a.cases)):
        if not os.path.isfile(os.path.join(a.cases, case, "case.json")):
            continue  # (a README beside the cases)
        spec = json.load(open(os.path.join(a.cases, case, "case.json")))
        base = spec["losses"]
        src = os.path.join(a.cases, case, "ckpt")
        work = os.path.join(a.work, case)
        shutil.rmtree(work, ignore_errors=True)
        atomic_root = os.path.join(work, "atomic_root")
        try:
            run([os.path.join(a.bin, "ucp-convert"), src, "-o", os.path.join(atomic_root, "global_step6_universal"), "-q"],
                what="ucp-convert")
        except RuntimeError as e:
            # A variant ucp refuses by name (as DeepSpeed's own converter does, case.json says): no
            # resume to run. Any other failure of ucp-convert is a failure here.
            refused = "not supported yet" in str(e) and spec.get("ds_to_universal", {}).get("rc", 0) != 0
            failed += not refused
            print(f"{case}: ucp-convert {'refuses it by name, as ds_to_universal.py does' if refused else 'FAILED'}: "
                  f"{str(e).strip().splitlines()[-1][-300:]}", flush=True)
            continue
        with open(os.path.join(atomic_root, "latest"), "w") as f:  # the tag the universal load starts from
            f.write("global_step6")
        resumes = list(spec["resume"])
        for also in a.also:
            zero, ep, nproc = (int(x) for x in also.split(":"))
            args = re.sub(r"--zero \d+", f"--zero {zero}", resumes[0]["args"])
            args = re.sub(r"--ep-size \d+", f"--ep-size {ep}", args)
            resumes.append({"name": f"also_z{zero}_ep{ep}_n{nproc}", "nproc": nproc, "args": args})
        for k, extra in enumerate(a.resume):
            nproc, args = extra.split("=", 1)
            resumes.append({"name": f"resume{k}_n{nproc}", "nproc": int(nproc), "args": args})
        for r in resumes:
            for kind in a.kinds.split(","):
                if kind == "universal":
                    load = atomic_root
                elif kind == "in-place":
                    load = os.path.join(work, "in_place_" + r["name"])
                    shutil.copytree(src, load)
                    run([os.path.join(a.bin, "ucp-reshard"), load, "--in-place", "-q"] + layout_flags(r["args"], r["nproc"]),
                        what="ucp-reshard --in-place")
                else:
                    load = os.path.join(work, "native_" + r["name"])
                    try:
                        run([os.path.join(a.bin, "ucp-reshard"), os.path.join(atomic_root, "global_step6_universal"),
                             "-o", load, "-q"] + layout_flags(r["args"], r["nproc"]), what="ucp-reshard")
                    except RuntimeError as e:
                        # A target layout ucp-reshard refuses by name: no resume, a row saying so.
                        why = str(e).strip().splitlines()[-1]
                        if "error: target " not in why:
                            raise
                        rows.append((case, r["name"], r["nproc"], kind, None, r.get("max_abs_loss_diff_vs_original"),
                                     None, True))
                        print(f"{case:24} {r['name']:38} {kind:9} refused by ucp-reshard: {why[-200:]}", flush=True)
                        continue
                log = os.path.join(work, f"{kind}_{r['name']}.jsonl")
                port += 1
                cmd = ["/usr/bin/python3", "launch.py", str(r["nproc"]), "--port", str(port), "--", "train.py", "--out",
                       os.path.join(work, "tmp"), "--steps", "10", "--lr", spec["lr"], "--load", load, "--no-save",
                       "--log", log] + r["args"].split() + (["--load-universal"] if kind == "universal" else [])
                if a.chroot:
                    # (chroot keeps `env` but starts in /: env -C enters the harness there)
                    cmd = ["chroot", a.chroot, "/usr/bin/env", "-C", os.path.abspath(a.harness)] + cmd
                try:
                    subprocess.run(cmd, cwd=a.harness, env=env, capture_output=True, text=True, check=True, timeout=600)
                    got = losses_of(log)
                    diff = max(abs(got[s] - base[s]) for s in ("7", "8", "9", "10"))
                except Exception as e:  # noqa: BLE001 - reported in the table
                    got, diff = {}, float("inf")
                    print(f"{case} {r['name']} {kind}: {str(e)[-2000:]}", file=sys.stderr)
                ds = r.get("max_abs_loss_diff_vs_original")
                expected_wrong = "EXPECTED_MISMATCH" in r["name"]
                # DeepSpeed's own resume is the bound; where it has none (its converter failed), the
                # noise between layouts DeepSpeed's own resumes of the dense cases measured, doubled:
                # fp32 <= 9.54e-07; bf16 <= 3.76e-04 (zero2_dp2_bf16 -> dp4, DeepSpeed 0.19.5).
                noise = 2 * 3.77e-4 if "--dtype bf16" in r["args"] else 2e-6
                bound = 1e-5 if expected_wrong else (2 * ds if ds is not None else noise)
                ok = diff <= bound
                failed += not ok
                rows.append((case, r["name"], r["nproc"], kind, diff, ds, bound, ok))
                print(f"{case:24} {r['name']:38} {kind:9} ucp {diff:.3g}  DeepSpeed {ds if ds is None else f'{ds:.3g}'}  bound {bound:.3g}  "
                      f"{'ok' if ok else 'FAIL'}", flush=True)
    table = ["| case | resumed on | ranks | load | max loss diff (ucp) | DeepSpeed's own | bound | |",
             "|---|---|---|---|---|---|---|---|"]
    for case, name, n, kind, diff, ds, bound, ok in rows:
        if diff is None:  # the target layout refused by name
            table.append(f"| {case} | {name} | {n} | {kind} | refused by ucp-reshard | "
                         f"{'none' if ds is None else f'{ds:.3g}'} | | |")
            continue
        table.append(f"| {case} | {name} | {n} | {kind} | {diff:.3g} | {'none' if ds is None else f'{ds:.3g}'} | {bound:.3g} | "
                     f"{'ok' if ok else 'FAIL'} |")
    print("\n".join(table))
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write("\n".join(table) + "\n")
    print(f"{len(rows) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
