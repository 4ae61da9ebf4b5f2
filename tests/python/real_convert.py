"""A real DeepSpeed checkpoint through ucp-inspect and ucp-convert (1 and 2 ranks, both stores),
every output compared with DeepSpeed's own universal checkpoint (real_universal.py).

    real_convert.py UCP_INSPECT UCP_CONVERT CASE_DIR WORK MPIEXEC

Leaves WORK/pt-np2/universal, the atomic checkpoint later steps (real_reshard.py) start from.
"""
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd, what):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(f"FAIL {what}: exit {r.returncode}\n{r.stdout[-2000:]}{r.stderr[-3000:]}")
        sys.exit(1)
    return r


def main():
    inspect, convert, case, work, mpiexec = sys.argv[1:6]
    src = os.path.join(case, "ckpt")
    ds_universal = os.path.join(src, "global_step6_universal")
    r = run([inspect, src], "ucp-inspect (default strictness)")
    print(r.stdout.splitlines()[0] if r.stdout else "", "| inspect: exit 0")
    shutil.rmtree(work, ignore_errors=True)
    for store in ("pt", "hdf5"):
        for ranks in (1, 2):
            out = os.path.join(work, f"{store}-np{ranks}", "universal")
            cmd = [convert, src, "-o", out, "--format", store, "-q"]
            if ranks > 1:
                cmd = [mpiexec, "--oversubscribe", "-np", str(ranks)] + cmd
            run(cmd, f"ucp-convert --format {store} on {ranks} rank(s)")
            compared = out
            if store == "hdf5":  # DeepSpeed reads the .pt store: compare through the lossless conversion back
                compared = os.path.join(work, f"{store}-np{ranks}", "as-pt")
                run([convert, "--from-atomic", out, "--format", "pt", "-o", compared, "-q"], "ucp-convert --from-atomic")
            r = run(["/usr/bin/python3", os.path.join(HERE, "real_universal.py"), compared, ds_universal,
                     "--model-states"], f"{store} np{ranks} against DeepSpeed's universal output")
            print(f"{store} np{ranks}: {r.stdout.strip()}")
    print("ok")


if __name__ == "__main__":
    main()
