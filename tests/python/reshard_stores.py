"""The two atomic stores give the same reshard: the same atomic checkpoint in the .pt store and in
the HDF5 store, resharded to the same targets, must give byte-identical files. Prints the bytes
each store delivered (HDF5 reads whole chunks) against the slab bytes asked for.

  reshard_stores.py UCP_RESHARD PT_ATOMIC H5_ATOMIC WORK_DIR MPIEXEC DP,TP,PP,ZERO,DTYPE ...
"""
import filecmp
import json
import os
import shutil
import subprocess
import sys

reshard, pt_atomic, h5_atomic, work, mpiexec = sys.argv[1:6]
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
failures = 0
for spec in sys.argv[6:]:
    dp, tp, pp, zero, dtype = spec.split(",")
    name = f"dp{dp}-tp{tp}-pp{pp}-z{zero}-{dtype}"
    outs, reports = {}, {}
    for store, atomic, ranks in (("pt", pt_atomic, 1), ("hdf5", h5_atomic, 2)):
        out = os.path.join(work, name, store)
        shutil.rmtree(out, ignore_errors=True)
        report = out + ".json"
        cmd = [reshard, atomic, "-o", out, "--dp", dp, "--tp", tp, "--pp", pp, "--zero-stage", zero, "--dtype", dtype,
               "-q", "--report", report]
        if ranks > 1:
            cmd = [mpiexec, "--oversubscribe", "-np", str(ranks)] + cmd
        subprocess.run(cmd, check=True, env=env)
        outs[store], reports[store] = out, json.load(open(report))
    tag = open(os.path.join(outs["pt"], "latest")).read().strip()
    a, b = os.path.join(outs["pt"], tag), os.path.join(outs["hdf5"], tag)
    names = sorted(os.listdir(a))
    match, mismatch, errors = filecmp.cmpfiles(a, b, names, shallow=False)
    extra = sorted(set(os.listdir(b)) - set(names))
    same = not mismatch and not errors and not extra and reports["hdf5"]["store"] == "hdf5"
    reads = ", ".join(f"{s}: {r['bytes_read'] / r['atomic_bytes']:.3f}x" for s, r in reports.items())
    print(f"{name}: {len(match)} of {len(names)} files identical{'' if same else ' FAIL ' + str(mismatch + errors + extra)}; "
          f"read {reads} the atomic bytes")
    failures += not same
sys.exit(1 if failures else 0)
