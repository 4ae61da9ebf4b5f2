#!/usr/bin/env python3
"""The shape of the code: the longest functions and files, to keep each one step of the data flow.

    python3 scripts/code_shape.py [--functions-over 80] [--files-over 600] [--json] [ROOT]

A function is a brace block opened after a ')' (or a trailer such as 'const', 'override', '-> T')
outside any other function; a class's length is counted too. Strings, characters and comments are
skipped. Lambdas and blocks inside a function count toward the function. The unpickler's opcode
switch is the one function allowed past the limit (issue 45). Exit status 0 always: a report.
"""
import argparse
import json
import pathlib
import re
import sys

ALLOWED = {("lib/pt/unpickler.cpp", "Machine::Run")}


def strip(text):
    """The text with comments, strings and character literals blanked, line breaks kept."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i)); i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j])); i = j
        elif text.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', text[i:])
            end = text.find(")" + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j])); i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(" " * (j + 1 - i)); i = j + 1
        else:
            out.append(c); i += 1
    return "".join(out)


HEAD = re.compile(r"(\)\s*(const|override|final|noexcept|mutable|\s)*(->\s*[\w:<>,\s*&]+)?\s*$)|"
                  r"(\b(class|struct)\s+(\w+)[^;{]*$)")
NAME = re.compile(r"([\w:~]+(operator\W+)?)\s*\([^()]*(\([^()]*\)[^()]*)*\)\s*[\w\s:<>,*&\->]*$")


def blocks(path, rel):
    text = strip(path.read_text(errors="replace"))
    stack = []  # (kind, name, start line)
    found = []
    line = 1
    last = 0
    for i, c in enumerate(text):
        if c == "\n":
            line += 1
        elif c == "{":
            head = text[last:i]
            last = i + 1
            inside_function = any(k == "function" for k, _, _ in stack)
            kind, name = "block", ""
            if not inside_function:
                m = HEAD.search(head)
                if m and m.group(5):
                    kind, name = "class", m.group(6)
                elif m:
                    nm = NAME.search(head.strip())
                    kind = "function"
                    name = nm.group(1) if nm else "?"
                    if name in ("if", "for", "while", "switch", "catch"):
                        kind = "block"
            stack.append((kind, name, line))
        elif c in "};":
            last = i + 1
            if c == "}" and stack:
                kind, name, start = stack.pop()
                if kind in ("function", "class"):
                    outer = [n for k, n, _ in stack if k == "class"]
                    full = "::".join(outer + [name]) if outer and "::" not in name else name
                    found.append({"file": rel, "kind": kind, "name": full,
                                  "line": start, "lines": line - start + 1})
    return found, text.count("\n") + 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", nargs="?", default=str(pathlib.Path(__file__).resolve().parent.parent))
    ap.add_argument("--functions-over", type=int, default=80)
    ap.add_argument("--files-over", type=int, default=600)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    root = pathlib.Path(a.root)
    funcs, files = [], []
    for p in sorted(list(root.glob("lib/**/*.[ch]*")) + list(root.glob("apps/**/*.[ch]*"))):
        if p.suffix not in (".cpp", ".h"):
            continue
        rel = str(p.relative_to(root))
        found, n = blocks(p, rel)
        funcs += found
        files.append({"file": rel, "lines": n})
    long_funcs = sorted((f for f in funcs if f["kind"] == "function" and f["lines"] > a.functions_over),
                        key=lambda f: -f["lines"])
    long_classes = sorted((f for f in funcs if f["kind"] == "class" and f["lines"] > a.files_over / 2),
                          key=lambda f: -f["lines"])
    long_files = sorted((f for f in files if f["lines"] > a.files_over), key=lambda f: -f["lines"])
    for f in long_funcs:
        f["allowed"] = (f["file"], f["name"]) in ALLOWED
    report = {"functions_over": a.functions_over, "files_over": a.files_over,
              "long_functions": long_funcs, "long_classes": long_classes, "long_files": long_files,
              "total_lines": sum(f["lines"] for f in files), "files": len(files)}
    if a.json:
        json.dump(report, sys.stdout, indent=1)
        print()
        return 0
    print(f"{report['files']} files, {report['total_lines']} lines under lib/ and apps/")
    print(f"functions over {a.functions_over} lines: {len(long_funcs)}")
    for f in long_funcs:
        note = "  (allowed: the opcode switch)" if f["allowed"] else ""
        print(f"  {f['lines']:5d}  {f['file']}:{f['line']}  {f['name']}{note}")
    print(f"classes over {a.files_over // 2} lines: {len(long_classes)}")
    for f in long_classes:
        print(f"  {f['lines']:5d}  {f['file']}:{f['line']}  {f['name']}")
    print(f"files over {a.files_over} lines: {len(long_files)}")
    for f in long_files:
        print(f"  {f['lines']:5d}  {f['file']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
