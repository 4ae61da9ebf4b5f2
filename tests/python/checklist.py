"""The end-to-end test scripts' one idea of a check: a labelled line, ok or FAIL with the detail, and
the exit status from all of them.

    from checklist import check, finish, tool_runner
    run = tool_runner(BIN_DIR, MPIEXEC)     # run("ucp-convert", [SRC, "-o", OUT], ranks=2)
    r = run("ucp-convert", [src, "-o", out])
    check("written", r.returncode == 0, r.stderr)
    finish("case")   # "case: 0 problems", exit 0; else the labels that failed, exit 1
"""
import os
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
