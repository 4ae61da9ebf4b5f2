#!/usr/bin/env python3
"""The real Hugging Face Trainer resumes from what ucp writes: the check of issue 43, and its record.

For every Trainer case (a folder holding checkpoint-4/ and case.json, as shared/real-hftrainer/cases
and tests/data/real-hftrainer hold them) and every target layout (DP 1, 2, 4 at the case's ZeRO stage,
and the case's DP at the other stages 1-3):
    ucp-convert CASE/checkpoint-4 -o ATOMIC
    ucp-reshard ATOMIC -o OUT --dp D --tp 1 --pp 1 --zero-stage Z     (OUT: a checkpoint-4 folder)
    Trainer.train(resume_from_checkpoint=OUT) on D processes, ZeRO-Z, the job's own ds_config (no
        load_universal): scripts/trainer_resume_one.py, the real transformers + accelerate + DeepSpeed
        0.19.5 in a Debian trixie chroot
and the losses of steps 5-8 are compared with the uninterrupted run's (case.json), beside DeepSpeed's
own universal resume at that world size (case.json resume_univ_w<D>; ZeRO-3's is known wrong, see the
corpus README). It prints the table and, with --record, writes FILE: per case and target the sha256
of every file ucp wrote and the losses; CI (tests/python/hftrainer_resume_record.py) checks that ucp
still writes those exact bytes, so the recorded resumes stay true of every build.

    scripts/trainer_resume.py --bin build/apps --cases DIR... [--record FILE] [--markdown FILE] [--work DIR]
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def tree_hashes(d):
    out = {}
    for root, dirs, files in os.walk(d):
        dirs[:] = [x for x in dirs if not x.startswith(".ucp")]
        for f in files:
            if f.startswith(".ucp"):
                continue
            p = os.path.join(root, f)
            out[os.path.relpath(p, d)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return dict(sorted(out.items()))


def targets(case):
    stage, world = case["zero_stage"], case["world_size"]
    t = [(d, stage) for d in (1, 2, 4)]
    t += [(world, z) for z in (1, 2, 3) if z != stage]
    return t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", required=True)
    ap.add_argument("--cases", nargs="+", required=True)
    ap.add_argument("--work", default="/tmp/ucp-trainer-resume")
    ap.add_argument("--record", default=None)
    ap.add_argument("--markdown", default=None)
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    record, rows = {}, []
    for case_dir in a.cases:
        case = json.load(open(os.path.join(case_dir, "case.json")))
        name = case["case"]
        ref = case["steps"]["full"]["losses"]
        atomic = os.path.join(a.work, name, "atomic")
        subprocess.run([os.path.join(a.bin, "ucp-convert"), os.path.join(case_dir, "checkpoint-4"), "-o", atomic, "-q"], check=True)
        record[name] = {}
        for d, z in targets(case):
            out = os.path.join(a.work, name, f"dp{d}_z{z}", "checkpoint-4")
            subprocess.run([os.path.join(a.bin, "ucp-reshard"), atomic, "-o", out, "--dp", str(d), "--tp", "1", "--pp", "1",
                            "--zero-stage", str(z), "-q"], check=True)
            result = os.path.join(a.work, name, f"dp{d}_z{z}.json")
            subprocess.run([sys.executable, os.path.join(HERE, "trainer_resume_one.py"), "--checkpoint", out, "--world", str(d),
                            "--stage", str(z), "--dtype", case["dtype"], "--gather16",
                            str(int(bool(case.get("stage3_gather_16bit_weights_on_model_save")))), "--result", result] +
                           (["--sub-group-size", str(case["sub_group_size"])] if case.get("sub_group_size") else []),
                           stdout=subprocess.DEVNULL)
            r = json.load(open(result))
            losses = r.get("losses_5_8") or [None] * 4
            diff = max(abs(x - ref[str(s)]) for s, x in zip(range(5, 9), losses)) if r["rc"] == 0 and None not in losses else None
            univ = case["steps"].get(f"resume_univ_w{d}", {})
            udiff = (univ.get("vs_full") or {}).get("max_abs_diff") if isinstance(univ, dict) else None
            entry = {"files": tree_hashes(out), "rc": r["rc"], "losses_5_8": losses, "max_abs_diff": diff, "error": r.get("error")}
            if case["dtype"] == "bf16" and z != case["zero_stage"]:
                # bf16's reduction order changes with the ZeRO stage: the uninterrupted run of the target
                # layout (from scratch), against the case's, is what a stage change may differ by.
                scratch = os.path.join(a.work, name, f"dp{d}_z{z}_scratch.json")
                subprocess.run([sys.executable, os.path.join(HERE, "trainer_resume_one.py"), "--world", str(d), "--stage", str(z),
                                "--dtype", "bf16", "--gather16", "1", "--result", scratch], stdout=subprocess.DEVNULL)
                s = json.load(open(scratch))
                if s["rc"] == 0 and None not in s["losses_5_8"]:
                    entry["layout_noise"] = max(abs(x - ref[str(k)]) for k, x in zip(range(5, 9), s["losses_5_8"]))
            record[name][f"dp{d}_z{z}"] = entry
            rows.append((name, d, z, r["rc"], diff, udiff, r.get("error", ""), entry.get("layout_noise")))
            print(f"{name} -> dp={d} ZeRO-{z}: rc={r['rc']} max|diff| {diff} (DeepSpeed universal at w{d}: {udiff}; "
                  f"uninterrupted run of the target layout: {entry.get('layout_noise')})", flush=True)
    lines = ["| case | target | Trainer resume | max abs diff steps 5-8 vs uninterrupted | DeepSpeed universal resume, same world |"
             " bf16: the target layout's own uninterrupted run |",
             "|---|---|---|---|---|---|"]
    for name, d, z, rc, diff, udiff, err, noise in rows:
        lines.append(f"| {name} | dp={d} ZeRO-{z} | {'ok' if rc == 0 else 'FAILED: ' + (err or '').splitlines()[-1][:80]} | "
                     f"{'-' if diff is None else f'{diff:.2e}'} | {'-' if udiff is None else f'{udiff:.2e}'} | "
                     f"{'-' if noise is None else f'{noise:.2e}'} |")
    print("\n".join(lines))
    if a.markdown:
        open(a.markdown, "w").write("\n".join(lines) + "\n")
    if a.record:  # merged into what the file holds: cases run another time are replaced
        if os.path.exists(a.record):
            record = {**json.load(open(a.record)), **record}
        with open(a.record, "w") as f:
            json.dump(record, f, indent=1, sort_keys=True)
            f.write("\n")
    sys.exit(0 if all(r[3] == 0 for r in rows) else 1)


if __name__ == "__main__":
    main()
