"""ucp-reshard --format hf on a real DeepSpeed case, against independent ground truth.

    hf_export.py BIN_DIR CASE_DIR ATOMIC WORK DATA_DIR [MPIEXEC]

BIN_DIR holds ucp-reshard and ucp-convert; ATOMIC is ucp-convert's atomic checkpoint of the case;
DATA_DIR is tests/data/hf. For a Llama-shaped case (model_config.json: rmsnorm, rope, swiglu):
- every tensor of the export equals DeepSpeed's own universal fp32 weights (ds_to_universal), cut by the
  harness's documented layout ([q; k; v] rows of heads x head_dim, [gate; up]) and without vocabulary
  padding, under Hugging Face's names; config.json says the case's model_config.json; the safetensors
  container is checked field by field by the reader below (not ucp's);
- the export is byte-identical to the fixture in DATA_DIR/<case>/, which transformers 5.3 itself loaded
  (no missing, unexpected or mismatched keys) and whose logits it computed (transformers_logits.json);
  those logits equal the training model's own forward pass (harness_logits.py, weights from DeepSpeed's
  universal output) within 1e-5: so the export is what transformers reads as the trained model;
- bf16: each value is torch's rounding of the fp32 export; files cut by --max-shard-size hold the same
  tensors, and 2 ranks write the same bytes as 1;
- the layout never matters: the atomic checkpoint resharded to three other layouts and converted back
  exports to the same bytes; so does DeepSpeed's own universal folder;
- --plan-only --json writes nothing and lists the index's tensors; command-line misuse exits 2.
For any other case: refused by name (the features no transformers class has, or --model-config for
facts the checkpoint lacks), nothing written.
"""
import filecmp
import json
import os
import re
import shutil
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ds_stubs  # noqa: E402,F401
from atomic_files import atomic_tensor  # noqa: E402
from checklist import check, finish  # noqa: E402
from damage import first_tensor, flip_in_record, records_holding  # noqa: E402
from safetensors_reader import read_safetensors  # noqa: E402

BIN, CASE_DIR, ATOMIC, WORK, DATA = sys.argv[1:6]
MPIEXEC = sys.argv[6] if len(sys.argv) > 6 else None
RESHARD, CONVERT = os.path.join(BIN, "ucp-reshard"), os.path.join(BIN, "ucp-convert")
CASE = os.path.basename(os.path.normpath(CASE_DIR))
CFG = json.load(open(os.path.join(CASE_DIR, "model_config.json")))
UNIVERSAL = os.path.join(CASE_DIR, "ckpt", "global_step6_universal")
INDEX = "model.safetensors.index.json"


def run(args, ranks=1):
    cmd = [RESHARD] + args
    if ranks > 1:
        cmd = [MPIEXEC, "--oversubscribe", "-np", str(ranks)] + cmd
    return subprocess.run(cmd, capture_output=True, text=True)


def read_export(d):
    """{name: tensor} over every file the index names, checking the index against the files."""
    index = json.load(open(os.path.join(d, INDEX)))
    tensors, size = {}, 0
    for f in sorted(set(index["weight_map"].values())):
        part = read_safetensors(os.path.join(d, f))
        for name, t in part.items():
            assert index["weight_map"].get(name) == f, f"{name} in {f}, the index says {index['weight_map'].get(name)}"
            tensors[name] = t
            size += t.numel() * t.element_size()
    assert sorted(tensors) == sorted(index["weight_map"]), "the index names tensors no file holds"
    assert index["metadata"]["total_size"] == size, f"total_size {index['metadata']['total_size']}, tensors {size}"
    return tensors


def expected_from_deepspeed():
    """LlamaForCausalLM's tensors from DeepSpeed's universal fp32 files, cut as the harness fused them."""
    L, h, nq, nkv, ffn, vocab = (CFG[k] for k in ("num_layers", "hidden_size", "num_attention_heads",
                                                   "num_key_value_heads", "ffn_hidden_size", "vocab_size"))
    hd = h // nq
    out = {}
    for name in os.listdir(os.path.join(UNIVERSAL, "zero")):
        path = os.path.join(UNIVERSAL, "zero", name, "fp32.pt")
        if not os.path.exists(path):
            continue
        t = torch.load(path, map_location="cpu")
        m = re.match(r"^(?:language_model\.encoder\.layers\.(\d+)|(\d+))\.(.+)$", name)
        if name.endswith("word_embeddings.weight"):
            out["model.embed_tokens.weight"] = atomic_tensor(t, (-1, h)) if not isinstance(t, dict) else t["param"]
            out["model.embed_tokens.weight"] = out["model.embed_tokens.weight"].reshape(-1, h)[:vocab]
        elif name.endswith("lm_head.weight") or name == "language_model.output_layer.weight":
            out["lm_head.weight"] = (t["param"] if isinstance(t, dict) else t).reshape(-1, h)[:vocab]
        elif name == "language_model.encoder.final_layernorm.weight" or name == f"{L + 2}.weight":
            out["model.norm.weight"] = atomic_tensor(t, (h,))
        elif m:
            i = int(m.group(1)) if m.group(1) is not None else int(m.group(2)) - 2
            key, p = m.group(3), f"model.layers.{i}."
            w = t["param"] if isinstance(t, dict) else t
            if key == "self_attention.query_key_value.weight":
                w = w.reshape(-1, h)
                out[p + "self_attn.q_proj.weight"], out[p + "self_attn.k_proj.weight"], out[p + "self_attn.v_proj.weight"] = \
                    w[:nq * hd], w[nq * hd:(nq + nkv) * hd], w[(nq + nkv) * hd:]
            elif key == "mlp.dense_h_to_4h.weight":
                w = w.reshape(-1, h)
                out[p + "mlp.gate_proj.weight"], out[p + "mlp.up_proj.weight"] = w[:ffn], w[ffn:]
            else:
                hf = {"input_layernorm.weight": "input_layernorm.weight", "post_attention_layernorm.weight":
                      "post_attention_layernorm.weight", "self_attention.dense.weight": "self_attn.o_proj.weight",
                      "mlp.dense_4h_to_h.weight": "mlp.down_proj.weight"}[key]
                shape = {"self_attn.o_proj.weight": (h, nq * hd), "mlp.down_proj.weight": (h, ffn)}.get(hf, (h,))
                out[p + hf] = w.reshape(shape)
        else:
            raise AssertionError(f"DeepSpeed's universal parameter {name}: no place in this test's map")
    return out


def llama_shaped():
    return CFG.get("normalization") == "rmsnorm" and CFG.get("position_embedding_type") == "rope" and CFG.get("swiglu")


def same_files(a, b, names):
    match, mismatch, errors = filecmp.cmpfiles(a, b, names, shallow=False)
    return not mismatch and not errors, mismatch + errors


def export_files(d):
    """The files of an export (a fixture's transformers_logits.json is the record of a reader, not one)."""
    return sorted(n for n in os.listdir(d) if n.endswith((".safetensors", ".json")) and not n.startswith(".")
                  and n != "transformers_logits.json")


def refused(label, args, words):
    out = os.path.join(WORK, re.sub(r"\W+", "_", label))
    r = run([ATOMIC, "-o", out, "--format", "hf", "-q"] + args)
    missing = [w for w in words if w not in r.stderr]
    check(f"{label}: refused naming {words}", r.returncode == 1 and not missing, f"exit {r.returncode}, missing {missing}: {r.stderr[-500:]}")
    check(f"{label}: nothing written", not os.path.exists(os.path.join(out, INDEX)) and not os.path.exists(os.path.join(out, "config.json")))


shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)

if not llama_shaped():
    # What the weights show refuses it before any fact is asked for.
    # GPT-2's class takes learned positions and LayerNorm, but not the case's GQA and SwiGLU.
    refused("a GPT-style model", [], ["GPT2LMHeadModel", "grouped-query attention", "SwiGLU", "LlamaForCausalLM",
                                      "fp32.pt"])
    # From a training run's root with nothing to reuse: refused before a conversion is made for nothing.
    root = os.path.join(WORK, "root")
    shutil.copytree(os.path.join(CASE_DIR, "ckpt"), root, ignore=shutil.ignore_patterns("*_universal", "latest_universal"))
    for args in ([], ["--plan-only"]):
        r = run([root, "-o", os.path.join(WORK, "from_root"), "--format", "hf"] + args)
        check(f"from its root{' (--plan-only)' if args else ''}: refused before converting", r.returncode == 1 and
              "LlamaForCausalLM" in r.stderr and sorted(os.listdir(root)) == ["global_step6", "latest"] and
              not os.path.exists(os.path.join(WORK, "from_root")), f"{os.listdir(root)} {r.stderr[-300:]}")
    finish(CASE)

# 1. The export, against DeepSpeed's own fp32 weights.
one = os.path.join(WORK, "np1")
r = run([ATOMIC, "-o", one, "--format", "hf"])
check("export: runs", r.returncode == 0, r.stderr[-600:])
got = read_export(one)
want = expected_from_deepspeed()
check("tensors: LlamaForCausalLM's names", sorted(got) == sorted(want), f"{sorted(set(got) ^ set(want))[:6]}")
bad = [n for n in want if n in got and not (got[n].dtype == torch.float32 and torch.equal(got[n], want[n].float()))]
check(f"tensors: {len(want)} equal DeepSpeed's universal fp32 bit for bit", not bad, f"differ: {bad[:6]}")
config = json.load(open(os.path.join(one, "config.json")))
pairs = {"hidden_size": "hidden_size", "intermediate_size": "ffn_hidden_size", "num_hidden_layers": "num_layers",
         "num_attention_heads": "num_attention_heads", "num_key_value_heads": "num_key_value_heads",
         "vocab_size": "vocab_size", "max_position_embeddings": "max_position_embeddings",
         "rms_norm_eps": "layernorm_epsilon", "rope_theta": "rope_theta"}
wrong = {k: (config.get(k), CFG[v]) for k, v in pairs.items() if config.get(k) != CFG[v]}
check("config.json: the case's model", not wrong and config["architectures"] == ["LlamaForCausalLM"] and
      config["tie_word_embeddings"] is (not CFG["untie_embeddings_and_output_weights"]) and
      config["attention_bias"] is CFG["add_bias_linear"] and config["torch_dtype"] == "float32", f"{wrong} {config}")

# 2. What transformers read: the fixture it loaded, and its logits against the training model's own.
fixture = os.path.join(DATA, CASE)
check("fixture: transformers checked this case's export", os.path.exists(os.path.join(fixture, "transformers_logits.json")),
      f"no {fixture}/transformers_logits.json (tests/hf/README.md says how to make it)")
if os.path.isdir(fixture):
    ok, differ = same_files(one, fixture, export_files(one))
    check("fixture: the export is byte-identical to what transformers loaded", ok and export_files(one) == export_files(fixture),
          f"differ: {differ}, files {export_files(one)} vs {export_files(fixture)}")
    tf = json.load(open(os.path.join(fixture, "transformers_logits.json")))
    check("fixture: transformers reported no missing, unexpected or mismatched keys", tf.get("loading_problems") is None, str(tf.get("loading_problems")))
    ref = os.path.join(WORK, "harness_logits.json")
    h = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "harness_logits.py"), CASE_DIR, "--out", ref],
                       capture_output=True, text=True)
    check("training model's logits: computed", h.returncode == 0, h.stderr[-400:])
    if h.returncode == 0:
        a, b = torch.tensor(json.load(open(ref))["logits"]), torch.tensor(tf["logits"])
        diff = (a - b).abs().max().item() if a.shape == b.shape else float("inf")
        check(f"logits: transformers on the export vs the training model: max |diff| {diff:.2e} <= 1e-5", diff <= 1e-5)

# 3. bf16, files cut by size, 2 ranks.
half = os.path.join(WORK, "bf16")
r = run([ATOMIC, "-o", half, "--format", "hf", "--dtype", "bf16"])
check("bf16: runs, saying the precision change", r.returncode == 0 and "fp32 -> bf16" in r.stderr, r.stderr[-400:])
if r.returncode == 0:
    hb = read_export(half)
    bad = [n for n in got if not torch.equal(hb[n].view(torch.int16), got[n].to(torch.bfloat16).view(torch.int16))]
    check("bf16: every value torch's rounding of the fp32 export", not bad and
          json.load(open(os.path.join(half, "config.json")))["torch_dtype"] == "bfloat16", f"{bad[:4]}")
cut = os.path.join(WORK, "cut")
r = run([ATOMIC, "-o", cut, "--format", "hf", "--max-shard-size", "100KB", "-q"])
files = [f for f in export_files(cut) if f.endswith(".safetensors")]
n = len(files)
check(f"--max-shard-size 100KB: {n} files named model-i-of-{n}", r.returncode == 0 and n > 2 and
      files == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)], f"{files} {r.stderr[-300:]}")
if r.returncode == 0:
    gc = read_export(cut)
    check("--max-shard-size: the same tensors", sorted(gc) == sorted(got) and all(torch.equal(gc[k], got[k]) for k in got))
    sizes = {f: sum(t.numel() * 4 for k, t in read_safetensors(os.path.join(cut, f)).items()) for f in files}
    big = [f for f, s in sizes.items() if s > 100_000 and len(read_safetensors(os.path.join(cut, f))) > 1]
    check("--max-shard-size: no file past the size but a single large tensor", not big, str(sizes))
if MPIEXEC:
    two = os.path.join(WORK, "cut_np2")
    r = run([ATOMIC, "-o", two, "--format", "hf", "--max-shard-size", "100KB", "-q"], ranks=2)
    ok, differ = same_files(cut, two, export_files(cut))
    check("2 ranks: the same bytes as 1", r.returncode == 0 and ok and export_files(two) == export_files(cut), f"{differ} {r.stderr[-300:]}")

# 4. The layout never matters: resharded by ucp, converted back, exported: the same bytes.
for dp, tp, pp, z in ((4, 1, 1, 1), (1, 2, 2, 1), (2, 1, 1, 3)):
    label = f"dp={dp} tp={tp} pp={pp} ZeRO-{z}"
    native, back, exp = (os.path.join(WORK, f"{w}_{dp}{tp}{pp}{z}") for w in ("native", "atomic", "hf"))
    r = run([ATOMIC, "-o", native, "-q", "--dp", str(dp), "--tp", str(tp), "--pp", str(pp), "--zero-stage", str(z)])
    r2 = subprocess.run([CONVERT, native, "-o", back, "-q"], capture_output=True, text=True) if r.returncode == 0 else r
    r3 = run([back, "-o", exp, "--format", "hf", "-q"]) if r2.returncode == 0 else r2
    ok, differ = same_files(one, exp, export_files(one)) if r3.returncode == 0 else (False, r3.stderr[-400:])
    check(f"layout {label}: resharded, converted back, exported: byte-identical", ok, str(differ))
theirs = os.path.join(WORK, "from_deepspeed_universal")
r = run([UNIVERSAL, "-o", theirs, "--format", "hf", "-q"])
ok, differ = same_files(one, theirs, export_files(one)) if r.returncode == 0 else (False, r.stderr[-400:])
check("DeepSpeed's own universal folder: the same bytes", ok, str(differ))

# A training run's root (`latest`), as users have it: its atomic checkpoint made in a scratch folder
# under -o (DeepSpeed's own universal folder of the tag is not reused: it records nothing of what it
# read, issue 42), then exported: the same bytes, the root as it was.
for label, keep_universal in (("with DeepSpeed's universal folder", True), ("native only", False)):
    root = os.path.join(WORK, "root_" + ("ds" if keep_universal else "native"))
    shutil.copytree(os.path.join(CASE_DIR, "ckpt"), root)
    if not keep_universal:
        shutil.rmtree(os.path.join(root, "global_step6_universal"))
        os.remove(os.path.join(root, "latest_universal"))
    listed = sorted(os.listdir(root))
    exp = root + "_hf"
    r = run([root, "-o", exp, "--format", "hf"])
    said = "converting it into " + os.path.join(exp, ".ucp-scratch-atomic")
    ok, differ = same_files(one, exp, export_files(one)) if r.returncode == 0 else (False, r.stderr[-400:])
    check(f"a checkpoint root ({label}): '{said}', the same bytes, nothing written into the root",
          ok and said in r.stderr and sorted(os.listdir(root)) == listed, f"{differ} {r.stderr[-300:]}")

# From a root, the export converts the fp32 weights alone: no moment is read. Shown with a byte of an
# exp_avg record flipped in one optimizer file (found by its bytes, torch.load's view of the file): the
# export writes the same bytes, while ucp-convert of that root, which reads the moments, refuses the
# record by its CRC-32.
root = os.path.join(WORK, "root_moment_damaged")
shutil.copytree(os.path.join(CASE_DIR, "ckpt"), root, ignore=shutil.ignore_patterns("*_universal"))
tag = open(os.path.join(root, "latest")).read().strip()
optim = sorted(f for f in os.listdir(os.path.join(root, tag)) if f.endswith("optim_states.pt"))[0]
optim = os.path.join(root, tag, optim)


moment = first_tensor(torch.load(optim, map_location="cpu", weights_only=False), ("exp_avg",))
records = records_holding(optim, moment) if moment is not None else []
check("damaged moment: the optimizer file's exp_avg found as one zip record", len(records) == 1, f"{optim}: {records}")
if len(records) == 1:
    flip_in_record(optim, records[0])
    exp = root + "_hf"
    r = run([root, "-o", exp, "--format", "hf"])
    ok, differ = same_files(one, exp, export_files(one)) if r.returncode == 0 else (False, r.stderr[-400:])
    check("damaged moment: the export from the root, which converts the weights alone, the same bytes",
          ok and "the fp32 weights alone" in r.stderr, f"{differ} {r.stderr[-300:]}")
    r = subprocess.run([CONVERT, root, "-o", os.path.join(WORK, "moment_damaged_atomic")], capture_output=True, text=True)
    check("damaged moment: ucp-convert, which reads the moments, refuses the record", r.returncode == 1 and
          "CRC-32 mismatch" in r.stderr and records[0] in r.stderr, r.stderr[-400:])
shutil.rmtree(root)

# 5. The plan, and misuse.
r = run([ATOMIC, "--format", "hf", "--plan-only", "--json", "--max-shard-size", "100KB"])
plan = json.loads(r.stdout) if r.returncode == 0 else {}
listed = sorted(t["name"] for f in plan.get("files", []) for t in f["tensors"])
check("--plan-only --json: the index's tensors and files", listed == sorted(got) and
      [f["name"] for f in plan["files"]] == files and plan["model"] == "LlamaForCausalLM", r.stderr[-300:])
for label, args in (("a layout flag", ["--dp", "2"]), ("--gpus", ["--gpus", "4"]), ("--json without --plan-only", ["--json"])):
    r = run([ATOMIC, "-o", os.path.join(WORK, "misuse"), "--format", "hf"] + args)
    check(f"--format hf with {label}: exit 2", r.returncode == 2 and not os.path.exists(os.path.join(WORK, "misuse")), r.stderr[-300:])
r = run([ATOMIC, "-o", os.path.join(WORK, "misuse"), "--max-shard-size", "1GB", "--dp", "1", "--tp", "1", "--pp", "1", "--zero-stage", "1"])
check("--max-shard-size without --format hf: exit 2", r.returncode == 2, r.stderr[-300:])
for label, args in (("--layout", ["--layout", os.path.join(WORK, "conflict.json")]), ("--keep", ["--keep", "2"]),
                    ("--share-buffer", ["--share-buffer", "1M"])):
    json.dump({}, open(os.path.join(WORK, "conflict.json"), "w"))
    r = run([ATOMIC, "-o", os.path.join(WORK, "misuse"), "--format", "hf"] + args)
    check(f"--format hf with {label}: exit 2 naming it", r.returncode == 2 and label in r.stderr, r.stderr[-300:])
r = run([os.path.join(CASE_DIR, "ckpt", "global_step6"), "-o", os.path.join(WORK, "misuse"), "--format", "hf"])
check("a checkpoint folder given for its root: refused, naming the root", r.returncode == 1 and "not its root" in r.stderr and
      "ckpt" in r.stderr, r.stderr[-300:])
root = os.path.join(WORK, "root_ds")
r = run([root, "-o", os.path.join(root, "global_step6", "hf"), "--format", "hf"])
check("-o inside the root's checkpoint folder: refused", r.returncode == 1 and "inside the checkpoint folder" in r.stderr and
      not os.path.exists(os.path.join(root, "global_step6", "hf")), r.stderr[-300:])

# --force replaces a folder ucp-reshard wrote, whole; never one holding what the run reads.
r = run([ATOMIC, "-o", cut, "--format", "hf", "--force", "-q"])
check("--force over an export cut otherwise: only the new files stay", r.returncode == 0 and
      export_files(cut) == export_files(one), f"{export_files(cut)} {r.stderr[-300:]}")
r = run([ATOMIC, "-o", cut, "--force", "-q", "--dp", "2", "--tp", "1", "--pp", "1", "--zero-stage", "1"])
check("--force: a DeepSpeed checkpoint over an export leaves no safetensors", r.returncode == 0 and not export_files(cut) and
      os.path.exists(os.path.join(cut, "latest")), f"{os.listdir(cut)} {r.stderr[-300:]}")
inner = os.path.join(cut, "inner_atomic")
shutil.copytree(ATOMIC, inner)
r = run([inner, "-o", cut, "--format", "hf", "--force"])
check("--force over the folder holding the input: refused, nothing removed", r.returncode == 1 and "holds the checkpoint this run reads"
      in r.stderr and os.path.exists(os.path.join(inner, "ucp_manifest.json")), r.stderr[-300:])

# A run killed before its commit point (a finished export with its commit point and the files after it
# removed, a temporary beside, as a kill leaves it) is the next run's to replace, without --force: the
# same command finishes the job. A finished export is not, nor a killed one beside a file no run wrote.
killed = os.path.join(WORK, "killed_export")
r = run([ATOMIC, "-o", killed, "--format", "hf", "-q"])
commit_point = "model.safetensors.index.json" if os.path.exists(os.path.join(killed, "model.safetensors.index.json")) else "config.json"
r = run([ATOMIC, "-o", killed, "--format", "hf"])
check("a finished export: the same command again is refused, asking for --force", r.returncode == 1 and "use --force" in r.stderr,
      r.stderr[-300:])
os.remove(os.path.join(killed, commit_point))
open(os.path.join(killed, commit_point + ".tmp-999999-1"), "w").write("{")
r = run([ATOMIC, "-o", killed, "--format", "hf"])
ok, differ = same_files(one, killed, export_files(one)) if r.returncode == 0 else (False, [])
check("killed before its commit point: the same command replaces it without --force, and says so", ok and
      export_files(killed) == export_files(one) and "stopped before its commit point" in r.stderr and
      not any(".tmp-" in n for n in os.listdir(killed)), f"{differ} {r.stderr[-400:]}")
os.remove(os.path.join(killed, commit_point))
open(os.path.join(killed, "notes.txt"), "w").write("mine")
r = run([ATOMIC, "-o", killed, "--format", "hf"])
check("killed, with a file no ucp-reshard run wrote beside: refused naming it, nothing removed", r.returncode == 1 and
      "notes.txt" in r.stderr and os.path.exists(os.path.join(killed, "notes.txt")) and
      all(os.path.exists(os.path.join(killed, f)) for f in export_files(one) if f != commit_point), r.stderr[-300:])
shutil.rmtree(killed)

conflict = os.path.join(WORK, "conflict.json")
json.dump({"hidden_size": CFG["hidden_size"] + 1}, open(conflict, "w"))
refused("--model-config against the checkpoint's args", ["--model-config", conflict], ["hidden_size", conflict, "args"])
json.dump({"rope_thetaa": 500000.0}, open(conflict, "w"))
refused("--model-config with a misspelt key", ["--model-config", conflict], ["rope_thetaa", "did you mean 'rope_theta'"])
json.dump({"num_attention_heads": "4"}, open(conflict, "w"))
refused("--model-config with a value of the wrong type", ["--model-config", conflict], ["num_attention_heads", "not an integer"])
finish(CASE)
