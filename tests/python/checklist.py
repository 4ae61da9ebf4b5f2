"""The end-to-end test scripts' one idea of a check: a labelled line, ok or FAIL with the detail, and
the exit status from all of them.

    from checklist import check, finish
    check("written", r.returncode == 0, r.stderr)
    finish("case")   # "case: 0 problems", exit 0; else the labels that failed, exit 1
"""
import sys

problems = []


def check(label, ok, detail=""):
    print(f"{label}: {'ok' if ok else 'FAIL'} {'' if ok else detail}")
    if not ok:
        problems.append(label)


def finish(name=""):
    print(f"{name + ': ' if name else ''}{len(problems)} problems" + (": " + ", ".join(problems) if problems else ""))
    sys.exit(1 if problems else 0)
