"""A checking script run inside the test's own process, as it would run on its own: one torch import
serves every run (a fresh interpreter costs a second or more of CPU each, most of a small case's check).

    code, output = run_script(path, argv)   # exit status and what it printed (stdout and stderr)
"""
import contextlib
import io
import runpy
import sys


def run_script(path, argv):
    out = io.StringIO()
    saved = sys.argv
    sys.argv = [path] + [str(a) for a in argv]
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        if isinstance(e.code, int) or e.code is None:
            code = e.code or 0
        else:  # sys.exit("message"): printed, exit status 1, as the interpreter does
            out.write(f"{e.code}\n")
            code = 1
    finally:
        sys.argv = saved
    return code, out.getvalue()
