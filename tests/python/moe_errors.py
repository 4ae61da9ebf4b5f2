"""A real Mixture-of-Experts checkpoint with a piece missing (or, at tp > 1, an expert file at a TP
rank DeepSpeed does not save it at): ucp-inspect and ucp-convert say which file, exit non-zero, and
ucp-convert leaves no output behind.

    moe_errors.py INSPECT CONVERT CASE_DIR WORK
"""
import os
import shutil
import subprocess
import sys

CASES = [
    # (what is removed, renamed to (or None), what the message must name)
    ("layer_1_expert_3_mp_rank_00_model_states.pt", None, "layer_1_expert_3_mp_rank_00_model_states.pt"),
    ("zero_pp_rank_1_mp_rank_00_optim_states.pt", None, "zero_pp_rank_1_mp_rank_00_optim_states.pt"),
]
# At tp=2 ep=2 experts 2-3 lie at TP rank 1 (global rank 1 saves them): one missing there, a ZeRO file
# of TP rank 1, and an expert file moved to TP rank 0.
CASES_TP2 = [
    ("layer_1_expert_3_mp_rank_01_model_states.pt", None, "layer_1_expert_3_mp_rank_01_model_states.pt"),
    ("zero_pp_rank_1_mp_rank_01_optim_states.pt", None, "zero_pp_rank_1_mp_rank_01_optim_states.pt"),
    ("layer_0_expert_2_mp_rank_01_model_states.pt", "layer_0_expert_2_mp_rank_00_model_states.pt",
     "layer_0_expert_2_mp_rank_00_model_states.pt: expert 2 at tp=0, where DeepSpeed's rank that saves it is at tp=1"),
]


def main():
    inspect, convert, case, work = sys.argv[1:5]
    src = os.path.join(case, "ckpt")
    tag = open(os.path.join(src, "latest")).read().strip()
    failed = 0
    tp2 = os.path.exists(os.path.join(src, tag, "mp_rank_01_model_states.pt"))
    for removed, renamed, named in CASES_TP2 if tp2 else CASES:
        root = os.path.join(work, removed.replace(".pt", ""))
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(src, os.path.join(root, "ckpt"))
        if renamed:
            os.rename(os.path.join(root, "ckpt", tag, removed), os.path.join(root, "ckpt", tag, renamed))
        else:
            os.remove(os.path.join(root, "ckpt", tag, removed))
        r = subprocess.run([inspect, os.path.join(root, "ckpt")], capture_output=True, text=True)
        text = r.stdout + r.stderr
        ok_inspect = r.returncode != 0 and named in text
        out = os.path.join(root, "out")
        c = subprocess.run([convert, os.path.join(root, "ckpt"), "-o", out, "-q"], capture_output=True, text=True)
        ok_convert = c.returncode != 0 and named in c.stderr and not os.path.exists(os.path.join(out, "ucp_manifest.json"))
        line = [l for l in (r.stderr or r.stdout).splitlines() if named in l]
        print(f"{'moved' if renamed else 'without'} {removed}: ucp-inspect exit {r.returncode}, ucp-convert exit {c.returncode}: "
              f"{line[0][:140] if line else '(not named)'}")
        if not (ok_inspect and ok_convert):
            failed += 1
            print(f"  FAILED: inspect said:\n{text[-800:]}\n  convert said:\n{c.stderr[-800:]}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
