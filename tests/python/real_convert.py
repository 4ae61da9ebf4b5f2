"""A real DeepSpeed checkpoint through ucp-inspect and ucp-convert (1 and 2 ranks, both stores),
every output compared with DeepSpeed's own universal checkpoint (real_universal.py).

    real_convert.py UCP_INSPECT UCP_CONVERT CASE_DIR WORK MPIEXEC UCP_RESHARD

Leaves WORK/pt-np2/universal, the atomic checkpoint later steps (real_reshard.py) start from.
"""
import hashlib
import json
import os
import shutil
import subprocess
import zipfile
import sys
import types

import in_process

HERE = os.path.dirname(os.path.abspath(__file__))


def checked_once(src, report, label):
    """The CRC-32 of every record is computed once: the weight-copy check verifies the records of the
    fp32 masters it reads (where the module keeps a copy of the weights: not ZeRO-3), and the mappers
    read for their CRC-32 only the others. Against the tensor records of the optimizer files, counted
    here from their zip directories."""
    records = 0
    tag = os.path.join(src, open(os.path.join(src, "latest")).read().strip()) if os.path.exists(os.path.join(src, "latest")) else src
    for f in os.listdir(tag):
        if f.endswith("optim_states.pt"):
            with zipfile.ZipFile(os.path.join(tag, f)) as z:
                records += sum(i.file_size for i in z.infolist() if "/data/" in i.filename)
    r = json.load(open(report))
    by_check = r["records_verified_by_weight_copy_check"]["bytes"]
    by_mappers = sum(p["bytes_crc_checked"] for p in r["per_rank"])
    copies = json.load(open(os.path.join(os.path.dirname(report), "universal", "ucp_manifest.json")))["source"]["zero_stage"] != 3
    print(f"{label}: record bytes CRC-checked by the weight-copy check {by_check}, by the mappers {by_mappers}, "
          f"of {records} in the optimizer files")
    if by_check + by_mappers > records or (copies and by_check == 0) or by_mappers == 0:
        print(f"FAIL {label}: a record's CRC-32 computed twice, or the masters' records not verified by the weight-copy check")
        sys.exit(1)


def run(cmd, what):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(f"FAIL {what}: exit {r.returncode}\n{r.stdout[-2000:]}{r.stderr[-3000:]}")
        sys.exit(1)
    return r


def check_universal(ours, ds_universal, what):
    """real_universal.py OURS DS_UNIVERSAL --model-states, in this process; its output as r.stdout."""
    code, output = in_process.run_script(os.path.join(HERE, "real_universal.py"), [ours, ds_universal, "--model-states"])
    if code != 0:
        print(f"FAIL {what}: exit {code}\n{output[-3000:]}")
        sys.exit(1)
    return types.SimpleNamespace(stdout=output)


def without_universal(inspect, convert, src, work, mpiexec, reshard, train_args, nproc):
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
        print("refused by name (a variant ucp does not read):",
              next(m for m in msg if "not supported yet" in m)[-300:])
        print("ok (no universal checkpoint from DeepSpeed here; a variant ucp does not read)")
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
    same_layout_as_deepspeed(reshard, outs[0], src, work, train_args, nproc)
    print("ok")


def same_layout_as_deepspeed(reshard, atomic, src, work, train_args, nproc):
    """A source whose optimizer state DeepSpeed keeps in its model-states files (DeepSpeed 0.17.6+'s
    DDP bf16 wrapper: bf16 without ZeRO in a model that is not a pipeline) resharded by ucp-reshard to
    its own layout: every file DeepSpeed wrote, and no other, equal (keys, order, values, tensor
    bytes), but for the vocabulary padding rows (zeros here) of the embedding and of its fp32 master,
    and the RNG states of model-parallel ranks other than 0 (the atomic checkpoint keeps rank 0's)."""
    import re
    import torch
    sys.path.insert(0, HERE)
    import ds_stubs  # noqa: F401
    from real_moe_reshard import deep_equal, load
    tag = open(os.path.join(src, "latest")).read().strip()
    shard = os.path.join(src, tag)
    root = load(os.path.join(shard, "mp_rank_00_model_states.pt"))
    opt = root.get("optimizer")
    if not (isinstance(opt, dict) and "fp32_groups" in opt and "optimizer_state_dict" in opt):
        return  # (its optimizer state is in optimizer files: check_against_files read them)
    flags = {k: int(v) for k, v in re.findall(r"--(tp|pp|zero) (\d+)", train_args)}
    tp, pp = flags.get("tp", 1), flags.get("pp", 1)
    out = os.path.join(work, "same-layout")
    run([reshard, atomic, "-o", out, "-q", "--dp", str(nproc // (tp * pp)), "--tp", str(tp), "--pp", str(pp),
         "--zero-stage", str(flags.get("zero", 1)), "--dtype", "bf16"], "ucp-reshard to the source's layout")
    mine = os.path.join(out, open(os.path.join(out, "latest")).read().strip())
    plan = json.loads(run([reshard, atomic, "--plan-only", "--json", "--dp", str(nproc // (tp * pp)), "--tp", str(tp),
                           "--pp", str(pp), "--zero-stage", str(flags.get("zero", 1)), "--dtype", "bf16"],
                          "ucp-reshard --plan-only").stdout)
    assert all(u["optimizer_files"] == 0 for u in plan["units"]), \
        f"--plan-only counts optimizer files {[u['optimizer_files'] for u in plan['units']]} for the DDP wrapper (none)"
    assert sorted(os.listdir(mine)) == sorted(os.listdir(shard)), f"files {sorted(set(os.listdir(mine)) ^ set(os.listdir(shard)))}"
    info = root["universal_checkpoint_info"]
    vocab, hidden = info["original_vocab_size"], None
    problems = []
    for f in sorted(os.listdir(shard)):
        theirs, ours = load(os.path.join(shard, f)), load(os.path.join(mine, f))
        emb = theirs["module"]["language_model.embedding.word_embeddings.weight"]
        rows_before = int(re.search(r"mp_rank_(\d+)", f).group(1)) * emb.shape[0]  # this TP rank's first row
        hidden = emb.shape[1]

        def allowed(path, numel, f=f):
            # the padding rows: the embedding, and its fp32 master (position 0 of the first group,
            # the harness's group rule), past the real vocabulary
            if path.endswith("/module/language_model.embedding.word_embeddings.weight") or \
                    path.endswith("/optimizer/fp32_groups[0][0]"):
                mask = torch.zeros(numel, dtype=torch.bool)
                mask[max(0, (vocab - rows_before)) * hidden:] = True
                return mask
            return None
        if not f.startswith("mp_rank_00_"):
            theirs.pop("rng_state", None), ours.pop("rng_state", None)
        deep_equal(theirs, ours, f, allowed, problems)
    assert not problems, "ucp-reshard's files differ from DeepSpeed's:\n  " + "\n  ".join(problems[:12])
    print(f"resharded to its own layout (tp={tp} pp={pp} bf16 without ZeRO, DeepSpeed's DDP bf16 wrapper): "
          f"{len(os.listdir(shard))} files equal DeepSpeed's (vocabulary padding rows aside)")


def check_against_files(atomic, src):
    """Without DeepSpeed's universal output, the atomic checkpoint against DeepSpeed's own files, read
    here independently of ucp. Every atomic tensor whose shape a TP rank holds whole (all of them at
    TP=1; the TP-replicated ones otherwise, where no TP merge is involved) is checked at that rank:
    - fp32, cast to the training dtype, equals the weight the job saved (a layer file's entry, or
      the module's; the optimizers copy the master weights into the model after each step);
    - exp_avg / exp_avg_sq equal the moments of the optimizer state: with ZeRO files, each
      parameter's fragments (param_slice_mappings) at their flat position in their group's buffer
      (DP rank x partition + start), in order, the first pipeline stage's copy where several hold
      one; without (the optimizer state inside the model-states file, by position), the positions
      named by the harness's own group rule (train.py: biases, layernorms and 1-d parameters in the
      no-decay group), in the module's order, with the fp32 masters checked against fp32 exactly."""
    import json
    import re
    import torch
    sys.path.insert(0, HERE)
    import ds_stubs  # noqa: F401  DeepSpeed's pickled classes
    load = lambda path: torch.load(path, map_location="cpu", weights_only=False) if "weights_only" in \
        torch.load.__code__.co_varnames else torch.load(path, map_location="cpu")  # noqa: E731
    source = json.load(open(os.path.join(atomic, "ucp_manifest.json")))["source"]
    shard = os.path.join(src, open(os.path.join(src, "latest")).read().strip())
    weights, moments = {}, {}  # tp -> name -> tensor; tp -> name -> {exp_avg, exp_avg_sq[, fp32]} (flat)
    for f in sorted(os.listdir(shard)):
        m = re.fullmatch(r"layer_(\d+)-model_(\d+)-model_states\.pt", f)
        if m:
            for key, t in load(os.path.join(shard, f)).items():
                weights.setdefault(int(m.group(2)), {})[("tied_modules.embed." if int(m.group(1)) == 1 else
                                                         f"{int(m.group(1))}.") + key] = t
            continue
        m = re.fullmatch(r"mp_rank_(\d+)_model_states\.pt", f)
        if not m or source["pp"] > 1:
            continue
        tp, root = int(m.group(1)), load(os.path.join(shard, f))
        weights.setdefault(tp, {}).update(root.get("module") or {})
        opt = root.get("optimizer")
        if isinstance(opt, dict) and "fp32_groups" in opt:  # the optimizer state by position, in this file
            module = [(n, t) for n, t in root["module"].items()]
            for g, group in enumerate(opt["optimizer_state_dict"]["param_groups"]):
                decay = group["weight_decay"] > 0
                names = [n for n, t in module if not (n.endswith(".bias") or "layernorm" in n or t.dim() == 1) == decay]
                assert len(names) == len(group["params"]), f"{f}: group {g}: {len(group['params'])} positions, {len(names)} parameters"
                for k, (name, pos) in enumerate(zip(names, group["params"])):
                    st = opt["optimizer_state_dict"]["state"][pos]
                    moments.setdefault(tp, {})[name] = {"exp_avg": st["exp_avg"].reshape(-1), "exp_avg_sq": st["exp_avg_sq"].reshape(-1),
                                                       "fp32": opt["fp32_groups"][g][k].reshape(-1)}
    runs = {}  # (tp, name) -> (mp, group) -> [(flat position, start, numel, state)]
    for f in sorted(os.listdir(shard)):
        m = re.fullmatch(r"(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt", f)
        if not m:
            continue
        osd = load(os.path.join(shard, f))["optimizer_state_dict"]
        state = osd["base_optimizer_state"]["state"]
        mp = int(m.group(2))
        for g, mapping in enumerate(osd["param_slice_mappings"]):
            size = state[g]["exp_avg"].numel()
            for name, frag in mapping.items():
                runs.setdefault((mp % source["tp"], name), {}).setdefault((mp, g), []).append(
                    (int(m.group(1)) * size + frag.start, frag.start, frag.numel, state[g]))
    for (tp, name), per in runs.items():
        pieces = sorted(per[min(per)], key=lambda r: r[0])
        first = pieces[0][0]
        got = {}
        for s in ("exp_avg", "exp_avg_sq"):
            flat = torch.full((sum(r[2] for r in pieces),), float("nan"))
            for at, start, n, st in pieces:
                flat[at - first:at - first + n] = st[s][start:start + n]
            got[s] = flat
        moments.setdefault(tp, {})[name] = got
    zero = os.path.join(atomic, "zero")
    names = sorted(p for p in os.listdir(zero) if os.path.isdir(os.path.join(zero, p)))
    checked = 0
    for name in names:
        atom = {s: load(os.path.join(zero, name, f"{s}.pt"))["param"] for s in ("fp32", "exp_avg", "exp_avg_sq")}
        for tp in sorted(weights):
            w = weights[tp].get(name)
            assert w is not None, f"{name}: no weight at tp={tp}"
            rows = atom["fp32"].shape[0] if atom["fp32"].dim() else None
            if w.dim() != atom["fp32"].dim() or tuple(w.shape[1:]) != tuple(atom["fp32"].shape[1:]) or \
                    (rows is not None and w.shape[0] < rows) or (source["tp"] > 1 and w.shape != atom["fp32"].shape):
                continue  # split over TP ranks: merged by the pattern, not checked here
            want = w[:rows] if rows is not None else w
            assert torch.equal(atom["fp32"].to(want.dtype), want), f"{name}: fp32 in {want.dtype} differs from the saved weight (tp={tp})"
            ref = moments.get(tp, {}).get(name)
            assert ref is not None, f"{name}: no optimizer state at tp={tp}"
            for s in ref:
                got = atom[s].reshape(-1)
                assert not bool(torch.isnan(ref[s][:got.numel()]).any()), f"{name}: {s} not covered by the optimizer state"
                assert torch.equal(got, ref[s][:got.numel()]), f"{name}: {s} differs from the optimizer state (tp={tp})"
            checked += 1
    assert checked >= (len(names) if source["tp"] == 1 else 1), f"only {checked} of {len(names)} parameters checked"
    # DeepSpeed's ZeRO optimizers refuse to restore a state without the release that wrote it.
    if source.get("ds_version"):
        osd = load(os.path.join(atomic, "zero", "optimizer_state.pt"))
        assert osd.get("ds_version") == source["ds_version"], f"optimizer_state.pt: ds_version {osd.get('ds_version')!r}"
    print(f"{checked} (parameter, TP rank) pairs of {len(names)} atomic parameters equal DeepSpeed's saved weights "
          f"(in the training dtype) and the moments its optimizer state holds")


def main():
    inspect, convert, case, work, mpiexec, reshard = sys.argv[1:7]
    src = os.path.join(case, "ckpt")
    ds_universal = os.path.join(src, "global_step6_universal")
    if not os.path.isdir(ds_universal):
        spec = json.load(open(os.path.join(case, "case.json")))
        return without_universal(inspect, convert, src, work, mpiexec, reshard, spec["train_args"], spec["nproc"])
    r = run([inspect, src], "ucp-inspect (default strictness)")
    print(r.stdout.splitlines()[0] if r.stdout else "", "| inspect: exit 0")
    shutil.rmtree(work, ignore_errors=True)
    for store in ("pt", "hdf5"):
        for ranks in (1, 2):
            out = os.path.join(work, f"{store}-np{ranks}", "universal")
            cmd = [convert, src, "-o", out, "--format", store, "-q", "--report", out + ".report.json"]
            if ranks > 1:
                cmd = [mpiexec, "--oversubscribe", "-np", str(ranks)] + cmd
            run(cmd, f"ucp-convert --format {store} on {ranks} rank(s)")
            checked_once(src, out + ".report.json", f"{store} np{ranks}")
            compared = out
            if store == "hdf5":  # DeepSpeed reads the .pt store: compare through the lossless conversion back
                compared = os.path.join(work, f"{store}-np{ranks}", "as-pt")
                run([convert, "--from-atomic", out, "--format", "pt", "-o", compared, "-q"], "ucp-convert --from-atomic")
            r = check_universal(compared, ds_universal, f"{store} np{ranks} against DeepSpeed's universal output")
            print(f"{store} np{ranks}: {r.stdout.strip()}")
    # Split items: every state tensor over 4 KiB reduced and written in parts by the 3 ranks, into its
    # one file: the same files as one rank writes, byte for byte, and DeepSpeed's tensors.
    plan = json.loads(run([convert, src, "--plan-only", "--json", "--ranks", "3", "--split-above", "4K"], "--plan-only").stdout)
    split = sum(isinstance(v, list) for p in plan["params"] for v in p["reducers"].values())
    print(f"--split-above 4K on 3 ranks: {split} items written in parts, {plan['shared_records']} records read in ranges "
          f"by several ranks (files cut between them)")
    zero3 = json.loads(subprocess.run([inspect, "--json", src], capture_output=True, text=True).stdout)["zero_stage"] == 3
    if (split == 0) != zero3:  # ZeRO-3's universal form (a padded 1-D tensor) is written whole
        print(f"FAIL --split-above 4K split {split} items of a {'ZeRO-3' if zero3 else 'ZeRO-0/1/2'} source")
        sys.exit(1)
    out = os.path.join(work, "pt-np3-split", "universal")
    run([mpiexec, "--oversubscribe", "-np", "3", convert, src, "-o", out, "-q", "--split-above", "4K"],
        "ucp-convert --split-above 4K on 3 ranks")
    def contents(d):  # every file the manifest lists, by its bytes
        files = json.load(open(os.path.join(d, "ucp_manifest.json")))["files"]
        return {f["path"]: hashlib.sha256(open(os.path.join(d, f["path"]), "rb").read()).hexdigest() for f in files}, \
            sum("parts" in f for f in files)
    (split_files, parted), (whole_files, _) = contents(out), contents(os.path.join(work, "pt-np1", "universal"))
    if split_files != whole_files or parted == 0 and split:
        diff = sorted(k for k in set(split_files) | set(whole_files) if split_files.get(k) != whole_files.get(k))
        print(f"FAIL split items: files differ from the 1-rank conversion: {diff[:5]} ({parted} recorded by parts)")
        sys.exit(1)
    run([inspect, "--verify", out], "ucp-inspect --verify of the split conversion (every part's XXH64)")
    r = check_universal(out, ds_universal, "split items against DeepSpeed's universal output")
    # A flipped byte in a file recorded by parts is found, named with the part's byte range.
    victim = next((f for f in json.load(open(os.path.join(out, "ucp_manifest.json")))["files"] if "parts" in f), None)
    if victim:
        part = victim["parts"][len(victim["parts"]) // 2]
        with open(os.path.join(out, victim["path"]), "r+b") as fh:
            fh.seek(part["offset"] + part["bytes"] // 2)
            b = fh.read(1)
            fh.seek(-1, 1)
            fh.write(bytes([b[0] ^ 1]))
        v = subprocess.run([inspect, "--verify", out], capture_output=True, text=True)
        if v.returncode == 0 or victim["path"] not in v.stdout + v.stderr or f"bytes [{part['offset']}," not in v.stdout + v.stderr:
            print(f"FAIL a flipped byte in {victim['path']} (recorded by parts) was not found by --verify: exit {v.returncode}\n"
                  f"{(v.stdout + v.stderr)[-1500:]}")
            sys.exit(1)
    print(f"pt np3, {split} (parameter, state) items split over the ranks, {parted} files recorded by parts: every file "
          f"as on 1 rank, byte for byte; --verify passes; {r.stdout.strip()}")
    print("ok")


if __name__ == "__main__":
    main()
