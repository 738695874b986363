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
import json
import os
import selectors
import signal
import subprocess
import sys
import time

UID = GID = 1000
WORKSPACE = "/workspace"
TEMPLATE = "/opt/envforge/task/workspace"
SNAPSHOTS = "/run/envforge-agent"
OOM_FILES = ("/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events")
CHILD_ENV = {"HOME": "/tmp", "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


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


def run_command(cmd, timeout, env=None, cwd=WORKSPACE, stdin=b"", cap=1 << 20, on_chunk=None):
    """Run cmd as the sandbox user in its own session; kill the whole group at the timeout."""
    started = time.monotonic()
    oom_before = oom_kills()
    proc = subprocess.Popen(
        ["/bin/bash", "-c", cmd], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        cwd=cwd, env=dict(CHILD_ENV, **(env or {})), start_new_session=True, user=UID, group=GID,
        extra_groups=[], close_fds=True)
    bufs = {"stdout": bytearray(), "stderr": bytearray()}
    trunc = {"stdout": False, "stderr": False}
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
    sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
    pending = memoryview(stdin or b"")
    if pending:
        os.set_blocking(proc.stdin.fileno(), False)
        sel.register(proc.stdin, selectors.EVENT_WRITE, "stdin")
    else:
        proc.stdin.close()
    deadline = started + timeout
    timed_out = False

    def take(name, data):
        room = cap - len(bufs[name])
        if room > 0:
            bufs[name] += data[:room]
        if len(data) > max(room, 0):
            trunc[name] = True
        if on_chunk is not None and data:
            on_chunk(name, data)

    def close_stdin():
        sel.unregister(proc.stdin)
        proc.stdin.close()

    while True:
        now = time.monotonic()
        if now >= deadline:
            timed_out = True
            break
        if proc.poll() is not None:
            break
        for key, _ in sel.select(timeout=min(0.05, deadline - now)):
            name = key.data
            if name == "stdin":
                try:
                    sent = os.write(proc.stdin.fileno(), pending[:65536])
                    pending = pending[sent:]
                    if not pending:
                        close_stdin()
                except (BrokenPipeError, OSError):
                    close_stdin()
                continue
            data = os.read(key.fileobj.fileno(), 65536)
            if data:
                take(name, data)
            else:
                sel.unregister(key.fileobj)
    if timed_out:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    exit_code = proc.wait()
    # Drain what is already buffered; background jobs that keep the pipes open are not waited for.
    for key in list(sel.get_map().values()):
        if key.data == "stdin":
            continue
        os.set_blocking(key.fileobj.fileno(), False)
        while True:
            try:
                data = os.read(key.fileobj.fileno(), 65536)
            except BlockingIOError:
                break
            if not data:
                break
            take(key.data, data)
    sel.close()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        try:
            stream.close()
        except OSError:
            pass
    oom = exit_code == -signal.SIGKILL and not timed_out and oom_kills() > oom_before
    return {
        "exit_code": 128 - exit_code if exit_code < 0 else exit_code,
        "stdout": base64.b64encode(bytes(bufs["stdout"])).decode(),
        "stderr": base64.b64encode(bytes(bufs["stderr"])).decode(),
        "stdout_truncated": trunc["stdout"], "stderr_truncated": trunc["stderr"],
        "duration": time.monotonic() - started, "timed_out": timed_out, "oom_killed": oom,
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


def kill_sandbox_processes():
    """SIGKILL every process of the sandbox user; repeat until none is left (forks race)."""
    killed = 0
    for _ in range(100):
        pids = sandbox_pids()
        if not pids:
            return killed
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        time.sleep(0.002)
    raise RuntimeError(f"processes of uid {UID} survive SIGKILL: {sandbox_pids()[:10]}")


def restore(snapshot):
    """Kill leftovers, empty /workspace and /tmp, and lay the chosen state back down."""
    started = time.monotonic()
    killed = kill_sandbox_processes()
    wipe = ("chmod -R u+rwX /workspace /tmp 2>/dev/null; "
            "find /workspace /tmp -mindepth 1 -maxdepth 1 -exec rm -rf -- {} + ; "
            "test -z \"$(ls -A /workspace)\"")
    res = run_command(wipe, 120, cwd="/")
    if res["exit_code"] != 0:
        raise RuntimeError("wipe failed: " + base64.b64decode(res["stderr"]).decode(errors="replace")[-300:])
    if snapshot:
        with open(os.path.join(SNAPSHOTS, snapshot + ".tar"), "rb") as fh:
            data = fh.read()
        res = run_command("tar -C /workspace -xpf -", 120, cwd="/", stdin=data)
    else:
        res = run_command(f"cp -a {TEMPLATE}/. {WORKSPACE}/", 120, cwd="/")
    if res["exit_code"] != 0:
        raise RuntimeError("restore failed: " + base64.b64decode(res["stderr"]).decode(errors="replace")[-300:])
    return {"killed": killed, "duration": time.monotonic() - started}


def snapshot(name):
    res = run_command("tar -C /workspace -cf - .", 120, cwd="/", cap=1 << 40)
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

    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        os.makedirs(SNAPSHOTS, mode=0o700, exist_ok=True)
    except OSError:
        pass
    send({"id": 0, "ok": True, "ready": True, "pid": os.getpid()})
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
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
                result = run_command(req["cmd"], float(req["timeout"]), req.get("env"), req.get("cwd") or WORKSPACE,
                                     base64.b64decode(req["stdin"]) if req.get("stdin") else b"",
                                     int(req.get("cap", 1 << 20)), on_chunk)
            elif op == "reset":
                result = restore(req.get("snapshot"))
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
