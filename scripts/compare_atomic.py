#!/usr/bin/env python3
"""Two checkpoints written from the same input by two installs of one ucp build: the same?

    compare_atomic.py A B [--same A_TEXT=B_TEXT ...]

For scripts/deb_check.sh: A is written by the .deb's tools in a chroot, B by the build tree's own binaries
outside, from copies of the same sample (an atomic checkpoint of ucp-convert, or what ucp-reshard wrote).
Every file of either folder must be in the other; every file but an atomic checkpoint's ucp_manifest.json
must be equal byte for byte. Two manifests are compared as JSON, field by field, after two maskings that are
the only differences two runs of one build in two places may have:
- `created`, the time of the conversion (scripts/compare_builds.py found it the one field that varies
  between two runs of one build in one place);
- the places themselves: each --same A_TEXT=B_TEXT says that A_TEXT in A's manifest stands where B_TEXT
  stands in B's (the output folder, the source folder, the pattern folder the tool reads). Each is
  replaced by one placeholder in its own manifest, and the count of replacements is printed, so that a
  mask that hides more than a path shows.
Prints each difference (the JSON path, both values); exits 1 on any, 2 on bad arguments.
"""
import argparse
import filecmp
import json
import os
import sys

MANIFEST = "ucp_manifest.json"
VARYING = ("created",)


def files_under(top):
    out = set()
    for folder, _, names in os.walk(top):
        out.update(os.path.relpath(os.path.join(folder, n), top) for n in names)
    return out


def mask(value, swaps, counts):
    """value with each swap's text replaced by its placeholder, counting the replacements."""
    if isinstance(value, dict):
        return {k: mask(v, swaps, counts) for k, v in value.items()}
    if isinstance(value, list):
        return [mask(v, swaps, counts) for v in value]
    if isinstance(value, str):
        for i, (text, placeholder) in enumerate(swaps):
            if text in value:
                counts[i] += value.count(text)
                value = value.replace(text, placeholder)
    return value


def differences(a, b, where="$"):
    if type(a) is not type(b):
        return [f"{where}: {json.dumps(a)[:200]} != {json.dumps(b)[:200]}"]
    if isinstance(a, dict):
        out = [f"{where}.{k}: only in {'A' if k in a else 'B'}" for k in sorted(set(a) ^ set(b))]
        for k in sorted(set(a) & set(b)):
            out += differences(a[k], b[k], f"{where}.{k}")
        return out
    if isinstance(a, list):
        out = [f"{where}: {len(a)} entries != {len(b)}"] if len(a) != len(b) else []
        for i, (x, y) in enumerate(zip(a, b)):
            out += differences(x, y, f"{where}[{i}]")
        return out
    return [] if a == b else [f"{where}: {json.dumps(a)[:200]} != {json.dumps(b)[:200]}"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--same", action="append", default=[], metavar="A_TEXT=B_TEXT")
    args = ap.parse_args()
    swaps_a, swaps_b = [], []
    for i, pair in enumerate(args.same):
        left, sep, right = pair.partition("=")
        if not sep or not left or not right:
            ap.error(f"--same {pair!r}: expected A_TEXT=B_TEXT, both non-empty")
        swaps_a.append((left, f"<place {i}>"))
        swaps_b.append((right, f"<place {i}>"))
    problems = []
    fa, fb = files_under(args.a), files_under(args.b)
    if not fa:
        print(f"{args.a}: no files (a missing folder, or nothing written)")
        return 1
    problems += [f"{n}: only in A ({args.a})" for n in sorted(fa - fb)]
    problems += [f"{n}: only in B ({args.b})" for n in sorted(fb - fa)]
    same_bytes = 0
    for n in sorted((fa & fb) - {MANIFEST}):
        if filecmp.cmp(os.path.join(args.a, n), os.path.join(args.b, n), shallow=False):
            same_bytes += 1
        else:
            problems.append(f"{n}: the bytes differ")

    manifests, counts = [], [[0] * len(swaps_a), [0] * len(swaps_b)]
    for top, swaps in ((args.a, swaps_a), (args.b, swaps_b)) if MANIFEST in fa & fb else ():
        with open(os.path.join(top, MANIFEST)) as f:
            m = json.load(f)
        for field in VARYING:
            m.pop(field, None)
        manifests.append(mask(m, swaps, counts[len(manifests)]))
    if manifests:
        problems += [f"{MANIFEST} {d}" for d in differences(*manifests)]
    for i, pair in enumerate(args.same):
        print(f"masked: {pair} ({counts[0][i]} in A, {counts[1][i]} in B)")
    for p in problems:
        print("DIFFERENT:", p)
    if problems:
        print(f"{len(problems)} differences")
        return 1
    print(f"{same_bytes} files equal byte for byte" +
          (f", the manifest equal but for {', '.join(VARYING)} and the places" if manifests else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
