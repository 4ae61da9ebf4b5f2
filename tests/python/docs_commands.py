"""Every shell command the documentation shows, run, so that the docs cannot rot.

    docs_commands.py SOURCE_DIR BIN_DIR BUILD_DIR SHARED_DIR WORK MPIEXEC [FILE.md ...]

SOURCE_DIR holds README.md and docs/*.md (or the FILEs given, relative to it). The convention, in the
markdown:
- a ```sh (or ```bash, ```shell) block is run, command by command (`\\` continues a line; `#` lines are
  comments), each in the scratch folder of its page, WORK/<page>/, in the order of the page: a later
  block may use what an earlier one wrote. A command must exit 0, or N where its trailing comment says
  `# exits N`;
- `<!-- not run: REASON -->` on the line before such a block leaves it out; the test lists it, with the
  reason, at the end;
- `<!-- file: NAME -->` before any block writes the block's text to NAME in the page's scratch folder
  (a ds_config.json the next commands read);
- any other block (```text, ```json, bare) is not a command: output, a listing, a file. A bare block
  that starts with a command (ucp-*, mpirun, bash, cmake, ...) is a problem: mark it sh or not run.

The names a reader sees stand for small real inputs, bound before a page's first block and printed:
the bundled sample, the real checkpoints of SHARED_DIR (../shared: real-hftrainer, real-dcp) and
tests/data (real-hf, real-mcore). Absolute paths (/ckpt/, /fs/, /opt/, /scratch/) are read under the
page's folder `root/`, and `checkpoint-500` as the real Trainer checkpoint's step (`checkpoint-4`). On
PATH: stand-ins for mpirun (the real one with --oversubscribe), srun (runs a ucp tool as one rank under
mpirun; only prints a training command) and sbatch (runs the script with SLURM_JOB_NUM_NODES from
--nodes and 8 GPUs a node), then BIN_DIR. A failure names the page, the line and the command.
"""
import os
import re
import shutil
import subprocess
import sys
import time

SOURCE, BIN, BUILD, SHARED, WORK = (os.path.abspath(a) for a in sys.argv[1:6])
MPIEXEC = shutil.which(sys.argv[6]) or sys.exit(f"docs_commands: no {sys.argv[6]}")  # the real one, before the stand-in
PAGES = sys.argv[7:] or ["README.md"] + sorted("docs/" + n for n in os.listdir(os.path.join(SOURCE, "docs")) if n.endswith(".md"))
DATA = os.path.join(SOURCE, "tests", "data")
SAMPLE = os.path.join(DATA, "sample_llama_tp2_pp2_dp2_bf16")
TRAINER = os.path.join(SHARED, "real-hftrainer", "cases", "zero2_dp2_fp32", "checkpoint-4")
DCP = os.path.join(SHARED, "real-dcp", "cases", "fsdp2_dp2", "checkpoint")
DS_LLAMA = os.path.join(SHARED, "real-deepspeed", "cases", "llama_tp2_dp2_zero1_fp32")  # Megatron-DeepSpeed, real args
DS_CONFIG = os.path.join(DS_LLAMA, "ds_config.json")
HF_LLAMA = os.path.join(DATA, "real-hf", "llama_fp32")
DCP_FACTS = os.path.join(DATA, "hf", "dcp_fsdp2_dp2", "model_config.json")
MCORE = os.path.join(DATA, "real-mcore", "llama_tp2", "checkpoint")  # torch_dist, iteration 3
MCORE_LEGACY = os.path.join(DATA, "real-mcore", "llama_tp2_legacy", "legacy")
RUN_LANGS = {"sh", "bash", "shell"}
COMMAND_WORDS = re.compile(r"^\s*(ucp-\w+|mpirun|mpiexec|bash|cmake|python3?|sbatch|srun|h5ls|man)\b(?!:)")
SUBSTITUTIONS = [(re.compile(r"(?<![\w./-])/(ckpt|fs|opt|scratch)/"), r"root/\1/", "/ckpt/, /fs/, /opt/, /scratch/ -> root/..."),
                 (re.compile(r"\bcheckpoint-500\b"), "checkpoint-4", "checkpoint-500 -> checkpoint-4 (the real Trainer case's step)"),
                 (re.compile(r"\bglobal_step500\b"), "global_step4", "global_step500 -> global_step4")]

# The inputs each page's names stand for: (name in the page's folder, how, source). "copy" where a
# command writes into it (--in-place, latest_universal), "link" where it is only read.
COMMON = [("scripts", "link", os.path.join(SOURCE, "scripts")), ("tests", "link", os.path.join(SOURCE, "tests")),
          ("build", "link", BUILD)]
MCORE_ROOT = [("root/ckpt/run1/latest_checkpointed_iteration.txt", "text", "3"),
              ("root/ckpt/run1/iter_0000003", "link", MCORE)]
BINDINGS = {
    "README.md": [("output_dir/checkpoint-4", "copy", TRAINER), ("root/fs/run1", "copy", SAMPLE),
                  ("ds_config.json", "copy", DS_CONFIG), ("ckpt", "copy", os.path.join(DS_LLAMA, "ckpt")), ("Llama-3.2-1B", "link", HF_LLAMA),
                  ("step-1000", "link", DCP), ("model.json", "copy", DCP_FACTS)] + MCORE_ROOT,
    "docs/reshard.md": [("output_dir/checkpoint-4", "copy", TRAINER),
                        ("ATOMIC", "command", ["ucp-convert", HF_LLAMA, "-o", "ATOMIC"])],
    "docs/huggingface.md": [("ckpt", "copy", os.path.join(DS_LLAMA, "ckpt")), ("output_dir/checkpoint-4", "copy", TRAINER),
                            ("Llama-3.2-1B", "link", HF_LLAMA)],
    "docs/dcp.md": [("ckpt/step-1000", "link", DCP), ("model.json", "copy", DCP_FACTS)],
    "docs/megatron.md": MCORE_ROOT + [("root/ckpt/legacy_run", "link", MCORE_LEGACY), ("Llama-3.2-1B", "link", HF_LLAMA),
                                      ("ckpt", "copy", os.path.join(DS_LLAMA, "ckpt")), ("titan/step-1000", "link", DCP),
                                      ("model.json", "copy", DCP_FACTS)],
}

SHIMS = {
    "mpirun": f"""#!/bin/bash
# docs test: the real mpirun, with --oversubscribe (more ranks than cores)
exec {MPIEXEC} --oversubscribe "$@"
""",
    "srun": """#!/bin/bash
# docs test: Slurm's srun stand-in. Its options are dropped; a ucp tool runs as one rank under mpirun,
# anything else (the training command) is printed, not run.
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
case "$(basename "$1")" in
  ucp-*) exec mpirun -np 1 "$@" ;;
  *) echo "srun (docs test): not run here, the training command: $*"; exit 0 ;;
esac
""",
    "sbatch": """#!/bin/bash
# docs test: Slurm's sbatch stand-in: runs the job script now, in an allocation of --nodes=N nodes of 8 GPUs.
nodes=1
while [ $# -gt 1 ]; do case "$1" in --nodes=*) nodes="${1#--nodes=}" ;; -N) shift; nodes="$1" ;; esac; shift; done
SLURM_JOB_NUM_NODES="$nodes" SLURM_GPUS_ON_NODE=8 exec bash "$1"
""",
}


def blocks(page):
    """(line of the first command, language, text lines, marker) for each fenced block of the page; a
    marker is the `<!-- not run: ... -->` / `<!-- file: ... -->` comment on the line before the fence."""
    lines = open(os.path.join(SOURCE, page)).read().split("\n")
    found, i = [], 0
    while i < len(lines):
        m = re.match(r"^(\s*)```(\S*)", lines[i])
        if not m:
            i += 1
            continue
        indent, lang = len(m.group(1)), m.group(2)
        before = lines[i - 1].strip() if i else ""
        marker = re.match(r"<!--\s*(not run|file):\s*(.*?)\s*-->$", before)
        end = i + 1
        while end < len(lines) and not re.match(r"^\s*```\s*$", lines[end]):
            end += 1
        found.append((i + 2, lang, [line[indent:] for line in lines[i + 1:end]], marker.groups() if marker else None))
        i = end + 1
    return found


def commands(first_line, text):
    """(line, command) for each command of a block: continuations joined, comments and blank lines left out."""
    out, pending, start = [], "", None
    for n, line in enumerate(text, first_line):
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if not pending:
            start = n
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append((start, pending + line))
        pending = ""
    return out


def expected_status(command):
    m = re.search(r"#\s*exits\s+(\d+)\b", command)
    return int(m.group(1)) if m else 0


def bind(folder, bindings, env):
    for name, how, source in COMMON + bindings:
        path = os.path.join(folder, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if how == "link":
            os.symlink(source, path)
        elif how == "text":
            open(path, "w").write(source + "\n")
        elif how == "copy" and os.path.isdir(source):
            shutil.copytree(source, path, symlinks=True)
        elif how == "copy":
            shutil.copy(source, path)
        else:  # a command that makes it
            r = subprocess.run(source, cwd=folder, env=env, capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"docs_commands: setup `{' '.join(source)}` failed: {r.stderr[-800:]}")
        print(f"  {name:28} {how:7} {source if isinstance(source, str) else ' '.join(source)}")


def main():
    started = time.monotonic()
    shutil.rmtree(WORK, ignore_errors=True)
    shims = os.path.join(WORK, "shims")
    os.makedirs(shims)
    for name, text in SHIMS.items():
        path = os.path.join(shims, name)
        open(path, "w").write(text)
        os.chmod(path, 0o755)
    env = dict(os.environ, PATH=f"{shims}:{BIN}:{os.environ['PATH']}", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    print(f"docs test: PATH starts with {shims} (mpirun, srun, sbatch stand-ins) and {BIN}")
    print("names read as: " + "; ".join(label for _, _, label in SUBSTITUTIONS))
    failures, not_run, count = [], [], 0
    for page in PAGES:
        page_blocks = blocks(page)
        problems = [f"{page}:{line - 1}: a ```{lang or ''} block that starts with a command: mark it ```sh (run) or "
                    f"<!-- not run: why -->" for line, lang, text, marker in page_blocks
                    if lang == "" and marker is None and text and COMMAND_WORDS.match(text[0])]
        failures += problems
        runnable = [b for b in page_blocks if b[1] in RUN_LANGS or (b[3] and b[3][0] == "file")]
        if not runnable:
            continue
        folder = os.path.join(WORK, re.sub(r"[^\w.-]", "_", page))
        os.makedirs(folder)
        print(f"\n== {page} (in {folder})")
        bind(folder, BINDINGS.get(page, []), env)
        for line, lang, text, marker in runnable:
            if marker and marker[0] == "file":
                open(os.path.join(folder, marker[1]), "w").write("\n".join(text) + "\n")
                print(f"  {page}:{line}: wrote {marker[1]}")
                continue
            if marker and marker[0] == "not run":
                not_run.append(f"{page}:{line - 1}: {marker[1]}")
                continue
            for at, command in commands(line, text):
                shown = command
                for pattern, replacement, _ in SUBSTITUTIONS:
                    command = pattern.sub(replacement, command)
                want = expected_status(shown)
                t0 = time.monotonic()
                try:
                    r = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=folder, env=env,
                                       capture_output=True, text=True, timeout=120)
                    status, output = r.returncode, (r.stdout + r.stderr)
                except subprocess.TimeoutExpired:
                    status, output = "timeout (120 s)", ""
                count += 1
                ok = status == want
                print(f"  {page}:{at}: {'ok  ' if ok else 'FAIL'} {time.monotonic() - t0:5.2f} s  $ {command}")
                if not ok:
                    tail = "\n".join("      " + x for x in output.strip().splitlines()[-12:])
                    failures.append(f"{page}:{at}: exit {status}, the page expects {want}: {shown}\n{tail}")
    print(f"\ndocs test: {count} commands run in {time.monotonic() - started:.1f} s")
    print(f"not run ({len(not_run)}):" + "".join("\n  " + n for n in not_run))
    if failures:
        print(f"\n{len(failures)} FAILED:" + "".join("\n  " + f for f in failures))
        sys.exit(1)
    print("docs test: every command ok")


main()
