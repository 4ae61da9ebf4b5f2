"""ucp-reshard --format hf of the real Megatron-Core torch_dist checkpoints (tests/data/real-mcore), against
independent ground truth.

    hf_mcore.py BIN_DIR CASES_DIR WORK DATA_DIR [MPIEXEC]

CASES_DIR is tests/data/real-mcore, DATA_DIR tests/data/hf (fixture mcore_llama_tp2/). For each
Llama-style case, converted on 2 ranks and exported at 1 and 2 ranks with no --model-config (the facts
come from Megatron-LM's args in the carried common.pt):
- every tensor equals reference.pt's (torch's own DCP loader) under Hugging Face's names: layer i of
  each stacked tensor; linear_qkv cut per query group into q (the group's heads), k and v; linear_fc1
  into [gate; up]; read with the tests' own safetensors reader;
- llama_dp2_distopt_bf16 (bf16 weights, fp32 masters in the distributed optimizer): the export is bf16
  by default, and every tensor equals the bf16 model tensor Megatron saved, bit for bit;
- llama_tp2: the export is byte-identical to the fixture transformers 5.3 itself loaded (no missing,
  unexpected or mismatched keys; tests/hf/README.md) and whose logits it recorded, and those logits
  equal the logits Megatron-Core's own GPTModel gave when the checkpoint was written
  (megatron_logits.json) within 1e-5;
- args that change what the model computes (use_rope_scaling set in a copy's common.pt) refuse the
  export by name;
- the GPT case (LayerNorm, GeLU, learned positions) is refused as GPT-2-shaped, the MoE case as Mixture
  of Experts, nothing written; a
  DeepSpeed layout from a Megatron-Core atomic checkpoint is refused, pointing to --format hf.
"""
import filecmp
import json
import os
import shutil
import struct
import sys
import zipfile
import zlib

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checklist import check, finish, tool_runner  # noqa: E402
from safetensors_reader import read_safetensors  # noqa: E402

BIN, CASES, WORK, DATA = sys.argv[1:5]
run = tool_runner(BIN, sys.argv[5] if len(sys.argv) > 5 else None)
FILES = ["config.json", "model-00001-of-00001.safetensors", "model.safetensors.index.json"]


def expected(ref, args):
    """Hugging Face's tensors from reference.pt, by Megatron-Core's layouts."""
    heads, groups = args["num_attention_heads"], args["num_query_groups"]
    hidden = ref["embedding.word_embeddings.weight"].shape[1]
    d, per = hidden // heads, heads // groups
    out = {"model.embed_tokens.weight": ref["embedding.word_embeddings.weight"],
           "model.norm.weight": ref["decoder.final_layernorm.weight"], "lm_head.weight": ref["output_layer.weight"]}
    L = "decoder.layers."
    for i in range(ref[L + "self_attention.linear_qkv.weight"].shape[0]):
        h = f"model.layers.{i}."
        qkv = ref[L + "self_attention.linear_qkv.weight"][i].view(groups, per + 2, d, hidden)
        out[h + "self_attn.q_proj.weight"] = qkv[:, :per].reshape(-1, hidden)
        out[h + "self_attn.k_proj.weight"] = qkv[:, per].reshape(-1, hidden)
        out[h + "self_attn.v_proj.weight"] = qkv[:, per + 1].reshape(-1, hidden)
        out[h + "self_attn.o_proj.weight"] = ref[L + "self_attention.linear_proj.weight"][i]
        gate, up = ref[L + "mlp.linear_fc1.weight"][i].chunk(2)
        out[h + "mlp.gate_proj.weight"], out[h + "mlp.up_proj.weight"] = gate, up
        out[h + "mlp.down_proj.weight"] = ref[L + "mlp.linear_fc2.weight"][i]
        out[h + "input_layernorm.weight"] = ref[L + "self_attention.linear_qkv.layer_norm_weight"][i]
        out[h + "post_attention_layernorm.weight"] = ref[L + "mlp.linear_fc1.layer_norm_weight"][i]
    return out


shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
ARGS = {"num_attention_heads": 4, "num_query_groups": 2}  # make_mcore.py's Llama-style model
for case in ("llama_tp2", "llama_pp2", "llama_dp2_distopt_bf16"):
    atomic = os.path.join(WORK, case, "atomic")
    r = run("ucp-convert", [os.path.join(CASES, case, "checkpoint"), "-o", atomic, "-q"], ranks=2)
    check(f"{case}: convert", r.returncode == 0, r.stderr[-800:])
    manifest = json.load(open(os.path.join(atomic, "ucp_manifest.json")))
    check(f"{case}: common.pt carried as the args file, no DeepSpeed model-states file",
          manifest["source"].get("args_file") == "common.pt" and "model_states" not in manifest["source"] and
          not os.path.exists(os.path.join(atomic, "..", "latest_universal")), str(manifest["source"]))
    ref = torch.load(os.path.join(CASES, case, "reference.pt"), map_location="cpu")
    # The export keeps the job's precision: a bf16 job's export is its bf16 model tensors, which Megatron
    # rounds from the fp32 masters the atomic checkpoint holds.
    want = expected(ref, ARGS)
    for ranks in (1, 2):
        out = os.path.join(WORK, case, f"hf-np{ranks}")
        r = run("ucp-reshard", [atomic, "-o", out, "--format", "hf"], ranks=ranks)
        check(f"{case}: export at {ranks} rank(s), no --model-config", r.returncode == 0, r.stderr[-1200:])
        if r.returncode != 0:
            continue
        got = read_safetensors(os.path.join(out, FILES[1]))
        bad = sorted(k for k in want if k not in got or not torch.equal(got[k], want[k]))
        check(f"{case} np{ranks}: every tensor is reference.pt's, per layer, q/k/v per query group, [gate; up]",
              not bad and sorted(got) == sorted(want), f"differ: {bad[:5]}; names {sorted(set(got) ^ set(want))[:5]}")
        if case == "llama_tp2":
            fixture = os.path.join(DATA, "mcore_" + case)
            same = [f for f in FILES if filecmp.cmp(os.path.join(out, f), os.path.join(fixture, f), shallow=False)]
            check(f"{case} np{ranks}: byte-identical to the fixture transformers loaded", same == FILES, f"equal: {same}")
    if case == "llama_tp2":
        recorded = json.load(open(os.path.join(DATA, "mcore_" + case, "transformers_logits.json")))
        megatron = json.load(open(os.path.join(CASES, case, "megatron_logits.json")))
        diff = (torch.tensor(recorded["logits"]) - torch.tensor(megatron["logits"])).abs().max().item()
        check(f"{case}: transformers' logits of the export equal Megatron-Core's own (max diff {diff:.2e})",
              recorded["ids"] == megatron["ids"] and recorded["loading_problems"] is None and
              recorded["class"] == "LlamaForCausalLM" and diff <= 1e-5, f"{recorded['loading_problems']} {diff}")
    out = os.path.join(WORK, case, "ds")
    r = run("ucp-reshard", [atomic, "-o", out, "--dp", "1", "--tp", "1", "--pp", "1", "--zero-stage", "1"])
    check(f"{case}: a DeepSpeed layout is refused, pointing to --format hf", r.returncode != 0 and "--format hf" in r.stderr and
          not os.path.exists(os.path.join(out, "latest")), r.stderr[-600:])

def set_flag_in_args(common_pt, flag):
    """common.pt with args.<flag> False made True: one pickle byte (NEWFALSE -> NEWTRUE) of data.pkl, its
    CRC-32 fixed in the local header and the central directory, so the file stays a valid zip."""
    raw = bytearray(open(common_pt, "rb").read())
    info = next(i for i in zipfile.ZipFile(common_pt).infolist() if i.filename.endswith("data.pkl"))
    n, e = struct.unpack("<HH", raw[info.header_offset + 26:info.header_offset + 30])
    start = info.header_offset + 30 + n + e
    key = raw.index(flag.encode(), start, start + info.file_size)
    value = raw.index(b"\x89", key + len(flag), key + len(flag) + 4)  # after the key (and its MEMOIZE)
    raw[value] = 0x88
    crc = struct.pack("<I", zlib.crc32(bytes(raw[start:start + info.file_size])) & 0xFFFFFFFF)
    raw[info.header_offset + 14:info.header_offset + 18] = crc
    central = raw.index(b"PK\x01\x02" + bytes(raw[info.header_offset + 4:info.header_offset + 6]), start + info.file_size)
    while not raw[central + 46:central + 46 + len(info.filename)] == info.filename.encode():
        central = raw.index(b"PK\x01\x02", central + 4)
    raw[central + 16:central + 20] = crc
    open(common_pt, "wb").write(bytes(raw))


# A Llama 3.1-style rotary scaling said in the args: the export would compute something else, refused by name.
scaled = os.path.join(WORK, "rope_scaling", "checkpoint")
shutil.copytree(os.path.join(CASES, "llama_tp2", "checkpoint"), scaled)
set_flag_in_args(os.path.join(scaled, "common.pt"), "use_rope_scaling")
atomic = os.path.join(WORK, "rope_scaling", "atomic")
r = run("ucp-convert", [scaled, "-o", atomic, "-q"])
check("use_rope_scaling: convert (the tensors are the same)", r.returncode == 0, r.stderr[-600:])
r = run("ucp-reshard", [atomic, "-o", os.path.join(WORK, "rope_scaling", "hf"), "--format", "hf"])
check("use_rope_scaling in the args: the export is refused naming it, nothing written", r.returncode != 0 and
      "use_rope_scaling" in r.stderr and not os.path.exists(os.path.join(WORK, "rope_scaling", "hf")), r.stderr[-600:])

atomic = os.path.join(WORK, "gpt_tp2", "atomic")
r = run("ucp-convert", [os.path.join(CASES, "gpt_tp2", "checkpoint"), "-o", atomic, "-q"])
check("gpt_tp2: convert", r.returncode == 0, r.stderr[-800:])
out = os.path.join(WORK, "gpt_tp2", "hf")
r = run("ucp-reshard", [atomic, "-o", out, "--format", "hf"])
check("gpt_tp2: refused as GPT-2-shaped, nothing written", r.returncode != 0 and "GPT-2" in r.stderr and not os.path.exists(out),
      r.stderr[-600:])
# Its reasons are true of it (a newcomer saw "linear layers without biases" of a model holding linear_qkv.bias).
check("gpt_tp2: no reason the checkpoint contradicts", "without biases" not in r.stderr and "normalization" not in r.stderr,
      r.stderr[-900:])
atomic = os.path.join(WORK, "moe_ep2", "atomic")
r = run("ucp-convert", [os.path.join(CASES, "moe_ep2", "checkpoint"), "-o", atomic, "-q"])
check("moe_ep2: convert", r.returncode == 0, r.stderr[-800:])
out = os.path.join(WORK, "moe_ep2", "hf")
r = run("ucp-reshard", [atomic, "-o", out, "--format", "hf"])
check("moe_ep2: refused as Mixture of Experts, nothing written", r.returncode != 0 and "Mixture of Experts" in r.stderr and
      not os.path.exists(out), r.stderr[-600:])
finish("hf_mcore")
