#!/usr/bin/env python3
"""Hostile sizes: files built to make a reader allocate without bound, each refused with a clear
message, exit 1, peak RSS under 64 MiB (ucp-convert, which reads every file of the folder before
it writes anything).

usage: hostile_sizes.py UCP_CONVERT FIXTURE WORK

The inputs (each a checkpoint folder whose mp_rank_00_model_states.pt is the hostile file, or, for
param_shapes, a copy of FIXTURE with one shape replaced):
- a pickle declaring a string of 10^12 bytes, and a tensor of 10^12 elements over a 1-element storage;
- a pickle nesting lists 10^6 deep, and one opening 10^6 MARKs;
- a zip of 10^6 entries (real ones: ~100 MB), and a zip64 record declaring 10^12;
- a tensor whose storage claims 2^63 bytes;
- a param_shapes entry of 2^62 elements (2^31 x 2^31), and one with a negative dimension.
The inputs are made by a child process (this script with --make); the peak RSS comes from wait4 in
the parent, which stays small (no torch, no 100 MB buffers), since a forked child's peak counts the
pages it shared with its parent before exec.
"""
import os
import shutil
import struct
import subprocess
import sys
import zipfile

MAX_RSS = 64 << 20


def edit_param_shapes(src, dst, dims):
    """(child process) dst = copy of src whose first model file's first param_shapes entry has `dims`."""
    import torch
    shutil.copytree(src, dst)
    tag = open(os.path.join(dst, "latest")).read().strip()
    d = os.path.join(dst, tag)
    f = sorted(n for n in os.listdir(d) if n.startswith("mp_rank_") and n.endswith("model_states.pt"))[0]
    sd = torch.load(os.path.join(d, f))
    group = sd["param_shapes"][0]
    first = next(iter(group))
    group[first] = torch.Size(dims)
    torch.save(sd, os.path.join(d, f))


if len(sys.argv) > 1 and sys.argv[1] == "--edit-param-shapes":
    edit_param_shapes(sys.argv[2], sys.argv[3], [int(x) for x in sys.argv[4].split(",")])
    sys.exit(0)

if len(sys.argv) > 1 and sys.argv[1] == "--make":
    fixture, work = sys.argv[2:4]
else:
    convert, fixture, work = sys.argv[1:4]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    made = subprocess.run([sys.executable, __file__, "--make", fixture, work], capture_output=True, text=True)
    if made.returncode != 0:
        sys.exit(f"cannot make the inputs: {made.stderr}")
    cases = [line.split("\t") for line in made.stdout.splitlines() if "\t" in line]
    problems = []
    for what, d, words in cases:
        log = os.path.join(work, os.path.basename(d) + ".log")
        with open(log, "wb") as out:
            proc = subprocess.Popen([convert, d, "-o", os.path.join(work, "out"), "-q"], stdout=out,
                                    stderr=subprocess.STDOUT)
            _, status, usage = os.wait4(proc.pid, 0)  # the child's own peak RSS
        code = os.waitstatus_to_exitcode(status)
        rss = usage.ru_maxrss * 1024
        text = open(log, errors="replace").read()
        line = text.strip().splitlines()[-1] if text.strip() else ""
        print(f"{what}: exit {code}, peak RSS {rss / 2**20:.1f} MiB: {line[:240]}")
        if code != 1:
            problems.append(f"{what}: exit {code}, expected 1")
        for w in words.split("|"):
            if w not in text:
                problems.append(f"{what}: the message lacks '{w}': {text.strip()[-300:]}")
        if rss > MAX_RSS:
            problems.append(f"{what}: peak RSS {rss / 2**20:.1f} MiB, over {MAX_RSS >> 20} MiB")
    if os.path.exists(os.path.join(work, "out")):
        problems.append("an output folder was created")
    shutil.rmtree(os.path.join(work, "zip_1e6_entries"), ignore_errors=True)  # 100 MB, no longer needed
    for p in problems:
        print("PROBLEM:", p)
    print(f"{len(cases)} hostile inputs, {len(problems)} problems")
    sys.exit(1 if problems else 0)

# Pickle protocol 2, by hand (the stdlib pickler cannot name torch's classes without torch).
PROTO = b"\x80\x02"


def glob(module, name):
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def tensor_pickle(numel_storage, size):
    """{'w': _rebuild_tensor_v2(<float storage '0' of numel_storage>, 0, size, (1,)*, False, OrderedDict())}"""
    def binint(n):
        return b"\x8a" + bytes([8]) + struct.pack("<q", n)  # LONG1, 8 bytes
    pid = b"(" + b"X\x07\x00\x00\x00storage" + glob("torch", "FloatStorage") + b"X\x01\x00\x00\x000" + \
        b"X\x03\x00\x00\x00cpu" + binint(numel_storage) + b"tQ"  # tuple, BINPERSID
    size_t = b"(" + b"".join(binint(s) for s in size) + b"t"
    stride_t = b"(" + b"".join(binint(1) for _ in size) + b"t"
    args = b"(" + pid + b"K\x00" + size_t + stride_t + b"\x89" + glob("collections", "OrderedDict") + b")R" + b"t"
    return PROTO + b"}X\x01\x00\x00\x00w" + glob("torch._utils", "_rebuild_tensor_v2") + args + b"Rs."


def pt_zip(path, pkl, storage=b""):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/version", "3\n")
        if storage:
            z.writestr("archive/data/0", storage)


def case_dir(name):
    d = os.path.join(work, name)
    os.makedirs(d)
    return d, os.path.join(d, "mp_rank_00_model_states.pt")


def many_entries_zip(path, n):
    """A real zip of n empty stored entries, written directly (zipfile takes minutes for 10^6)."""
    local, central, off = [], [], 0
    for i in range(n):
        name = b"archive/data/%d" % i
        hdr = struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 0, 0, 0, 0, 0, 0, len(name), 0) + name
        central.append(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 0, 0, 0, 0, 0, 0, len(name),
                                   0, 0, 0, 0, 0, off) + name)
        local.append(hdr)
        off += len(hdr)
    cd = b"".join(central)
    cd_off = off
    # zip64 end record and locator (the count does not fit 16 bits), then the classic record.
    z64 = struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, n, n, len(cd), cd_off)
    loc = struct.pack("<IIQI", 0x07064B50, 0, cd_off + len(cd), 1)
    eocd = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    with open(path, "wb") as f:
        f.write(b"".join(local))
        f.write(cd + z64 + loc + eocd)


def declared_entries_zip(path, declared):
    """A small valid zip whose zip64 end record declares `declared` entries."""
    pt_zip(path, PROTO + b"N.")
    data = bytearray(open(path, "rb").read())
    eocd = data.rfind(b"PK\x05\x06")
    count, cd_size, cd_off = struct.unpack_from("<HII", data, eocd + 10)
    z64 = struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, declared, declared, cd_size, cd_off)
    loc = struct.pack("<IIQI", 0x07064B50, 0, eocd, 1)
    tail = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, cd_size, cd_off, 0)
    with open(path, "wb") as f:
        f.write(bytes(data[:eocd]) + z64 + loc + tail)


cases = []  # (name, folder, words the message must hold)

d, f = case_dir("string_1e12")
pt_zip(f, PROTO + b"\x8e" + struct.pack("<Q", 10**12) + b"x.")  # BINBYTES8 of 10^12 bytes
cases.append(("a pickle declaring 10^12 bytes", d, ["needs 1000000000000 more bytes"]))

d, f = case_dir("tensor_1e12")
pt_zip(f, tensor_pickle(1, [10**12]), storage=b"\0" * 4)
cases.append(("a tensor of 10^12 elements over 1", d, ["1000000000000"]))

d, f = case_dir("nesting_1e6")
pt_zip(f, PROTO + b"](" * 10**6 + b"e" * 10**6 + b".")
cases.append(("lists nested 10^6 deep", d, ["more than 65536"]))

d, f = case_dir("marks_1e6")
pt_zip(f, PROTO + b"(" * 10**6 + b"N.")
cases.append(("10^6 MARKs", d, ["more than 65536 MARKs"]))

d, f = case_dir("zip_1e6_entries")
many_entries_zip(f, 10**6)
cases.append(("a zip of 10^6 entries", d, ["declares 1000000 entries"]))

d, f = case_dir("zip_declares_1e12")
declared_entries_zip(f, 10**12)
cases.append(("a zip declaring 10^12 entries", d, ["declares 1000000000000 entries"]))

d, f = case_dir("storage_2e63")
pt_zip(f, tensor_pickle(2**61, [4]), storage=b"\0" * 16)
cases.append(("a storage of 2^63 bytes", d, ["2305843009213693952"]))

for name, dims, words in [("param_shapes_2e62", "2147483648,2147483648", ["more than 2^48 elements"]),
                          ("param_shapes_negative", "-4,8", ["negative dimension"])]:
    d = os.path.join(work, name)
    p = subprocess.run([sys.executable, __file__, "--edit-param-shapes", fixture, d, dims], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"cannot make {name}: {p.stderr}")
    cases.append((f"a param_shapes entry {dims.replace(',', ' x ')}", d, ["param_shapes"] + words))

for what, d, words in cases:
    print(f"{what}\t{d}\t{'|'.join(words)}")
