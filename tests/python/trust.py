"""Issue 29's findings, each a check on a real DeepSpeed checkpoint (../shared/real-deepspeed), each
named after the finding it guards, each failing on the build that had the finding:

  trust.py FINDING UCP_BIN_DIR CASES_DIR WORK

FINDING is one of:
  corrupt_atom      a flipped byte in an atom (both stores): ucp-reshard refuses naming file,
                    parameter and state (HDF5: atoms.h5, hashed whole before HDF5 reads it); no `latest`.
  corrupt_source    a flipped byte in a real optimizer file's tensor record: ucp-convert refuses
                    naming the file and the record's CRC-32; no manifest. ucp-inspect --verify
                    refuses it, and on the clean copy says what it verified (text, JSON).
  precision         an fp32 job resharded without --dtype stays fp32 (file names, dtypes, the
                    planner's candidates); --dtype bf16 is said ("fp32 -> bf16").
  commit_order      an output in its tag's checkpoint root, which takes no file (latest_universal):
                    ucp-convert fails before its manifest.
  resume_finished   --resume on a finished conversion exits 0 and says so; on a damaged one it refuses.
  command_line      every command-line error exits 2 with words (--dp 0: "at least 1").
  never_replace     --in-place on a root holding DeepSpeed's own <tag>_universal leaves it as it
                    was (and converts beside it: issue 42, row 1); --force refuses a folder ucp did not write (DeepSpeed's universal folder,
                    a training run's checkpoint root).
  one_fault         one missing optimizer file, or one damaged record under --verify, is one error
                    line naming the file (the parameters that lost elements counted in it), not
                    one line per parameter; no "0 elements" header.
  small_things      finding 12's wording: "1 model-parallel rank", --plan-only --ranks N says the
                    ranks it planned for (not "single process").
  in_place_plan     --in-place --plan-only [--json] says what the step would do (convert, reshard
                    into which tag, the space) and writes nothing; the JSON validates against its
                    schema; the real step then writes the tag it named.
  layout_validation explicit flags refuse what the planner refuses (tp=4 over 2 key-value heads),
                    in the same words.
"""
import json
import os
import shutil
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ds_stubs  # noqa: E402,F401
from damage import flip, flip_in_record, tree_digest as digest  # noqa: E402
from refusal import refusal_problems  # noqa: E402

finding, bindir, cases, work = sys.argv[1:5]
CONVERT, RESHARD, INSPECT = (os.path.join(bindir, t) for t in ("ucp-convert", "ucp-reshard", "ucp-inspect"))
problems = []


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


def expect(label, p, must, code=1):
    bad = refusal_problems(p, must, code)
    print(f"{label}: {'ok' if not bad else 'FAIL ' + '; '.join(bad)}\n    {(p.stdout + p.stderr).strip()[:400]}")
    problems.extend(f"{label}: {b}" for b in bad)


def check(label, ok, detail=""):
    print(f"{label}: {'ok' if ok else 'FAIL'} {detail}")
    if not ok:
        problems.append(label)


def copy_case(case, where):
    dst = os.path.join(work, where)
    shutil.copytree(os.path.join(cases, case, "ckpt"), dst, ignore=shutil.ignore_patterns("*_universal", "latest_universal"))
    return dst


def convert(src, out, *flags):
    p = run([CONVERT, src, "-o", out, "-q", "--force"] + list(flags))
    if p.returncode != 0:
        sys.exit(f"ucp-convert {src}: exit {p.returncode}: {p.stderr[-800:]}")
    return out


shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
FP32 = "zero1_dp4_fp32"

if finding == "corrupt_atom":
    for store in ("pt", "hdf5"):
        atomic = convert(os.path.join(cases, FP32, "ckpt"), os.path.join(work, store, "universal"), "--format", store)
        victim = "language_model.encoder.layers.1.mlp.dense_4h_to_h.weight"
        if store == "pt":
            path = os.path.join(atomic, "zero", victim, "fp32.pt")
            flip_in_record(path)
            must = [path, victim, "fp32", "damaged"]
        else:
            import h5py
            with h5py.File(os.path.join(atomic, "atoms.h5"), "r+") as h:
                d = h[victim]["exp_avg"]
                d[0, 0] = d[0, 0] + 1.0  # the manifest's (and the attribute's) XXH64 stay as they were
            must = ["atoms.h5", "damaged", "XXH64"]  # hashed whole before HDF5 reads it (issue 42 row 9): no parameter named
        out = os.path.join(work, store, "resharded")
        p = run([RESHARD, atomic, "-o", out, "-q", "--dp", "2", "--tp", "1", "--pp", "1", "--zero-stage", "1"])
        expect(f"corrupt_atom {store}: ucp-reshard refuses", p, must)
        check(f"corrupt_atom {store}: no latest", not os.path.exists(os.path.join(out, "latest")))

elif finding == "corrupt_source":
    case = "tp2_dp2_bf16_zero0"
    src = copy_case(case, "source")
    path = os.path.join(src, "global_step6", "bf16_zero_pp_rank_1_mp_rank_01_optim_states.pt")
    record = flip_in_record(path)
    out = os.path.join(work, "universal")
    p = run([CONVERT, src, "-o", out, "-q"])
    expect("corrupt_source: ucp-convert refuses", p, [path, record, "CRC-32 mismatch"])
    check("corrupt_source: no manifest", not os.path.exists(os.path.join(out, "ucp_manifest.json")))
    # The clean source converts (the check does not refuse good files); inspect --verify says it checked.
    clean = copy_case(case, "clean")
    p = run([CONVERT, clean, "-o", os.path.join(work, "clean_universal"), "-q"])
    check("corrupt_source: the clean copy converts", p.returncode == 0, p.stderr[-300:])
    p = run([INSPECT, src, "--verify"])
    expect("corrupt_source: ucp-inspect --verify refuses (2: unreadable input)", p, ["CRC-32 mismatch"], code=2)
    # Finding 12: --verify on a clean source says what it checked, in text and JSON.
    p = run([INSPECT, clean, "--verify"])
    check("inspect --verify on a clean source says so", p.returncode == 0 and "verified: " in p.stdout, p.stdout[-300:])
    plain = run([INSPECT, clean])
    check("inspect without --verify says nothing of it", "verified" not in plain.stdout)
    p = run([INSPECT, clean, "--verify", "--json"])
    v = json.loads(p.stdout).get("verified", {}) if p.returncode == 0 else {}
    check("inspect --verify --json: records and bytes", v.get("zip_records", 0) > 0 and v.get("bytes", 0) > 0, str(v))

elif finding == "precision":
    atomic = convert(os.path.join(cases, FP32, "ckpt"), os.path.join(work, "universal"))
    out = os.path.join(work, "fp32_target")
    p = run([RESHARD, atomic, "-o", out, "--dp", "2", "--tp", "1", "--pp", "1", "--zero-stage", "1"])
    check("precision: reshard without --dtype", p.returncode == 0, p.stderr[-300:])
    files = sorted(os.listdir(os.path.join(out, "global_step6")))
    check("precision: fp32 job keeps fp32 optimizer file names", files and not any(f.startswith("bf16_") for f in files), str(files))
    ms = torch.load(os.path.join(out, "global_step6", "mp_rank_00_model_states.pt"), map_location="cpu")
    dtypes = {t.dtype for t in ms["module"].values() if torch.is_tensor(t)} if isinstance(ms.get("module"), dict) else set()
    check("precision: the module's weights stay fp32", dtypes == {torch.float32}, str(dtypes))
    check("precision: ds_config keeps bf16 off", not ms["ds_config"].get("bf16", {}).get("enabled", False))
    check("precision: no precision change said", "->" not in p.stderr.split("parameters, from")[-1].split(";")[0], p.stderr[:300])
    p = run([RESHARD, atomic, "--gpus", "2", "--plan-only", "--json"])
    plan = json.loads(p.stdout) if p.returncode == 0 else {}
    dts = {c["layout"]["dtype"] for c in plan.get("candidates", [])}
    check("precision: --gpus plans in the job's fp32", dts == {"fp32"}, str(dts))
    out = os.path.join(work, "bf16_target")
    p = run([RESHARD, atomic, "-o", out, "--dp", "2", "--tp", "1", "--pp", "1", "--zero-stage", "1", "--dtype", "bf16"])
    check("precision: --dtype bf16 is said", p.returncode == 0 and "fp32 -> bf16" in p.stderr, p.stderr[-300:])

elif finding == "commit_order":
    # The atomic folder is writable, its parent (the tag's checkpoint root, where latest_universal
    # goes) is not. As root, permissions do not bind: the conversion runs as nobody (setpriv), the
    # folder nobody's.
    parent = copy_case(FP32, "locked_parent")
    out = os.path.join(parent, "universal")
    os.makedirs(out)
    src = parent
    prefix = []
    if os.geteuid() == 0:
        prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        for dp, dns, fns in os.walk(work):
            for n in dns + fns:
                os.chmod(os.path.join(dp, n), 0o755) if n in dns else None
        os.chown(out, 65534, 65534)
        os.chmod(work, 0o755)
    os.chmod(parent, 0o555)
    try:
        p = run(prefix + [CONVERT, src, "-o", out, "-q"])
    finally:
        os.chmod(parent, 0o755)
    expect("commit_order: ucp-convert fails", p, ["latest_universal"])
    check("commit_order: no manifest left", not os.path.exists(os.path.join(out, "ucp_manifest.json")))

elif finding == "resume_finished":
    src = os.path.join(cases, FP32, "ckpt")
    out = convert(src, os.path.join(work, "universal"))
    for _ in range(2):
        p = run([CONVERT, src, "-o", out, "--resume"])
        check("resume_finished: --resume on a finished folder exits 0", p.returncode == 0 and "already complete" in p.stderr,
              p.stderr[-300:])
    victim = next(os.path.join(dp, f) for dp, _, fs in os.walk(os.path.join(out, "zero")) for f in fs if f == "exp_avg.pt")
    flip(victim, os.path.getsize(victim) // 2)
    p = run([CONVERT, src, "-o", out, "--resume"])
    expect("resume_finished: a damaged finished folder is refused", p, [victim, "damaged", "--force"])

elif finding == "command_line":
    atomic = os.path.join(work, "none")
    for tool, args, must in [
            (RESHARD, [atomic, "-o", "x", "--dp", "0", "--tp", "1", "--pp", "1", "--zero-stage", "1"], ["--dp", "at least 1"]),
            (RESHARD, [atomic, "-o", "x", "--dp", "two"], ["--dp", "not a whole number"]),
            (RESHARD, [atomic, "--zero-stage", "7"], ["--zero-stage"]),
            (RESHARD, [atomic, "--no-such-flag"], ["--no-such-flag"]),
            (CONVERT, [atomic, "--no-such-flag"], ["--no-such-flag"]),
            (CONVERT, [], ["source checkpoint folder"]),
            (INSPECT, [atomic, "--no-such-flag"], ["--no-such-flag"]),
            (RESHARD, [], ["atomic"]),
            (RESHARD, [atomic, "-o", "x", "--dp", "1", "--tp", "1", "--pp", "1", "--zero-stage", "1", "--json"],
             ["--json goes with --plan-only"]),
            (CONVERT, [atomic, "-o", "x", "--json"], ["--json goes with --plan-only"]),
            (RESHARD, [atomic, "-o", "x", "--dp", "1", "--tp", "1", "--pp", "1", "--zero-stage", "1", "--gpus-per-node", "4"],
             ["--gpus-per-node", "--gpus"]),
            (CONVERT, [atomic, "-o", "x", "--threads", "0"], ["--threads", "at least 1"])]:
        p = run([tool] + args)
        expect(f"command_line: {os.path.basename(tool)} {' '.join(args[1:]) or '(nothing)'}", p, must, code=2)
        check("command_line: message is short", len(p.stderr) < 400, f"{len(p.stderr)} characters")
elif finding == "never_replace":
    root = os.path.join(work, "root")
    shutil.copytree(os.path.join(cases, FP32, "ckpt"), root)

    theirs = os.path.join(root, "global_step6_universal")
    before = digest(theirs)
    p = run([RESHARD, root, "--in-place", "--dp", "2", "--tp", "1", "--pp", "1", "--zero-stage", "1"])
    check("never_replace: --in-place runs", p.returncode == 0, p.stderr[-400:])
    check("never_replace: DeepSpeed's global_step6_universal is as it was", digest(theirs) == before)
    check("never_replace: DeepSpeed's universal folder of this tag is not reused (it records nothing of what it read)",
          "not reused" in p.stderr and os.path.exists(os.path.join(root, "global_step6_ucp_universal", "ucp_manifest.json")),
          p.stderr[-300:])
    check("never_replace: latest names the new tag", open(os.path.join(root, "latest")).read().strip() != "global_step6")
    # From that tag on to another layout: ucp's atomic checkpoint reused, DeepSpeed's folder still as it was.
    p = run([RESHARD, root, "--in-place", "--dp", "4", "--tp", "1", "--pp", "1", "--zero-stage", "2"])
    check("never_replace: a second --in-place from the resharded tag reuses ucp's atomic checkpoint",
          p.returncode == 0 and "reusing the atomic checkpoint" in p.stderr and "global_step6_ucp_universal" in p.stderr and
          digest(theirs) == before, p.stderr[-300:])
    # A <tag>_universal that is not DeepSpeed's of this tag (another tag's model-states files): left as
    # it is, ucp converts beside it.
    other = os.path.join(work, "other_root")
    shutil.copytree(os.path.join(cases, FP32, "ckpt"), other)
    shutil.copy(os.path.join(cases, "zero2_dp3_fp32", "ckpt", "global_step6", "mp_rank_00_model_states.pt"),
                os.path.join(other, "global_step6_universal", "mp_rank_00_model_states.pt"))
    theirs2 = os.path.join(other, "global_step6_universal")
    before2 = digest(theirs2)
    p = run([RESHARD, other, "--in-place", "--dp", "2", "--tp", "1", "--pp", "1", "--zero-stage", "1"])
    check("never_replace: another job's <tag>_universal: left as it was", p.returncode == 0 and digest(theirs2) == before2,
          p.stderr[-300:])
    check("never_replace: ... ucp's atomic checkpoint beside it", os.path.exists(
        os.path.join(other, "global_step6_ucp_universal", "ucp_manifest.json")), p.stderr[-300:])
    theirs, before = theirs2, before2
    p = run([CONVERT, os.path.join(cases, FP32, "ckpt"), "-o", theirs, "--force", "-q"])
    expect("never_replace: ucp-convert --force into DeepSpeed's universal folder", p, ["did not write", theirs])
    stray = os.path.join(work, "stray")
    os.makedirs(stray)
    open(os.path.join(stray, "notes.txt"), "w").write("mine")
    p = run([CONVERT, os.path.join(cases, FP32, "ckpt"), "-o", stray, "--force", "-q"])
    expect("never_replace: ucp-convert --force into a folder of someone's files", p, ["not written by ucp", stray])
    check("never_replace: ... which stay", open(os.path.join(stray, "notes.txt")).read() == "mine")
    check("never_replace: ... which stays as it was", digest(theirs) == before)
    atomic = os.path.join(root, "global_step6_universal")  # DeepSpeed's own, read as an atomic checkpoint
    ds_root = os.path.join(work, "ds_root")
    shutil.copytree(os.path.join(cases, FP32, "ckpt"), ds_root, ignore=shutil.ignore_patterns("*_universal"))
    p = run([RESHARD, atomic, "-o", ds_root, "--force", "-q", "--dp", "4", "--tp", "1", "--pp", "1", "--zero-stage", "1"])
    expect("never_replace: ucp-reshard --force into a training run's root", p, ["not written by ucp-reshard", ds_root])
    check("never_replace: ... whose checkpoint stays", os.path.exists(os.path.join(ds_root, "global_step6", "mp_rank_00_model_states.pt")))

elif finding == "one_fault":
    case = "tp2_pp2_dp2_zero1_fp32"
    lost = "zero_pp_rank_1_mp_rank_01_optim_states.pt"
    missing = copy_case(case, "missing")
    os.remove(os.path.join(missing, "global_step6", lost))
    damaged = copy_case(case, "damaged")
    path = os.path.join(damaged, "global_step6", lost)
    flip_in_record(path)
    for label, cmd, code in [("inspect, a missing file", [INSPECT, missing], 1),
                             ("convert, a missing file", [CONVERT, missing, "-o", os.path.join(work, "out1"), "-q"], 1),
                             ("inspect --verify, a damaged record", [INSPECT, damaged, "--verify"], 2)]:
        p = run(cmd)
        lines = [ln for ln in p.stderr.splitlines() if lost in ln]
        faults = [ln for ln in p.stderr.splitlines() if "missing fragment" in ln]
        check(f"one_fault: {label}: exit {code}", p.returncode == code, f"exit {p.returncode}")
        check(f"one_fault: {label}: one line names the file", len(lines) == 1, "\n" + p.stderr[-600:])
        check(f"one_fault: {label}: no follow-on missing-fragment lines", not faults, f"{len(faults)} of them")
        check(f"one_fault: {label}: no '0 elements' header", " 0 elements" not in p.stdout)

elif finding == "small_things":
    atomic = convert(os.path.join(cases, FP32, "ckpt"), os.path.join(work, "universal"))
    p = run([RESHARD, atomic, "-o", os.path.join(work, "one"), "--dp", "1", "--tp", "1", "--pp", "1", "--zero-stage", "1"])
    check("small_things: '1 model-parallel rank'", p.returncode == 0 and "1 model-parallel rank " in p.stderr and
          "1 model-parallel ranks" not in p.stderr, p.stderr[:300])
    p = run([CONVERT, os.path.join(cases, FP32, "ckpt"), "--plan-only", "--ranks", "3"])
    check("small_things: --plan-only --ranks 3 says 3 ranks", p.returncode == 0 and "planned for 3 MPI ranks" in p.stderr and
          "single process" not in p.stderr, p.stderr[:300])

elif finding == "in_place_plan":
    import jsonschema
    layout = ["--dp", "2", "--tp", "1", "--pp", "1", "--zero-stage", "1"]
    # With DeepSpeed's own universal folder of the tag beside it: not reused (issue 42, row 1), said.
    ds = os.path.join(work, "with_ds_universal")
    shutil.copytree(os.path.join(cases, FP32, "ckpt"), ds)
    p = run([RESHARD, ds, "--in-place", "--plan-only"] + layout)
    check("in_place_plan: DeepSpeed's universal folder would not be reused, and why", p.returncode == 0 and
          "would convert it into" in p.stdout and "global_step6_ucp_universal" in p.stdout and "not reused" in p.stdout,
          p.stdout + p.stderr[-300:])
    # Without it: converted.
    root = os.path.join(work, "root")
    shutil.copytree(os.path.join(cases, FP32, "ckpt"), root, ignore=shutil.ignore_patterns("*_universal"))
    listing = lambda: sorted(os.path.join(dp, f) for dp, _, fs in os.walk(root) for f in fs)  # noqa: E731
    before = listing()
    p = run([RESHARD, root, "--in-place", "--plan-only"] + layout)
    check("in_place_plan: text plan", p.returncode == 0 and "would convert it into" in p.stdout and
          "global_step6_dp2_tp1_pp1_z1_fp32" in p.stdout and "nothing written" in p.stdout, p.stdout + p.stderr[-300:])
    p = run([RESHARD, root, "--in-place", "--plan-only", "--json"] + layout)
    plan = json.loads(p.stdout) if p.returncode == 0 else {}
    schema = json.load(open(os.path.join(os.path.dirname(__file__), "..", "..", "schemas", "in-place-plan.schema.json")))
    try:
        jsonschema.validate(plan, schema)
        check("in_place_plan: JSON validates", True)
    except jsonschema.ValidationError as e:
        check("in_place_plan: JSON validates", False, str(e)[:300])
    check("in_place_plan: action", plan.get("action") == "convert_and_reshard", str(plan.get("action")))
    check("in_place_plan: nothing written", listing() == before)
    p = run([RESHARD, root, "--in-place", "-q"] + layout)
    check("in_place_plan: the step writes the tag it named", p.returncode == 0 and
          open(os.path.join(root, "latest")).read().strip() == plan.get("target_tag"), p.stderr[-300:])
    p = run([RESHARD, root, "--in-place", "--plan-only", "--json"] + layout)
    check("in_place_plan: then nothing to do", p.returncode == 0 and json.loads(p.stdout).get("action") == "nothing")

elif finding == "layout_validation":
    atomic = convert(os.path.join(cases, "tp2_pp2_dp2_zero1_fp32", "ckpt"), os.path.join(work, "universal"))
    out = os.path.join(work, "tp4")
    p = run([RESHARD, atomic, "-o", out, "-q", "--dp", "1", "--tp", "4", "--pp", "1", "--zero-stage", "1"])
    expect("layout_validation: --tp 4 over 2 key-value heads", p, ["tp=4 does not divide the 2 key-value heads"])
    check("layout_validation: nothing written", not os.path.exists(os.path.join(out, "latest")))
    p = run([RESHARD, atomic, "--gpus", "4", "--tp", "4", "--plan-only"])
    expect("layout_validation: the planner, same words", p, ["tp=4 does not divide the 2 key-value heads"])
else:
    sys.exit(f"unknown finding {finding}")

print(f"{finding}: {len(problems)} problems")
sys.exit(1 if problems else 0)
