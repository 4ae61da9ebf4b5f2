"""ucp-reshard --format dcp (torchtitan's Llama as torch.distributed.checkpoint.save writes it),
against independent ground truth.

    dcp_target.py BIN_DIR DS_CASE DCP_CASES DCP_FACTS RECORD WORK [MPIEXEC]

DS_CASE is ../shared/real-deepspeed/cases/llama_tp2_dp2_zero1_fp32 (a Megatron-DeepSpeed Llama run by
real DeepSpeed), DCP_CASES ../shared/real-dcp/cases (torch 2.6's own DCP files of torchtitan's Llama),
DCP_FACTS tests/data/hf (the model_config.json of each DCP case). Every DCP folder ucp writes is read
by dcp_files.py (written here: .metadata unpickled into stand-ins, each range torch.load-ed, chunks
placed; the ranges must tile each file), never by ucp alone:
- the DeepSpeed case converted, then written as DCP on dp=1, dp=2 (FSDP2) and tp=2 (torchtitan's TP
  plan): every weight, exp_avg and exp_avg_sq equals the atomic tensor's, cut and renamed as torchtitan
  names them (query_key_value's rows by its sub-parameter sizes into wq, wk, wv; dense_h_to_4h's into
  w1, w3; q and k rows from Megatron's rotate-half to torchtitan's interleaved pairs, by the same
  permutation torchtitan's Hugging Face adapter inverts), bit for bit; the steps equal the atomic
  steps; each param group's options equal the checkpoint's, `params` its tensors' names; the chunks
  are the boxes the mesh gives (torch.chunk's pieces; on dp=48 the trailing ranks' boxes are empty); 2 ranks write the same bytes as 1; ucp-convert
  reads the DCP folder back to the same tensors;
- the real DCP cases (FSDP2 dp=2, TP 2) converted and written back on their own mesh: every tensor
  and every param-group option equals torch's own files' (reference.pt), the same keys in the same
  order, the same chunks, each item in the file torch put it in; RECORD says torch 2.6 loaded these
  very files (their sha256) into the case's model on its mesh, logits equal to its own;
- RECORD (tests/data/dcp-target/real_reader.json, scripts/dcp_real_check.sh): torch 2.6's own reader
  read ucp's DCP of the DeepSpeed case on each mesh (dcp_to_torch_save, and dcp.load into torchtitan's
  Llama on that mesh with gloo); the files ucp writes now must be those files, byte for byte (their
  sha256), and the record must say every tensor and option was equal and the logits agreed;
- Megatron-Core's Llama (tests/data/real-mcore/llama_tp2: stacked layers, per-query-group QKV) on tp=2:
  the DCP's weights equal ucp's Hugging Face export of it (hf_mcore checks that against transformers'
  logits), renamed, q and k rows re-ordered; on tp=2, dp=2 and dp=1 every weight, moment and step equals
  Megatron's own full state (reference.pt) cut and renamed in torch here, and each param group holds the
  parameters Megatron-Core's default rule puts there (the norms in the group of wd_mult 0, written with
  weight_decay 0); RECORD says torch 2.6 loaded these very files into torchtitan's Llama on each mesh,
  every tensor and option equal, its logits within 1e-5 of Megatron-Core's own (megatron_logits.json);
- refusals by name, nothing written: dp and tp together, an unknown mesh dimension, --dtype bf16,
  --max-shard-size, a GPT-style model (learned positions, LayerNorm: said as GPT-shaped, --format hf naming
  GPT2LMHeadModel), a DeepSpeed layout flag.
"""
import hashlib
import json
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklist import check, finish, fresh_folder, tool_runner  # noqa: E402
from dcp_expect import atom, expected_from_mcore, expected_from_megatron, flat, same, to_pairs  # noqa: E402
from dcp_files import read_dcp  # noqa: E402
from megatron_args_edit import set_flag_in_args  # noqa: E402
from safetensors_reader import read_safetensors  # noqa: E402

BIN, DS_CASE, DCP_CASES, DCP_FACTS, RECORD, WORK = sys.argv[1:7]
MPIEXEC = sys.argv[7] if len(sys.argv) > 7 else None
run = tool_runner(BIN, MPIEXEC)
fresh_folder(WORK)










def piece(idx, parts, k):
    """torch.chunk's piece k of the indices `idx`, as (first index, count); past the last piece an empty
    one at the end of `idx`."""
    pieces = idx.chunk(parts)
    if k < len(pieces):
        return pieces[k]
    return idx[len(idx):]  # empty


def span(idx, end):
    return (int(idx[0]) if len(idx) else end, len(idx))


def expected_chunks(mesh, fqn, shape):
    """The boxes torch's DCP records for `fqn` on `mesh` ("dp=N", "tp=M", "dp=N,tp=M"; rank r is (r // tp,
    r % tp)): torchtitan's TP plan's piece of rank t (rows or columns), then FSDP2's piece d of its rows,
    each torch.chunk's; the boxes without repeats (a norm's is the same on every rank of a TP group)."""
    degree = dict((k, int(v)) for k, v in (p.split("=") for p in mesh.split(",")))
    dp, tp = degree.get("dp", 1), degree.get("tp", 1)
    norm = fqn.endswith("_norm.weight") or fqn == "norm.weight"
    tp_dim = -1 if norm else 1 if fqn.endswith("attention.wo.weight") or fqn.endswith("feed_forward.w2.weight") else 0
    boxes = []
    for r in range(dp * tp):
        d, t = divmod(r, tp)
        idx = [torch.arange(n) for n in shape]
        if tp_dim >= 0:
            idx[tp_dim] = piece(idx[tp_dim], tp, t)
        rows = piece(idx[0], dp, d)
        first, count = span(rows, int(idx[0][-1]) + 1 if len(idx[0]) else 0)
        box = ((first,) + tuple(span(i, 0)[0] for i in idx[1:]), (count,) + tuple(len(i) for i in idx[1:]))
        if box not in boxes:
            boxes.append(box)
    return sorted(boxes)


def check_chunks(label, md, mesh):
    bad = []
    for key, entry in md.state_dict_metadata.items():
        if type(entry).__name__ != "TensorStorageMetadata" or key.endswith(".step"):
            continue
        fqn = key[len("model."):] if key.startswith("model.") else key[len("optim.state."):].rsplit(".", 1)[0]
        got = sorted((tuple(c.offsets), tuple(c.sizes)) for c in entry.chunks)
        if got != expected_chunks(mesh, fqn, tuple(entry.size)):
            bad.append(key)
    check(f"{label}: every tensor's chunks are the boxes {mesh} gives", not bad, str(bad[:3]))


def check_tensors(label, got, want):
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    bad = [k for k in want if k in got and not same(got[k], want[k])]
    check(f"{label}: the same keys", not missing and not extra, f"missing {missing[:3]}, extra {extra[:3]}")
    check(f"{label}: every tensor bit for bit ({len(want)})", not bad, str(bad[:3]))




def check_objects(label, got, want):
    bad = [k for k in want if k not in got or got[k] != want[k] or type(got[k]) is not type(want[k])]
    check(f"{label}: every param-group option as saved ({len(want)})", not bad, str([(k, got.get(k), want[k]) for k in bad[:3]]))


def check_record(label, folder, what):
    """The files torch 2.6's own reader read (RECORD) are the files ucp wrote now, and it found them right."""
    mesh = label
    if not os.path.isfile(RECORD):
        check("the real reader's record exists", False, RECORD)
        return
    rec = json.load(open(RECORD))["folders"].get(mesh)
    if rec is None:
        check(f"{what}: in the real reader's record", False, RECORD)
        return
    now = {f: hashlib.sha256(b).hexdigest() for f, b in files_of(folder).items()}
    check(f"{what}: the files torch 2.6 read, byte for byte", now == rec["sha256"],
          str(sorted(f for f in now if now[f] != rec["sha256"].get(f))))
    n, o = rec["expected_tensors"], rec["expected_options"]
    ok = (rec["dcp_to_torch_save_tensors_equal"] == n and rec["dcp_to_torch_save_options_equal"] == o
          and rec["loaded_tensors_equal"] == n and rec["loaded_options_equal"] == o and rec["max_abs_logit_difference"] <= 1e-5)
    check(f"{what}: torch's dcp_to_torch_save and dcp.load found every tensor ({n}) and option ({o}) equal, "
          f"logits within 1e-5 ({rec['max_abs_logit_difference']:.2e})", ok, json.dumps(rec)[:600])


def files_of(folder):
    return {f: open(os.path.join(folder, f), "rb").read() for f in sorted(os.listdir(folder)) if f.endswith(".distcp") or f == ".metadata"}


def from_deepspeed():
    cfg = json.load(open(os.path.join(DS_CASE, "model_config.json")))
    atomic = os.path.join(WORK, "ds", "atomic")
    r = run("ucp-convert", [os.path.join(DS_CASE, "ckpt"), "-o", atomic], ranks=2)
    check("the DeepSpeed Llama case converts", r.returncode == 0, r.stderr[-2000:])
    want_t, want_o = expected_from_megatron(atomic, cfg)
    for mesh, ranks in [("dp=1", 1), ("dp=2", 2), ("tp=2", 2), ("dp=2,tp=2", 2), ("dp=48", 2)]:  # dp=48: trailing ranks with empty shards
        out = os.path.join(WORK, "ds", "dcp-" + mesh.replace("=", "").replace(",", "-"))
        r = run("ucp-reshard", [atomic, "-o", out, "--format", "dcp", "--mesh", mesh], ranks=ranks)
        check(f"DeepSpeed -> DCP {mesh}: written", r.returncode == 0, r.stderr[-2000:])
        if r.returncode:
            continue
        n = 1
        for part in mesh.split(","):
            n *= int(part.split("=")[1])
        check(f"DeepSpeed -> DCP {mesh}: one file per mesh rank", sorted(f for f in os.listdir(out) if f.endswith(".distcp")) ==
              sorted(f"__{i}_0.distcp" for i in range(n)), str(sorted(os.listdir(out))))
        got_t, got_o, md = read_dcp(out)
        if mesh != "dp=48":
            check_record(mesh, out, f"DeepSpeed -> DCP {mesh}")
        check_tensors(f"DeepSpeed -> DCP {mesh}", got_t, want_t)
        check_objects(f"DeepSpeed -> DCP {mesh}", got_o, want_o)
        check_chunks(f"DeepSpeed -> DCP {mesh}", md, mesh)
        if mesh == "dp=48":
            continue
        one = os.path.join(WORK, "ds", "np1", os.path.basename(out))  # the same folder name: .metadata records it
        r = run("ucp-reshard", [atomic, "-o", one, "--format", "dcp", "--mesh", mesh])
        check(f"DeepSpeed -> DCP {mesh}: 1 rank writes the same bytes as {ranks}", r.returncode == 0 and files_of(one) == files_of(out), r.stderr[-1000:])
        back = out + "-back"
        r = run("ucp-convert", [out, "-o", back], ranks=2)
        check(f"DeepSpeed -> DCP {mesh}: ucp-convert reads it back", r.returncode == 0, r.stderr[-2000:])
        if r.returncode == 0:
            bad = [k for k, v in want_t.items() if k.startswith("model.") and not same(atom(back, k[6:], "fp32"), v)]
            bad += [k for k, v in want_t.items() if k.startswith("optim.state.") and not k.endswith(".step") and
                    not same(atom(back, k[12:].rsplit(".", 1)[0], k.rsplit(".", 1)[1]), v)]
            check(f"DeepSpeed -> DCP {mesh} -> atomic: weights and moments bit for bit", not bad, str(bad[:3]))




def from_dcp():
    for case, mesh in [("fsdp2_dp2", "dp=2"), ("tp2", "tp=2")]:
        src = os.path.join(DCP_CASES, case, "checkpoint")
        atomic = os.path.join(WORK, "dcp", case, "atomic")
        r = run("ucp-convert", [src, "-o", atomic], ranks=2)
        check(f"real DCP {case}: converts", r.returncode == 0, r.stderr[-2000:])
        out = os.path.join(WORK, "dcp", case + "-dcp")  # the name scripts/dcp_real_check.sh gives it: .metadata records it
        facts = os.path.join(DCP_FACTS, "dcp_" + case, "model_config.json")
        r = run("ucp-reshard", [atomic, "-o", out, "--format", "dcp", "--mesh", mesh, "--model-config", facts], ranks=2)
        check(f"real DCP {case}: written back as DCP on {mesh}", r.returncode == 0, r.stderr[-2000:])
        if r.returncode:
            continue
        ref = flat(torch.load(os.path.join(DCP_CASES, case, "reference.pt")))
        got_t, got_o, md = read_dcp(out)
        check_record(f"{case} {mesh}", out, f"real DCP {case} -> DCP")
        _, theirs_o, theirs_md = read_dcp(src)
        check_tensors(f"real DCP {case} -> DCP", got_t, {k: v for k, v in ref.items() if isinstance(v, torch.Tensor)})
        check_objects(f"real DCP {case} -> DCP", got_o, theirs_o)
        check(f"real DCP {case} -> DCP: the same keys in the same order as torch's",
              list(md.state_dict_metadata) == list(theirs_md.state_dict_metadata) and list(md.planner_data.items()) == list(theirs_md.planner_data.items()))
        chunks = lambda m: {k: [(tuple(c.offsets), tuple(c.sizes)) for c in e.chunks] for k, e in m.state_dict_metadata.items() if hasattr(e, "chunks")}
        check(f"real DCP {case} -> DCP: the same chunks as torch's", chunks(md) == chunks(theirs_md))
        where = lambda m: sorted((i.fqn, s.relative_path) for i, s in m.storage_data.items())
        check(f"real DCP {case} -> DCP: every item in the file torch put it in", where(md) == where(theirs_md))


def from_megatron_core(mcore_case):
    """Megatron-Core's stacked layers (per-query-group QKV) through both targets of the same translation:
    the DCP's weights equal the Hugging Face export's (itself checked against transformers' logits by
    hf_mcore), renamed, q and k rows from rotate-half to torchtitan's interleaved pairs."""
    atomic, hf, out = (os.path.join(WORK, "mcore", x) for x in ("atomic", "hf", "dcp-tp2"))  # the record's folder names
    r = run("ucp-convert", [os.path.join(mcore_case, "checkpoint"), "-o", atomic])
    check("a Megatron-Core Llama converts", r.returncode == 0, r.stderr[-1000:])
    r1 = run("ucp-reshard", [atomic, "-o", hf, "--format", "hf"])
    r2 = run("ucp-reshard", [atomic, "-o", out, "--format", "dcp", "--mesh", "tp=2"], ranks=2)
    check("Megatron-Core -> hf and -> DCP tp=2: written", r1.returncode == 0 and r2.returncode == 0, (r1.stderr + r2.stderr)[-1500:])
    if r1.returncode or r2.returncode:
        return
    # What a user needs to load it, said by the run: the layout, torchtitan's model arguments (Megatron's
    # own shapes: reference.pt's), and the two groups Megatron trains (30 matrices decayed, 9 norms not).
    ref = torch.load(os.path.join(mcore_case, "reference.pt"), weights_only=False)
    layers, hidden = ref["decoder.layers.self_attention.linear_proj.weight"].shape[:2]
    facts = (f"dim {hidden}, n_layers {layers}, n_heads 4, n_kv_heads 2, vocab_size {ref['embedding.word_embeddings.weight'].shape[0]}, "
             f"feed-forward hidden size {ref['decoder.layers.mlp.linear_fc2.weight'].shape[2]}, norm_eps 1e-05, rope_theta 10000")
    for said in [facts, "the layout is get_state_dict's", "CheckpointManager layout", "is not written yet",
                 "2 optimizer param groups, each listing its parameters (group 0: 30 tensors, weight_decay 0.01; group 1: 9 tensors, "
                 "weight_decay 0)", "build the optimizer with the same groups"]:
        check(f"Megatron-Core -> DCP tp=2 says: {said[:60]}", said in r2.stderr, r2.stderr[-2000:])
    weights = {}
    for f in sorted(os.listdir(hf)):
        if f.endswith(".safetensors"):
            weights.update(read_safetensors(os.path.join(hf, f)))
    cfg = json.load(open(os.path.join(hf, "config.json")))
    hd = cfg["hidden_size"] // cfg["num_attention_heads"]
    names = {"self_attn.q_proj": "attention.wq", "self_attn.k_proj": "attention.wk", "self_attn.v_proj": "attention.wv",
             "self_attn.o_proj": "attention.wo", "mlp.gate_proj": "feed_forward.w1", "mlp.up_proj": "feed_forward.w3",
             "mlp.down_proj": "feed_forward.w2", "input_layernorm": "attention_norm", "post_attention_layernorm": "ffn_norm"}
    want = {"model.tok_embeddings.weight": weights["model.embed_tokens.weight"], "model.norm.weight": weights["model.norm.weight"],
            "model.output.weight": weights["lm_head.weight"]}
    for k, v in weights.items():
        parts = k.split(".")
        if parts[1] == "layers":
            key = f"model.layers.{parts[2]}.{names['.'.join(parts[3:-1])]}.weight"
            want[key] = to_pairs(v, hd) if parts[4] in ("q_proj", "k_proj") else v
    got, got_o, _ = read_dcp(out)
    got_model = {k: v for k, v in got.items() if k.startswith("model.")}
    check_tensors("Megatron-Core -> DCP tp=2 (weights, against the hf export)", got_model, want)
    # Every tensor and option against Megatron's own full state (reference.pt, common.json), the param
    # groups as Megatron-Core rebuilds them (it saves no `params`): norms in the group of wd_mult 0.
    want_t, want_o = expected_from_mcore(mcore_case, cfg["num_attention_heads"], cfg["num_key_value_heads"])
    for mesh, ranks in [("tp=2", 2), ("dp=2", 2), ("dp=1", 1)]:
        folder = os.path.join(WORK, "mcore", "dcp-" + mesh.replace("=", ""))
        if mesh != "tp=2":
            r = run("ucp-reshard", [atomic, "-o", folder, "--format", "dcp", "--mesh", mesh], ranks=ranks)
            check(f"Megatron-Core -> DCP {mesh}: written", r.returncode == 0, r.stderr[-1500:])
            if r.returncode:
                continue
            got, got_o, _ = read_dcp(folder)
        check_record(f"mcore {mesh}", folder, f"Megatron-Core -> DCP {mesh}")
        check_tensors(f"Megatron-Core -> DCP {mesh} (against Megatron's reference.pt)", got, want_t)
        check_objects(f"Megatron-Core -> DCP {mesh}", got_o, want_o)


def unknown_groups(mcore_case):
    """The same save with args.use_mup set (MuP builds Megatron's groups by its own rule): which parameter
    is in which group is not known, said by the conversion, and --format dcp, which would write each
    group's parameters, is refused; --format hf (weights only) is written."""
    src = os.path.join(WORK, "mup", "checkpoint")
    fresh_folder(os.path.dirname(src))
    shutil.copytree(os.path.join(mcore_case, "checkpoint"), src)
    os.chmod(os.path.join(src, "common.pt"), 0o644)
    set_flag_in_args(os.path.join(src, "common.pt"), "use_mup")
    atomic = os.path.join(WORK, "mup", "atomic")
    r = run("ucp-convert", [src, "-o", atomic])
    check("Megatron-Core with use_mup converts, saying its groups' members are not known",
          r.returncode == 0 and "built by the job's use_mup" in r.stderr and "--format dcp, which writes each group's parameters, refuses" in r.stderr,
          r.stderr[-1500:])
    refused("Megatron-Core groups of unknown members", [atomic, "--format", "dcp", "--mesh", "dp=1"],
            [atomic, "param group 1 of 2 holds no parameter", "not Megatron-Core's default pair", "--format hf"])
    r = run("ucp-reshard", [atomic, "-o", os.path.join(WORK, "mup", "hf"), "--format", "hf"])
    check("Megatron-Core with use_mup: --format hf written", r.returncode == 0, r.stderr[-800:])


def refused(label, args, expect, ranks=1, status=None):
    """Refused with every string of `expect` said, nothing written; with exit status `status` where given
    (2: a bad command line, judged before anything is read)."""
    out = os.path.join(WORK, "refused", label.replace(" ", "_"))
    r = run("ucp-reshard", args + ["-o", out], ranks=ranks)
    text = r.stderr
    ok = (r.returncode != 0 if status is None else r.returncode == status) and all(e in text for e in expect) and \
        "Traceback" not in text and not os.path.exists(os.path.join(out, ".metadata"))
    check(f"refused: {label}", ok, f"rc {r.returncode}: {text[-800:]}")


def refusals():
    atomic = os.path.join(WORK, "ds", "atomic")
    dcp = ["--format", "dcp"]
    refused("a mesh dimension given twice", [atomic, *dcp, "--mesh", "dp=2,dp=4"], ["--mesh", "dp given twice"], status=2)
    refused("a mesh dimension other than dp and tp", [atomic, *dcp, "--mesh", "pp=2"], ["--mesh", "'pp=2'"], status=2)
    refused("a mesh size not a number", [atomic, *dcp, "--mesh", "tp=x"], ["--mesh", "'tp=x'"], status=2)
    refused("bf16", [atomic, *dcp, "--dtype", "bf16"], ["--dtype bf16", "fp32"])
    refused("--max-shard-size", [atomic, *dcp, "--max-shard-size", "1MB"], ["--max-shard-size", "--format hf"])
    refused("--mesh with hf", [atomic, "--format", "hf", "--mesh", "dp=2"], ["--mesh", "--format dcp"])
    refused("a DeepSpeed layout flag", [atomic, *dcp, "--tp", "2"], ["--tp", "--mesh"])
    # the real Llama case has 4 query heads and 2 key-value heads: tp=4 would cut heads
    refused("tp not dividing the heads", [atomic, *dcp, "--mesh", "tp=4"], ["--mesh tp=4", "does not divide", "2 key-value heads"])
    gpt = os.path.join(WORK, "gpt", "atomic")
    r = run("ucp-convert", [os.path.join(os.path.dirname(DS_CASE), "tp2_pp2_dp2_zero1_fp32", "ckpt"), "-o", gpt], ranks=2)
    check("a GPT-style case converts", r.returncode == 0, r.stderr[-1000:])
    refused("a GPT-style model (learned positions, LayerNorm)", [gpt, *dcp, "--mesh", "dp=2"], [gpt, "torchtitan's Llama", "GPT-shaped",
                                                                                              "GPT2LMHeadModel"], ranks=2)


from_deepspeed()
from_dcp()
from_megatron_core(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "real-mcore", "llama_tp2"))
unknown_groups(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "real-mcore", "llama_tp2"))
refusals()
finish("dcp_target")
