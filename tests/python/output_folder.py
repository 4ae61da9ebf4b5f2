"""The output folder rules of ucp-convert (from a source and --from-atomic) and ucp-reshard.

A run never writes into what it reads: an output folder that is the input (the source's shard
folder, the --from-atomic folder, the atomic checkpoint) or lies inside it, also when reached through
a symbolic link, is refused with exit 1 before anything is created there.

Two runs never write one folder: each tool takes OUT/.ucp-lock first. For each tool:
  - a lock held by a live process (this test's own, on this host) makes the run exit 1 with a message
    naming the holder's pid and host; the run writes nothing and leaves the holder's lock alone;
  - a lock of another host is refused too (its process cannot be checked), and says so;
  - a stale lock (a pid that has exited; or this test's pid with another start time: a reused pid)
    is taken over: the run succeeds, says it took the lock over, and removes its own lock at the end;
  - a finished run leaves no lock.

  output_folder.py UCP_CONVERT UCP_RESHARD FIXTURE_DIR ATOMIC_DIR WORK_DIR
"""
import json
import os
import shutil
import socket
import subprocess
import sys

convert, reshard, fixture, atomic, work = sys.argv[1:6]
problems = []


def start_ticks(pid):
    stat = open(f"/proc/{pid}/stat").read()
    return stat[stat.rindex(")") + 2:].split()[22 - 3]


def dead_pid():
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def lock(out, pid, host=None, ticks=None):
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    open(os.path.join(out, ".ucp-lock.tmp-1"), "w").close()  # left by a run killed while taking a lock
    holder = {"tool": "ucp-test", "host": host or socket.gethostname(), "pid": pid,
              "start_ticks": ticks if ticks is not None else start_ticks(pid), "started": "2026-01-01T00:00:00Z"}
    text = json.dumps(holder) + "\n"
    with open(os.path.join(out, ".ucp-lock"), "w") as f:
        f.write(text)
    return text


# Inside the input, directly or through a symbolic link.
tag = os.path.join(fixture, open(os.path.join(fixture, "latest")).read().strip())
os.makedirs(work, exist_ok=True)
inputs = {"convert": (tag, lambda out: [convert, fixture, "-o", out]),
          "convert --from-atomic": (atomic, lambda out: [convert, "--from-atomic", atomic, "--format", "pt", "-o", out]),
          "reshard": (atomic, lambda out: [reshard, atomic, "-o", out, "--dp", "1", "--tp", "1", "--pp", "1", "--zero-stage", "1"])}
for name, (src, cmd) in inputs.items():
    link = os.path.join(work, "link-" + name.replace(" ", "_").replace("-", ""))
    if os.path.lexists(link):
        os.remove(link)
    os.symlink(os.path.abspath(src), link)
    before = sorted(os.listdir(src))
    for out, how in ((src, "the input itself"), (os.path.join(src, "out"), "inside the input"),
                     (link, "a link to the input"), (os.path.join(link, "out"), "inside it through a link")):
        p = subprocess.run(cmd(out), capture_output=True, text=True, timeout=600)
        if p.returncode != 1 or "the output folder is" not in p.stderr:
            problems.append(f"{name}: -o {how}: exit {p.returncode}, {p.stderr.strip()[-300:]}")
        if "link" in how and "symbolic link" not in p.stderr:
            problems.append(f"{name}: -o {how}: the message does not say a link led there")
    if sorted(os.listdir(src)) != before:
        problems.append(f"{name}: a refused run changed the input folder: {sorted(set(os.listdir(src)) ^ set(before))}")
    print(f"{name}, output in the input: {'ok' if not any(x.startswith(name + ':') for x in problems) else 'FAIL'}")

tools = {name: cmd for name, (_, cmd) in inputs.items()}
for name, cmd in tools.items():
    out = os.path.join(work, name.replace(" ", "_").replace("-", ""))
    # A live holder: refused, nothing written, the holder's lock intact.
    for host, why in ((None, "a live process of this host"), ("elsewhere.invalid", "another host")):
        text = lock(out, os.getpid(), host)
        p = subprocess.run(cmd(out), capture_output=True, text=True, timeout=600)
        if p.returncode != 1:
            problems.append(f"{name}: exit {p.returncode} with the lock of {why} (want 1)")
        if f"pid {os.getpid()}" not in p.stderr or (host or socket.gethostname()) not in p.stderr:
            problems.append(f"{name}: the refusal does not name the holder ({why}): {p.stderr.strip()[-300:]}")
        if host and "another host" not in p.stderr:
            problems.append(f"{name}: the refusal does not say the holder is on another host")
        if sorted(os.listdir(out)) != [".ucp-lock", ".ucp-lock.tmp-1"] or open(os.path.join(out, ".ucp-lock")).read() != text:
            problems.append(f"{name}: the refused run touched the folder: {sorted(os.listdir(out))}")
    # Stale: an exited pid, and a reused one (this process, another start time).
    for pid, ticks, why in ((dead_pid(), "1", "an exited process"), (os.getpid(), "1", "a reused pid")):
        lock(out, pid, ticks=ticks)
        p = subprocess.run(cmd(out), capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            problems.append(f"{name}: exit {p.returncode} with the stale lock of {why}: {p.stderr.strip()[-300:]}")
        elif "took over the lock" not in p.stderr:
            problems.append(f"{name}: no note that the stale lock of {why} was taken over")
        if any(f.startswith(".ucp-lock") for f in os.listdir(out)):
            problems.append(f"{name}: a finished run left a lock or a killed run's leftover: {sorted(os.listdir(out))}")
    print(f"{name}: {'ok' if not any(x.startswith(name + ':') for x in problems) else 'FAIL'}")

for p in problems:
    print("FAIL:", p)
sys.exit(1 if problems else 0)
