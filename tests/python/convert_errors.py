"""Damaged checkpoints that ucp-convert must refuse: a TP-replicated parameter whose copies differ,
a missing fragment, overlapping fragments, a truncated shard file, a parameter name that would
escape zero/. Each run must exit 1, name the file, the rank coordinates and the parameter, and
leave no manifest behind; what it does leave, ucp-inspect and ucp-reshard must call an unfinished run.

  convert_errors.py UCP_CONVERT FIXTURE_DIR WORK_DIR [MPIEXEC]
"""
import os
import shutil
import struct
import subprocess
import sys
import zipfile

import torch

sys.path.insert(0, os.path.dirname(__file__))
import ds_stubs  # noqa: E402,F401
from refusal import refusal_problems  # noqa: E402

binary, fixture, work = sys.argv[1], sys.argv[2], sys.argv[3]
mpiexec = sys.argv[4] if len(sys.argv) > 4 else None
failures = []


def copy_fixture(case):
    d = os.path.join(work, case)
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(fixture, d)
    tag = open(os.path.join(d, "latest")).read().strip()
    return d, os.path.join(d, tag)


def mapping_holder(tagdir, param_suffix, tp):
    """(file, group, name, fragment) of the first fragment of a parameter ending in param_suffix at tp."""
    for f in sorted(os.listdir(tagdir)):
        if "optim_states" not in f or not f.endswith(f"mp_rank_{tp:02d}_optim_states.pt"):
            continue
        sd = torch.load(os.path.join(tagdir, f))
        for g, m in enumerate(sd["optimizer_state_dict"]["param_slice_mappings"]):
            for name, frag in m.items():
                if name.endswith(param_suffix):
                    return f, g, name, frag
    raise SystemExit(f"no fragment of *{param_suffix} at tp={tp}")


def edit(tagdir, f, fn):
    path = os.path.join(tagdir, f)
    sd = torch.load(path)
    fn(sd["optimizer_state_dict"])
    torch.save(sd, path)


def unfinished_output_problems(out):
    """What the refused run left (its journal, the files its ranks finished, which may include
    model-states files and zero/) must be taken by ucp-inspect and ucp-reshard for what it is: an
    unfinished conversion, never a checkpoint."""
    if not os.path.isdir(os.path.join(out, ".ucp-journal")):
        return []
    tools = os.path.dirname(os.path.abspath(binary))
    problems = []
    for cmd in ([os.path.join(tools, "ucp-inspect"), out],
                [os.path.join(tools, "ucp-reshard"), out, "-o", out + "-reshard", "--dp", "1", "--tp", "1", "--pp", "1",
                 "--zero-stage", "1"]):
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if p.returncode == 0 or "unfinished ucp-convert run" not in p.stderr:
            problems.append(f"{os.path.basename(cmd[0])} on the unfinished output: exit {p.returncode}: {p.stderr.strip()[:300]}")
    return problems


def run(case, src, must_contain, ranks, extra=()):
    out = os.path.join(work, case + f"-out-np{ranks}")
    shutil.rmtree(out, ignore_errors=True)
    cmd = [binary, src, "-o", out, "-q"] + list(extra)
    if ranks > 1:
        cmd = [mpiexec, "--oversubscribe", "-np", str(ranks)] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    text = p.stdout + p.stderr
    problems = refusal_problems(p, must_contain)
    if os.path.exists(os.path.join(out, "ucp_manifest.json")):
        problems.append("a manifest was written")
    left = [os.path.join(d, n) for d, _, names in os.walk(out) for n in names if ".tmp-" in n]
    if left:
        problems.append(f"{len(left)} temporary files left, e.g. {left[0]}")
    problems += unfinished_output_problems(out)
    status = "ok" if not problems else "FAIL " + "; ".join(problems)
    print(f"{case} ({ranks} rank{'s' if ranks > 1 else ''}): {status}\n    {text.strip()[:600]}")
    if problems:
        failures.append(case)


# 1. A replicated parameter (layer norm, TP-replicated) whose tp=1 copy differs by one element.
src, tag = copy_fixture("replicate_differs")
f, g, name, frag = mapping_holder(tag, "input_layernorm.weight", 1)
edit(tag, f, lambda osd: osd["single_partition_of_fp32_groups"][g].__setitem__(frag.start, 7.0))
cases = [("replicate_differs", src, [f, "tp=1", name, "differs"])]
# ... also when every state over 4 KiB is written in parts: the parts written before the error go too.
cases.append(("replicate_differs_split", src, [f, "tp=1", name, "differs"], ["--split-above", "4K"]))

# 2. A missing fragment: one parameter's entry dropped from one rank's param_slice_mappings.
src, tag = copy_fixture("missing_fragment")
f, g, name, frag = mapping_holder(tag, "mlp.dense_4h_to_h.weight", 0)
edit(tag, f, lambda osd: osd["param_slice_mappings"][g].pop(name))
cases.append(("missing_fragment", src, [f, "tp=0", name, "missing fragment"]))

# 3. Overlapping fragments: one fragment grown by one element into its neighbour's.
src, tag = copy_fixture("overlapping_fragment")
f, g, name, frag = mapping_holder(tag, "self_attention.dense.weight", 0)
edit(tag, f, lambda osd: setattr(osd["param_slice_mappings"][g][name], "numel", frag.numel + 1))
cases.append(("overlapping_fragment", src, [f, "tp=0", name, "overlap"]))

# 4. A truncated shard file.
src, tag = copy_fixture("truncated_file")
victim = sorted(n for n in os.listdir(tag) if "optim_states" in n)[-1]
path = os.path.join(tag, victim)
with open(path, "r+b") as fh:
    fh.truncate(os.path.getsize(path) // 2)
cases.append(("truncated_file", src, [victim]))

def flip_in_largest_record(path, where):
    """Flips one bit of byte int(where * size) of the largest tensor record of `path`; returns its name."""
    with zipfile.ZipFile(path) as z:
        rec = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
        z.fp.seek(rec.header_offset + 26)
        name_len, extra_len = struct.unpack("<HH", z.fp.read(4))
        at = rec.header_offset + 30 + name_len + extra_len + min(rec.file_size - 1, int(where * rec.file_size))
    with open(path, "r+b") as fh:
        fh.seek(at)
        b = fh.read(1)
        fh.seek(at)
        fh.write(bytes([b[0] ^ 0x40]))
    return rec.filename


# 4b. A flipped byte in a tensor record of a model-states file, which is carried over as it is (DeepSpeed
#     loads it): its zip CRC-32 is checked as it is copied.
src, tag = copy_fixture("carried_file_flipped")
victim = "mp_rank_00_model_states.pt"
record = flip_in_largest_record(os.path.join(tag, victim), 0.5)
cases.append(("carried_file_flipped", src, [victim, record, "CRC-32 mismatch"]))

# 4b'. A flipped byte in an optimizer file's step tensor (a 4- or 8-byte record, used as a value, not
#      read through the mapper): it would land in every step.pt; refused as its file is indexed.
src, tag = copy_fixture("step_record_flipped")
victim = sorted(n for n in os.listdir(tag) if "optim_states" in n)[0]
with zipfile.ZipFile(os.path.join(tag, victim)) as z:
    steps = [i for i in z.infolist() if "/data/" in i.filename and i.file_size <= 8]
    rec = steps[0]
    z.fp.seek(rec.header_offset + 26)
    name_len, extra_len = struct.unpack("<HH", z.fp.read(4))
    at = rec.header_offset + 30 + name_len + extra_len
with open(os.path.join(tag, victim), "r+b") as fh:
    fh.seek(at)
    b = fh.read(1)
    fh.seek(at)
    fh.write(bytes([b[0] ^ 0x01]))
cases.append(("step_record_flipped", src, [victim, rec.filename, "CRC-32 mismatch"]))

# 4c. A flipped byte in an optimizer file's largest record, at its start, middle and last byte. With
#     --split-above 4K on 3 ranks, the second of the four files (pp, tp, dp = 0, 0, 1) is cut between
#     ranks 0 and 1 and the record read in ranges whose CRC-32s are combined across ranks (said in the
#     message); on 1 and 2 ranks it is read whole.
shared_cases = []
for label, where in (("first", 0.0), ("middle", 0.5), ("last", 1.0)):
    src, tag = copy_fixture("optimizer_record_flipped_" + label)
    victim = "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    record = flip_in_largest_record(os.path.join(tag, victim), where)
    cases.append(("optimizer_record_flipped_" + label, src, [victim, record, "CRC-32 mismatch"]))
    shared_cases.append(("optimizer_record_flipped_" + label, src,
                         [victim, record, "CRC-32 mismatch", "read in ranges by ranks 0, 1"], ["--split-above", "4K"]))

# 5. Parameter names that cannot be folder names under zero/: one that climbs out, one absolute, one
#    with a NUL byte, '..' itself, one of 300 bytes (renamed consistently in every file; they match no
#    pattern rule, hence --no-strict to get as far as the store). Refused before anything is written.
old = "2.input_layernorm.weight"
for label, new, shown, why in [("dotdot", "../" + old, "../" + old, "holds a '/'"),
                               ("absolute", "/tmp/" + old, "/tmp/" + old, "holds a '/'"),
                               ("nul", old + "\0x", old + "\\x00x", "holds a NUL byte"),
                               ("parent", "..", "..", "is '..'"),
                               ("long", "w" * 300, "w" * 80 + "...", "is 300 bytes long")]:
    src, tag = copy_fixture("unsafe_name_" + label)
    for f in sorted(os.listdir(tag)):
        path = os.path.join(tag, f)
        sd = torch.load(path)
        if "param_shapes" in sd:
            sd["param_shapes"] = [type(g)((new if k == old else k, v) for k, v in g.items()) for g in sd["param_shapes"]]
        if "optimizer_state_dict" in sd and "param_slice_mappings" in sd["optimizer_state_dict"]:
            osd = sd["optimizer_state_dict"]
            osd["param_slice_mappings"] = [type(g)((new if k == old else k, v) for k, v in g.items())
                                           for g in osd["param_slice_mappings"]]
        torch.save(sd, path)
    cases.append(("unsafe_name_" + label, src, [f"parameter name '{shown}' {why}"], ["--no-strict"]))

# 6. A `latest` whose tag is no plain folder name: refused naming the file, nothing read through it.
for label, text, why in [("dotdot", "../global_step12", "holds a '/'"), ("parent", "..", "is '..'"),
                         ("absolute", "/etc", "holds a '/'"), ("long", "g" * 256, "is 256 bytes long")]:
    src, tag = copy_fixture("unsafe_tag_" + label)
    with open(os.path.join(src, "latest"), "w") as f:
        f.write(text)
    cases.append(("unsafe_tag_" + label, src, [os.path.join(src, "latest"), "the tag", why]))

for case, src, must, *extra in cases:
    for ranks in ([1, 2] if mpiexec else [1]):
        run(case, src, must, ranks, *extra)
if mpiexec:
    for case, src, must, extra in shared_cases:
        run(case + "_shared", src, must, 3, extra)
print(f"{len(cases) + (len(shared_cases) if mpiexec else 0)} damaged checkpoints, {len(failures)} failures")
sys.exit(1 if failures else 0)
