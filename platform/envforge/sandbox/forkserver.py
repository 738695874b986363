"""A fork server for Python commands: an interpreter that has already imported what each run imports
first, forking one child per run.

A grading's test command is `python3 -P pytest_launcher.py ...`, and importing pytest is 0.2-0.3 s of
CPU in every one of them (a task's gate grades ~30 copies). The agent starts this server once per
interpreter and start-up environment (`forkserver_key`), it imports the preload list once, and every
run after that is a fork: the child drops to the sandbox user, takes the command's pipes, working
directory, environment and argv, and runs the script as `__main__`, as the interpreter would have.

Why it runs as root, like the agent: a server owned by the sandbox user could be signalled,
`prlimit`ed or traced by the very commands it serves, so one run could change the next, and a reset
would have to kill it. As root it is out of their reach and outlives resets. It imports only from
places no sandbox process can write: the root filesystem is read-only, and every writable mount is
taken off `sys.path` while it imports (the agent also refuses an interpreter that lies in one).

What a forked run shares with the other forks of its server, and a fresh interpreter would not: the
string hash seed (fixed when an interpreter starts; `random` is reseeded in every child by the
standard library itself) and the memory layout (an object's address, which some test ids hold). Runs
whose point is to see what varies between runs (the gate's repeated gradings, the derivation's suite
runs) therefore start fresh interpreters; see `verify.selection.TestRun.fresh_interpreter`.

Protocol, on a SOCK_SEQPACKET socket that is the server's fd 0: the server first answers
{"ready": true} (or {"ready": false, "error": ...}); then per request, a JSON message with the
command's fds attached (stdin, stdout, stderr and optionally the report pipe, which becomes fd 3),
answered by {"pid": N} (or {"error": ..., "errno": N} when it cannot fork) and, once the child has
ended, {"exit": code} (negative: the signal that killed it).

This file is sent to the container as source (see agent.py) and must stay stdlib-only and compatible
with the base image's Python (3.11). Its own imports are what a child finds already imported beyond
the preload list: kept to modules pytest's start-up imports anyway.
"""

import json
import os
import socket
import sys

UID = GID = 1000
# The mounts a sandbox command can write to (agent.WRITABLE): nothing the server imports may come from them.
WRITABLE = ("/workspace", "/tmp", "/run/envforge", "/dev/shm")
MAX_MESSAGE = 1 << 20
MAX_FDS = 4


def writable(path):
    """Whether a path lies in a mount the sandbox user can write (symbolic links followed)."""
    real = os.path.realpath(path or ".")
    return any(real == w or real.startswith(w + "/") for w in WRITABLE)


def preload(modules):
    """Import the modules with every writable place off sys.path, then put sys.path back as it was."""
    os.chdir("/")
    saved = list(sys.path)
    sys.path[:] = [p for p in saved if isinstance(p, str) and p and not writable(p)]
    try:
        for name in modules:
            __import__(name)
    finally:
        sys.path[:] = saved


def _set_dumpable():
    """Make the child dumpable again, as an exec'd interpreter of the sandbox user is.

    Changing uid from root clears the flag, which would make the child's /proc entries root-owned
    and differ from a normal run; it holds nothing of the server's once its fds are closed."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE
    except Exception:  # noqa: BLE001 - best effort: the run itself is unaffected
        pass


def become_command(request, fds):
    """In the forked child, as root: become the command's process, then run its script (never returns)."""
    os.setsid()
    try:
        with open("/proc/self/oom_score_adj", "w") as fh:
            fh.write("1000")  # the OOM killer's first choice, as every command is (agent._oom_first)
    except OSError:
        pass
    for target, fd in enumerate(fds):
        if fd >= 0:
            os.dup2(fd, target)  # stdin, stdout, stderr, report
    for fd in [int(f) for f in os.listdir("/proc/self/fd")]:
        if fd >= len(fds) or fds[fd] < 0:
            try:
                os.close(fd)
            except OSError:
                pass
    os.setgroups([])
    os.setgid(GID)
    os.setuid(UID)
    _set_dumpable()
    cwd = request["cwd"]
    try:
        os.chdir(cwd)
    except OSError as exc:
        os.write(2, f"bash: line 1: cd: {cwd}: {exc.strerror}\n".encode())
        os._exit(1)
    os.environ.clear()
    os.environ.update(request["env"])
    import time

    time.tzset()  # TZ may differ from the server's
    sys.argv[:] = [request["script"], *request["args"]]
    import runpy

    runpy.run_path(request["script"], run_name="__main__")
    sys.exit(0)


def serve(sock):
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, MAX_FDS)
        except OSError:
            return
        if not data:
            return  # the agent is gone
        try:
            request = json.loads(data)
            pid = os.fork()
        except (OSError, ValueError) as exc:
            for fd in fds:
                os.close(fd)
            sock.send(json.dumps({"error": str(exc), "errno": getattr(exc, "errno", None)}).encode())
            continue
        if pid == 0:
            sock.detach()  # its fd is closed with the others; the socket object must not close it again
            become_command(request, list(fds) + [-1] * (MAX_FDS - len(fds)))
        for fd in fds:
            os.close(fd)
        sock.send(json.dumps({"pid": pid}).encode())
        _, status = os.waitpid(pid, 0)
        sock.send(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode())


def main():
    sock = socket.socket(fileno=0)
    try:
        # Under memory pressure the OOM killer takes commands (1000) first, then this server, and the
        # agent (0) last: a lost server costs only a fall-back to the shell.
        with open("/proc/self/oom_score_adj", "w") as fh:
            fh.write("500")
    except OSError:
        pass
    try:
        preload(json.loads(sys.argv[1]))
    except BaseException as exc:  # noqa: BLE001 - said to the agent, which then runs commands without us
        sock.send(json.dumps({"ready": False, "error": f"{type(exc).__name__}: {exc}"[:500]}).encode())
        return
    sock.send(json.dumps({"ready": True}).encode())
    serve(sock)


if __name__ == "__main__":
    main()
