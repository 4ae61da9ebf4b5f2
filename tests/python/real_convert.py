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


def without_universal(inspect, convert, src, work, mpiexec):
    """A case DeepSpeed's ds_to_universal.py could not convert (its variant has no universal output
    to compare with): ucp either refuses it by name, saying the variant is not supported (exit 1 or
    2, nothing written), or converts it the same on 1 and 2 ranks."""
    r = subprocess.run([inspect, src], capture_output=True, text=True)
    if r.returncode != 0:
        msg = r.stderr.strip().splitlines()
        if r.returncode not in (1, 2) or not any("not supported yet" in m for m in msg):
            print(f"FAIL ucp-inspect: exit {r.returncode} without naming an unsupported variant:\n{r.stderr[-2000:]}")
            sys.exit(1)
        out = os.path.join(work, "refused")
        shutil.rmtree(work, ignore_errors=True)
        c = subprocess.run([convert, src, "-o", out, "-q"], capture_output=True, text=True)
        if c.returncode not in (1, 2) or os.path.exists(out):
            print(f"FAIL ucp-convert of a variant ucp-inspect refuses: exit {c.returncode}, output left: {os.path.exists(out)}")
            sys.exit(1)
        print("refused by name, as DeepSpeed's ds_to_universal.py refuses it:",
              next(m for m in msg if "not supported yet" in m)[-300:])
        print("ok (no universal checkpoint from DeepSpeed; a variant ucp does not read)")
        return
    shutil.rmtree(work, ignore_errors=True)
    outs = []
    for ranks in (1, 2):
        out = os.path.join(work, f"pt-np{ranks}", "universal")
        cmd = [convert, src, "-o", out, "-q"]
        if ranks > 1:
            cmd = [mpiexec, "--oversubscribe", "-np", str(ranks)] + cmd
        run(cmd, f"ucp-convert on {ranks} rank(s)")
        outs.append(out)
    files = lambda d: sorted(os.path.relpath(os.path.join(p, f), d) for p, _, fs in os.walk(d) for f in fs  # noqa: E731
                             if f != "ucp_manifest.json")
    assert files(outs[0]) == files(outs[1]), "1 and 2 ranks wrote different files"
    for f in files(outs[0]):
        a, b = (open(os.path.join(o, f), "rb").read() for o in outs)
        assert a == b, f"{f}: 1 and 2 ranks wrote different bytes"
    print(f"no universal checkpoint from DeepSpeed; ucp-convert on 1 and 2 ranks wrote the same {len(files(outs[0]))} files")
    print("ok")


def main():
    inspect, convert, case, work, mpiexec = sys.argv[1:6]
    src = os.path.join(case, "ckpt")
    ds_universal = os.path.join(src, "global_step6_universal")
    if not os.path.isdir(ds_universal):
        return without_universal(inspect, convert, src, work, mpiexec)
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
