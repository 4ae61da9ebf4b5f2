"""ucp-reshard of Megatron-Core atomic checkpoints to DeepSpeed layouts, the Adam state with them (issue 53): real
Megatron-Core 0.17.1 saves (tests/data/real-mcore: a Llama in fp32 with FP32Optimizer, one in bf16 with the distributed
optimizer, a Mixture-of-Experts Llama) converted by ucp-convert, then written by ucp-reshard as Megatron-DeepSpeed's
GPTModel / GPTModelPipe at several TP x PP x DP x ZeRO layouts.

    mcore_to_deepspeed.py UCP_BIN_DIR REAL_MCORE WORK RECORD [mpiexec]

Ground truth: the Megatron-Core atomic checkpoint's own tensors (real_mcore.py checks them bit for bit against the
reference.pt Megatron-Core's process saved beside its files), cut here as Megatron-DeepSpeed's GPTModel holds them,
by this file's own reading of both models: layer l of each stacked decoder.layers.* key; query_key_value = [every
query head; every key head; every value head] from linear_qkv's rows per query group (its query heads, its key head,
its value head); dense_h_to_4h = linear_fc1 ([gate; up]); the experts' linear_fc1 / linear_fc2 per expert, the
router as the gate's wg. Each layout ucp-reshard wrote is read back by ucp-convert (a GPTModelPipe one resharded to
GPTModel first) and every parameter's fp32, exp_avg and exp_avg_sq compared bit for bit; its step and its param
groups' options (lr, betas, eps, weight_decay, wd_mult) are the source's, and the DeepSpeed optimizer files list
`params` as torch's state_dict does. The scratch conversion is gone after the run, failed or not.
Refused by name, nothing written: a model Megatron-DeepSpeed's tables do not hold (GPT with an untied output layer),
--plan-only.
Real reader: RECORD (tests/data/real-mcore/mcore_deepspeed_loads.json, written by scripts/mcore_deepspeed_loads.py in the
trixie chroot) holds what real DeepSpeed 0.19.5 made of such layouts (its harness's Llama loaded with the optimizer's
state): every row's logits within 1e-5 of transformers' on the same model (fp32; bf16 within 1e-2, its weights rounded),
its training rows' losses finite and apart from a fresh Adam's; and ucp now writes every file of those rows with the
sha256 DeepSpeed read.
"""
import glob
import json
import math
import os
import re
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ds_stubs  # noqa: E402,F401  (DeepSpeed's pickled classes, for torch.load)
from atomic_files import atomic_tensor, same_bytes  # noqa: E402
from checklist import check, finish, fresh_folder, tool_runner  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from harness_logits import files_differing  # noqa: E402  (the tag's files against the record's sha256)

BIN, REAL, WORK, RECORD = sys.argv[1:5]
run = tool_runner(BIN, sys.argv[5] if len(sys.argv) > 5 else None)


def tool(name, *args, ranks=1):
    r = run(name, list(args), ranks)
    return r.returncode, r.stdout, r.stderr


def ok(cond, label, detail=""):
    check(label, cond, detail)
    return cond


fresh_folder(WORK)
STATES = ["fp32", "exp_avg", "exp_avg_sq"]


def atoms(folder):
    """name -> {state: tensor}, the step, and the manifest of an atomic checkpoint."""
    m = json.load(open(os.path.join(folder, "ucp_manifest.json")))
    out, steps = {}, set()
    for p in m["params"]:
        out[p["name"]] = {s: atomic_tensor(torch.load(os.path.join(folder, p["files"][s])), p["shape"]) for s in STATES}
        steps.add(float(torch.load(os.path.join(folder, p["files"]["step"]))))
    return out, steps, m


def expected(src, facts):
    """Megatron-DeepSpeed GPTModel's parameters, each state, from Megatron-Core's keys `src`."""
    heads, groups, layers = facts["heads"], facts["groups"], facts["layers"]
    out = {}
    for s in STATES:
        t = {k: v[s] for k, v in src.items()}
        put = lambda name, value: out.setdefault(name, {}).__setitem__(s, value)  # noqa: E731
        put("language_model.embedding.word_embeddings.weight", t["embedding.word_embeddings.weight"])
        put("language_model.encoder.final_layernorm.weight", t["decoder.final_layernorm.weight"])
        put("language_model.output_layer.weight", t["output_layer.weight"])
        for l in range(layers):
            at = f"language_model.encoder.layers.{l}."
            qkv = t["decoder.layers.self_attention.linear_qkv.weight"][l]
            h = qkv.shape[-1]
            per_group = qkv.reshape(groups, -1, h)
            d = per_group.shape[1] // (heads // groups + 2)
            q = per_group[:, : heads // groups * d].reshape(-1, h)
            k = per_group[:, heads // groups * d: (heads // groups + 1) * d].reshape(-1, h)
            v = per_group[:, (heads // groups + 1) * d:].reshape(-1, h)
            put(at + "self_attention.query_key_value.weight", torch.cat([q, k, v]))
            put(at + "input_layernorm.weight", t["decoder.layers.self_attention.linear_qkv.layer_norm_weight"][l])
            put(at + "self_attention.dense.weight", t["decoder.layers.self_attention.linear_proj.weight"][l])
            put(at + "post_attention_layernorm.weight", t["decoder.layers.mlp.linear_fc1.layer_norm_weight"][l])
            if "decoder.layers.mlp.router.weight" in t:
                moe = at + "mlp.deepspeed_moe."
                put(moe + "gate.wg.weight", t["decoder.layers.mlp.router.weight"][l])
                for e in range(t["decoder.layers.mlp.router.weight"].shape[1]):
                    put(moe + f"experts.deepspeed_experts.{e}.dense_h_to_4h.weight", t["decoder.layers.mlp.experts.experts.linear_fc1.weight"][l][e])
                    put(moe + f"experts.deepspeed_experts.{e}.dense_4h_to_h.weight", t["decoder.layers.mlp.experts.experts.linear_fc2.weight"][l][e])
            else:
                put(at + "mlp.dense_h_to_4h.weight", t["decoder.layers.mlp.linear_fc1.weight"][l])
                put(at + "mlp.dense_4h_to_h.weight", t["decoder.layers.mlp.linear_fc2.weight"][l])
    return out


def halves(w, heads):
    """A query or key projection's rows, each head's rotary pairs (2i, 2i + 1: torchtitan's, Meta's) as halves
    (i, i + d/2: Megatron's and Hugging Face's rotate-half)."""
    d = w.shape[0] // heads
    return w.reshape(heads, d // 2, 2, -1).transpose(1, 2).reshape(w.shape)


def expected_titan(src, facts):
    """Megatron-DeepSpeed GPTModel's parameters from torchtitan's Llama `src`."""
    out = {}
    for s in STATES:
        t = {k: v[s] for k, v in src.items()}
        put = lambda name, value: out.setdefault(name, {}).__setitem__(s, value)  # noqa: E731
        put("language_model.embedding.word_embeddings.weight", t["tok_embeddings.weight"])
        put("language_model.encoder.final_layernorm.weight", t["norm.weight"])
        put("language_model.output_layer.weight", t["output.weight"])
        for l in range(facts["layers"]):
            at, of = f"language_model.encoder.layers.{l}.", f"layers.{l}."
            put(at + "self_attention.query_key_value.weight", torch.cat([
                halves(t[of + "attention.wq.weight"], facts["heads"]), halves(t[of + "attention.wk.weight"], facts["groups"]),
                t[of + "attention.wv.weight"]]))
            put(at + "self_attention.dense.weight", t[of + "attention.wo.weight"])
            put(at + "input_layernorm.weight", t[of + "attention_norm.weight"])
            put(at + "post_attention_layernorm.weight", t[of + "ffn_norm.weight"])
            put(at + "mlp.dense_h_to_4h.weight", torch.cat([t[of + "feed_forward.w1.weight"], t[of + "feed_forward.w3.weight"]]))
            put(at + "mlp.dense_4h_to_h.weight", t[of + "feed_forward.w2.weight"])
    return out


def options(group):
    return {k: v for k, v in group.items() if k not in ("params", "step", "name", "moe")}


def param_groups(v):
    """The torch optimizer's param_groups inside a DeepSpeed optimizer file (ZeRO's, the BF16 optimizer's, torch's)."""
    if isinstance(v, dict):
        if isinstance(v.get("param_groups"), list) and v["param_groups"] and isinstance(v["param_groups"][0], dict):
            return v["param_groups"]
        for x in v.values():
            if (found := param_groups(x)) is not None:
                return found
    return None


def source_group(groups, name, shape):
    """The source optimizer's group of a Megatron-DeepSpeed parameter, by its role as Megatron's _get_param_groups
    gives it: is_expert_parallel for an expert's, wd_mult 1 for a weight of two or more dimensions, 0 for biases and
    norms; a source of one group (torchtitan's): that one."""
    if len(groups) == 1:
        return groups[0]
    expert, decayed = ".deepspeed_experts." in name, len(shape) >= 2 and not name.endswith(".bias")
    (g,) = [g for g in groups if g.get("is_expert_parallel", False) == expert and g["wd_mult"] == (1.0 if decayed else 0.0)]
    return g


TITAN = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared", "real-dcp", "cases",
                                      "fsdp2_dp2", "checkpoint"))
# torchtitan's DCP holds no model facts Megatron's args would: given as ucp-reshard's --model-config.
TITAN_FACTS = os.path.join(WORK, "titan_facts.json")
json.dump({"num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64, "layernorm_epsilon": 1e-5,
           "rope_theta": 10000.0}, open(TITAN_FACTS, "w"))
# (case, model facts, [layout flags])
CASES = [
    ("llama_tp2_legacy", {"heads": 4, "groups": 2, "layers": 4},
     [["--tp", "2", "--pp", "1", "--dp", "1", "--zero-stage", "1"],
      ["--tp", "1", "--pp", "1", "--dp", "2", "--zero-stage", "2"],
      ["--tp", "1", "--pp", "1", "--dp", "2", "--zero-stage", "3"],
      ["--tp", "2", "--pp", "2", "--dp", "1", "--zero-stage", "1"]]),
    ("llama_tp2_dp2_distopt_bf16", {"heads": 4, "groups": 2, "layers": 4},
     [["--tp", "2", "--pp", "1", "--dp", "2", "--zero-stage", "1"],
      ["--tp", "1", "--pp", "1", "--dp", "2", "--zero-stage", "0"]]),
    # (DeepSpeed 0.19.5 averages an expert's gradient as Megatron-Core does: its moments as they are; the default
    # release, 0.14.5, takes them scaled, as the run says: checked as said.)
    ("moe_ep2", {"heads": 4, "groups": 2, "layers": 4},
     [["--tp", "1", "--pp", "1", "--dp", "2", "--ep", "2", "--zero-stage", "1", "--ds-version", "0.19.5"],
      ["--tp", "2", "--pp", "1", "--dp", "2", "--ep", "2", "--zero-stage", "1", "--ds-version", "0.19.5"],
      ["--tp", "1", "--pp", "1", "--dp", "2", "--ep", "1", "--zero-stage", "2"],
      ["--tp", "1", "--pp", "1", "--dp", "2", "--ep", "2", "--zero-stage", "1"]]),
    ("moe_ep2_dp4_distopt_bf16", {"heads": 4, "groups": 2, "layers": 2},
     [["--tp", "1", "--pp", "1", "--dp", "4", "--ep", "2", "--zero-stage", "1", "--ds-version", "0.19.5"]]),
    ("torchtitan_fsdp2_dp2", {"heads": 4, "groups": 2, "layers": 4},
     [["--tp", "2", "--pp", "1", "--dp", "1", "--zero-stage", "1", "--model-config", TITAN_FACTS],
      ["--tp", "1", "--pp", "1", "--dp", "2", "--zero-stage", "3", "--model-config", TITAN_FACTS]]),
]

for case, facts, layouts in CASES:
    src_dir = os.path.join(WORK, case, "atomic")
    titan = case.startswith("torchtitan")
    code, _, err = tool("ucp-convert", TITAN if titan else os.path.join(REAL, case, "checkpoint"), "-o", src_dir, "-q")
    if not ok(code == 0, f"{case}: converted", err[-400:]):
        continue
    src, src_steps, src_manifest = atoms(src_dir)
    want = (expected_titan if titan else expected)(src, facts)
    src_groups = torch.load(os.path.join(src_dir, "zero", "optimizer_state.pt"))["param_groups"]
    for n, flags in enumerate(layouts):
        name = f"{case} -> {' '.join(f for f in flags if f != '--model-config' and f != TITAN_FACTS)}"
        out = os.path.join(WORK, case, f"ds{n}")
        code, _, err = tool("ucp-reshard", src_dir, "-o", out, *flags, ranks=2)
        err_reshard = err
        if not ok(code == 0, f"{name}: written", err[-600:]):
            continue
        ok(not os.path.exists(os.path.join(out, ".ucp-scratch-atomic")), f"{name}: the scratch conversion removed")
        ok(open(os.path.join(out, "latest")).read().strip() == f"global_step{src_manifest['source']['iteration']}",
              f"{name}: the source's iteration as the tag")
        # Every DeepSpeed optimizer file holding a torch state (an expp_rank file under ZeRO holds none): its
        # groups list their params, as torch's state_dict does.
        held = [g for g in (param_groups(torch.load(f)) for f in glob.glob(os.path.join(out, "global_step*", "*optim_states.pt"))) if g]
        ok(held and all("params" in g for groups in held for g in groups), f"{name}: every optimizer file's groups list their params")
        back = os.path.join(WORK, case, f"back{n}")
        if "--pp" in flags and flags[flags.index("--pp") + 1] != "1":  # GPTModelPipe: back to GPTModel names first
            plain = os.path.join(WORK, case, f"plain{n}")
            mid = os.path.join(WORK, case, f"mid{n}")
            code, _, err = tool("ucp-convert", out, "-o", mid, "-q")
            code2, _, err2 = tool("ucp-reshard", mid, "-o", plain, "--tp", "1", "--pp", "1", "--dp", "1", "--zero-stage", "1",
                                 "--model", "plain", "-q")
            ok(code == 0 and code2 == 0, f"{name}: GPTModelPipe resharded to GPTModel", (err + err2)[-400:])
            out = plain
        code, _, err = tool("ucp-convert", out, "-o", back, "-q")
        if not ok(code == 0, f"{name}: read back by ucp-convert", err[-400:]):
            continue
        got, steps, manifest = atoms(back)
        back_groups = torch.load(os.path.join(back, "zero", "optimizer_state.pt"))["param_groups"]
        wrong = [p["name"] for p in manifest["params"]
                 if options(back_groups[p["group"]]) != options(source_group(src_groups, p["name"], p["shape"]))]
        ok(not wrong, f"{name}: each parameter's optimizer options those of its source group (by its role)", f"{wrong[:4]}")
        ok(set(got) == set(want), f"{name}: Megatron-DeepSpeed's parameters", f"{sorted(set(got) ^ set(want))[:6]}")
        scaled = re.search(r"exp_avg x([0-9.]+), exp_avg_sq x([0-9.]+)", err_reshard)
        factor = {"fp32": 1.0, "exp_avg": float(scaled[1]), "exp_avg_sq": float(scaled[2])} if scaled else None
        bad = [f"{p}.{s}" for p in want if p in got for s in STATES if not same_bytes(
            got[p][s], want[p][s] * factor[s] if factor and ".deepspeed_experts." in p else want[p][s])]
        ok(not bad, f"{name}: every fp32, exp_avg and exp_avg_sq bit for bit the source tensor's rows", f"{bad[:6]}")
        ok(steps == src_steps, f"{name}: the step", f"{steps} vs {src_steps}")
        ok(manifest["source"]["dtype"] == src_manifest["source"]["dtype"], f"{name}: the job's dtype kept")

# --no-optimizer: the model's files alone, its moments not read.
out = os.path.join(WORK, "llama_tp2_legacy", "no-optimizer")
code, _, err = tool("ucp-reshard", os.path.join(WORK, "llama_tp2_legacy", "atomic"), "-o", out, "--tp", "2", "--pp", "1", "--dp", "2",
                    "--zero-stage", "1", "--no-optimizer", ranks=2)
written = sorted(os.path.basename(f) for f in glob.glob(os.path.join(out, "global_step*", "*")))
ok(code == 0 and written == ["mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt"] and "the fp32 weights alone" in err and
   not os.path.exists(os.path.join(out, ".ucp-scratch-atomic")), "--no-optimizer: the model-states files alone", f"{written} {err[-500:]}")

# A run killed during its scratch conversion leaves OUT/.ucp-scratch-atomic (its lock, part of zero/): the next run
# replaces it (its lock names a process gone), and removes it at the end.
out = os.path.join(WORK, "llama_tp2_legacy", "after-kill")
os.makedirs(os.path.join(out, ".ucp-scratch-atomic", "zero", "language_model.output_layer.weight"))
open(os.path.join(out, ".ucp-scratch-atomic", "zero", "language_model.output_layer.weight", "fp32.pt"), "wb").write(b"partial")
json.dump({"tool": "ucp-reshard", "host": os.uname().nodename, "pid": 2 ** 22 + 7, "start_ticks": 1, "started": "2026-12-08T00:00:00Z"},
          open(os.path.join(out, ".ucp-scratch-atomic", ".ucp-lock"), "w"))
code, _, err = tool("ucp-reshard", os.path.join(WORK, "llama_tp2_legacy", "atomic"), "-o", out, "--tp", "1", "--pp", "1", "--dp", "1",
                    "--zero-stage", "1")
ok(code == 0 and os.path.exists(os.path.join(out, "latest")) and not os.path.exists(os.path.join(out, ".ucp-scratch-atomic")),
   "a killed run's scratch (its lock's process gone): replaced, the layout written, the scratch removed", err[-600:])

# What real DeepSpeed read: the record's rows, and the same bytes written now.
record = json.load(open(RECORD))
for case, c in record["cases"].items():
    src_dir = os.path.join(WORK, case, "atomic")
    for name, row in c["rows"].items():
        label = f"DeepSpeed {record['deepspeed']} on {case} {name}"
        d, tolerance = row["max_abs_diff_logits_vs_transformers"], 1e-5 if c["dtype"] == "fp32" else 1e-2
        ok(d <= tolerance, f"{label}: logits within {tolerance:g} of transformers'", str(d))
        ok(row["load"]["load_optimizer_states"] and row["load"]["global_steps"] == 3 + len(row["losses"]),
           f"{label}: loaded with the optimizer's state at the source's iteration", str(row["load"]))
        if row["losses"]:
            ok(all(math.isfinite(x) for x in row["losses"]) and row["losses"] != row["losses_without_optimizer_state"],
               f"{label}: trains on, the carried Adam state stepping (a fresh Adam's losses differ)", str(row["losses"]))
        out = os.path.join(WORK, case, "record-" + name)
        code, _, err = tool("ucp-reshard", src_dir, "-o", out, "-q", *row["reshard_args"], ranks=2)
        if ok(code == 0, f"{label}: written again", err[-400:]):
            differ, n = files_differing(out, row["ckpt_sha256"])
            ok(not differ, f"{label}: the {n} files DeepSpeed read, byte for byte", str(differ))

# Refused by name, nothing written.
gpt = os.path.join(WORK, "gpt_tp2", "atomic")
code, _, err = tool("ucp-convert", os.path.join(REAL, "gpt_tp2", "checkpoint"), "-o", gpt, "-q")
ok(code == 0, "gpt_tp2: converted", err[-300:])
out = os.path.join(WORK, "gpt_tp2", "ds")
code, _, err = tool("ucp-reshard", gpt, "-o", out, "--tp", "1", "--pp", "1", "--dp", "1", "--zero-stage", "1")
ok(code == 1 and "tie_word_embeddings" in err and not os.path.exists(out),
      "an untied GPT (GPT-2's tables tie the output layer): refused, nothing written", err[-400:])
code, _, err = tool("ucp-reshard", os.path.join(WORK, "llama_tp2_legacy", "atomic"), "-o", out, "--tp", "1", "--pp", "1",
                   "--dp", "1", "--zero-stage", "1", "--plan-only")
ok(code == 1 and "--plan-only" in err and not os.path.exists(out), "--plan-only: refused, nothing written", err[-400:])
shutil.rmtree(WORK, ignore_errors=True)
finish("mcore_to_deepspeed")
