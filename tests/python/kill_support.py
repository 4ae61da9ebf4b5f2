"""What the kill tests (kill_anywhere.py, in_place.py) share: the environment of an uninterrupted run,
the fault points a reference run logged (lib/core/fault_point.h), the choice of points to kill at,
and a SIGKILL from outside at a random time."""
import os
import signal
import subprocess
import time


def clean_env():
    """The environment without any kill or fault-log setting, the manifest's time fixed (same input,
    same bytes)."""
    env = dict(os.environ, SOURCE_DATE_EPOCH="1700000000")
    for k in ("UCP_TEST_KILL_AT", "UCP_TEST_KILL_RANK", "UCP_TEST_FAULT_LOG"):
        env.pop(k, None)
    return env


def read_points(log):
    """The fault points a run logged (UCP_TEST_FAULT_LOG), in the order passed: (rank, name, n, path)."""
    points = []
    with open(log) as f:
        for line in f:
            parts = line.rstrip("\n").split(" ", 3)
            points.append((parts[0], parts[1], int(parts[2]), parts[3] if len(parts) > 3 else ""))
    return points


def spread(points, count, rng):
    """`count` points spread over the run: one at random in each of `count` equal stretches."""
    step = len(points) / count
    return [points[min(len(points) - 1, int(k * step + rng.random() * step))] for k in range(count)]


def special(points, names):
    """Every point at a file of one of these base names (markers, the lock), and every sync."""
    return [pt for pt in points if os.path.basename(pt[3].split(":")[0]) in names or pt[1] == "sync"]


def kill_after(command, env, seconds):
    """Runs `command` in a session of its own and SIGKILLs the whole session after `seconds` (when it
    has not ended already); returns once every process of it has gone."""
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                            start_new_session=True)
    time.sleep(seconds)
    kill_session(proc.pid)
    proc.wait()
    while session_members(proc.pid):  # Open MPI puts each rank in a process group of its own
        kill_session(proc.pid)
        time.sleep(0.05)


def session_members(sid):
    """The processes of session `sid` (a batch system's job), mpiexec's ranks in their own process groups included."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
                if state != "Z" and os.getsid(int(entry)) == sid:  # a zombie holds no file open
                    members.append(int(entry))
            except (OSError, IndexError):
                pass
    return members


def kill_session(sid):
    """SIGKILL to every process of session `sid`, as a batch system ends a job."""
    for pid in session_members(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
