"""ucp-convert of a Hugging Face model folder (issue 44, "Hugging Face models in"): LlamaForCausalLM's
config.json and safetensors in, a weights-only atomic checkpoint out.

Usage: hf_import.py BIN_DIR WORK [MPIEXEC]

The generator here knows every tensor before it writes a byte (torch's random values, a few special
ones: subnormals, -0.0, the largest finite) and writes the safetensors files itself
(safetensors_writer.py), one file or shards with model.safetensors.index.json. It knows Megatron-
DeepSpeed's parameters independently of ucp: query_key_value = cat(q, k, v), dense_h_to_4h =
cat(gate, up), the rest one to one. Checked, per model (fp32 / bf16 / fp16; tied and untied; GQA and
not; biases; head_dim other than hidden / heads; sharded) on 1 and 2 ranks, both stores:
- every atomic tensor equals the generator's parameter bit for bit (bf16 and fp16 widened by torch);
- the manifest: framework hf, optimizer none, weights_only, fp32 alone per parameter, no step, no
  zero/optimizer_state.pt, the model-states file and job/config.json (byte-equal) listed;
- the round trip: ucp-reshard --format hf --dtype <the source's> gives back the same tensors, byte for
  byte (read by safetensors_reader.py);
- damaged inputs refused by name, rc != 0, no manifest: header length past the cap and past the file,
  overlapping offsets, a hole, dtype I64, a tensor the index puts elsewhere, one it lacks, total_size,
  a missing shard, a truncated file, rope_scaling, another class, a tied lm_head.weight saved unequal.
"""
import json
import os
import struct
import sys

import h5py
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ds_stubs  # noqa: E402,F401 - DeepSpeed classes the state files pickle (SubparamShape)
from atomic_files import same_bytes  # noqa: E402
from checklist import check, finish, fresh_folder, refused_when_damaged, tool_runner  # noqa: E402
from safetensors_reader import read_safetensors  # noqa: E402
from safetensors_writer import header_of, pack, write_safetensors  # noqa: E402

BIN, WORK = sys.argv[1:3]
MPIEXEC = sys.argv[3] if len(sys.argv) > 3 else None
run = tool_runner(BIN, MPIEXEC)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
TORCH_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def hf_tensors(c, seed):
    """{name: fp32 tensor} of LlamaForCausalLM of config `c`, in its state_dict's order."""
    g = torch.Generator().manual_seed(seed)
    h, hd, q, kv, ffn = c["hidden_size"], c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"], c["intermediate_size"]
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    t = {"model.embed_tokens.weight": r(c["vocab_size"], h)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = r(h)
        for name, rows in (("q", q * hd), ("k", kv * hd), ("v", kv * hd)):
            t[p + f"self_attn.{name}_proj.weight"] = r(rows, h)
            if c["attention_bias"]:
                t[p + f"self_attn.{name}_proj.bias"] = r(rows)
        t[p + "self_attn.o_proj.weight"] = r(h, q * hd)
        if c["attention_bias"]:
            t[p + "self_attn.o_proj.bias"] = r(h)
        t[p + "post_attention_layernorm.weight"] = r(h)
        for name, shape in (("gate", (ffn, h)), ("up", (ffn, h)), ("down", (h, ffn))):
            t[p + f"mlp.{name}_proj.weight"] = r(*shape)
            if c["mlp_bias"]:
                t[p + f"mlp.{name}_proj.bias"] = r(shape[0])
    t["model.norm.weight"] = r(h)
    if not c["tie_word_embeddings"]:
        t["lm_head.weight"] = r(c["vocab_size"], h)
    # Values the widening must carry exactly: subnormals of fp16 and bf16, -0.0, the largest finite.
    special = torch.tensor([6e-8, -3e-5, 1e-39, -0.0, 65504.0, 1.0e-3])
    t["model.norm.weight"][: len(special)] = special
    return t


def megatron_params(c, t):
    """The atomic checkpoint's parameters, Megatron-DeepSpeed's names, from the Hugging Face tensors."""
    out = {"language_model.embedding.word_embeddings.weight": t["model.embed_tokens.weight"]}
    for i in range(c["num_hidden_layers"]):
        p, m = f"model.layers.{i}.", f"language_model.encoder.layers.{i}."
        out[m + "input_layernorm.weight"] = t[p + "input_layernorm.weight"]
        for kind in ["weight"] + (["bias"] if c["attention_bias"] else []):
            out[m + f"self_attention.query_key_value.{kind}"] = torch.cat([t[p + f"self_attn.{x}_proj.{kind}"] for x in "qkv"])
            out[m + f"self_attention.dense.{kind}"] = t[p + f"self_attn.o_proj.{kind}"]
        out[m + "post_attention_layernorm.weight"] = t[p + "post_attention_layernorm.weight"]
        for kind in ["weight"] + (["bias"] if c["mlp_bias"] else []):
            out[m + f"mlp.dense_h_to_4h.{kind}"] = torch.cat([t[p + f"mlp.gate_proj.{kind}"], t[p + f"mlp.up_proj.{kind}"]])
            out[m + f"mlp.dense_4h_to_h.{kind}"] = t[p + f"mlp.down_proj.{kind}"]
    out["language_model.encoder.final_layernorm.weight"] = t["model.norm.weight"]
    if not c["tie_word_embeddings"]:
        out["language_model.output_layer.weight"] = t["lm_head.weight"]
    return out


def make_model(d, c, dtype, shards, seed):
    """A model folder as save_pretrained lays it out; returns its tensors in `dtype`."""
    fresh_folder(d)
    t = {k: v.to(DTYPES[dtype]) for k, v in hf_tensors(c, seed).items()}
    config = dict(c, architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu", dtype=TORCH_NAMES[dtype])
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2}, f)
    if shards == 1:
        write_safetensors(os.path.join(d, "model.safetensors"), t)
        return t
    names = list(t)
    weight_map, total = {}, 0
    for s in range(shards):
        part = {k: t[k] for k in names[s::shards]}
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(os.path.join(d, fname), part)
        for k, v in part.items():
            weight_map[k] = fname
            total += v.numel() * v.element_size()
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    return t


def atomic_tensors(out, store):
    with open(os.path.join(out, "ucp_manifest.json")) as f:
        m = json.load(f)
    got = {}
    if store == "hdf5":
        with h5py.File(os.path.join(out, "atoms.h5"), "r") as h:
            for p in m["params"]:
                got[p["name"]] = torch.from_numpy(h[p["name"]]["fp32"][()])
    else:
        for p in m["params"]:
            got[p["name"]] = torch.load(os.path.join(out, p["files"]["fp32"]))["param"]
    return m, got


def check_manifest(label, m, src, out, store):
    s = m["source"]
    check(f"{label}: source", s["framework"] == "hf" and s["optimizer"] == "none" and s.get("weights_only") is True and
          s["naming"] == "plain" and (s["dp"], s["tp"], s["pp"], s["iteration"], s["zero_stage"]) == (1, 1, 1, 0, 0), str(s))
    storage = [sorted(p["files"]) if store == "pt" else sorted(p["hdf5"]["xxh64"]) for p in m["params"]]
    check(f"{label}: fp32 only", all(x == ["fp32"] for x in storage), str(storage[:3]))
    listed = {f["path"] for f in m["files"]}
    check(f"{label}: side files", "mp_rank_00_model_states.pt" in listed and "job/config.json" in listed and
          "job/generation_config.json" in listed and "zero/optimizer_state.pt" not in listed, str(sorted(listed)[:8]))
    same = open(os.path.join(src, "config.json"), "rb").read() == open(os.path.join(out, "job/config.json"), "rb").read()
    check(f"{label}: config.json carried byte for byte", same)
    ms = torch.load(os.path.join(out, "mp_rank_00_model_states.pt"))
    args = ms["args"]
    c = json.load(open(os.path.join(src, "config.json")))
    info = ms["universal_checkpoint_info"]
    check(f"{label}: model-states file", type(args).__name__ == "Namespace" and ms["module"] is None and
          (args.hidden_size, args.num_layers, args.kv_channels, args.tensor_model_parallel_size, ms["iteration"], ms["global_steps"]) ==
          (c["hidden_size"], c["num_hidden_layers"], c["head_dim"], 1, 0, 0) and
          (info["original_vocab_size"], info["padded_vocab_size"]) == (c["vocab_size"], -(-c["vocab_size"] // 128) * 128), str(args))


def check_import(label, c, src, t, dtype, ranks, store):
    out = os.path.join(WORK, label.replace(" ", "_"))
    r = run("ucp-convert", [src, "-o", out, "--format", store, "--force"], ranks=ranks)
    check(f"{label}: converted", r.returncode == 0, r.stderr[-2000:])
    if r.returncode != 0:
        return None
    m, got = atomic_tensors(out, store)
    want = {k: v.float() for k, v in megatron_params(c, t).items()}
    check(f"{label}: the parameters", sorted(got) == sorted(want), str(sorted(set(got) ^ set(want))))
    bad = [k for k in want if k in got and not same_bytes(got[k], want[k])]
    check(f"{label}: every tensor bit for bit", not bad, str(bad[:4]))
    check_manifest(label, m, src, out, store)
    return out


def check_round_trip(label, atomic, t, dtype):
    out = os.path.join(WORK, label.replace(" ", "_") + "_hf")
    r = run("ucp-reshard", [atomic, "-o", out, "--format", "hf", "--dtype", dtype, "--force"], ranks=2)
    check(f"{label}: exported", r.returncode == 0, r.stderr[-2000:])
    if r.returncode != 0:
        return
    got = {}
    for f in sorted(os.listdir(out)):
        if f.endswith(".safetensors"):
            got.update(read_safetensors(os.path.join(out, f)))
    bad = [k for k in t if k not in got or not same_bytes(got[k], t[k])]
    check(f"{label}: round trip byte for byte", not bad and sorted(got) == sorted(t), str(bad[:4]) + str(sorted(set(got) ^ set(t))[:4]))


BASE = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "intermediate_size": 48, "vocab_size": 100, "max_position_embeddings": 64, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False}
MODELS = [  # (label, config changes, dtype, shards, runs: (ranks, store))
    ("fp32 gqa untied", {}, "fp32", 1, [(1, "pt"), (2, "hdf5")]),
    ("bf16 mha tied sharded", {"num_key_value_heads": 4, "tie_word_embeddings": True}, "bf16", 3, [(2, "pt"), (1, "hdf5")]),
    ("fp16 biases head_dim", {"head_dim": 16, "attention_bias": True, "mlp_bias": True}, "fp16", 2, [(2, "pt"), (2, "hdf5")]),
]


def damage_header(name, change):
    """mutate(folder): model.safetensors rewritten with its header changed by change(header, data)."""
    def mutate(d):
        path = os.path.join(d, name)
        raw = open(path, "rb").read()
        (n,) = struct.unpack("<Q", raw[:8])
        header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
        new = change(header, data)
        with open(path, "wb") as f:
            f.write(new if isinstance(new, bytes) else pack(header, data))
    return mutate


def shift(tensor, by):
    def change(h, data):
        h[tensor]["data_offsets"] = [x + by for x in h[tensor]["data_offsets"]]
    return change


def damaged_cases(fp32_src, sharded_src):
    def header_length(value):
        return lambda d: open(os.path.join(d, "model.safetensors"), "r+b").write(struct.pack("<Q", value))
    first = sorted(read_safetensors(os.path.join(fp32_src, "model.safetensors")))[0]
    cases = [
        ("header length past the cap", fp32_src, header_length(1 << 40), ["model.safetensors", "header length"]),
        ("header length past the file", fp32_src, header_length(1 << 20), ["model.safetensors", "header length", "truncated"]),
        ("offsets overlapping", fp32_src, damage_header("model.safetensors", shift("model.norm.weight", -4)),
         ["model.safetensors", "model.norm.weight"]),
        ("a hole", fp32_src, damage_header("model.safetensors", hole_before("model.norm.weight")),
         ["model.safetensors", "hole", "model.norm.weight"]),
        ("dtype I64", fp32_src, damage_header("model.safetensors", lambda h, data: h[first].__setitem__("dtype", "I64")),
         ["model.safetensors", first, "I64"]),
        ("truncated", fp32_src, lambda d: os.truncate(os.path.join(d, "model.safetensors"),
                                                      os.path.getsize(os.path.join(d, "model.safetensors")) - 4),
         ["model.safetensors", "truncated"]),
        ("rope_scaling", fp32_src, lambda d: edit_json(os.path.join(d, "config.json"),
                                                       lambda j: j.update(rope_scaling={"rope_type": "linear", "factor": 2.0})),
         ["config.json", "rope_scaling"]),
        ("index puts a tensor elsewhere", sharded_src, lambda d: edit_json(os.path.join(d, "model.safetensors.index.json"),
         lambda j: j["weight_map"].update({"model.norm.weight": other_shard(j, "model.norm.weight")})),
         ["model.norm.weight", "model.safetensors.index.json"]),
        ("index lacks a tensor", sharded_src, lambda d: edit_json(os.path.join(d, "model.safetensors.index.json"),
         lambda j: j["weight_map"].pop("model.norm.weight")), ["model.norm.weight", "weight_map"]),
        ("index total_size", sharded_src, lambda d: edit_json(os.path.join(d, "model.safetensors.index.json"),
         lambda j: j["metadata"].update(total_size=j["metadata"]["total_size"] + 2)), ["total_size"]),
        ("another class", fp32_src, lambda d: edit_json(os.path.join(d, "config.json"),
                                                        lambda j: j.update(architectures=["FalconForCausalLM"])),
         ["config.json", "FalconForCausalLM"]),
        ("tied output layer differs", sharded_src, add_lm_head, ["lm_head.weight", "tie_word_embeddings"]),
        ("missing shard", sharded_src, lambda d: os.remove(os.path.join(d, "model-00002-of-00003.safetensors")),
         ["model-00002-of-00003.safetensors"]),
    ]
    for label, src, mutate, expect in cases:
        refused_when_damaged(run, WORK, label, src, mutate, expect)


def hole_before(tensor):
    """change(header, data): 8 bytes put before `tensor`'s data, the offsets from it on moved past them."""
    def change(h, data):
        at = h[tensor]["data_offsets"][0]
        for k, e in h.items():
            if k != "__metadata__" and e["data_offsets"][0] >= at:
                e["data_offsets"] = [x + 8 for x in e["data_offsets"]]
        return pack(h, data[:at] + b"\0" * 8 + data[at:])
    return change


def add_lm_head(d):
    """A tied model's lm_head.weight saved after all, but not equal to the embedding it is tied to."""
    index_path = os.path.join(d, "model.safetensors.index.json")
    index = json.load(open(index_path))
    shard = index["weight_map"]["model.embed_tokens.weight"]
    t = read_safetensors(os.path.join(d, shard))
    t["lm_head.weight"] = t["model.embed_tokens.weight"] + 1
    write_safetensors(os.path.join(d, shard), t)
    index["weight_map"]["lm_head.weight"] = shard
    index["metadata"]["total_size"] += t["lm_head.weight"].numel() * t["lm_head.weight"].element_size()
    json.dump(index, open(index_path, "w"))


def edit_json(path, change):
    with open(path) as f:
        j = json.load(f)
    change(j)
    with open(path, "w") as f:
        json.dump(j, f)


def other_shard(index, tensor):
    return next(f for f in sorted(set(index["weight_map"].values())) if f != index["weight_map"][tensor])


def main():
    fresh_folder(WORK)
    sources = {}
    for seed, (label, changes, dtype, shards, runs) in enumerate(MODELS):
        c = dict(BASE, **changes)
        src = os.path.join(WORK, "models", label.replace(" ", "_"))
        t = make_model(src, c, dtype, shards, seed)
        sources[label] = src
        for ranks, store in runs:
            atomic = check_import(f"{label} np{ranks} {store}", c, src, t, dtype, ranks, store)
            if atomic:
                check_round_trip(f"{label} np{ranks} {store}", atomic, t, dtype)
    r = run("ucp-inspect", [sources["fp32 gqa untied"]])
    check("ucp-inspect describes the model folder", r.returncode == 0 and "hf" in r.stdout + r.stderr, r.stdout[-800:] + r.stderr[-800:])
    damaged_cases(sources["fp32 gqa untied"], sources["bf16 mha tied sharded"])
    # --force replaces only what ucp wrote, from this source as from any
    mine = os.path.join(WORK, "mine")
    os.makedirs(os.path.join(mine, "zero"), exist_ok=True)
    for f in ("notes.txt", os.path.join("zero", "keep.txt")):
        open(os.path.join(mine, f), "w").write("the user's\n")
    r = run("ucp-convert", [sources["fp32 gqa untied"], "-o", mine, "--force"])
    check("--force on a folder ucp did not write: refused, the user's files kept", r.returncode != 0 and
          "not written by ucp" in r.stderr and os.path.exists(os.path.join(mine, "zero", "keep.txt")) and
          not os.path.exists(os.path.join(mine, "ucp_manifest.json")), r.stderr[-600:])
    finish("hf_import")


if __name__ == "__main__":
    main()
