"""--format mcore from another family's names (issue 53): Hugging Face Llamas imported by ucp-convert
(tests/data/real-hf: transformers' own save_pretrained) and real Megatron-DeepSpeed-style DeepSpeed
checkpoints (../shared/real-deepspeed beside the checkout: a Llama and GPTs) and torchtitan's Llama (a real FSDP2
DCP checkpoint of ../shared/real-dcp: its reference.pt, dcp_to_torch_save's, with q and k made rotate-half) written
as Megatron-LM's release checkpoint at several TP x PP x DP layouts.

    mcore_cross_family.py UCP_BIN_DIR REAL_HF_DIR WORK RECORD [mpiexec]

Every tensor is checked against a ground truth this file builds itself from files other programs wrote:
- the model: the Hugging Face tensors (the safetensors transformers wrote), or DeepSpeed's own universal
  output of the same checkpoint (ds_to_universal's zero/<name>/fp32.pt: query_key_value = [q; k; v],
  dense_h_to_4h = [gate; up]), joined as Megatron-LM's own Llama converter joins them: linear_qkv per
  query group (its query heads, its key head, its value head), linear_fc1 = [gate; up], layers stacked;
  bit for bit in the saved dtype;
- where each chunk is: in the file of the rank whose TP piece and pipeline stage hold it (rank
  t + TP * DP * p, Megatron-Core's order; DP rank 0 saves), inside the piece;
- common.pt: the args Megatron-LM's load checks (num_layers, hidden_size, num_attention_heads), the layout,
  a vocabulary divisor that keeps the rows at that TP, no optimizer, iteration 0; the tracker says release;
- the linears' extra state: [None] per layer, as the local spec saves it;
- a round trip: the Hugging Face models' Megatron-LM roots read back by ucp-convert and exported again give the
  tensors transformers saved, bit for bit.
Real reader: RECORD (tests/data/real-mcore/mcore_cross_family_readers.json, written by cross_family_check.py in
the trixie chroot) holds the sha256 of every file of the outputs Megatron-LM's own load_checkpoint loaded with
the job's default flags, and the loaded model's logits against transformers' (the Hugging Face models) or the
DeepSpeed harness model's: every output here recorded must be those bytes, and the record must say it loaded
without error at iteration 0 and its logits agree (fp32 within 1e-5; bf16 within two bf16 steps at 1).
Megatron-DeepSpeed-style GPTs of the real cases (LayerNorm with biases, learned positions, SwiGLU, GQA, biases on every
linear layer, tied; GPTModelPipe's and GPTModel's names) are checked the same way against DeepSpeed's universal output.
Refused by name, nothing written: torchtitan's optimizer state without --weights-only, a --tp that
does not divide the query groups, a --make-vocab-size-divisible-by that does not keep the rows, --dtype
other than the job's.
"""
import glob
import hashlib
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklist import check, finish, fresh_folder, tool_runner  # noqa: E402
from dcp_files import read_dcp  # noqa: E402
from safetensors_reader import read_model_folder  # noqa: E402
from mcore_expected import LINEARS, expected_from_deepspeed_gpt, expected_from_deepspeed_llama, expected_from_hf, owner  # noqa: E402

BIN, REAL_HF, WORK, RECORD = sys.argv[1:5]
run = tool_runner(BIN, sys.argv[5] if len(sys.argv) > 5 else None)
record = json.load(open(RECORD))["outputs"]
fresh_folder(WORK)
DS_CASES = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared", "real-deepspeed", "cases"))


def check_output(label, out, expected, layers, tp, pp, dp, vocab, dtype):
    release = os.path.join(out, "release")
    check(f"{label}: the tracker says release", open(os.path.join(out, "latest_checkpointed_iteration.txt")).read() == "release")
    files = sorted(os.path.basename(f) for f in glob.glob(os.path.join(release, "__*_0.distcp")))
    want = sorted(f"__{t + tp * dp * p}_0.distcp" for t in range(tp) for p in range(pp))
    check(f"{label}: one file per rank of DP rank 0", files == want, f"{files} != {want}")
    tensors, objects, md = read_dcp(release)
    check(f"{label}: the model's keys, no others", sorted(tensors) == sorted(expected), f"{sorted(tensors)}")
    for key, value in expected.items():
        got = tensors.get(key)
        ok = got is not None and got.dtype == value.dtype and got.shape == value.shape and torch.equal(got, value)
        check(f"{label}: {key} bit for bit ({value.dtype})", ok,
              f"{None if got is None else (got.dtype, tuple(got.shape))} vs {value.dtype} {tuple(value.shape)}")
    misplaced = []
    for index, info in md.storage_data.items():
        if getattr(index, "offset", None) is None:
            continue
        chunk = md.state_dict_metadata[index.fqn].chunks[index.index]
        rank = owner(index.fqn, list(chunk.offsets), list(chunk.sizes), list(md.state_dict_metadata[index.fqn].size), tp, pp, dp, layers)
        if rank is None or info.relative_path != f"__{rank}_0.distcp":
            misplaced.append((index.fqn, tuple(chunk.offsets), info.relative_path, rank))
    check(f"{label}: every chunk in its TP piece and stage's file", not misplaced, str(misplaced[:4]))
    extra = {f"decoder.layers.{m}._extra_state/shard_{i}_{layers}" for m in LINEARS for i in range(layers)}
    check(f"{label}: the linears' extra state, [None] per layer", set(objects) == extra and all(v == [None] for v in objects.values()),
          str(sorted(objects)[:4]))
    common = torch.load(os.path.join(release, "common.pt"))
    a = common.get("args")
    ok = (a is not None and a.num_layers == layers and a.tensor_model_parallel_size == tp and a.pipeline_model_parallel_size == pp
          and a.data_parallel_size == dp and a.world_size == tp * pp * dp and a.padded_vocab_size == vocab
          and vocab % (a.make_vocab_size_divisible_by * tp) == 0 and a.no_save_optim and a.no_save_rng
          and a.bf16 == (dtype == torch.bfloat16) and a.swiglu)
    check(f"{label}: common.pt's args at the layout, a divisor that keeps {vocab} rows", ok, str(vars(a) if a is not None else common))
    check(f"{label}: common.pt holds no optimizer, iteration 0", "optimizer" not in common and common.get("iteration") == 0
          and "opt_param_scheduler" not in common, str(sorted(common)))
    if os.path.basename(out) in record:
        rec = record[os.path.basename(out)]
        files = {}
        for d, _, names in os.walk(out):
            for n in names:
                rel = os.path.relpath(os.path.join(d, n), out)
                if not rel.startswith(".ucp"):
                    files[rel] = hashlib.sha256(open(os.path.join(d, n), "rb").read()).hexdigest()
        check(f"{label}: the bytes Megatron-LM's load_checkpoint loaded (the record)", files == rec["sha256"],
              str(sorted(set(files.items()) ^ set(rec["sha256"].items()))[:3]))
        bound = 1e-5 if rec["dtype"] == "fp32" else 2 ** -6
        check(f"{label}: the record: loaded at iteration 0, no error, logits within {bound:g} of {rec['reference'][:40]}...",
              rec["error"] is None and rec["strict_load_error"] is None and rec["iterations"] == [0]
              and rec["max_abs_logit_diff"] is not None and rec["max_abs_logit_diff"] <= bound, str(rec)[:400])
        seen.add(os.path.basename(out))
    return a


seen = set()
LAYOUTS = [(1, 1, 1, 1), (2, 2, 1, 2), (2, 1, 2, 2)]  # tp, pp, dp, ranks
for case in ["llama_fp32", "llama_bf16", "llama_sharded"]:
    src = os.path.join(REAL_HF, case)
    atomic = os.path.join(WORK, case)
    r = run("ucp-convert", [src, "-o", atomic])
    check(f"{case}: imports", r.returncode == 0, r.stderr[-800:])
    t, config = read_model_folder(src), json.load(open(os.path.join(src, "config.json")))
    dtype = next(iter(t.values())).dtype
    expected = expected_from_hf(t, config["num_hidden_layers"], config["num_key_value_heads"], dtype)
    for tp, pp, dp, ranks in LAYOUTS:
        label = f"{case} tp{tp} pp{pp} dp{dp}"
        out = os.path.join(WORK, f"{case}-tp{tp}pp{pp}dp{dp}")
        r = run("ucp-reshard", [atomic, "-o", out, "--format", "mcore", "--tp", str(tp), "--pp", str(pp), "--dp", str(dp)], ranks=ranks)
        check(f"{label}: written", r.returncode == 0 and "release" in r.stderr, r.stderr[-800:])
        if r.returncode == 0:
            a = check_output(label, out, expected, config["num_hidden_layers"], tp, pp, dp, config["vocab_size"], dtype)
            launch = next((line for line in r.stderr.splitlines() if "launch Megatron-LM" in line), "")
            want = [f"--tensor-model-parallel-size {tp} ", f"--pipeline-model-parallel-size {pp} ", "--normalization RMSNorm",
                    "--swiglu", "--disable-bias-linear", "--position-embedding-type rope", "--ckpt-format torch_dist",
                    f"--make-vocab-size-divisible-by {a.make_vocab_size_divisible_by} ", f"--num-query-groups {config['num_key_value_heads']} "]
            want += ["--untie-embeddings-and-output-weights"] if not config.get("tie_word_embeddings") else []
            want += ["--bf16"] if dtype == torch.bfloat16 else []
            missing = [w for w in want if w not in launch + " "]
            unwanted = [w for w in ["--untie-embeddings-and-output-weights"] if config.get("tie_word_embeddings") and w in launch]
            check(f"{label}: the note gives Megatron-LM's flags for this model", launch and not missing and not unwanted,
                  f"missing {missing}, unwanted {unwanted}: {launch}")

# round trip: the Megatron-LM root read back (ucp-convert takes the iteration its tracker names: release) and exported
# as a Hugging Face model again gives the model transformers saved, every tensor bit for bit
for case in ["llama_fp32", "llama_bf16"]:
    root = os.path.join(WORK, f"{case}-tp2pp2dp1")
    back, hf = os.path.join(WORK, f"{case}-back"), os.path.join(WORK, f"{case}-hf")
    r = run("ucp-convert", [root, "-o", back], ranks=2)
    check(f"{case} tp2 pp2: ucp-convert reads the release checkpoint back", r.returncode == 0, r.stderr[-600:])
    r = run("ucp-reshard", [back, "-o", hf, "--format", "hf"])
    check(f"{case} tp2 pp2: exported to Hugging Face again", r.returncode == 0, r.stderr[-600:])
    if r.returncode == 0:
        want, got = read_model_folder(os.path.join(REAL_HF, case)), read_model_folder(hf)
        same = sorted(want) == sorted(got) and all(want[k].dtype == got[k].dtype and torch.equal(want[k], got[k]) for k in want)
        check(f"{case}: Hugging Face -> Megatron-LM -> Hugging Face gives transformers' tensors bit for bit", same,
              f"{sorted(set(want) ^ set(got))[:4]}")

# refusals on the import, nothing written
atomic = os.path.join(WORK, "llama_fp32")
for flags, what, words in [
        (["--tp", "4", "--pp", "1"], "--tp 4 with 2 query groups", ["--tp 4", "query groups"]),
        (["--tp", "2", "--pp", "1", "--make-vocab-size-divisible-by", "3"], "a divisor that does not keep 320 rows",
         ["320 vocabulary rows", "--make-vocab-size-divisible-by 32"]),
        (["--tp", "1", "--pp", "3"], "--pp 3 with 2 layers", ["--pp 3", "2 layers"]),
        (["--tp", "1", "--pp", "1", "--dtype", "bf16"], "--dtype bf16 of an fp32 job", ["--dtype bf16", "fp32"])]:
    out = os.path.join(WORK, "refused")
    r = run("ucp-reshard", [atomic, "-o", out] + ["--format", "mcore"] + flags)
    check(f"import, {what}: refused by name, nothing written", r.returncode != 0 and all(w in r.stderr for w in words)
          and not os.path.exists(out), r.stderr[-600:])

# a real DeepSpeed checkpoint of a Megatron-DeepSpeed-style Llama (GPTModel names, ZeRO-1, TP=2 DP=2, fp32)
ds = os.path.join(DS_CASES, "llama_tp2_dp2_zero1_fp32")
check("../shared/real-deepspeed beside the checkout", os.path.isdir(ds), ds)
if os.path.isdir(ds):
    atomic = os.path.join(WORK, "ds")
    r = run("ucp-convert", [os.path.join(ds, "ckpt"), "-o", atomic], ranks=2)
    check("DeepSpeed llama: converts", r.returncode == 0, r.stderr[-800:])
    out = os.path.join(WORK, "ds-out")  # (its optimizer state carried: deepspeed_to_mcore.py)
    for flags, words in [(["--tp", "3", "--pp", "1"], "4 attention heads"), (["--tp", "1", "--pp", "3"], "4 layers"),
                         (["--tp", "4", "--pp", "1"], "2 query groups")]:
        r = run("ucp-reshard", [os.path.join(ds, "ckpt"), "-o", out, "--format", "mcore", "--weights-only", "--plan-only"] + flags)
        check(f"DeepSpeed llama's root --plan-only {' '.join(flags)}: refused before any conversion, naming the {words}",
              r.returncode != 0 and words in r.stderr and "converting" not in r.stderr and not os.path.exists(out), r.stderr[-400:])
    r = run("ucp-reshard", [atomic, "-o", out, "--format", "mcore", "--gpus", "4"])
    check("--format mcore --gpus: refused naming --gpus", r.returncode != 0 and "no --gpus" in r.stderr and not os.path.exists(out), r.stderr[-300:])
    cfg, expected = expected_from_deepspeed_llama(ds)
    for tp, pp, dp, ranks in [(2, 2, 1, 2), (1, 1, 1, 1)]:
        label = f"DeepSpeed llama --weights-only tp{tp} pp{pp} dp{dp}"
        out = os.path.join(WORK, f"ds-tp{tp}pp{pp}dp{dp}")
        r = run("ucp-reshard", [atomic, "-o", out, "--format", "mcore", "--tp", str(tp), "--pp", str(pp), "--dp", str(dp), "--weights-only"],
                ranks=ranks)
        check(f"{label}: written", r.returncode == 0, r.stderr[-800:])
        if r.returncode == 0:
            check_output(label, out, expected, cfg["num_layers"], tp, pp, dp, cfg["vocab_size"], torch.float32)
    # straight from the training root: its scratch conversion reads the fp32 weights alone, and the files are the
    # atomic checkpoint's output byte for byte but .metadata (its save id names the atomic checkpoint written from),
    # whose chunks read the same tensors; the scratch is gone
    out = os.path.join(WORK, "ds-root-tp2pp2dp1")
    r = run("ucp-reshard", [os.path.join(ds, "ckpt"), "-o", out, "--format", "mcore", "--tp", "2", "--pp", "2", "--weights-only"], ranks=2)
    check("DeepSpeed llama's root --weights-only: converts the fp32 weights alone, then writes", r.returncode == 0
          and "the fp32 weights alone" in r.stderr, r.stderr[-800:])

    def files_of(d):
        return {os.path.relpath(os.path.join(p, n), d): open(os.path.join(p, n), "rb").read()
                for p, _, names in os.walk(d) for n in names if not n.startswith(".ucp")}
    if r.returncode == 0:
        a, b = files_of(out), files_of(os.path.join(WORK, "ds-tp2pp2dp1"))
        meta = os.path.join("release", ".metadata")
        ta, tb = read_dcp(os.path.join(out, "release"))[0], read_dcp(os.path.join(WORK, "ds-tp2pp2dp1", "release"))[0]
        same_tensors = sorted(ta) == sorted(tb) and all(torch.equal(ta[k], tb[k]) for k in ta)
        check("DeepSpeed llama's root --weights-only: the atomic checkpoint's output byte for byte (.metadata: the same tensors), "
              "no scratch left", sorted(a) == sorted(b) and all(a[k] == b[k] for k in a if k != meta) and same_tensors
              and not any(n.startswith(".ucp-scratch") for n in os.listdir(out)), f"{sorted(set(a) ^ set(b))} {os.listdir(out)}")

for name, layouts in [("tp2_pp2_dp2_zero1_fp32", [(2, 2, 1, 2), (1, 1, 1, 1)]), ("zero3_dp4_fp32", [(1, 2, 2, 2)])]:
    case = os.path.join(DS_CASES, name)
    atomic = os.path.join(WORK, name)
    r = run("ucp-convert", [os.path.join(case, "ckpt"), "-o", atomic], ranks=2)
    check(f"DeepSpeed GPT {name}: converts", r.returncode == 0, r.stderr[-800:])
    cfg, expected = expected_from_deepspeed_gpt(case)
    # the facts its files do not hold (a ZeRO-3 save of GPTModel keeps no Megatron args), as a user gives them
    facts = os.path.join(WORK, f"{name}-facts.json")
    json.dump({k: cfg[k] for k in ("num_attention_heads", "num_key_value_heads")}, open(facts, "w"))
    for tp, pp, dp, ranks in layouts:
        label = f"DeepSpeed GPT {name} --weights-only tp{tp} pp{pp} dp{dp}"
        out = os.path.join(WORK, f"{name}-tp{tp}pp{pp}dp{dp}")
        r = run("ucp-reshard", [atomic, "-o", out, "--format", "mcore", "--tp", str(tp), "--pp", str(pp), "--dp", str(dp), "--weights-only",
                                "--model-config", facts], ranks=ranks)
        check(f"{label}: written", r.returncode == 0 and "LayerNorm, learned-position, SwiGLU model with biases" in r.stderr, r.stderr[-800:])
        launch = next((line for line in r.stderr.splitlines() if "launch Megatron-LM" in line), "")
        check(f"{label}: the note gives Megatron-LM's flags for a LayerNorm model with learned positions and biases",
              all(w in launch for w in ["--normalization LayerNorm", "--position-embedding-type learned_absolute", "--swiglu"])
              and "--disable-bias-linear" not in launch and "--untie" not in launch, launch)
        trusted = name.startswith("zero3")  # its files hold no Megatron args: the heads are --model-config's word alone
        check(f"{label}: " + ("the facts taken on trust said" if trusted else "no fact said to be taken on trust (the args hold them)"),
              ("taken on trust from --model-config" in r.stderr) == trusted, r.stderr[-600:])
        if r.returncode == 0:
            a = check_output(label, out, expected, cfg["num_layers"], tp, pp, dp, cfg["vocab_size"], torch.float32)
            check(f"{label}: the args say LayerNorm, learned positions, biases, tied", a is not None and a.normalization == "LayerNorm"
                  and a.position_embedding_type == "learned_absolute" and a.add_bias_linear and not a.untie_embeddings_and_output_weights,
                  str(vars(a))[:400])
    if name.startswith("zero3"):  # facts --model-config gives that the weights contradict: refused by name, nothing written
        for key, value, words in [("hidden_size", cfg["hidden_size"] * 2, "the word embedding's columns"),
                                  ("num_layers", cfg["num_layers"] * 2, "the layers' names"),
                                  ("num_key_value_heads", cfg["num_attention_heads"], "key rows of heads")]:
            bad = os.path.join(WORK, f"{name}-bad-facts.json")
            json.dump({"num_attention_heads": cfg["num_attention_heads"], "num_key_value_heads": cfg["num_key_value_heads"], key: value},
                      open(bad, "w"))
            out = os.path.join(WORK, f"{name}-bad-facts")
            r = run("ucp-reshard", [atomic, "-o", out, "--format", "mcore", "--tp", "1", "--pp", "1", "--weights-only", "--model-config", bad])
            check(f"DeepSpeed GPT {name}: --model-config's {key} {value} against the weights: refused by name, nothing written",
                  r.returncode != 0 and bad in r.stderr and words in r.stderr and not os.path.exists(out), r.stderr[-400:])

# torchtitan's Llama (a real FSDP2 DCP checkpoint, torch's own writer): its q and k rows in torchtitan's interleaved
# rotary pairs, made rotate-half as Hugging Face's conversion of Meta's weights permutes them
titan = os.path.join(os.path.dirname(DS_CASES), "..", "real-dcp", "cases", "fsdp2_dp2")
if os.path.isdir(titan):
    atomic = os.path.join(WORK, "titan")
    r = run("ucp-convert", [os.path.join(titan, "checkpoint"), "-o", atomic], ranks=2)
    check("torchtitan fsdp2_dp2: converts", r.returncode == 0, r.stderr[-800:])
    facts = os.path.join(os.path.dirname(REAL_HF), "hf", "dcp_fsdp2_dp2", "model_config.json")
    cfg = json.load(open(facts))
    ref = torch.load(os.path.join(titan, "reference.pt"))["model"]
    heads, hidden = cfg["num_attention_heads"], ref["tok_embeddings.weight"].shape[1]
    groups = ref["layers.0.attention.wk.weight"].shape[0] // (hidden // heads)
    cfg["num_layers"] = len({k.split(".")[1] for k in ref if k.startswith("layers.")})

    def halves(w, n):  # each head's rows (2i, 2i+1) pairs -> (i, i + d/2) halves
        return w.view(n, -1, 2, w.shape[1]).transpose(1, 2).reshape(w.shape)
    t = {"model.embed_tokens.weight": ref["tok_embeddings.weight"], "model.norm.weight": ref["norm.weight"],
         "lm_head.weight": ref["output.weight"]}
    for i in range(cfg["num_layers"]):
        p = f"layers.{i}."
        t.update({f"model.layers.{i}.self_attn.q_proj.weight": halves(ref[p + "attention.wq.weight"], heads),
                  f"model.layers.{i}.self_attn.k_proj.weight": halves(ref[p + "attention.wk.weight"], groups),
                  f"model.layers.{i}.self_attn.v_proj.weight": ref[p + "attention.wv.weight"],
                  f"model.layers.{i}.self_attn.o_proj.weight": ref[p + "attention.wo.weight"],
                  f"model.layers.{i}.mlp.gate_proj.weight": ref[p + "feed_forward.w1.weight"],
                  f"model.layers.{i}.mlp.up_proj.weight": ref[p + "feed_forward.w3.weight"],
                  f"model.layers.{i}.mlp.down_proj.weight": ref[p + "feed_forward.w2.weight"],
                  f"model.layers.{i}.input_layernorm.weight": ref[p + "attention_norm.weight"],
                  f"model.layers.{i}.post_attention_layernorm.weight": ref[p + "ffn_norm.weight"]})
    expected = expected_from_hf(t, cfg["num_layers"], groups, torch.float32)
    out = os.path.join(WORK, "titan-refused")
    r = run("ucp-reshard", [atomic, "-o", out, "--format", "mcore", "--tp", "1", "--pp", "1", "--model-config", facts])
    check("torchtitan with its optimizer state: refused, naming --weights-only, nothing written", r.returncode != 0
          and "not yet from torchtitan's" in r.stderr and "--weights-only" in r.stderr and not os.path.exists(out), r.stderr[-600:])
    for tp, pp, dp, ranks in [(2, 2, 1, 2)]:
        label = f"torchtitan fsdp2_dp2 --weights-only tp{tp} pp{pp} dp{dp}"
        out = os.path.join(WORK, f"titan-tp{tp}pp{pp}dp{dp}")
        r = run("ucp-reshard", [atomic, "-o", out, "--format", "mcore", "--tp", str(tp), "--pp", str(pp), "--dp", str(dp), "--weights-only",
                                "--model-config", facts], ranks=ranks)
        check(f"{label}: written", r.returncode == 0 and "torchtitan's names" in r.stderr, r.stderr[-800:])
        if r.returncode == 0:
            check_output(label, out, expected, cfg["num_layers"], tp, pp, dp, ref["tok_embeddings.weight"].shape[0], torch.float32)

check("every output in the record written and checked here", seen == set(record), str(set(record) - seen))
finish("mcore_cross_family")
