"""Runs a test script as `python3 SCRIPT ARGS...` would, in a process forked from one that has already
imported torch: the test suite starts some 400 Python processes that import torch, at about 1.5 s of CPU
each (a third of the suite's CPU on this machine), and a fork costs milliseconds. The torch is the same
real torch; each script still runs in a process of its own, with its own arguments, working folder,
environment, standard streams and exit status.

    torch_zygote.py SCRIPT [ARGS...]    run SCRIPT (starting the server if none runs)
    torch_zygote.py --stop              stop this checkout's server, if one runs
    from torch_zygote import python_command; subprocess.run(python_command(SCRIPT, *ARGS))   a script's own run

The server (one a checkout and Python, at a socket in /tmp named after both) imports torch and numpy,
then for each run forks a process that forks the script's: the script's process leads a session of its
own, and is killed with it when the client goes (ctest's timeout killing the client). The server ends
after IDLE_SECONDS without a run, or with --stop. Anything that keeps the server from serving a run
(none can be started, a refused connection) makes the client run the script itself: slower, never
different. One thing differs in the forked process: a child it forks (subprocess without vfork) starts with
its RSS, which the kernel keeps in the child's peak RSS across exec; a test that bounds a tool's peak RSS
runs unforked (tests/CMakeLists.txt: ucp_python_step_unforked).
"""
import array
import fcntl
import hashlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time

IDLE_SECONDS = 120
HERE = os.path.dirname(os.path.abspath(__file__))
KEY = hashlib.sha1(f"{HERE}\0{sys.executable}\0{os.getuid()}".encode()).hexdigest()[:16]
SOCKET = f"/tmp/ucp-torch-zygote-{KEY}.sock"
LOCK = f"/tmp/ucp-torch-zygote-{KEY}.lock"


def send_message(conn, payload, fds=()):
    data = json.dumps(payload).encode()
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    conn.sendmsg([struct.pack("<I", len(data)), data], ancillary)


def receive_message(conn):
    fds = array.array("i")
    head, ancillary, _, _ = conn.recvmsg(4, socket.CMSG_SPACE(3 * fds.itemsize))
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    if len(head) != 4:
        raise ConnectionError("no message")
    size = struct.unpack("<I", head)[0]
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("a message cut short")
        data += chunk
    return json.loads(data), list(fds)


def python_command(script, *args):
    """The command that runs `python3 SCRIPT ARGS...` through this server (a test script's own run of another)."""
    return [sys.executable, os.path.abspath(__file__), script, *args]


# ---- the server


def run_script(request, fds):
    """In the forked process: becomes `python3 SCRIPT ARGS...` and never returns."""
    code = 1
    try:
        os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        script = request["argv"][0]
        sys.argv = list(request["argv"])
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        import runpy
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as e:
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except BaseException:  # as the interpreter reports an uncaught exception
            import traceback
            traceback.print_exc()
            code = 1
        import atexit
        import threading
        threading._shutdown()  # as the interpreter ends: its threads joined, then its exit functions
        atexit._run_exitfuncs()
        if request["env"].get("UCP_ZYGOTE_CPU_LOG"):  # where a run's CPU goes: the script's own, its children's
            import resource
            me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
            with open(request["env"]["UCP_ZYGOTE_CPU_LOG"], "a") as log:
                log.write(json.dumps({"argv": request["argv"], "self": me.ru_utime + me.ru_stime,
                                      "children": kids.ru_utime + kids.ru_stime}) + "\n")
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code & 0xFF)


def serve_one(conn, listener):
    """In a process forked per run: forks the script's, reports its exit status, kills its session if
    the client goes first."""
    listener.close()
    request, fds = receive_message(conn)
    pid = os.fork()
    if pid == 0:
        conn.close()
        run_script(request, fds)
    for fd in fds:
        os.close(fd)
    status = None
    while status is None:
        done, raw = os.waitpid(pid, os.WNOHANG)
        if done:
            status = os.waitstatus_to_exitcode(raw)
            break
        readable, _, _ = select.select([conn], [], [], 0.05)
        if readable and not conn.recv(1):  # the client is gone: so is the run
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
            os._exit(0)
    try:
        send_message(conn, {"status": status})
    except OSError:
        pass
    os._exit(0)


def serve():
    import numpy  # noqa: F401 (imported once, for every run)
    import torch  # noqa: F401
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        os.unlink(SOCKET)
    except FileNotFoundError:
        pass
    listener.bind(SOCKET)
    listener.listen(64)
    children = set()
    last = time.monotonic()
    while True:
        for pid in list(children):
            if os.waitpid(pid, os.WNOHANG)[0]:
                children.discard(pid)
        if children:
            last = time.monotonic()
        elif time.monotonic() - last > IDLE_SECONDS:
            break
        readable, _, _ = select.select([listener], [], [], 1.0)
        if not readable:
            continue
        conn, _ = listener.accept()
        last = time.monotonic()
        try:
            conn.settimeout(10)
            head = conn.recv(4, socket.MSG_PEEK)
            if head == b"STOP":
                conn.close()
                break
            conn.settimeout(None)
        except OSError:
            conn.close()
            continue
        pid = os.fork()
        if pid == 0:
            try:
                serve_one(conn, listener)
            finally:
                os._exit(1)
        conn.close()
        children.add(pid)
    try:
        if os.stat(SOCKET).st_ino == os.fstat(listener.fileno()).st_ino:
            os.unlink(SOCKET)
    except OSError:
        pass
    listener.close()


# ---- the client


def connect():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(SOCKET)
        return s
    except OSError:
        s.close()
        return None


def start_server():
    """A server for this checkout, started under a lock (one, however many clients start at once)."""
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        conn = connect()
        if conn:
            return conn
        subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve"], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            conn = connect()
            if conn:
                return conn
            time.sleep(0.05)
    return None


def run_here(argv):
    os.execv(sys.executable, [sys.executable] + argv)


def main():
    argv = sys.argv[1:]
    if argv == ["--serve"]:
        serve()
        return
    if argv == ["--stop"]:
        conn = connect()
        if conn:
            conn.sendall(b"STOP")
            conn.close()
        return
    if not argv:
        sys.exit("usage: torch_zygote.py SCRIPT [ARGS...] | --stop")
    if argv[0].startswith("-"):  # python3 -c CODE, -m MODULE: as they are
        run_here(argv)
    conn = connect() or start_server()
    if conn is None:
        run_here(argv)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        send_message(conn, {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}, [0, 1, 2])
    except OSError:
        run_here(argv)  # no run was started (a server going as it came): the script runs here
    try:
        reply, _ = receive_message(conn)
    except (OSError, ConnectionError, ValueError) as e:
        sys.exit(f"torch_zygote.py: the process running {argv[0]} went away without its exit status ({e})")
    status = reply["status"]
    if status < 0:  # killed by a signal: so is this process, as the script's own would be
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    sys.exit(status)


if __name__ == "__main__":
    main()
