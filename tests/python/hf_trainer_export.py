"""ucp-reshard --format hf from a Hugging Face Trainer + DeepSpeed checkpoint (issue 43, "export with the
model's own config"): the parameters already carry Hugging Face's names, so they pass through unchanged.

Usage: hf_trainer_export.py BIN_DIR CASES WORK [MPIEXEC]
CASES is ../shared/real-hftrainer/cases: each case's checkpoint-4/ is what Trainer wrote, and
zero_to_fp32/model.safetensors DeepSpeed's zero_to_fp32.py output of it (the referee), read here by
tests/python/safetensors_reader.py, not by the code that wrote the export.

Per case (ZeRO-2 and ZeRO-3, fp32, 2 processes): ucp-convert checkpoint-4, then ucp-reshard --format hf on
1 and 2 ranks; the job's config.json comes from the atomic checkpoint (job/config.json) where the
conversion carried it, else from --model-config checkpoint-4/config.json. Checked:
- the same keys as zero_to_fp32's, every tensor equal bit for bit (fp32), also from checkpoint-4 itself
  (converted into the output's scratch folder);
- config.json and generation_config.json byte-equal to checkpoint-4's;
- one model.safetensors and no index (save_pretrained's way for a model under --max-shard-size);
- --max-shard-size 100KB: model-0000i-of-0000N.safetensors and the index (weight_map naming each tensor's
  file, total_size, total_parameters as save_pretrained writes them), the same tensors;
- --dtype bf16: zero_to_fp32's tensors rounded to bf16 by torch, bit for bit, and config.json's dtype
  field alone rewritten ("bfloat16");
- the export reads no optimizer state: with a byte of the atomic checkpoint's zero/optimizer_state.pt
  flipped it writes the same bytes, while a DeepSpeed layout from it is refused naming the file;
- refused by name: Hugging Face names and no config.json anywhere (asks for --model-config), a
  --model-config that contradicts the carried config.json.
"""
import json
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklist import check, finish, fresh_folder, tool_runner  # noqa: E402
import ds_stubs  # noqa: E402,F401
from damage import first_tensor, flip_in_record, records_holding  # noqa: E402
from safetensors_reader import read_safetensors  # noqa: E402

BIN, CASES, WORK = sys.argv[1:4]
MPIEXEC = sys.argv[4] if len(sys.argv) > 4 else None
run = tool_runner(BIN, MPIEXEC)
INDEX = "model.safetensors.index.json"


def read_export(d):
    """({name: tensor}, index or None): one model.safetensors, or the files the index names (each
    checked against the index)."""
    if not os.path.exists(os.path.join(d, INDEX)):
        return read_safetensors(os.path.join(d, "model.safetensors")), None
    index = json.load(open(os.path.join(d, INDEX)))
    tensors = {}
    for f in sorted(set(index["weight_map"].values())):
        for name, t in read_safetensors(os.path.join(d, f)).items():
            assert name not in tensors, f"{name} in two files"
            assert index["weight_map"].get(name) == f, f"{name} in {f}, the index says {index['weight_map'].get(name)}"
            tensors[name] = t
    return tensors, index


def bits(t):
    return t.contiguous().view(torch.int32 if t.dtype == torch.float32 else torch.int16)


def differing(got, want, cast=None):
    """Names whose tensors are not bit-equal (dtype, shape or a bit), want optionally cast first."""
    bad = []
    for name, w in want.items():
        w = w if cast is None else w.to(cast)
        g = got.get(name)
        if g is None or g.dtype != w.dtype or g.shape != w.shape or not torch.equal(bits(g), bits(w)):
            bad.append(name)
    return bad


def damaged_root_checks(case, ckpt, work, given, exported):
    """The export from the root reads the fp32 masters in the optimizer files and nothing else there: a
    byte flipped in a master record is refused naming the file and the record, nothing left at -o; a byte
    flipped in an exp_avg record changes nothing."""
    tag = open(os.path.join(ckpt, "latest")).read().strip()
    for label, keys, refused in (("an fp32 master", ("single_partition_of_fp32_groups", "fp32_flat_groups"), True),
                                 ("an exp_avg", ("exp_avg",), False)):
        copy = os.path.join(work, "damaged-root")
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(ckpt, copy)
        optim = os.path.join(copy, tag, sorted(f for f in os.listdir(os.path.join(copy, tag)) if f.endswith("optim_states.pt"))[0])
        state = torch.load(optim, map_location="cpu")
        tensor = first_tensor(state, keys)
        found = records_holding(optim, tensor) if tensor is not None else []
        record = found[0] if len(found) == 1 else None
        check(f"{case}: {label} of {os.path.basename(optim)} found as one zip record", record is not None, optim)
        if record is None:
            continue
        flip_in_record(optim, record)
        out = os.path.join(work, "hf-damaged-root")
        shutil.rmtree(out, ignore_errors=True)
        r = run("ucp-reshard", [copy, "-o", out, "--format", "hf"] + given)
        if refused:
            check(f"{case}: {label} damaged in the root: the export refuses the record by its CRC-32, naming file and record, "
                  "nothing left at -o", r.returncode == 1 and "CRC-32 mismatch" in r.stderr and record in r.stderr and
                  os.path.basename(optim) in r.stderr and not os.path.exists(out), r.stderr[-800:])
        else:
            got = read_export(out)[0] if r.returncode == 0 else {}
            check(f"{case}: {label} damaged in the root: the export, which reads no moment, the same tensors",
                  r.returncode == 0 and sorted(got) == sorted(exported) and not differing(got, exported), r.stderr[-800:])
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(copy)


def carries_job_config(atomic):
    manifest = json.load(open(os.path.join(atomic, "ucp_manifest.json")))
    return any(f.get("path") == "job/config.json" for f in manifest.get("files", []))


def bytes_of(path):
    return open(path, "rb").read() if os.path.exists(path) else None


for case in ("zero2_dp2_fp32", "zero3_dp2_fp32"):
    ckpt = os.path.join(CASES, case, "checkpoint-4")
    if not os.path.isdir(ckpt):
        check(f"{case}: the case is there", False, ckpt)
        continue
    work = os.path.join(WORK, case)
    fresh_folder(work)
    atomic = os.path.join(work, "atomic")
    r = run("ucp-convert", [ckpt, "-o", atomic], ranks=2)
    check(f"{case}: ucp-convert checkpoint-4", r.returncode == 0, r.stderr[-2000:])
    if r.returncode != 0:
        continue
    reference = read_safetensors(os.path.join(CASES, case, "zero_to_fp32", "model.safetensors"))
    carried = carries_job_config(atomic)
    given = [] if carried else ["--model-config", os.path.join(ckpt, "config.json")]
    print(f"{case}: config.json from {'the atomic checkpoint (job/config.json)' if carried else '--model-config'}")
    config, generation = bytes_of(os.path.join(ckpt, "config.json")), bytes_of(os.path.join(ckpt, "generation_config.json"))

    for ranks in (1, 2):
        out = os.path.join(work, f"hf-np{ranks}")
        r = run("ucp-reshard", [atomic, "-o", out, "--format", "hf"] + given, ranks=ranks)
        label = f"{case} np{ranks}"
        check(f"{label}: exported", r.returncode == 0, r.stderr[-2000:])
        if r.returncode != 0:
            continue
        got, index = read_export(out)
        check(f"{label}: one model.safetensors, no index, as save_pretrained writes a model this small", index is None,
              sorted(os.listdir(out)))
        check(f"{label}: zero_to_fp32's keys", sorted(got) == sorted(reference),
              f"missing {sorted(set(reference) - set(got))}, extra {sorted(set(got) - set(reference))}")
        bad = differing(got, reference)
        check(f"{label}: every tensor equal to zero_to_fp32's bit for bit ({len(reference)} tensors)", not bad, bad[:5])
        check(f"{label}: config.json byte-equal to checkpoint-4's", bytes_of(os.path.join(out, "config.json")) == config)
        check(f"{label}: generation_config.json byte-equal to checkpoint-4's",
              bytes_of(os.path.join(out, "generation_config.json")) == generation)

    out = os.path.join(work, "hf-from-checkpoint")
    before = sorted(os.listdir(ckpt))
    r = run("ucp-reshard", [ckpt, "-o", out, "--format", "hf"] + given)
    check(f"{case} from checkpoint-4 itself (converted into the scratch folder): exported", r.returncode == 0, r.stderr[-2000:])
    if r.returncode == 0:
        got, index = read_export(out)
        bad = differing(got, reference)
        check(f"{case} from checkpoint-4 itself: the same tensors bit for bit, the config files",
              index is None and sorted(got) == sorted(reference) and not bad and
              bytes_of(os.path.join(out, "config.json")) == config and
              bytes_of(os.path.join(out, "generation_config.json")) == generation, bad[:5])
        check(f"{case} from checkpoint-4 itself: nothing written beside the tag, the scratch folder removed",
              sorted(os.listdir(ckpt)) == before and not os.path.exists(os.path.join(out, ".ucp-scratch-atomic")))
        check(f"{case} from checkpoint-4 itself: the weights read where the optimizer files keep them (no tensor "
              "written to the scratch)", "fp32 weights left in" in r.stderr and "partitions" in r.stderr, r.stderr[-1500:])
        if carried:
            check(f"{case} from checkpoint-4 itself: the run names checkpoint-4's config.json, not the scratch copy gone after it",
                  "checkpoint-4/config.json)" in r.stderr and ".ucp-scratch-atomic/job" not in r.stderr,
                  r.stderr[-1500:])
        damaged_root_checks(case, ckpt, work, given, got)

    out = os.path.join(work, "hf-sharded")
    r = run("ucp-reshard", [atomic, "-o", out, "--format", "hf", "--max-shard-size", "100KB"] + given, ranks=2)
    check(f"{case} sharded: exported", r.returncode == 0, r.stderr[-2000:])
    if r.returncode == 0:
        got, index = read_export(out)
        files = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
        n = len(files)
        check(f"{case} sharded: model-0000i-of-0000N.safetensors and the index", index is not None and n > 1 and
              files == [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)], files)
        if index is not None:
            check(f"{case} sharded: the index names every tensor", sorted(index["weight_map"]) == sorted(reference))
            size = sum(t.numel() * t.element_size() for t in got.values())
            check(f"{case} sharded: total_size, total_parameters", index["metadata"] ==
                  {"total_parameters": sum(t.numel() for t in reference.values()), "total_size": size}, index["metadata"])
        bad = differing(got, reference)
        check(f"{case} sharded: the same tensors bit for bit", sorted(got) == sorted(reference) and not bad, bad[:5])
        check(f"{case} sharded: config.json byte-equal", bytes_of(os.path.join(out, "config.json")) == config)

    out = os.path.join(work, "hf-bf16")
    r = run("ucp-reshard", [atomic, "-o", out, "--format", "hf", "--dtype", "bf16"] + given, ranks=2)
    check(f"{case} bf16: exported", r.returncode == 0, r.stderr[-2000:])
    if r.returncode == 0:
        got, _ = read_export(out)
        bad = differing(got, reference, cast=torch.bfloat16)
        check(f"{case} bf16: zero_to_fp32's tensors rounded by torch, bit for bit", sorted(got) == sorted(reference) and not bad, bad[:5])
        want = config.replace(b'"dtype": "float32"', b'"dtype": "bfloat16"')
        check(f"{case} bf16: config.json's dtype alone rewritten", want != config and
              bytes_of(os.path.join(out, "config.json")) == want)
        check(f"{case} bf16: said in the output", "float32 -> bfloat16" in r.stderr, r.stderr[-1000:])

    # The export reads no optimizer state (under ZeRO-3, zero/optimizer_state.pt holds rank 0's flat
    # partitions): with a byte of that file flipped it writes the same bytes, while a DeepSpeed layout,
    # which reads the file, is refused naming it.
    damaged = os.path.join(work, "atomic-damaged-optimizer")
    shutil.copytree(atomic, damaged)
    state = os.path.join(damaged, "zero", "optimizer_state.pt")
    with open(state, "r+b") as f:
        f.seek(os.path.getsize(state) // 2)
        flipped = f.read(1)[0] ^ 0x01
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([flipped]))
    out, ref = os.path.join(work, "hf-damaged-optimizer"), os.path.join(work, "hf-np1")
    r = run("ucp-reshard", [damaged, "-o", out, "--format", "hf"] + given)
    same = r.returncode == 0 and sorted(os.listdir(out)) == sorted(os.listdir(ref)) and \
        all(bytes_of(os.path.join(out, f)) == bytes_of(os.path.join(ref, f)) for f in os.listdir(ref))
    check(f"{case}: zero/optimizer_state.pt damaged: the export, which does not read it, the same bytes", same, r.stderr[-1000:])
    stage = "3" if "zero3" in case else "2"
    r = run("ucp-reshard", [damaged, "-o", os.path.join(work, "ds-damaged-optimizer"), "--dp", "1", "--tp", "1", "--pp", "1",
                            "--zero-stage", stage])
    check(f"{case}: zero/optimizer_state.pt damaged: a DeepSpeed layout, which reads it, refused naming it",
          r.returncode == 1 and "optimizer_state.pt" in r.stderr, r.stderr[-1000:])
    shutil.rmtree(damaged)

    if carried:
        other = os.path.join(work, "other_config.json")
        with open(other, "w") as f:
            json.dump(dict(json.loads(config), rms_norm_eps=1e-5), f)
        r = run("ucp-reshard", [atomic, "-o", os.path.join(work, "refused"), "--format", "hf", "--model-config", other])
        check(f"{case}: a --model-config other than the carried config.json refused, naming both", r.returncode != 0 and
              "other_config.json" in r.stderr and "job/config.json" in r.stderr, r.stderr[-1000:])
    else:
        r = run("ucp-reshard", [atomic, "-o", os.path.join(work, "refused"), "--format", "hf"])
        check(f"{case}: Hugging Face names and no config.json refused, asking for --model-config", r.returncode != 0 and
              "--model-config path/to/config.json" in r.stderr and "model.embed_tokens.weight" in r.stderr, r.stderr[-1000:])
        check(f"{case}: nothing written by the refused run", not os.path.exists(os.path.join(work, "refused", "config.json")))

finish("hf_trainer_export")
