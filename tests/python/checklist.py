"""The end-to-end test scripts' one idea of a check: a labelled line, ok or FAIL with the detail, and
the exit status from all of them.

    from checklist import cases_holding, check, finish, fresh_folder, tool_runner
    run = tool_runner(BIN_DIR, MPIEXEC)     # run("ucp-convert", [SRC, "-o", OUT], ranks=2)
    r = run("ucp-convert", [src, "-o", out])
    check("written", r.returncode == 0, r.stderr)
    finish("case")   # "case: 0 problems", exit 0; else the labels that failed, exit 1
"""
import os
import shutil
import subprocess
import sys

problems = []


def check(label, ok, detail=""):
    print(f"{label}: {'ok' if ok else 'FAIL'} {'' if ok else detail}")
    if not ok:
        problems.append(label)


def finish(name=""):
    print(f"{name + ': ' if name else ''}{len(problems)} problems" + (": " + ", ".join(problems) if problems else ""))
    sys.exit(1 if problems else 0)


def tool_runner(bin_dir, mpiexec=None):
    """run(tool, args, ranks=1): bin_dir/tool with args, under `mpiexec --oversubscribe -np ranks` when
    ranks > 1 and an mpiexec is given (else as one process); stdout and stderr captured as text."""
    def run(tool, args, ranks=1):
        cmd = [os.path.join(bin_dir, tool), *args]
        if ranks > 1 and mpiexec:
            cmd = [mpiexec, "--oversubscribe", "-np", str(ranks)] + cmd
        return subprocess.run(cmd, capture_output=True, text=True)
    return run


def fresh_folder(path):
    """`path` emptied (a test's work folder: nothing of an earlier run read as this one's)."""
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)


def cases_holding(folder, name):
    """The sub-folders of `folder` that hold a file `name` (a case's marker: reference.pt, expect.txt), sorted."""
    return sorted(c for c in os.listdir(folder) if os.path.isfile(os.path.join(folder, c, name)))


def refused_when_damaged(run, work, label, src, mutate, expect):
    """A copy of checkpoint folder `src` under work/damaged/<label>, changed by mutate(folder): ucp-convert
    (2 ranks) must fail with every string of `expect` in its error, without a traceback or an abort,
    and leave no manifest."""
    d = os.path.join(work, "damaged", label.replace(" ", "_"))
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(src, os.path.join(d, "ckpt"))
    for folder, _, files in os.walk(os.path.join(d, "ckpt")):  # writable, whatever the source's modes
        for f in files:
            os.chmod(os.path.join(folder, f), 0o644)
    mutate(os.path.join(d, "ckpt"))
    out = os.path.join(d, "out")
    r = run("ucp-convert", [os.path.join(d, "ckpt"), "-o", out], ranks=2)
    check(f"damaged: {label}: refused naming it", r.returncode != 0 and all(e in r.stderr for e in expect) and
          "Traceback" not in r.stderr and "terminate called" not in r.stderr, f"rc {r.returncode}: {r.stderr[-1200:]}")
    check(f"damaged: {label}: no manifest left", not os.path.exists(os.path.join(out, "ucp_manifest.json")))
    return os.path.join(d, "ckpt")
