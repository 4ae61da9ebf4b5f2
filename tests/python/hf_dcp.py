"""ucp-reshard --format hf of the real PyTorch Distributed Checkpoints (torchtitan names), against
independent ground truth.

    hf_dcp.py BIN_DIR CASES_DIR WORK DATA_DIR HARNESS_DIR [MPIEXEC]

CASES_DIR is ../shared/real-dcp/cases, DATA_DIR tests/data/hf (fixtures dcp_<case>/ with the
model_config.json the export is given), HARNESS_DIR the DCP harness (tiny_llama.py). For each case:
- every tensor of the export equals reference.pt's (torch's own dcp_to_torch_save) under Hugging Face's
  names, q and k re-ordered by the permutation torchtitan's own Hugging Face adapter applies
  (w.view(heads, d / heads / 2, 2, dim).transpose(1, 2)), read with a safetensors reader written here;
- the export is byte-identical to the fixture that transformers 5.3 itself loaded (no missing,
  unexpected or mismatched keys; tests/hf/README.md) and whose logits it recorded, and those logits
  equal the training model's own forward pass (tiny_llama.py, weights from reference.pt) within 1e-5;
  2 ranks write the same bytes as 1;
- without --model-config the facts a DCP does not hold are asked for by name, nothing written; the
  same facts by torchtitan's names export the same bytes; a DeepSpeed layout from it asks for them too, and
  with them is written; the DCP folder itself is refused, pointing to ucp-convert.
"""
import filecmp
import json
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklist import check, finish, tool_runner  # noqa: E402
import dcp_logits  # noqa: E402
from safetensors_reader import read_safetensors  # noqa: E402

BIN, CASES, WORK, DATA, HARNESS = sys.argv[1:6]
MPIEXEC = sys.argv[6] if len(sys.argv) > 6 else None
FILES = ["config.json", "model-00001-of-00001.safetensors", "model.safetensors.index.json"]
run = tool_runner(BIN, MPIEXEC)


def permute(w, heads):  # torchtitan's adapter, to Hugging Face's rotate-half
    rows, cols = w.shape
    return w.view(heads, rows // heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def expected(ref, cfg):
    heads, hidden = cfg["num_attention_heads"], ref["tok_embeddings.weight"].shape[1]
    head_dim = hidden // heads
    out = {"model.embed_tokens.weight": ref["tok_embeddings.weight"], "model.norm.weight": ref["norm.weight"],
           "lm_head.weight": ref["output.weight"]}
    layers = 1 + max(int(k.split(".")[1]) for k in ref if k.startswith("layers."))
    for i in range(layers):
        p, h = f"layers.{i}.", f"model.layers.{i}."
        out[h + "input_layernorm.weight"] = ref[p + "attention_norm.weight"]
        out[h + "post_attention_layernorm.weight"] = ref[p + "ffn_norm.weight"]
        out[h + "self_attn.q_proj.weight"] = permute(ref[p + "attention.wq.weight"], heads)
        wk = ref[p + "attention.wk.weight"]
        out[h + "self_attn.k_proj.weight"] = permute(wk, wk.shape[0] // head_dim)
        out[h + "self_attn.v_proj.weight"] = ref[p + "attention.wv.weight"]
        out[h + "self_attn.o_proj.weight"] = ref[p + "attention.wo.weight"]
        out[h + "mlp.gate_proj.weight"] = ref[p + "feed_forward.w1.weight"]
        out[h + "mlp.up_proj.weight"] = ref[p + "feed_forward.w3.weight"]
        out[h + "mlp.down_proj.weight"] = ref[p + "feed_forward.w2.weight"]
    return out


shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
cases = sorted(c[len("dcp_"):] for c in os.listdir(DATA) if c.startswith("dcp_"))
check("DCP fixtures found", len(cases) >= 2, str(cases))
for case in cases:
    fixture = os.path.join(DATA, "dcp_" + case)
    config = os.path.join(fixture, "model_config.json")
    cfg = json.load(open(config))
    atomic = os.path.join(WORK, case, "atomic")
    r = run("ucp-convert", [os.path.join(CASES, case, "checkpoint"), "-o", atomic, "-q"], ranks=2)
    check(f"{case}: convert", r.returncode == 0, r.stderr[-800:])
    ref = torch.load(os.path.join(CASES, case, "reference.pt"), map_location="cpu")["model"]

    for ranks in (1, 2):
        out = os.path.join(WORK, case, f"hf-np{ranks}")
        r = run("ucp-reshard", [atomic, "-o", out, "--format", "hf", "--model-config", config], ranks=ranks)
        check(f"{case}: export at {ranks} rank(s)", r.returncode == 0, r.stderr[-1200:])
        if r.returncode != 0:
            continue
        same = [f for f in FILES if filecmp.cmp(os.path.join(out, f), os.path.join(fixture, f), shallow=False)]
        check(f"{case} np{ranks}: byte-identical to the fixture transformers loaded", same == FILES, f"equal: {same}")
        got = read_safetensors(os.path.join(out, FILES[1]))
        want = expected(ref, cfg)
        bad = sorted(k for k in want if k not in got or not torch.equal(got[k], want[k]))
        check(f"{case} np{ranks}: every tensor is reference.pt's under Hugging Face's names (q, k permuted)",
              not bad and sorted(got) == sorted(want), f"differ: {bad[:5]}; names {sorted(set(got) ^ set(want))[:5]}")

    recorded = json.load(open(os.path.join(fixture, "transformers_logits.json")))
    train = dcp_logits.logits(os.path.join(CASES, case), HARNESS)
    diff = (torch.tensor(recorded["logits"]) - train).abs().max().item()
    check(f"{case}: transformers' logits of the export equal the training model's (max diff {diff:.2e})",
          recorded["loading_problems"] is None and recorded["class"] == "LlamaForCausalLM" and diff <= 1e-5,
          f"{recorded['loading_problems']} {recorded['class']} {diff}")

    out = os.path.join(WORK, case, "hf-no-config")
    r = run("ucp-reshard", [atomic, "-o", out, "--format", "hf"])
    check(f"{case}: without --model-config the missing facts are asked for", r.returncode != 0 and
          "num_attention_heads" in r.stderr and "--model-config" in r.stderr and not os.path.exists(out), r.stderr[-600:])
    # The same facts by torchtitan's ModelArgs names give the same bytes; a fact given twice is refused.
    aliased = os.path.join(WORK, case, "torchtitan_names.json")
    json.dump({"n_heads": cfg["num_attention_heads"], "max_seq_len": cfg["max_position_embeddings"],
               "norm_eps": cfg["layernorm_epsilon"], "rope_theta": cfg["rope_theta"]}, open(aliased, "w"))
    out = os.path.join(WORK, case, "hf-aliased")
    r = run("ucp-reshard", [atomic, "-o", out, "--format", "hf", "--model-config", aliased])
    check(f"{case}: torchtitan's names in --model-config give the same export", r.returncode == 0 and
          all(filecmp.cmp(os.path.join(out, f), os.path.join(fixture, f), shallow=False) for f in FILES), r.stderr[-600:])
    both = os.path.join(WORK, case, "both_names.json")
    json.dump({"n_heads": 4, "num_attention_heads": 4}, open(both, "w"))
    r = run("ucp-reshard", [atomic, "-o", os.path.join(WORK, case, "hf-both"), "--format", "hf", "--model-config", both])
    check(f"{case}: one fact under two names is refused", r.returncode != 0 and "n_heads" in r.stderr and "num_attention_heads" in r.stderr,
          r.stderr[-400:])
    # The DCP folder itself given to ucp-reshard: said to be converted first.
    r = run("ucp-reshard", [os.path.join(CASES, case, "checkpoint"), "-o", os.path.join(WORK, case, "hf-direct"), "--format", "hf",
                            "--model-config", config])
    check(f"{case}: the DCP folder given to ucp-reshard: 'convert it first'", r.returncode != 0 and "dcp checkpoint" in r.stderr and
          "ucp-convert" in r.stderr, r.stderr[-400:])
    out = os.path.join(WORK, case, "ds")
    r = run("ucp-reshard", [atomic, "-o", out, "--dp", "1", "--tp", "1", "--pp", "1", "--zero-stage", "1"])
    check(f"{case}: a DeepSpeed layout without the facts: refused, asking for them by name (--model-config), nothing written",
          r.returncode != 0 and "num_attention_heads" in r.stderr and "--model-config" in r.stderr and not os.path.exists(out), r.stderr[-600:])
    r = run("ucp-reshard", [atomic, "-o", out, "--dp", "1", "--tp", "1", "--pp", "1", "--zero-stage", "1", "--model-config", config])
    check(f"{case}: with them, written under Megatron-DeepSpeed's names (its tensors: mcore_to_deepspeed.py)", r.returncode == 0 and
          os.path.exists(os.path.join(out, "latest")) and not os.path.exists(os.path.join(out, ".ucp-scratch-atomic")), r.stderr[-600:])

finish("hf_dcp")
