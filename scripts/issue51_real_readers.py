#!/usr/bin/python3
"""Issue 51's closing check with the real readers: tests/data/real-hf/issue51_readers.json. Run from the HOST as
root, after a build, with the Debian trixie chroot /work/oracle-hf/trixie set up (transformers 5.3.0 in
/opt/hf/venv, DeepSpeed 0.19.5 at /opt/ds0195: set up as scripts/trainer_resume_one.py lists):

    scripts/issue51_real_readers.py BUILD_DIR SCRATCH [--out tests/data/real-hf/issue51_readers.json]

SCRATCH must lie under /work/scratch (bind-mounted into the chroot at the same path; unmounted at the end).
(A) ds_version by default: tests/data/real-hf/llama_fp32 imported (ucp-convert) and resharded WITHOUT
    --ds-version (fresh AdamW, --optimizer-config) to TP=2 x PP=2, TP=2, and DP=2 ZeRO-2; each layout's files'
    ds_version (torch.load in the chroot), then real DeepSpeed 0.19.5 loads it (scripts/harness_logits.py,
    load_lr_scheduler_states=False) and its logits are compared with transformers' own of the source model on
    the same batch (tests/hf/transformers_check.py --record --ids-from).
(B) GPT-2 with "n_inner": null: tests/data/real-hf/gpt2_tiny with that one text edit in config.json, imported,
    resharded to TP=2, converted back and exported (--format hf); config.json and generation_config.json must
    equal the source's byte for byte, and GPT2LMHeadModel.from_pretrained of the export must load with no
    missing/unexpected/mismatched keys and give the source model's logits (max |diff|).
A reader's refusal is recorded with its error text, never worked around. (--inner-*: run inside the chroot.)
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
CHROOT = "/work/oracle-hf/trixie"
OPTIMIZER = {"optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                                       "weight_decay": 0.01}}}
LAYOUTS = {"tp2_pp2_dp1_z1": {"tp": 2, "pp": 2, "dp": 1, "zero": 1},
           "tp2_pp1_dp1_z1": {"tp": 2, "pp": 1, "dp": 1, "zero": 1},
           "tp1_pp1_dp2_z2": {"tp": 1, "pp": 1, "dp": 2, "zero": 2}}
HF_ENV = ". /opt/hf/hfenv.sh; cd /tmp; "
DS_PATH = "PYTHONPATH=/opt/ds0195:/work/shared/real-deepspeed/harness/shims "  # where DeepSpeed is imported (hjson shim)


# ---------------------------------------------------------------- inside the chroot
def inner_ds_version(tag_dir, out):
    import torch
    found = {}
    for path in sorted(glob.glob(os.path.join(tag_dir, "*.pt"))):
        sd = torch.load(path, map_location="cpu", weights_only=False)
        if isinstance(sd, dict) and "ds_version" in sd:
            found[os.path.basename(path)] = sd["ds_version"]
    json.dump(found, open(out, "w"), indent=1)


def inner_gpt2(src, export, out):
    import torch
    import transformers
    from transformers import GPT2LMHeadModel
    rows = {}
    logits = {}
    for name, folder in (("source", src), ("export", export)):
        model, info = GPT2LMHeadModel.from_pretrained(folder, output_loading_info=True)
        model.eval()
        cfg = model.config
        ids = (torch.arange(2 * 16).view(2, 16) * 37 + 11) % cfg.vocab_size
        with torch.no_grad():
            logits[name] = model(input_ids=ids).logits.float()
        rows[name] = {k: sorted(map(str, info.get(k, []))) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
        rows[name].update(n_inner=cfg.n_inner, mlp_width=model.transformer.h[0].mlp.c_fc.nf, dtype=str(model.dtype))
    json.dump({"reader": f"transformers {transformers.__version__}, torch {torch.__version__}",
               "ids": ids.tolist(), "loads": rows, "logits_shape": list(logits["export"].shape),
               "max_abs_diff_logits": (logits["export"] - logits["source"]).abs().max().item()}, open(out, "w"), indent=1)


def inner_versions(out):
    import sys as s
    import deepspeed
    import torch
    import transformers
    import huggingface_hub
    json.dump({"python": s.version.split()[0], "torch": torch.__version__, "deepspeed": deepspeed.__version__,
               "transformers": transformers.__version__, "huggingface_hub": huggingface_hub.__version__},
              open(out, "w"))


# ---------------------------------------------------------------- host side
def in_chroot(cmd):
    r = subprocess.run(["chroot", CHROOT, "env", "-i", "bash", "-c", HF_ENV + cmd], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"chroot command failed ({r.returncode}): {cmd}\n{r.stdout[-3000:]}{r.stderr[-6000:]}")
    return r


def unmount(path):
    """umount path and every mount under it (deepest first)."""
    with open("/proc/mounts") as f:
        points = [line.split()[1] for line in f if line.split()[1] == path or line.split()[1].startswith(path + "/")]
    for p in sorted(set(points), reverse=True):
        subprocess.run(["umount", p], check=True)


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    return r.returncode, (r.stdout + r.stderr).strip()


def part_a(tool, scratch, config):
    from weights_only_logits import max_diff
    import importlib.util  # scripts/hf_import_deepspeed.py (tests/python has a module of that name on sys.path)
    spec = importlib.util.spec_from_file_location("scripts_hf_import_deepspeed", os.path.join(HERE, "hf_import_deepspeed.py"))
    spec.loader.exec_module(mod := importlib.util.module_from_spec(spec))
    model_flags = mod.model_flags
    src = os.path.join(ROOT, "tests", "data", "real-hf", "llama_fp32")
    hf = json.load(open(os.path.join(src, "config.json")))
    atomic = os.path.join(scratch, "atomic")
    rc, text = run([tool("ucp-convert"), src, "-o", atomic, "-q"])
    assert rc == 0, text
    rows = {}
    for name, lay in LAYOUTS.items():
        out = os.path.join(scratch, "ckpt", "L_" + name)
        args = ["--dp", str(lay["dp"]), "--tp", str(lay["tp"]), "--pp", str(lay["pp"]), "--zero-stage", str(lay["zero"]),
                "--optimizer-config", config]
        rc, text = run([tool("ucp-reshard"), atomic, "-o", out, "-q"] + args)
        row = rows[name] = {"ucp_reshard_args": args[:-1] + ["cfg.json"]}
        assert rc == 0, text
        tag = open(os.path.join(out, "latest")).read().strip()
        dsv = os.path.join(scratch, "out", name + "-ds_version.json")
        in_chroot(DS_PATH + f"python3 {os.path.abspath(__file__)} --inner-ds-version {out}/{tag} {dsv}")
        row["ds_version_per_file"] = json.load(open(dsv))
        row["ds_versions"] = sorted(set(row["ds_version_per_file"].values()))
        got_path = os.path.join(scratch, "out", name + "-deepspeed.json")
        cmd = [sys.executable, os.path.join(HERE, "harness_logits.py"), out, "--out", got_path,
               "--no-load-lr-scheduler-states"] + model_flags(hf)
        cmd += [x for k, v in lay.items() for x in ("--" + k, str(v))]
        rc, text = run(cmd)
        row["deepspeed_loaded"] = rc == 0
        if rc:
            row["deepspeed_error"] = text[-6000:]
            print(f"(A) {name}: DeepSpeed REFUSED it:\n{text[-6000:]}", flush=True)
            continue
        got = json.load(open(got_path))
        ref_path = os.path.join(scratch, "out", name + "-transformers.json")
        in_chroot(f"python3 {ROOT}/tests/hf/transformers_check.py --record {src} {ref_path} --ids-from {got_path}")
        ref = json.load(open(ref_path))
        assert ref["ids"] == got["ids"] and not ref["loading_problems"]
        row.update(load=got["load"], max_abs_diff_deepspeed_vs_transformers=max_diff(got["logits"], ref["logits"]),
                   ckpt_sha256=got["ckpt_sha256"])
        print(f"(A) {name}: ds_version {row['ds_versions']}, DeepSpeed loaded it (global_steps "
              f"{got['load']['global_steps']}), max |DeepSpeed - transformers| = "
              f"{row['max_abs_diff_deepspeed_vs_transformers']:.3g}", flush=True)
    return {"model": "tests/data/real-hf/llama_fp32", "harness_load": "load_lr_scheduler_states=False", "rows": rows}


def part_b(tool, scratch, config):
    g = os.path.join(scratch, "ckpt", "gpt2")
    shutil.copytree(os.path.join(ROOT, "tests", "data", "real-hf", "gpt2_tiny"), g)
    text = open(os.path.join(g, "config.json")).read()
    assert text.count('"n_inner": 128') == 1
    open(os.path.join(g, "config.json"), "w").write(text.replace('"n_inner": 128', '"n_inner": null'))
    d = lambda n: os.path.join(scratch, "ckpt", n)  # noqa: E731
    steps = [["ucp-convert", g, "-o", d("g_atomic")],
             ["ucp-reshard", d("g_atomic"), "-o", d("g_layout"), "--dp", "1", "--tp", "2", "--pp", "1", "--zero-stage", "1",
              "--optimizer-config", config],
             ["ucp-convert", d("g_layout"), "-o", d("g_atomic2")],
             ["ucp-reshard", d("g_atomic2"), "-o", d("g_hf"), "--format", "hf"]]
    res = {"source": "tests/data/real-hf/gpt2_tiny with '\"n_inner\": 128' -> '\"n_inner\": null' in config.json",
           "commands": []}
    for s in steps:
        rc, text = run([tool(s[0])] + s[1:])
        shown = " ".join(s).replace(config, "cfg.json").replace(d(""), "$S/")
        res["commands"].append({"cmd": shown, "rc": rc, **({"error": text[-4000:]} if rc else {})})
        if rc:
            print(f"(B) {s[0]} failed ({rc}):\n{text}", flush=True)
            return res
    for f in ("config.json", "generation_config.json"):
        res[f + "_byte_equal"] = open(os.path.join(g, f), "rb").read() == open(os.path.join(d("g_hf"), f), "rb").read()
    res["export_files"] = sorted(os.listdir(d("g_hf")))
    res["model_safetensors_exists"] = os.path.isfile(os.path.join(d("g_hf"), "model.safetensors"))
    out = os.path.join(scratch, "out", "gpt2-transformers.json")
    try:
        in_chroot(f"python3 {os.path.abspath(__file__)} --inner-gpt2 {g} {d('g_hf')} {out}")
    except RuntimeError as e:
        res["transformers_error"] = str(e)[-6000:]
        print(f"(B) transformers REFUSED the export:\n{e}", flush=True)
        return res
    res["transformers"] = json.load(open(out))
    res["transformers"].pop("ids")
    print(f"(B) config.json equal {res['config.json_byte_equal']}, generation_config.json equal "
          f"{res['generation_config.json_byte_equal']}, export loads {res['transformers']['loads']['export']}, "
          f"max |logits diff| = {res['transformers']['max_abs_diff_logits']:.3g}", flush=True)
    return res


def main():
    p = argparse.ArgumentParser()
    p.add_argument("build", nargs="?")
    p.add_argument("scratch", nargs="?")
    p.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "real-hf", "issue51_readers.json"))
    p.add_argument("--inner-ds-version", nargs=2)
    p.add_argument("--inner-gpt2", nargs=3)
    p.add_argument("--inner-versions", nargs=1)
    a = p.parse_args()
    if a.inner_ds_version:
        return inner_ds_version(*a.inner_ds_version)
    if a.inner_gpt2:
        return inner_gpt2(*a.inner_gpt2)
    if a.inner_versions:
        return inner_versions(*a.inner_versions)
    from harness_logits import bind
    scratch = os.path.abspath(a.scratch)
    if not scratch.startswith("/work/scratch/"):
        sys.exit("SCRATCH must lie under /work/scratch (the chroot sees it there)")
    unmount(CHROOT + scratch)
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(os.path.join(scratch, "ckpt"))
    os.makedirs(os.path.join(scratch, "out"))
    if not os.path.ismount(CHROOT + "/proc"):
        subprocess.run(["mount", "-t", "proc", "proc", CHROOT + "/proc"], check=True)
    try:
        bind(scratch, ro=False)
        bind(os.path.join(ROOT, "tests"))  # read-only: transformers_check.py and the source models
        bind(HERE)
        bind("/work/shared")  # read-only: the harness (its hjson shim), as harness_logits.py binds it
        tool = lambda name: os.path.join(os.path.abspath(a.build), "apps", name)  # noqa: E731
        config = os.path.join(scratch, "out", "cfg.json")
        json.dump(OPTIMIZER, open(config, "w"))
        vfile = os.path.join(scratch, "out", "versions.json")
        in_chroot(DS_PATH + f"python3 {os.path.abspath(__file__)} --inner-versions {vfile}")
        versions = json.load(open(vfile))
        versions["ucp_commit"] = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True,
                                                text=True).stdout.strip()
        table = {"issue": 51, "versions": versions, "optimizer_config (cfg.json)": OPTIMIZER}
        table["A_ds_version_default"] = part_a(tool, scratch, config)
        table["B_gpt2_n_inner_null"] = part_b(tool, scratch, config)
    finally:  # every bind this script or harness_logits.py made (proc stays, as harness_logits.py leaves it)
        for path in (CHROOT + scratch, CHROOT + ROOT, CHROOT + "/work/shared"):
            unmount(path)
    with open(a.out, "w") as f:
        json.dump(table, f, indent=1)
        f.write("\n")
    print("wrote", a.out)


if __name__ == "__main__":
    main()
