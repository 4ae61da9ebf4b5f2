"""A weights-only atomic checkpoint (issue 44: a Hugging Face model's weights) to DeepSpeed layouts, with a
fresh optimizer (--optimizer-config) and without one (--no-optimizer):

    weights_only_reshard.py BIN_DIR CASE_DIR WORK MPIEXEC SCHEMAS_DIR

CASE_DIR is a real DeepSpeed case (../shared/real-deepspeed/cases/llama_tp2_dp2_zero1_fp32): converted
with ucp-convert, then made weights-only (weights_only.py: moments, steps and optimizer_state.pt left out).
The ground truth is that folder's fp32 atoms, which DeepSpeed wrote (through ucp-convert, equal to
ds_to_universal's). Checked:
- the weights-only manifest against schemas/manifest.schema.json; ucp-inspect says "weights only" (text
  and --json), --verify passes; a reader of its Adam moments (ucp-convert --from-atomic) is refused
  naming the parameter;
- refusals by name: no --optimizer-config nor --no-optimizer; --no-optimizer with ZeRO-3, --format hf,
  --in-place, --optimizer-config; --optimizer-config on a checkpoint with its own optimizer state; a
  config that is no Adam;
- per layout (TP=2, PP=2, ZeRO-1/2/3, bf16 with the BF16 optimizer and with ZeRO-1), the fresh
  optimizer's files converted back with ucp-convert: fp32 equal to the weights bit for bit, exp_avg and
  exp_avg_sq zero, step 0; each optimizer file's param_groups as torch's AdamW lists them, lr, betas, eps
  and weight decay from the config (none for the group of norms);
- --format hf: the same files as from the full atomic checkpoint;
- --no-optimizer: no optimizer file, the model files byte-identical to the fresh optimizer's run, and at
  TP=1 without a pipeline each weight of `module` equal to the atomic weight (rounded as torch rounds to
  bf16).
"""
import glob
import json
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ds_stubs  # noqa: E402,F401
from atomic_files import atomic_tensor, same_bytes  # noqa: E402
from checklist import check, finish, tool_runner  # noqa: E402
from refusal import refusal_problems  # noqa: E402
from weights_only import make_weights_only  # noqa: E402

bindir, case, work, mpiexec, schemas = sys.argv[1:6]
run = tool_runner(bindir, mpiexec)
CONFIG = {"train_batch_size": 12, "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95],
                                                                           "eps": 1e-8, "weight_decay": 0.1}}}
LAYOUTS = {  # name: (flags, also --no-optimizer)
    "tp2_dp2_z1": (["--dp", "2", "--tp", "2", "--pp", "1", "--zero-stage", "1"], True),
    "pp2_dp2_z1": (["--dp", "2", "--tp", "1", "--pp", "2", "--zero-stage", "1"], True),
    "dp3_z2": (["--dp", "3", "--tp", "1", "--pp", "1", "--zero-stage", "2"], True),
    "tp2_dp2_z3": (["--dp", "2", "--tp", "2", "--pp", "1", "--zero-stage", "3"], False),
    "pp2_dp2_z0_bf16": (["--dp", "2", "--tp", "1", "--pp", "2", "--zero-stage", "0", "--dtype", "bf16"], True),
    "dp2_z1_bf16": (["--dp", "2", "--tp", "1", "--pp", "1", "--zero-stage", "1", "--dtype", "bf16"], True),
}


def refused(label, p, must, code=1):
    bad = refusal_problems(p, must, code)
    check(label, not bad, "; ".join(bad) + " | " + (p.stdout + p.stderr).strip()[-500:])


def load(path):
    return torch.load(path, map_location="cpu")


def plain_name(name, layers=4):
    """GPTModel's name of a GPTModelPipe (Llama: untied lm_head) parameter; a GPTModel name as it is."""
    spec, _, local = name.partition(".")
    if not spec.isdigit():
        return name
    k = int(spec)
    if k == 1:
        return "language_model.embedding." + local
    if k == layers + 2:
        return "language_model.encoder.final_layernorm." + local
    if local == "lm_head.weight":
        return "language_model.output_layer.weight"
    return f"language_model.encoder.layers.{k - 2}.{local}"


def atoms(folder, state="fp32"):
    """The atomic tensors of a state, by GPTModel name."""
    m = json.load(open(os.path.join(folder, "ucp_manifest.json")))
    return {plain_name(p["name"]): atomic_tensor(load(os.path.join(folder, p["files"][state])), p["shape"])
            for p in m["params"] if state in p["files"]}


def prepare():
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    full, wo = os.path.join(work, "atomic"), os.path.join(work, "weights-only")
    r = run("ucp-convert", [os.path.join(case, "ckpt"), "-o", full, "-q"], ranks=2)
    if r.returncode != 0:
        check("convert the real case", False, r.stderr[-800:])
        finish("weights_only_reshard")
    make_weights_only(full, wo)
    with open(os.path.join(work, "ds_config.json"), "w") as f:
        json.dump(CONFIG, f)
    with open(os.path.join(work, "sgd.json"), "w") as f:
        json.dump({"type": "SGD", "params": {"lr": 0.1}}, f)
    return full, wo


def check_folder(full, wo):
    import jsonschema
    schema = json.load(open(os.path.join(schemas, "manifest.schema.json")))
    m = json.load(open(os.path.join(wo, "ucp_manifest.json")))
    errors = [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(m)]
    check("weights-only manifest valid", not errors, "; ".join(errors[:3]))
    broken = dict(m, params=[dict(m["params"][0], files=dict(m["params"][0]["files"], exp_avg="zero/x/exp_avg.pt"))] + m["params"][1:])
    check("schema refuses a moment in a weights-only manifest",
          not jsonschema.Draft202012Validator(schema).is_valid(broken))
    full_m = json.load(open(os.path.join(full, "ucp_manifest.json")))
    check("schema still requires the moments of a full manifest",
          not jsonschema.Draft202012Validator(schema).is_valid(dict(full_m, params=m["params"])))
    r = run("ucp-inspect", [wo])
    check("inspect says weights only", r.returncode == 0 and "weights only" in r.stdout, r.stdout[-400:] + r.stderr)
    r = run("ucp-inspect", [wo, "--json", "--verify"])
    j = json.loads(r.stdout) if r.stdout.strip().startswith("{") else {}
    check("inspect --json --verify", r.returncode == 0 and j.get("weights_only") is True and j.get("ok") is True,
          r.stdout[-400:] + r.stderr)
    inspect_schema = json.load(open(os.path.join(schemas, "inspect-atomic.schema.json")))
    errors = [e.message for e in jsonschema.Draft202012Validator(inspect_schema).iter_errors(j)]
    check("inspect --json valid", not errors, "; ".join(errors[:3]))
    r = run("ucp-inspect", [full, "--json"])
    check("inspect --json of a full checkpoint", json.loads(r.stdout).get("weights_only") is False, r.stdout[-200:])
    r = run("ucp-convert", ["--from-atomic", wo, "-o", os.path.join(work, "h5"), "--format", "hdf5"])
    refused("a reader of the moments refused by name", r, ["language_model.", "exp_avg", "weights only"])


def check_refusals(full, wo):
    layout = LAYOUTS["tp2_dp2_z1"][0]
    out = os.path.join(work, "refused")
    cfg = os.path.join(work, "ds_config.json")
    refused("no optimizer flag", run("ucp-reshard", [wo, "-o", out] + layout),
            ["weights-only", "--optimizer-config", "--no-optimizer"])
    check("nothing written when refused", not os.path.exists(os.path.join(out, "latest")))
    refused("--no-optimizer with ZeRO-3", run("ucp-reshard", [wo, "-o", out, "--no-optimizer"] + LAYOUTS["tp2_dp2_z3"][0]),
            ["--no-optimizer", "ZeRO-3"], 2)
    refused("--no-optimizer with --format hf", run("ucp-reshard", [wo, "-o", out, "--no-optimizer", "--format", "hf"]),
            ["--no-optimizer", "--format hf"], 2)
    refused("--no-optimizer with --in-place", run("ucp-reshard", [wo, "--in-place", "--no-optimizer"] + layout),
            ["--no-optimizer", "--in-place"], 2)
    refused("--no-optimizer with --optimizer-config",
            run("ucp-reshard", [wo, "-o", out, "--no-optimizer", "--optimizer-config", cfg] + layout),
            ["--no-optimizer", "--optimizer-config"], 2)
    refused("--optimizer-config on a checkpoint with optimizer state",
            run("ucp-reshard", [full, "-o", out, "--optimizer-config", cfg] + layout), ["--optimizer-config", "weights-only"])
    refused("an SGD config", run("ucp-reshard", [wo, "-o", out, "--optimizer-config", os.path.join(work, "sgd.json")] + layout),
            ["sgd.json", "SGD", "Adam"])
    refused("a config without an optimizer",
            run("ucp-reshard", [wo, "-o", out, "--optimizer-config", os.path.join(wo, "ucp_manifest.json")] + layout),
            ["ucp_manifest.json", "optimizer"])


def check_model_export(full, wo):
    """--format hf works as for any atomic checkpoint: the same files as from the checkpoint with its moments."""
    outs = [os.path.join(work, "hf-" + k) for k in ("weights-only", "full")]
    for src, out in zip((wo, full), outs):
        r = run("ucp-reshard", [src, "-o", out, "--format", "hf", "-q"])
        check(f"--format hf from {os.path.basename(src)}", r.returncode == 0, r.stderr[-500:])
    names = sorted(os.listdir(outs[0])) if os.path.isdir(outs[0]) else []
    same = names and names == sorted(os.listdir(outs[1])) and all(
        open(os.path.join(outs[0], n), "rb").read() == open(os.path.join(outs[1], n), "rb").read() for n in names)
    check("--format hf: the same files from the weights-only checkpoint", bool(same), str(names))


def check_param_groups(name, out):
    files = glob.glob(os.path.join(out, "global_step0", "*_optim_states.pt"))
    check(f"{name}: optimizer files written", bool(files), out)
    want = CONFIG["optimizer"]["params"]
    for f in files:
        sd = load(f)["optimizer_state_dict"]
        base = sd.get("base_optimizer_state") or sd.get("optimizer_state_dict")
        groups = base["param_groups"]
        decays = [g["weight_decay"] for g in groups]
        ok = len(groups) == 2 and decays == [want["weight_decay"], 0.0] and all(
            g["lr"] == want["lr"] and g["betas"] == tuple(want["betas"]) and g["eps"] == want["eps"] and
            g["amsgrad"] is False and list(g)[-1] == "params" for g in groups)
        check(f"{name}: {os.path.basename(f)} param_groups", ok, str(groups))


def check_fresh(name, flags, wo, weights):
    out = os.path.join(work, name, "fresh")
    report = os.path.join(work, name, "report.json")
    r = run("ucp-reshard", [wo, "-o", out, "--optimizer-config", os.path.join(work, "ds_config.json"), "--report", report]
            + flags, ranks=2)
    check(f"{name}: fresh optimizer written", r.returncode == 0 and "fresh optimizer" in r.stderr, r.stderr[-800:])
    if r.returncode != 0:
        return None
    rep = json.load(open(report))
    check(f"{name}: report: a fresh optimizer, the weights read once", rep.get("optimizer") == "fresh" and
          rep["bytes_read"] == rep["atomic_bytes"] == 4 * sum(t.numel() for t in weights.values()), str(rep)[:300])
    check_param_groups(name, out)
    back = os.path.join(work, name, "back")
    r = run("ucp-convert", [out, "-o", back, "-q"])
    check(f"{name}: converted back", r.returncode == 0, r.stderr[-800:])
    if r.returncode != 0:
        return out
    got = atoms(back)
    bad = [n for n, t in weights.items() if n not in got or not same_bytes(got[n], t)]
    check(f"{name}: fp32 = the weights, bit for bit ({len(weights)} parameters)", not bad and len(got) == len(weights), bad[:3])
    for state in ("exp_avg", "exp_avg_sq"):
        nonzero = [n for n, t in atoms(back, state).items() if torch.count_nonzero(t) > 0]
        check(f"{name}: {state} zero", not nonzero, nonzero[:3])
    steps = {float(load(s)) for s in glob.glob(os.path.join(back, "zero", "*", "step.pt"))}
    check(f"{name}: step 0", steps == {0.0}, str(steps))
    return out


def model_files(folder):
    return sorted(os.path.basename(f) for f in glob.glob(os.path.join(folder, "global_step0", "*")))


def check_no_optimizer(name, flags, wo, weights, fresh):
    out = os.path.join(work, name, "no-optimizer")
    r = run("ucp-reshard", [wo, "-o", out, "--no-optimizer"] + flags, ranks=2)
    check(f"{name}: --no-optimizer written", r.returncode == 0 and "--no-optimizer" in r.stderr, r.stderr[-800:])
    if r.returncode != 0:
        return
    files = model_files(out)
    check(f"{name}: no optimizer file", files and not any("optim_states" in f for f in files), f"{files} in {out}")
    if fresh:
        expected = [f for f in model_files(fresh) if "optim_states" not in f]
        differ = [f for f in expected if open(os.path.join(fresh, "global_step0", f), "rb").read() !=
                  open(os.path.join(out, "global_step0", f), "rb").read()]
        check(f"{name}: model files identical to the fresh optimizer's", files == expected and not differ,
              f"{files} vs {expected}; differ {differ}")
    if "--tp" in flags and flags[flags.index("--tp") + 1] == "1" and flags[flags.index("--pp") + 1] == "1":
        module = load(os.path.join(out, "global_step0", "mp_rank_00_model_states.pt"))["module"]
        bf16 = "bf16" in flags
        bad = []
        for n, t in weights.items():
            want = t.to(torch.bfloat16) if bf16 else t
            got = module[n][: want.shape[0]] if n in module else None  # vocabulary padding rows after the weights
            if got is None or not same_bytes(got, want) or (module[n].shape[0] > want.shape[0] and
                                                            torch.count_nonzero(module[n][want.shape[0]:]) > 0):
                bad.append(n)
        check(f"{name}: module weights = the atomic weights", not bad and len(module) == len(weights), bad[:3])
    # ucp reads a DeepSpeed tag through its optimizer files: one reason, naming the way back
    back = os.path.join(work, name, "no-optimizer-back")
    r = run("ucp-convert", [out, "-o", back])
    check(f"{name}: ucp-convert of the --no-optimizer tag refused by name", r.returncode != 0 and
          "no optimizer states file" in r.stderr and "--no-optimizer" in r.stderr and
          not os.path.exists(os.path.join(back, "ucp_manifest.json")), r.stderr[-800:])


def main():
    full, wo = prepare()
    check_folder(full, wo)
    check_refusals(full, wo)
    check_model_export(full, wo)
    weights = atoms(wo)
    for name, (flags, no_optimizer) in LAYOUTS.items():
        fresh = check_fresh(name, flags, wo, weights)
        if no_optimizer:
            check_no_optimizer(name, flags, wo, weights, fresh)
    finish("weights_only_reshard")


main()
