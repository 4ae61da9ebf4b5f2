"""Targets ucp-reshard must refuse before any data moves, each with a reason and exit 1, leaving
no `latest`: more stages than layers, a TP that does not divide the attention heads, ZeRO-2 with
pipeline parallelism, ZeRO stage 0 without bf16, ZeRO-3 with pipeline parallelism, a parameter whose split
dimension no rule decided (TP=2 refused, TP=1 fine), and a non-empty output folder. Layout files
(--layout): an unknown key, a bad value and a missing degree are refused naming the key; a good
file with a flag over it writes the same bytes as the equivalent flags.

  reshard_errors.py UCP_RESHARD ATOMIC_DIR WORK_DIR [LAYOUT_FILE]
"""
import filecmp
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from refusal import refusal_problems  # noqa: E402

binary, atomic, work = sys.argv[1:4]
failures = 0


def run(case, src, flags, must, code=1):
    global failures
    out = os.path.join(work, case)
    p = subprocess.run([binary, src, "-o", out, "-q"] + flags, capture_output=True, text=True)
    text = p.stdout + p.stderr
    bad = refusal_problems(p, must, code)
    if code != 0 and os.path.exists(os.path.join(out, "latest")) and case != "non_empty_output":
        bad.append("a `latest` was written")
    print(f"{case}: {'ok' if not bad else 'FAIL ' + '; '.join(bad)}\n    {text.strip()[:300]}")
    failures += bool(bad)


shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
layout = ["--dp", "2", "--zero-stage", "1", "--dtype", "bf16"]
run("pp_beyond_layers", atomic, layout + ["--tp", "1", "--pp", "3"], ["pp=3 exceeds the 2 transformer layers"])
# (the model's heads decide first, in the planner's words: one rule for every way of naming a layout)
run("tp_not_dividing_kv", atomic, layout + ["--tp", "3", "--pp", "1"], ["tp=3 does not divide the 4 attention heads"])
run("zero2_with_pp", atomic, ["--dp", "2", "--tp", "1", "--pp", "2", "--zero-stage", "2"], ["ZeRO-2 with pipeline"])
run("zero0_fp16", atomic, ["--dp", "2", "--tp", "1", "--pp", "1", "--zero-stage", "0", "--dtype", "fp16"],
    ["needs --dtype bf16"])
run("zero3_with_pp", atomic, ["--dp", "2", "--tp", "1", "--pp", "2", "--zero-stage", "3"], ["ZeRO-3 with pipeline"])

# A parameter no rule classified: its split dimension is unknown.
unknown = os.path.join(work, "unknown_split", "universal")
shutil.copytree(atomic, unknown)
mpath = os.path.join(unknown, "ucp_manifest.json")
m = json.load(open(mpath))
victim = next(p for p in m["params"] if p["name"].endswith("mlp.dense_4h_to_h.weight"))
victim["split_dim_known"] = False
json.dump(m, open(mpath, "w"))
run("unknown_split_tp2", unknown, layout + ["--tp", "2", "--pp", "1"], [victim["name"], "refusing to guess"])
run("unknown_split_tp1", unknown, layout + ["--tp", "1", "--pp", "1"], [], code=0)

# Names in the manifest that would reach outside a folder: the source tag (the target's folder name),
# a parameter's tensor file (the manifest's own file list: tests/unit/test_naming.cpp). Refused before anything is written.
def edited_manifest(case, fn):
    d = os.path.join(work, "sources", case, "universal")
    shutil.copytree(atomic, d)
    path = os.path.join(d, "ucp_manifest.json")
    m = json.load(open(path))
    fn(m)
    json.dump(m, open(path, "w"))
    return d


for label, tag, why in [("dotdot", "../escape", "holds a '/'"), ("absolute", "/tmp/escape", "holds a '/'"),
                        ("parent", "..", "is '..'"), ("nul", "global\0step", "holds a NUL byte"),
                        ("long", "t" * 256, "is 256 bytes long")]:
    src = edited_manifest("unsafe_tag_" + label, lambda m: m["source"].__setitem__("tag", tag))
    run("unsafe_tag_" + label, src, layout + ["--tp", "1", "--pp", "1"], ["ucp_manifest.json", "source.tag", why])
    if os.path.exists(os.path.join(work, "escape")) or os.path.exists("/tmp/escape"):
        print(f"unsafe_tag_{label}: FAIL something was written outside the output folder")
        failures += 1
src = edited_manifest("unsafe_param_file",
                      lambda m: m["params"][0]["files"].__setitem__("fp32", "/etc/passwd"))
run("unsafe_param_file", src, layout + ["--tp", "1", "--pp", "1"], ["'/etc/passwd' is absolute"])

os.makedirs(os.path.join(work, "non_empty_output"), exist_ok=True)
open(os.path.join(work, "non_empty_output", "keep.txt"), "w").write("x")
run("non_empty_output", atomic, layout + ["--tp", "1", "--pp", "1"], ["not empty", "no ucp-reshard run wrote it", "choose another -o"])
run("missing_atomic", os.path.join(work, "no_such_folder"), layout + ["--tp", "1", "--pp", "1"], ["no_such_folder: does not exist"])


def layout_file(case, doc):
    path = os.path.join(work, case + ".json")
    with open(path, "w") as f:
        f.write(doc if isinstance(doc, str) else json.dumps(doc))
    return path


good = {"dp": 2, "tp": 2, "pp": 2, "zero_stage": 1, "dtype": "bf16", "partition_method": [0, 3, 7]}
run("layout_unknown_key", atomic, ["--layout", layout_file("unknown", dict(good, dp_size=2))],
    ["unknown.json", "unknown key 'dp_size'"])
run("layout_bad_dtype", atomic, ["--layout", layout_file("bad_dtype", dict(good, dtype="int8"))],
    ["bad_dtype.json", "'dtype' must be", "int8"])
run("layout_bad_degree", atomic, ["--layout", layout_file("bad_degree", dict(good, tp=0))], ["'tp' must be a positive integer"])
run("layout_not_json", atomic, ["--layout", layout_file("not_json", "{dp: 2")], ["not_json.json", "not JSON"])
no_dp = dict(good)
del no_dp["dp"]
run("layout_missing_dp", atomic, ["--layout", layout_file("missing_dp", no_dp)], ["no dp", "--dp"], code=2)
if len(sys.argv) > 4:  # the example file of tests/data, with --dp and --dtype over it
    run("layout_file", atomic, ["--layout", sys.argv[4], "--dp", "2", "--dtype", "bf16"], [], code=0)
    run("layout_flags", atomic, ["--dp", "2", "--tp", "2", "--pp", "2", "--zero-stage", "1", "--dtype", "bf16",
                                 "--partition-method", "0,3,7"], [], code=0)
    a, b = (os.path.join(work, c, "global_step12") for c in ("layout_file", "layout_flags"))
    names = sorted(os.listdir(b))
    match, mismatch, errors = filecmp.cmpfiles(a, b, names, shallow=False)
    ok = len(names) == len(os.listdir(a)) and not mismatch and not errors
    print(f"layout_file vs layout_flags: {len(match)} of {len(names)} files identical: {'ok' if ok else 'FAIL'}")
    failures += not ok
sys.exit(1 if failures else 0)
