"""ucp's DCP output read by torch 2.6's own DCP code (run in the Debian trixie chroot of
../shared/real-dcp/harness/README.md; not in CI). For each DCP folder ucp-reshard --format dcp wrote
from the atomic checkpoint of the real DeepSpeed Llama case:
1. torch's dcp_to_torch_save: every tensor equals what the atomic tensors give under torchtitan's
   names (tests/python/dcp_expect.py), bit for bit, every param-group option equals the checkpoint's;
2. on the mesh it was written for (gloo, torch.multiprocessing.spawn; FSDP2 or torchtitan's TP plan
   as the real-dcp harness's gen_dcp.py applies them, its tiny_llama.py model), get_state_dict ->
   dcp.load -> set_state_dict loads it; the full state dict torch then gathers (weights, exp_avg,
   exp_avg_sq, step) equals the expected tensors bit for bit; and the model's logits on a fixed batch
   equal the reference logits of the source model (tests/python/harness_logits.py: the DeepSpeed
   harness's own Megatron-style model with DeepSpeed's own universal tensors) within 1e-5.
A JSON record: per folder the sha256 of every file torch read, the counts and the largest logit
difference; tests/python/dcp_target.py checks ucp's output against it in CI.

    python3 dcp_real_check.py ATOMIC CASE_DIR REF_LOGITS.json HARNESS_DIR OUT.json DCP_DIR:MESH[:DCP_CASE]...

The real DCP cases (../shared/real-dcp/cases/fsdp2_dp2, tp2) converted by ucp-convert and written back
by ucp-reshard on their own mesh (DCP_DIR:MESH:DCP_CASE) are checked the same way against torch's own
reference.pt and the logits of the case's model (tiny_llama.py, reference.pt's weights, one process).
A real Megatron-Core case written as DCP (DCP_DIR:MESH:mcore=CASE_DIR=HF_CONFIG) against Megatron's own
full state (its reference.pt) and Megatron-Core's own logits (its megatron_logits.json).
"""
import hashlib
import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
from dcp_expect import expected_from_mcore, expected_from_megatron, flat, same  # noqa: E402

IDS = (torch.arange(2 * 16).view(2, 16) * 37 + 11) % 300  # harness_logits.py's batch


def degrees(mesh):
    """{"dp": N, "tp": M} of "dp=N", "tp=M" or "dp=N,tp=M"."""
    return {k: int(v) for k, v in (p.split("=") for p in mesh.split(","))}


def sha256s(folder):
    return {f: hashlib.sha256(open(os.path.join(folder, f), "rb").read()).hexdigest()
            for f in sorted(os.listdir(folder)) if f.endswith(".distcp") or f == ".metadata"}


def worker(rank, world, folder, mesh, cfg, harness, groups, out, ids):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29517", USE_LIBUV="0")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    sys.path.insert(0, harness)
    import gen_dcp
    import tiny_llama
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    torch.manual_seed(1234)  # the model's own initial values: all overwritten by the load
    args = tiny_llama.ModelArgs(dim=cfg["hidden_size"], n_layers=cfg["num_layers"], n_heads=cfg["num_attention_heads"],
                                n_kv_heads=cfg["num_key_value_heads"], ffn_hidden=cfg["ffn_hidden_size"],
                                vocab_size=cfg["vocab_size"], norm_eps=cfg["layernorm_epsilon"], rope_theta=cfg["rope_theta"],
                                max_seq_len=cfg["max_position_embeddings"])
    model = tiny_llama.Transformer(args)
    degree = degrees(mesh)
    names = tuple(k for k in ("dp", "tp") if k in degree)
    dev_mesh = init_device_mesh("cpu", tuple(degree[k] for k in names), mesh_dim_names=names)
    if "tp" in degree:  # torchtitan's order: TP inside, then FSDP2 over dp
        gen_dcp.tp_plan_and_apply(model, dev_mesh["tp"] if len(names) > 1 else dev_mesh)
    if "dp" in degree:
        gen_dcp.cpu_stream_backport()
        gen_dcp.fsdp_apply(model, dev_mesh["dp"] if len(names) > 1 else dev_mesh, False)
    named = dict(model.named_parameters())
    opt = torch.optim.AdamW([{"params": [named[p] for p in g["params"]], **{k: v for k, v in g.items() if k != "params"}} for g in groups])
    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=folder)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    full_m, full_o = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    with torch.no_grad():
        logits = model(ids)
    if hasattr(logits, "full_tensor"):
        logits = logits.full_tensor()
    if rank == 0:
        torch.save({"model": full_m, "optim": full_o, "logits": logits}, out)
    dist.barrier()
    dist.destroy_process_group()


def titan_config(args):
    """Megatron's names of the facts, from the real-dcp case's model_args (tiny_llama.ModelArgs)."""
    return {"hidden_size": args["dim"], "num_layers": args["n_layers"], "num_attention_heads": args["n_heads"],
            "num_key_value_heads": args["n_kv_heads"], "ffn_hidden_size": args["ffn_hidden"], "vocab_size": args["vocab_size"],
            "layernorm_epsilon": args["norm_eps"], "rope_theta": args["rope_theta"], "max_position_embeddings": args["max_seq_len"]}


def reference_of_dcp_case(case_dir, harness):
    """A real DCP case's tensors and options (torch's own reference.pt) and its model's logits (tiny_llama.py, one process)."""
    sys.path.insert(0, harness)
    import tiny_llama
    ref = torch.load(os.path.join(case_dir, "reference.pt"), weights_only=False)
    cfg = titan_config(json.load(open(os.path.join(case_dir, "layout.json")))["info"]["model_args"])
    model = tiny_llama.Transformer(tiny_llama.ModelArgs(**json.load(open(os.path.join(case_dir, "layout.json")))["info"]["model_args"]))
    model.load_state_dict(ref["model"])
    with torch.no_grad():
        logits = model(IDS).tolist()
    everything = flat(ref)
    want_t = {k: v for k, v in everything.items() if isinstance(v, torch.Tensor)}
    want_o = {k: v for k, v in everything.items() if not isinstance(v, torch.Tensor)}
    return cfg, want_t, want_o, logits


def check_folder(want_t, want_o, cfg, ref_logits, harness, folder, mesh, ids=IDS):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    rec = {"mesh": mesh, "sha256": sha256s(folder)}
    with tempfile.TemporaryDirectory() as tmp:
        dcp_to_torch_save(folder, os.path.join(tmp, "full.pt"))
        got = flat(torch.load(os.path.join(tmp, "full.pt"), weights_only=False))
        rec["dcp_to_torch_save_tensors_equal"] = sum(same(got[k], v) for k, v in want_t.items() if k in got)
        rec["dcp_to_torch_save_options_equal"] = sum(got.get(k) == v for k, v in want_o.items())
        rec["expected_tensors"], rec["expected_options"] = len(want_t), len(want_o)
        groups = []
        for g in range(1 + max(int(k.split(".")[2]) for k in want_o)):
            groups.append({k.split(".", 3)[3]: v for k, v in want_o.items() if k.startswith(f"optim.param_groups.{g}.")})
        out = os.path.join(tmp, "loaded.pt")
        world = 1
        for n in degrees(mesh).values():
            world *= n
        mp.spawn(worker, args=(world, folder, mesh, cfg, harness, groups, out, ids), nprocs=world)
        loaded = torch.load(out, weights_only=False)
    groups_now = flat({"optim": {"param_groups": loaded["optim"]["param_groups"]}})
    rec["loaded_options_equal"] = sum(groups_now.get(k) == v for k, v in want_o.items())
    full = flat({"model": loaded["model"]})
    for fqn, st in loaded["optim"]["state"].items():
        for name, v in st.items():
            full[f"optim.state.{fqn}.{name}"] = v
    rec["loaded_tensors_equal"] = sum(same(full[k], v) for k, v in want_t.items() if k in full)
    ref = torch.tensor(ref_logits)
    rec["max_abs_logit_difference"] = float((loaded["logits"][..., :ref.shape[-1]] - ref).abs().max())
    rec["logits_shape"] = list(loaded["logits"].shape)
    return rec


def reference_of_mcore_case(spec):
    """A real-mcore case (tests/data/real-mcore/<case>, spec "mcore=CASE_DIR=HF_CONFIG"): Megatron's own full
    state (reference.pt) as torchtitan names it, the param groups as Megatron-Core rebuilds them
    (dcp_expect.expected_from_mcore), the model's facts from ucp's Hugging Face export's config.json, and
    Megatron-Core's own logits (megatron_logits.json) with the batch they were computed on."""
    _, case_dir, hf_config = spec.split("=")
    hf = json.load(open(hf_config))
    cfg = {"hidden_size": hf["hidden_size"], "num_layers": hf["num_hidden_layers"], "num_attention_heads": hf["num_attention_heads"],
           "num_key_value_heads": hf["num_key_value_heads"], "ffn_hidden_size": hf["intermediate_size"], "vocab_size": hf["vocab_size"],
           "layernorm_epsilon": hf["rms_norm_eps"], "rope_theta": hf["rope_theta"], "max_position_embeddings": hf["max_position_embeddings"]}
    want_t, want_o = expected_from_mcore(case_dir, cfg["num_attention_heads"], cfg["num_key_value_heads"])
    ref = json.load(open(os.path.join(case_dir, "megatron_logits.json")))
    return cfg, want_t, want_o, ref["logits"], torch.tensor(ref["ids"])


def main():
    """Each DCP_DIR:MESH is checked against the DeepSpeed case's atomic tensors; DCP_DIR:MESH:CASE (a real
    DCP case written back) against that case's reference.pt and its own model's logits."""
    atomic, case, ref_json, harness, out = sys.argv[1:6]
    ds_cfg = json.load(open(os.path.join(case, "model_config.json")))
    ref = json.load(open(ref_json))
    ds_logits = ref["logits"] if isinstance(ref, dict) else ref
    ds_t, ds_o = expected_from_megatron(atomic, ds_cfg)
    record = {"torch": torch.__version__, "folders": {}}
    for spec in sys.argv[6:]:
        folder, mesh, *dcp_case = spec.split(":")
        ids = IDS
        if dcp_case and dcp_case[0].startswith("mcore="):
            cfg, want_t, want_o, logits, ids = reference_of_mcore_case(dcp_case[0])
            label = "mcore " + mesh
        elif dcp_case:
            cfg, want_t, want_o, logits = reference_of_dcp_case(dcp_case[0], harness)
            label = os.path.basename(dcp_case[0]) + " " + mesh
        else:
            cfg, want_t, want_o, logits, label = ds_cfg, ds_t, ds_o, ds_logits, mesh
        rec = check_folder(want_t, want_o, cfg, logits, harness, folder, mesh, ids)
        print(json.dumps(rec))
        record["folders"][label] = rec
    with open(out, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
