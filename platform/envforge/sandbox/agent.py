"""The in-sandbox agent: a small stdlib-only program that runs commands for the host.

It is started as the container's main process (see `container.py`), reads one JSON request
per line on stdin and writes one JSON response per line on stdout, both carried by the
container's attach socket. A round trip costs about a millisecond, against ~50 ms for a
`docker exec`.

Trust boundary: the agent runs as root *inside* the container with only CAP_SETUID,
CAP_SETGID and CAP_KILL; every command runs as the unprivileged sandbox user (uid 1000),
which loses all capabilities on the uid switch and cannot signal, trace or write to the
agent. A policy's code therefore cannot forge the agent's responses.

This file is sent to the container as `python3 -c <source>`, so it must stay stdlib-only and
compatible with the base image's Python (3.11).
"""

import base64
import errno
import json
import os
import select
import selectors
import signal
import socket
import stat as _stat
import sys
import time

UID = GID = 1000
WORKSPACE = "/workspace"
TEMPLATE = "/opt/envforge/task/workspace"
SNAPSHOTS = "/run/envforge-agent"
OOM_FILES = ("/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events")
CHILD_ENV = {"HOME": "/tmp", "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


_oom_seen = [0]  # the cgroup's OOM-kill count when last looked at


def oom_killed_since_last_look():
    """Whether the memory cgroup OOM-killed something since the previous look.

    Reading the counter costs ~0.3 ms, so it is read only when a command died of SIGKILL
    (and at reset); a background OOM kill between looks is attributed to the next
    SIGKILL'd command, a rare misattribution we accept for the speed.
    """
    now = oom_kills()
    seen, _oom_seen[0] = _oom_seen[0], now
    return now > seen


def oom_kills():
    for path in OOM_FILES:
        try:
            with open(path) as fh:
                for line in fh:
                    if line.startswith("oom_kill "):
                        return int(line.split()[1])
        except OSError:
            continue
    return 0


BIN_DIR = "/run/envforge-bin"  # root-owned tmpfs (exec): the execute-only shell and command scripts
XBASH = BIN_DIR + "/bash"
# The waiting shell's whole program: wait for "go", then run the command script.
# The script is read into the shell and eval'd, not sourced: bash names a sourced file in every error
# ("/run/envforge-bin/cmd-7-102.sh: line 7: x: command not found"), and that name counts the sandbox's
# earlier commands, so the same command's observation differed with the sandbox's history (a rollout's
# next prompt, and everything after it, depended on which warm sandbox it got). Eval'd, it is "bash: x: ...".
_RUN = 'IFS= read -r -d "" __s < "$__f"; unset __f; eval "unset __s\n$__s"'
_BOOT = "read -r -u 3 _go || exit 0; exec 3<&-; __f=$ENVFORGE_CMD; unset _go ENVFORGE_CMD; " + _RUN
# For a command that gets a report channel on fd 3: no waiting, the script already exists.
_BOOT_NOW = "__f=$ENVFORGE_CMD; unset ENVFORGE_CMD; " + _RUN


def _oom_first():
    """Make this process the OOM killer's first choice (oom_score_adj 1000).

    Every command starts there, so a memory hog of the sandbox user dies before the agent (at
    0, with far less memory than any hog). Raising needs no privilege. Lowering it again needs
    nothing either down to the inherited floor (0): a command that lowers itself and then
    makes the agent the biggest process can still get the agent killed, and the host then
    scores that as the command's OOM (`Sandbox.exec`), a model outcome like any other OOM.
    """
    try:
        with open("/proc/self/oom_score_adj", "w") as fh:
            fh.write("1000")
    except OSError:
        pass


def install_execute_only_shell():
    """Copy bash to an execute-only file (mode 0111, root-owned).

    A process exec'd from a file its user cannot read is marked non-dumpable by the kernel,
    so other processes of the sandbox user cannot ptrace it or open its /proc fds. That is
    what makes a shell started *before* its command safe to keep waiting.
    """
    os.makedirs(BIN_DIR, exist_ok=True)
    os.chmod(BIN_DIR, 0o755)
    with open("/bin/bash", "rb") as src, open(XBASH + ".tmp", "wb") as dst:
        dst.write(src.read())
    os.chmod(XBASH + ".tmp", 0o111)
    os.rename(XBASH + ".tmp", XBASH)


def _script(cmd, cwd, env):
    lines = [f"cd -- {_quote(cwd)} || exit 1"]
    lines += [f"export {k}={_quote(v)}" for k, v in env.items() if k.isidentifier()]
    return "\n".join(lines) + "\n" + cmd + "\n"


def _quote(value):
    return "'" + str(value).replace("'", "'\\''") + "'"


class Spawner:
    """Starts commands as the sandbox user from a shell that is already running and waiting.

    fork + setuid + exec of bash costs about 3 ms here, so it happens between commands: a
    de-privileged, non-dumpable bash waits on a pipe, and a command only costs writing its
    script and one "go". The sandbox user's processes can kill the waiting shell (then the
    next one is started on demand) but cannot trace it, read its pipes or forge its input.
    """

    RESERVE = 2  # shells kept waiting: back-to-back commands find one that finished starting

    def __init__(self):
        self.ready = []  # [(pid, token, ctl_w, in_w, out_r, err_r)], oldest first
        self.counter = 0

    def prepare(self):
        while len(self.ready) < self.RESERVE:
            self.ready.append(self._fork())

    def discard(self):
        while self.ready:
            pid, _token, *fds = self.ready.pop()
            for fd in fds:
                os.close(fd)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass

    def _token(self):
        self.counter += 1
        return f"{os.getpid()}-{self.counter}"

    def _fork(self, report_w=None, token=None):
        """Start a de-privileged shell. With report_w, it runs its script at once with report_w
        as fd 3; otherwise it waits on a control pipe (fd 3) for "go"."""
        token = token or self._token()
        ctl_r, ctl_w = os.pipe() if report_w is None else (report_w, -1)
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: drop privileges, become the waiting shell
            try:
                _oom_first()
                os.setsid()
                os.setgroups([])
                os.setgid(GID)
                os.setuid(UID)
                os.dup2(in_r, 0)
                os.dup2(out_w, 1)
                os.dup2(err_w, 2)
                os.dup2(ctl_r, 3)
                for fd in (0, 1, 2, 3):  # dup2 onto itself keeps O_CLOEXEC
                    os.set_inheritable(fd, True)
                for fd in [int(f) for f in os.listdir("/proc/self/fd")]:  # close_range may be blocked by
                    if fd > 3:  # seccomp; 64k close() calls
                        try:  # would cost milliseconds
                            os.close(fd)
                        except OSError:
                            pass
                os.chdir("/")
                env = dict(CHILD_ENV, ENVFORGE_CMD=f"{BIN_DIR}/cmd-{token}.sh")
                os.execve(XBASH, ["bash", "-c", _BOOT if report_w is None else _BOOT_NOW], env)
            except BaseException as exc:  # noqa: BLE001 - report and leave, never return into the agent
                try:
                    os.write(2, f"envforge-agent: cannot start shell: {exc}\n".encode())
                finally:
                    os._exit(126)
        for fd in (ctl_r, in_r, out_w, err_w):
            os.close(fd)
        return pid, token, ctl_w, in_w, out_r, err_r

    def spawn_with_report(self, cmd, cwd, env, report_w):
        """Start cmd in a fresh shell whose fd 3 is report_w (costs a fork; used for grading)."""
        token = self._token()
        script = f"{BIN_DIR}/cmd-{token}.sh"
        with open(script, "w") as fh:
            fh.write(_script(cmd, cwd, env))
        os.chmod(script, 0o644)
        pid, _token, _ctl, in_w, out_r, err_r = self._fork(report_w=report_w, token=token)
        return pid, in_w, out_r, err_r, script

    def spawn(self, cmd, cwd, env):
        """Start cmd; returns (pid, stdin_w, stdout_r, stderr_r, script_path)."""
        body = _script(cmd, cwd, env)
        for _ in range(2):
            if not self.ready:
                self.ready.append(self._fork())
            pid, token, ctl_w, in_w, out_r, err_r = self.ready.pop(0)
            script = f"{BIN_DIR}/cmd-{token}.sh"
            with open(script, "w") as fh:
                fh.write(body)
            os.chmod(script, 0o644)
            try:
                os.write(ctl_w, b"go\n")
                os.close(ctl_w)
                return pid, in_w, out_r, err_r, script
            except OSError:  # the waiting shell was killed: reap it and start a fresh one
                for fd in (ctl_w, in_w, out_r, err_r):
                    try:
                        os.close(fd)
                    except OSError:
                        pass
                os.unlink(script)
                try:
                    os.waitpid(pid, 0)
                except ChildProcessError:
                    pass
        raise RuntimeError("could not start a command process")


SPAWNER = Spawner()


# The fork server's source (forkserver.py), set ahead of this file by the host (container.AGENT_SOURCE).
FORKSERVER_SOURCE = globals().get("FORKSERVER_SOURCE")
# Variables that reach a process's dynamic loader or C library before Python runs: a run with any of
# them starts its own interpreter, since a fork server (root) must not start with them and a fork
# would not see them take effect.
_LOADER_VARS = ("GCONV_PATH", "LOCPATH", "NLSPATH", "PYTHONHOME", "PYTHONPLATLIBDIR", "PYTHONEXECUTABLE")
FORKSERVER_START_S = 60.0


def _startup_var(name):
    """Whether the interpreter reads the variable when it starts (so forks of one server share it)."""
    return name.startswith(("PYTHON", "LC_")) or name in ("LANG", "LANGUAGE", "PATH", "HOME")


def resolve_interpreter(name, path):
    """The file the shell would run for `name` under PATH, or None when a fork server cannot stand in
    for it: the file, or a PATH entry searched before it, lies where the sandbox user can write
    (something could be planted there later), or the entry is relative."""
    if "/" in name:
        return None
    for entry in path.split(":"):
        if not entry.startswith("/") or _writable_place(entry):
            return None
        candidate = os.path.join(entry, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return None if _writable_place(candidate) else candidate
    return None


def _writable_place(path):
    real = os.path.realpath(path)
    return any(real == w or real.startswith(w + "/") for w in WRITABLE.split())


class ForkServers:
    """Fork servers (forkserver.py) by interpreter and start-up environment, started on first use.

    A run it cannot serve (see `key`) or a server that fails in any way falls back to the shell; a
    broken server is killed and started again on a later run, unless it failed to import its preload
    list (that would fail again: `unstartable`)."""

    MAX = 2

    def __init__(self):
        self.servers = {}  # key -> (pid, socket), least recently used first
        self.unstartable = set()  # keys whose server could not import its preload list: not tried again

    def key(self, python, env):
        if FORKSERVER_SOURCE is None or env.get("PYTHONNOUSERSITE") != "1":
            return None  # a user site-packages directory is looked up in /tmp at start-up
        if any(k.startswith("LD_") or k in _LOADER_VARS or k == "PYTHONPYCACHEPREFIX" for k in env):
            return None
        interpreter = resolve_interpreter(python["interpreter"], env.get("PATH", ""))
        if interpreter is None:
            return None
        startup = tuple(sorted((k, v) for k, v in env.items() if _startup_var(k)))
        return json.dumps([interpreter, python["interpreter"], python["flags"], python["preload"], startup])

    def spawn(self, python, cwd, env, report_w):
        """Start the run in a fork; (pid, stdin_w, stdout_r, stderr_r, server socket) or None."""
        key = self.key(python, env)
        if key is None:
            return None
        if key in self.unstartable:
            return None
        server = self.servers.pop(key, None) or self._start(key)
        if server is None:
            return None
        pid, sock = server
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        theirs = [in_r, out_w, err_w] + ([report_w] if report_w is not None else [])
        # What the waiting shell adds to the environment of the command it runs (it starts in / and cds).
        env = dict(env, PWD=cwd, OLDPWD="/", SHLVL="1", _=json.loads(key)[0])
        request = {"script": python["script"], "args": python["args"], "cwd": cwd, "env": env}
        try:
            socket.send_fds(sock, [json.dumps(request).encode()], theirs)
            sock.settimeout(FORKSERVER_START_S)
            reply = json.loads(sock.recv(65536) or b"{}")
            sock.settimeout(None)
        except (OSError, ValueError):
            reply = {}
        for fd in (in_r, out_w, err_w):
            os.close(fd)
        if "pid" not in reply:
            for fd in (in_w, out_r, err_r):
                os.close(fd)
            self._stop(pid, sock)  # a server that cannot fork (pids, memory) is started afresh next time
            return None
        if report_w is not None:
            os.close(report_w)
        self.servers[key] = (pid, sock)
        while len(self.servers) > self.MAX:
            self._stop(*self.servers.pop(next(iter(self.servers))))
        return reply["pid"], in_w, out_r, err_r, sock

    def _start(self, key):
        interpreter, argv0, flags, preload, startup = json.loads(key)
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            pid = os.fork()
        except OSError:
            a.close()
            b.close()
            return None
        if pid == 0:  # the server: root, like the agent; fd 0 the socket, 1 and 2 /dev/null
            try:
                null = os.open("/dev/null", os.O_RDWR)
                os.dup2(b.fileno(), 0)
                os.dup2(null, 1)
                os.dup2(null, 2)
                for fd in (0, 1, 2):
                    os.set_inheritable(fd, True)
                for fd in [int(f) for f in os.listdir("/proc/self/fd")]:
                    if fd > 2:
                        try:
                            os.close(fd)
                        except OSError:
                            pass
                os.chdir("/")
                os.execve(interpreter, [argv0, *flags, "-c", FORKSERVER_SOURCE, json.dumps(preload)], dict(startup))
            finally:
                os._exit(127)
        b.close()
        try:
            a.settimeout(FORKSERVER_START_S)
            ready = json.loads(a.recv(65536) or b"{}").get("ready")
            a.settimeout(None)
        except (OSError, ValueError):
            ready = None  # it died or hung (memory, pids): it may start another time
        if ready is False:
            self.unstartable.add(key)
        if not ready:
            self._stop(pid, a)
            return None
        return pid, a

    def _stop(self, pid, sock):
        sock.close()
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass

    def forget(self, sock):
        """Drop a server whose socket closed under a run (it died): the next run starts another."""
        for key, (pid, server) in list(self.servers.items()):
            if server is sock:
                del self.servers[key]
                self._stop(pid, server)


FORK_SERVERS = ForkServers()


def _forked_exit(sock, pid, block):
    """The exit code the fork server reports for its child `pid` (None: not yet).

    A server that died under the run (the memory cgroup's OOM killer) cannot say: its child's group
    is killed and the run ends as killed (137)."""
    try:
        sock.setblocking(block)
        data = sock.recv(65536)
    except BlockingIOError:
        return None
    except OSError:
        data = b""
    finally:
        sock.setblocking(True)
    try:
        return json.loads(data)["exit"]
    except (ValueError, KeyError):
        _kill_group(pid)
        FORK_SERVERS.forget(sock)
        return -signal.SIGKILL


def _kill_group(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        try:  # not yet its own group leader
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


REPORT_CAP = 64 << 20
SNAPSHOT_CAP = 256 << 20


def run_command(
    cmd, timeout, env=None, cwd=WORKSPACE, stdin=b"", cap=1 << 20, on_chunk=None, report=False, python=None
):
    """Run cmd as the sandbox user in its own session; kill the whole group at the timeout.

    With report=True the command gets a write-only pipe on fd 3 whose other end only the
    agent holds (`pytest --junitxml=/dev/fd/3`): a report no file in the sandbox can replace.
    With `python` ({interpreter, flags, script, args, preload}: what cmd runs, said as data) the
    run may be a fork of a server that has imported `preload` already (forkserver.py).
    """
    started = time.monotonic()
    rep_r = rep_w = server = script = None
    full_env = dict(CHILD_ENV, **(env or {}))
    try:
        if report:
            rep_r, rep_w = os.pipe()
            # Reopening /dev/fd/3 checks the pipe inode's mode, and the agent (root) owns it.
            os.fchmod(rep_w, 0o622)
        forked = FORK_SERVERS.spawn(python, cwd, full_env, rep_w) if python else None
        if forked is not None:
            pid, in_w, out_r, err_r, server = forked
        elif report:
            pid, in_w, out_r, err_r, script = SPAWNER.spawn_with_report(cmd, cwd, full_env, rep_w)
        else:
            pid, in_w, out_r, err_r, script = SPAWNER.spawn(cmd, cwd, full_env)
    except OSError as exc:
        # fork() -> EAGAIN: the sandbox's own processes fill its pids limit; ENOMEM: they fill its
        # memory. Either is the command's outcome (as it would be for a shell), not an
        # infrastructure fault.
        if exc.errno not in (errno.EAGAIN, errno.ENOMEM):
            raise
        what = "process limit" if exc.errno == errno.EAGAIN else "memory"
        msg = f"envforge: cannot start the command: the sandbox's {what} is exhausted\n".encode()
        return {
            "exit_code": 126,
            "stdout": "",
            "stderr": base64.b64encode(msg).decode(),
            "stdout_truncated": False,
            "stderr_truncated": False,
            "oom_seen": _oom_seen[0],
            "duration": time.monotonic() - started,
            "timed_out": False,
            "oom_killed": False,
        }
    bufs = {"stdout": bytearray(), "stderr": bytearray(), "report": bytearray()}
    trunc = {"stdout": False, "stderr": False, "report": False}
    caps = {"stdout": cap, "stderr": cap, "report": REPORT_CAP}
    sel = selectors.DefaultSelector()
    sel.register(out_r, selectors.EVENT_READ, "stdout")
    sel.register(err_r, selectors.EVENT_READ, "stderr")
    if rep_r is not None:
        sel.register(rep_r, selectors.EVENT_READ, "report")
    pending = memoryview(stdin or b"")
    if pending:
        os.set_blocking(in_w, False)
        sel.register(in_w, selectors.EVENT_WRITE, "stdin")
    else:
        os.close(in_w)
    deadline = started + timeout
    timed_out = False
    status = None
    # A pidfd becomes readable when the shell exits, even while background jobs hold its pipes; a fork
    # server's socket, when it has reaped its child.
    pidfd = None
    if server is not None:
        sel.register(server, selectors.EVENT_READ, "exit")
    else:
        try:
            pidfd = os.pidfd_open(pid)
            sel.register(pidfd, selectors.EVENT_READ, "exit")
        except (AttributeError, OSError):
            pass
    watching_exit = server is not None or pidfd is not None

    def take(name, data):
        room = caps[name] - len(bufs[name])
        if room > 0:
            bufs[name] += data[:room]
        if len(data) > max(room, 0):
            trunc[name] = True
        if on_chunk is not None and data and name != "report" and room > 0:
            on_chunk(name, data[:room])  # streaming stops at the cap, like the buffer

    def reap(block):
        nonlocal status
        if status is None and server is not None:
            status = _forked_exit(server, pid, block)
        elif status is None:
            done, st = os.waitpid(pid, 0 if block else os.WNOHANG)
            if done:
                status = os.waitstatus_to_exitcode(st)
        return status

    while True:
        now = time.monotonic()
        if now >= deadline:
            timed_out = True
            break
        if reap(False) is not None:
            break
        keys = [k for k in sel.get_map().values() if k.data != "stdin"]
        if not watching_exit and not any(k.data in ("stdout", "stderr", "report") for k in keys):
            time.sleep(min(0.002, deadline - now))
            continue
        wait = deadline - now if watching_exit else min(0.01, deadline - now)
        for key, _ in sel.select(timeout=wait):
            name = key.data
            if name == "exit":
                sel.unregister(key.fileobj)
                continue
            if name == "stdin":
                try:
                    pending = pending[os.write(in_w, pending[:65536]) :]
                    if not pending:
                        sel.unregister(in_w)
                        os.close(in_w)
                except OSError:
                    sel.unregister(in_w)
                    os.close(in_w)
                continue
            data = os.read(key.fd, 65536)
            if data:
                take(name, data)
            else:
                sel.unregister(key.fd)
    if timed_out:
        _kill_group(pid)
    exit_code = reap(True)
    # Drain what is already buffered; background jobs that keep the pipes open are not waited for.
    for key in list(sel.get_map().values()):
        if key.data in ("stdout", "stderr", "report"):
            os.set_blocking(key.fd, False)
            while True:
                try:
                    data = os.read(key.fd, 65536)
                except BlockingIOError:
                    break
                if not data:
                    break
                take(key.data, data)
        if key.data == "stdin":
            os.close(in_w)
    sel.close()
    if pidfd is not None:
        os.close(pidfd)
    os.close(out_r)
    os.close(err_r)
    if rep_r is not None:
        os.close(rep_r)
    if script is not None:
        try:
            os.unlink(script)
        except OSError:
            pass
    exit_code = 128 - exit_code if exit_code < 0 else exit_code
    # 137 = SIGKILL, of the shell itself or (reported by the shell) of the command it ran.
    oom = exit_code == 137 and not timed_out and oom_killed_since_last_look()
    extra = (
        {"report": base64.b64encode(bytes(bufs["report"])).decode(), "report_truncated": trunc["report"]}
        if report
        else {}
    )
    return {
        **extra,
        "oom_seen": _oom_seen[0],
        "exit_code": exit_code,
        "stdout": base64.b64encode(bytes(bufs["stdout"])).decode(),
        "stderr": base64.b64encode(bytes(bufs["stderr"])).decode(),
        "stdout_truncated": trunc["stdout"],
        "stderr_truncated": trunc["stderr"],
        "duration": time.monotonic() - started,
        "timed_out": timed_out,
        "oom_killed": oom,
        "forked": server is not None,
    }


def sandbox_pids():
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as fh:
                for line in fh:
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) == UID:
                            pids.append(int(entry))
                        break
        except OSError:
            continue
    return pids


def kill_sandbox_processes(keep=()):
    """SIGKILL every process of the sandbox user except `keep`; repeat until none is left (forks race)."""
    killed = 0
    keep = set(keep)
    for _ in range(100):
        pids = [p for p in sandbox_pids() if p not in keep]
        if not pids:
            return killed
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        time.sleep(0.002)
    raise RuntimeError(f"processes of uid {UID} survive SIGKILL: {[p for p in sandbox_pids() if p not in keep][:10]}")


# Everything a command can write to, emptied on reset as the sandbox user once its processes are
# dead: the tmpfs mounts (a `chmod 000` does not stop it), POSIX message queues and System V IPC.
# What survived a reset could reach the next episode or its grading (a symlink into /dev/shm).
WRITABLE = "/workspace /tmp /run/envforge /dev/shm"
WIPE_WRITABLE = (
    f"chmod -R u+rwX {WRITABLE} 2>/dev/null; "
    f"find {WRITABLE} -mindepth 1 -maxdepth 1 -exec rm -rf -- {{}} + ; "
    "find /dev/mqueue -mindepth 1 -maxdepth 1 -delete 2>/dev/null; "
    "ipcrm --all 2>/dev/null; "
    f'test -z "$(find {WRITABLE} /dev/mqueue -mindepth 1 -maxdepth 1 2>/dev/null | head -n 1)"'
)


# The workspace right after the last restore that took one: {path: (inode, ctime)} of its files and
# links (None: the last restore took none, so the next changed-only request restores in full).
_RECORD = [None]


def restore(snapshot, changed_only=False):
    """Kill leftovers, empty /workspace and /tmp, and lay the chosen state back down.

    Files the grader installed (root-owned, under GRADER_DIR) are removed as well. With
    `changed_only` (the initial state only) the workspace keeps what is unchanged since the last
    restore and only the rest is put back (`restore_changed`); without a record of that restore, or
    if anything fails, the full restore runs and takes a record for the next one.
    """
    started = time.monotonic()
    # Spare shells go too: sandbox processes cannot trace them, but can SIGSTOP or prlimit them.
    SPAWNER.discard()
    killed = kill_sandbox_processes()
    oom_killed_since_last_look()
    clear_grader_files()
    record, _RECORD[0] = _RECORD[0], None
    if changed_only and not snapshot and record is not None:
        _RECORD[0] = as_sandbox_user(lambda: restore_changed(record))
        if _RECORD[0] is not None:
            return {
                "killed": killed,
                "duration": time.monotonic() - started,
                "oom_seen": _oom_seen[0],
                "changed_only": True,
            }
    wipe = WIPE_WRITABLE + ' && test -z "$(ls -A /workspace)"'
    if snapshot:
        with open(os.path.join(SNAPSHOTS, snapshot + ".tar"), "rb") as fh:
            data = fh.read()
        res = run_command(wipe + " && tar -C /workspace -xpf -", 120, cwd="/", stdin=data)
    else:
        res = run_command(wipe + f" && cp -a {TEMPLATE}/. {WORKSPACE}/", 120, cwd="/")
    if res["exit_code"] != 0:
        raise RuntimeError("restore failed: " + base64.b64decode(res["stderr"]).decode(errors="replace")[-300:])
    if changed_only and not snapshot:
        _RECORD[0] = as_sandbox_user(lambda: workspace_record(WORKSPACE))
    return {"killed": killed, "duration": time.monotonic() - started, "oom_seen": _oom_seen[0]}


def as_sandbox_user(work):
    """work()'s value (a dict), computed in a fork of the agent as the sandbox user; None if it failed.

    Root here may not write in the user's directories (no CAP_DAC_OVERRIDE), and a fork costs no
    interpreter start. The value comes back through a pipe only the agent reads."""
    import marshal

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read_end)
            null = os.open("/dev/null", os.O_RDWR)
            for fd in (0, 1, 2):  # never the agent's attach stream
                os.dup2(null, fd)
            os.setgroups([])
            os.setgid(GID)
            os.setuid(UID)
            data = marshal.dumps(work())
            with os.fdopen(write_end, "wb") as out:
                out.write(data)
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as fh:
        data = fh.read()
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        return None
    try:
        return marshal.loads(data)
    except (EOFError, ValueError, TypeError):
        return None


def workspace_record(root):
    """{path: (inode, ctime)} of every file and link under root.

    A rename keeps a file's size and times but not its inode at that path; any write, chmod, link
    or rename sets its ctime, which no process can set back. With the template's own size, mode and
    mtime, this is what `restore_changed` compares."""
    record = {}
    for folder, dirs, files in os.walk(root):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
            st = os.lstat(os.path.join(folder, name))
            record[os.path.join(folder, name)] = (st.st_ino, st.st_ctime_ns)
    return record


def restore_changed(record):
    """Put the workspace back to the template by changing only what changed since the last restore,
    empty the other writable places, and return the new record.

    A file or link is kept when its inode and ctime are those recorded right after the last restore
    and its type, mode, size and mtime equal the template's; everything else is removed and copied
    again, and directory modes and times are put back. So a reset after a grading that changed a few
    files costs two walks instead of deleting and copying every file (~0.1 s of CPU for a 1,500-file
    repository). What it cannot see: a write whose ctime falls in the same clock tick as the record
    (a write through a shared mmap on tmpfs does set it on this kernel: tested). The host asks for it
    only after code it trusts not to aim for that (the gate's gradings, `Sandbox.trust_until_reset`),
    never after a policy's. Runs as the sandbox user (`as_sandbox_user`); any error fails it.
    """
    for place in WRITABLE.split()[1:]:
        _empty(place)
    for name in os.listdir("/dev/mqueue"):
        os.unlink(os.path.join("/dev/mqueue", name))
    _remove_ipc()
    _sync_tree(TEMPLATE, WORKSPACE, record)
    return workspace_record(WORKSPACE)


def _empty(place):
    for entry in os.scandir(place):
        _remove(entry.path)


def _remove(path):
    """Remove a file or a whole tree of the sandbox user's, whatever modes it set (`chmod 000`)."""
    import shutil

    st = os.lstat(path)
    if not _stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return
    for root, dirs, _files in os.walk(path, topdown=True):
        os.chmod(root, 0o700)
        for name in dirs:
            sub = os.path.join(root, name)
            if not os.path.islink(sub):
                os.chmod(sub, 0o700)
    shutil.rmtree(path)


def _remove_ipc():
    """System V IPC objects of the sandbox user, as `ipcrm --all` removes them (run only when some exist)."""
    for kind in ("shm", "sem", "msg"):
        try:
            with open(f"/proc/sysvipc/{kind}") as fh:
                if len(fh.readlines()) > 1:
                    break
        except OSError:
            pass
    else:
        return
    import subprocess

    subprocess.run(["ipcrm", "--all"], check=True, stdin=subprocess.DEVNULL)


def _same(src, src_st, dst, dst_st, record):
    kind = _stat.S_IFMT(src_st.st_mode)
    if kind != _stat.S_IFMT(dst_st.st_mode):
        return False
    if _stat.S_ISDIR(src_st.st_mode):
        return True  # compared entry by entry
    if record.get(dst) != (dst_st.st_ino, dst_st.st_ctime_ns):
        return False
    if _stat.S_ISLNK(src_st.st_mode):
        return os.readlink(src) == os.readlink(dst)
    return _stat.S_ISREG(src_st.st_mode) and (
        src_st.st_size,
        src_st.st_mtime_ns,
        _stat.S_IMODE(src_st.st_mode),
    ) == (dst_st.st_size, dst_st.st_mtime_ns, _stat.S_IMODE(dst_st.st_mode))


def _sync_tree(src, dst, record):
    """Make dst what `cp -a src/. dst/` would, touching only the entries that differ or changed."""
    import shutil

    src_st = os.lstat(src)
    dst_mode = _stat.S_IMODE(os.lstat(dst).st_mode)
    if dst_mode & 0o700 != 0o700:
        os.chmod(dst, dst_mode | 0o700)
    theirs = {entry.name: entry for entry in os.scandir(src)}
    for entry in os.scandir(dst):
        twin = theirs.get(entry.name)
        if twin is not None and _same(
            twin.path, twin.stat(follow_symlinks=False), entry.path, entry.stat(follow_symlinks=False), record
        ):
            if entry.is_dir(follow_symlinks=False):
                _sync_tree(twin.path, entry.path, record)
            continue
        _remove(entry.path)
    present = set(os.listdir(dst))
    for name, twin in theirs.items():
        if name in present:
            continue
        target = os.path.join(dst, name)
        if twin.is_dir(follow_symlinks=False):
            shutil.copytree(twin.path, target, symlinks=True)
        else:
            shutil.copy2(twin.path, target, follow_symlinks=False)
    now = os.lstat(dst)
    if _stat.S_IMODE(now.st_mode) != _stat.S_IMODE(src_st.st_mode):
        os.chmod(dst, _stat.S_IMODE(src_st.st_mode))
    if now.st_mtime_ns != src_st.st_mtime_ns:
        os.utime(dst, ns=(src_st.st_atime_ns, src_st.st_mtime_ns))


GRADER_DIR = "/run/envforge-verifier"  # root-owned tmpfs: verifier files and runners, read-only to commands


def clear_grader_files():
    for entry in os.listdir(GRADER_DIR):
        _remove_tree(os.path.join(GRADER_DIR, entry))


def _remove_tree(path):
    if os.path.isdir(path) and not os.path.islink(path):
        for entry in os.listdir(path):
            _remove_tree(os.path.join(path, entry))
        os.rmdir(path)
    else:
        os.unlink(path)


def install(dest, files, mode):
    """Write files as root under GRADER_DIR: sandbox processes can read and run them, never change them."""
    root = os.path.realpath(GRADER_DIR)
    dest = os.path.realpath(dest)
    if os.path.commonpath([root, dest]) != root:
        raise ValueError(f"install destination {dest} is outside {GRADER_DIR}")
    for rel, data in files.items():
        path = os.path.realpath(os.path.join(dest, rel))
        if os.path.commonpath([dest, path]) != dest:
            raise ValueError(f"install path {rel!r} escapes {dest}")
        parent = os.path.dirname(path)
        os.makedirs(parent, exist_ok=True)
        while parent != root and parent.startswith(root):
            os.chmod(parent, 0o755)
            parent = os.path.dirname(parent)
        with open(path, "wb") as fh:
            fh.write(base64.b64decode(data))
        os.chmod(path, mode)
    return {"files": len(files)}


def snapshot(name):
    res = run_command("tar -C /workspace -cf - .", 120, cwd="/", cap=SNAPSHOT_CAP)
    if res["stdout_truncated"]:
        raise RuntimeError(f"snapshot larger than {SNAPSHOT_CAP >> 20} MiB")
    if res["exit_code"] != 0:
        raise RuntimeError("snapshot failed: " + base64.b64decode(res["stderr"]).decode(errors="replace")[-300:])
    data = base64.b64decode(res["stdout"])
    with open(os.path.join(SNAPSHOTS, name + ".tar"), "wb") as fh:
        fh.write(data)
    return {"bytes": len(data)}


def main():
    out = sys.stdout.buffer

    def send(obj):
        out.write(json.dumps(obj, separators=(",", ":")).encode() + b"\n")
        out.flush()

    # A pipe whose reader died (a waiting shell killed by a command) must be an EPIPE we
    # handle, never a signal that kills the agent.
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    os.makedirs(SNAPSHOTS, mode=0o700, exist_ok=True)
    os.makedirs(GRADER_DIR, mode=0o755, exist_ok=True)
    install_execute_only_shell()
    send({"id": 0, "ok": True, "ready": True, "pid": os.getpid()})
    pending = b""
    while True:
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            if line.strip():
                handle(line, send)
        # Start spare shells only while no request is waiting, so forks stay off the critical path.
        if len(SPAWNER.ready) < SPAWNER.RESERVE and not select.select([0], [], [], 0)[0]:
            try:
                SPAWNER.ready.append(SPAWNER._fork())
            except OSError:
                pass
            continue
        data = os.read(0, 1 << 20)
        if not data:
            break
        pending += data


def handle(line, send):
    rid = None
    try:
        req = json.loads(line)
        rid = req.get("id")
        op = req.get("op")
        if op == "exec":
            on_chunk = None
            if req.get("stream"):

                def on_chunk(name, data, rid=rid):
                    send({"id": rid, "chunk": name, "data": base64.b64encode(data).decode()})

            result = run_command(
                req["cmd"],
                float(req["timeout"]),
                req.get("env"),
                req.get("cwd") or WORKSPACE,
                base64.b64decode(req["stdin"]) if req.get("stdin") else b"",
                int(req.get("cap", 1 << 20)),
                on_chunk,
                bool(req.get("report")),
                req.get("python"),
            )
        elif op == "reset":
            result = restore(req.get("snapshot"), bool(req.get("changed_only")))
        elif op == "kill":
            SPAWNER.discard()
            result = {"killed": kill_sandbox_processes()}
        elif op == "install":
            result = install(req["dest"], req["files"], int(req.get("mode", 0o644)))
        elif op == "snapshot":
            result = snapshot(req["name"])
        elif op == "ping":
            result = {"pid": os.getpid()}
        else:
            raise ValueError(f"unknown op {op!r}")
        send(dict(result, id=rid, ok=True))
    except Exception as exc:  # report, never die: the host decides what a failure means
        send({"id": rid, "ok": False, "error": f"{type(exc).__name__}: {exc}"})


if __name__ == "__main__":
    main()
