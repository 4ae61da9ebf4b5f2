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
    2, nothing written), or converts it the same on 1 and 2 ranks, to what DeepSpeed's files hold
    (check_against_files)."""
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
    check_against_files(outs[0], src)
    print("ok")


def check_against_files(atomic, src):
    """Without DeepSpeed's universal output, the atomic checkpoint against DeepSpeed's own files, read
    here independently of ucp (TP=1 only, where no TP merge is involved):
    - fp32, cast to the training dtype, equals the weight the job saved (a layer file's entry, or
      the module's; the optimizers copy the master weights into the model after each step);
    - exp_avg / exp_avg_sq equal the moments reassembled from the optimizer files: each
      parameter's fragments (param_slice_mappings) at their flat position in their group's buffer
      (DP rank x partition + start), in order; the first pipeline stage's copy of a parameter
      several stages hold."""
    import re
    import torch
    sys.path.insert(0, HERE)
    import ds_stubs  # noqa: F401  DeepSpeed's pickled classes
    load = lambda path: torch.load(path, map_location="cpu", weights_only=False) if "weights_only" in \
        torch.load.__code__.co_varnames else torch.load(path, map_location="cpu")  # noqa: E731
    manifest = __import__("json").load(open(os.path.join(atomic, "ucp_manifest.json")))["source"]
    if manifest["tp"] != 1:
        print(f"(tp={manifest['tp']}: the atomic tensors are not checked against the files here)")
        return
    shard = os.path.join(src, open(os.path.join(src, "latest")).read().strip())
    weights = {}
    for f in sorted(os.listdir(shard)):
        m = re.fullmatch(r"layer_(\d+)-model_00-model_states\.pt", f)
        if m:
            for key, t in load(os.path.join(shard, f)).items():
                weights[("tied_modules.embed." if int(m.group(1)) == 1 else f"{int(m.group(1))}.") + key] = t
        elif re.fullmatch(r"mp_rank_\d+_model_states\.pt", f):
            module = load(os.path.join(shard, f)).get("module")
            weights.update({k: v for k, v in (module or {}).items() if k not in weights})
    runs = {}  # name -> (mp, group) -> [(flat position, start, numel, state)]
    for f in sorted(os.listdir(shard)):
        m = re.fullmatch(r"(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt", f)
        if not m:
            continue
        osd = load(os.path.join(shard, f))["optimizer_state_dict"]
        state = osd["base_optimizer_state"]["state"]
        for g, mapping in enumerate(osd["param_slice_mappings"]):
            size = state[g]["exp_avg"].numel()
            for name, frag in mapping.items():
                runs.setdefault(name, {}).setdefault((int(m.group(2)), g), []).append(
                    (int(m.group(1)) * size + frag.start, frag.start, frag.numel, state[g]))
    zero = os.path.join(atomic, "zero")
    names = sorted(p for p in os.listdir(zero) if os.path.isdir(os.path.join(zero, p)))
    assert sorted(names) == sorted(runs), f"atomic parameters {sorted(set(names) ^ set(runs))[:6]} differ from the mapped ones"
    for name in names:
        fp32 = load(os.path.join(zero, name, "fp32.pt"))["param"]
        want = weights[name][:fp32.shape[0]] if fp32.dim() else weights[name]
        assert torch.equal(fp32.to(want.dtype), want), f"{name}: fp32 in the training dtype differs from the saved weight"
        pieces = sorted(runs[name][min(runs[name])], key=lambda r: r[0])
        first = pieces[0][0]
        for s in ("exp_avg", "exp_avg_sq"):
            flat = torch.full((sum(r[2] for r in pieces),), float("nan"))
            for at, start, n, st in pieces:
                flat[at - first:at - first + n] = st[s][start:start + n]
            got = load(os.path.join(zero, name, f"{s}.pt"))["param"].reshape(-1)
            assert not bool(torch.isnan(flat[:got.numel()]).any()), f"{name}: {s} not covered by the optimizer files"
            assert torch.equal(got, flat[:got.numel()]), f"{name}: {s} differs from the optimizer files' fragments"
    print(f"{len(names)} atomic parameters equal DeepSpeed's saved weights (in the training dtype) and the moments "
          f"its optimizer files map")


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
