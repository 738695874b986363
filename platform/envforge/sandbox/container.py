"""One isolated, quota-bound container to act in.

Isolation is on by default and cannot be configured away: no network (unless the task's
spec opts into an allow-list), all capabilities dropped, no-new-privileges, commands run as
an unprivileged user, a read-only root filesystem with size-limited tmpfs mounts for
/workspace, /tmp and /run/envforge, limits on CPU, memory (no swap) and process count, no
host paths or Docker socket, and an environment built from scratch.

Commands go through the in-container agent (`agent.py`, ~1 ms per command) over the attach
socket. If the agent dies, the command in flight raises `InfraError('agent_died')`, the
sandbox is marked tainted (a pool destroys it on release) and later commands fall back to
`docker exec` (~50 ms), which `stats.fallback_execs` reports.

The pristine workspace lives in the image (TEMPLATE_DIR) and is copied into the /workspace
tmpfs at start and on every reset, so a reset sandbox is byte-identical to a fresh one.

This module is the container's life and the transport to it; the git operations on the
workspace (diff, apply, changed paths) are in `workspace.py`, and the fixed shell programs
both send are in `programs.py`.
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import json
import re
import shlex
import socket
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import docker
from docker.errors import APIError, ImageNotFound, NotFound
from docker.types import LogConfig
from docker.utils.socket import STDERR, STDOUT, frames_iter

from envforge.errors import InfraError
from envforge.observe import metrics as live
from envforge.sandbox import workspace
from envforge.sandbox.channel import AgentChannel, AgentDead, AgentTimeout
from envforge.sandbox.engine import ENGINE_ERRORS, MANAGED_LABEL, OWNER_LABEL, engine_call, owner_id
from envforge.sandbox.programs import KILL_ALL, OOM_FIRST_THEN_EXEC, READ_OOM_KILLS, RESET_TO_INITIAL, SUPERVISOR
from envforge.settings import read_env
from envforge.task import EXTRA_TMPFS_MB, WORKSPACE, Limits, NetworkPolicy

SANDBOX_UID = 1000
DEFAULT_OUTPUT_CAP = 1 << 20  # bytes kept per stream; the rest is counted and dropped
SHM_MB = RUN_ENVFORGE_MB = EXTRA_TMPFS_MB // 2  # /dev/shm and /run/envforge, counted in Limits' memory check
# The agent, with the fork server it may start (forkserver.py) set ahead of it as a string.
AGENT_SOURCE = (
    f"FORKSERVER_SOURCE = {(Path(__file__).with_name('forkserver.py')).read_text()!r}\n"
    + (Path(__file__).with_name("agent.py")).read_text()
)
_HOST_GRACE_S = 30.0  # how much longer than a command's timeout the host waits for the agent
BASE_ENV = {
    "HOME": "/tmp",
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
}
_SNAPSHOT_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

# One shared pool for the async API: hundreds of sandboxes block in I/O at once.
_ASYNC_EXECUTOR = ThreadPoolExecutor(max_workers=read_env().sandbox_threads, thread_name_prefix="envforge-sandbox")


@dataclass(frozen=True)
class ExecResult:
    """What one command did. `timed_out` and `oom_killed` are task outcomes, not faults."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    duration_s: float
    timed_out: bool = False
    oom_killed: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    report: bytes | None = None  # what the command wrote to fd 3, when a report channel was asked for
    forked: bool = False  # the run was a fork of a fork server (PythonCommand), not a new interpreter

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def text(self) -> str:
        return self.stdout.decode("utf-8", errors="replace")

    def err_text(self) -> str:
        return self.stderr.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class PythonCommand:
    """An exec's command said as data: `interpreter` (found on the run's PATH) runs `script` with
    `args`. The agent may then run it as a fork of a server that has imported `preload` already
    (sandbox/forkserver.py: it saves the interpreter's start and those imports, 0.2-0.3 s of CPU for
    pytest), or, when it cannot, run the exec's shell command, which must do exactly the same."""

    script: str
    args: tuple[str, ...] = ()
    interpreter: str = "python3"
    flags: tuple[str, ...] = ("-P",)
    preload: tuple[str, ...] = ()

    def as_json(self) -> dict:
        return {
            "script": self.script,
            "args": list(self.args),
            "interpreter": self.interpreter,
            "flags": list(self.flags),
            "preload": list(self.preload),
        }


@dataclass(frozen=True)
class Snapshot:
    """A workspace state to reset to. `INITIAL` is the task's pristine state from the image."""

    name: str | None = None


INITIAL = Snapshot(None)


@dataclass(frozen=True)
class SandboxOptions:
    """Container settings derived from a task's limits and network policy."""

    limits: Limits = Limits()
    network: NetworkPolicy = NetworkPolicy()
    output_cap: int = DEFAULT_OUTPUT_CAP
    runtime: str | None = None  # e.g. "runsc" for gVisor where it is registered
    use_agent: bool = True

    def key(self) -> str:
        """A hashable identity: sandboxes with equal keys are interchangeable in a pool."""
        return json.dumps(
            {
                "limits": self.limits.model_dump(mode="json"),
                "network": self.network.model_dump(mode="json"),
                "cap": self.output_cap,
                "runtime": self.runtime,
                "agent": self.use_agent,
            },
            sort_keys=True,
        )

    def container_kwargs(self) -> dict:
        lim = self.limits
        uid = f"uid={SANDBOX_UID},gid={SANDBOX_UID}"
        kwargs = dict(
            # The agent runs as root inside with three capabilities; every command it starts
            # runs as uid 1000 and loses them all (see agent.py for the trust boundary).
            user="0:0",
            cap_drop=["ALL"],
            cap_add=["SETUID", "SETGID", "KILL"],
            security_opt=["no-new-privileges:true"],
            network_mode="none",
            read_only=True,
            tmpfs={
                WORKSPACE: f"rw,exec,nosuid,nodev,size={lim.workspace_mb}m,{uid},mode=0755",
                "/tmp": f"rw,exec,nosuid,nodev,size={lim.tmp_mb}m,mode=1777",
                "/run/envforge": f"rw,exec,nosuid,nodev,size={RUN_ENVFORGE_MB}m,{uid},mode=0700",
                "/run/envforge-agent": f"rw,noexec,nosuid,nodev,size={lim.workspace_mb}m,mode=0700",
                "/run/envforge-bin": "rw,exec,nosuid,nodev,size=16m,mode=0755",
                # Root-owned: what the grader installs here (verifier files, runners) is read-only to commands.
                "/run/envforge-verifier": "rw,exec,nosuid,nodev,size=64m,mode=0755",
            },
            mem_limit=f"{lim.memory_mb}m",
            memswap_limit=f"{lim.memory_mb}m",
            shm_size=f"{SHM_MB}m",  # wiped on reset, like every other place a command can write
            nano_cpus=int(lim.cpus * 1e9),
            pids_limit=lim.pids,
            init=True,
            ipc_mode="private",
            environment=dict(BASE_ENV),
            log_config=LogConfig(type="none"),  # agent traffic must not fill the daemon's disk
            stdin_open=True,
            working_dir=WORKSPACE,
        )
        if self.runtime:
            kwargs["runtime"] = self.runtime
        if self.network.mode == "allowlist":
            from envforge.sandbox.network import ALLOWLIST_NETWORK

            del kwargs["network_mode"]
            kwargs["network"] = ALLOWLIST_NETWORK  # default-deny; see network.py
        return kwargs


@dataclass
class SandboxStats:
    started_at: float = field(default_factory=time.time)
    start_s: float = 0.0
    execs: int = 0
    fallback_execs: int = 0
    resets: int = 0
    changed_only_resets: int = 0  # resets that restored only what changed (trust_until_reset)
    agent_alive: bool = True
    agent_failure: str | None = None


class Sandbox:
    """A started container for one task image. Use as a context manager, or call close()."""

    def __init__(
        self, client: docker.DockerClient, container, options: SandboxOptions, image: str, channel: AgentChannel | None
    ):
        self.client = client
        self.container = container
        self.options = options
        self.image = image
        self._channel = channel
        self.stats = SandboxStats(agent_alive=channel is not None)
        self.tainted: str | None = None  # why this sandbox must not be reused, if it must not
        self._network = None
        self._oom_seen = 0  # the memory cgroup's OOM-kill count when the agent last looked
        self._trusted = False  # only trusted code ran since the last reset (trust_until_reset)

    # -- lifecycle -----------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        client: docker.DockerClient,
        image: str,
        options: SandboxOptions | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> "Sandbox":
        """Create and start a sandbox with its workspace in the task's initial state."""
        from envforge.sandbox.network import attach_allowlist, ensure_allowlist_network

        options = options or SandboxOptions()
        if options.network.mode == "allowlist":
            with engine_call("allowlist_network_failed"):
                ensure_allowlist_network(client)
        started = time.perf_counter()
        all_labels = {MANAGED_LABEL: "1", OWNER_LABEL: owner_id(), "envforge.image": image, **(labels or {})}
        command = ["/bin/sh", "-c", SUPERVISOR, AGENT_SOURCE] if options.use_agent else ["sleep", "infinity"]
        try:
            container = client.containers.create(
                image,
                command=command,
                name=f"envforge-{uuid.uuid4().hex[:12]}",
                labels=all_labels,
                **options.container_kwargs(),
            )
        except ImageNotFound:
            raise InfraError("image_missing", f"image {image} is not built; run `envforge images build`") from None
        except ENGINE_ERRORS as exc:
            raise InfraError("container_create_failed", f"{type(exc).__name__}: {exc}"[:500]) from None
        sandbox = cls(client, container, options, image, None)
        try:
            with engine_call("container_start_failed"):
                if options.use_agent:
                    sandbox._channel = AgentChannel(client, container.id)
                    sandbox.stats.agent_alive = True
                container.start()
                if options.network.mode == "allowlist":
                    sandbox._network = attach_allowlist(client, container, options.network)
            sandbox._restore(INITIAL)
        except BaseException:
            sandbox.close()
            raise
        sandbox.stats.start_s = time.perf_counter() - started
        return sandbox

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def id(self) -> str:
        return self.container.id

    @property
    def agent_alive(self) -> bool:
        return self._channel is not None and not self._channel.closed

    def close(self) -> bool:
        """Remove the container (and its allow-list rules); safe to call twice. False when the
        engine could not remove it (it is down or restarting): the pool removes it later."""
        if self._channel is not None:
            self._channel.close()
        if self._network is not None:
            self._network.release()
            self._network = None
        try:
            self.container.remove(force=True, v=True)
        except NotFound:
            pass
        except ENGINE_ERRORS:
            return False
        return True

    release = close

    # -- commands ------------------------------------------------------------------------

    def exec(
        self,
        command: str,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        workdir: str = WORKSPACE,
        stdin: bytes | None = None,
        on_output: Callable[[str, bytes], None] | None = None,
        output_cap: int | None = None,
        report: bool = False,
        python: PythonCommand | None = None,
    ) -> ExecResult:
        """Run a shell command as the sandbox user; its process group is killed at the timeout.

        Raises InfraError when the container, the engine or the agent fails; a non-zero exit,
        a timeout or an OOM kill of the command are ordinary results. `on_output(stream,
        bytes)` receives output as it is produced. `report=True` gives the command a pipe on
        fd 3 that only the agent reads (ExecResult.report): graders point test reporters at
        /dev/fd/3 so that no file in the sandbox can stand in for the report. `python`: the same
        command as data, which the agent may run as a fork of a preloaded interpreter (PythonCommand).
        """
        timeout = float(timeout_s if timeout_s is not None else self.options.limits.command_timeout_s)
        cap = self.options.output_cap if output_cap is None else output_cap
        self.stats.execs += 1
        if self.agent_alive:
            payload = {
                "op": "exec",
                "cmd": command,
                "timeout": timeout,
                "env": {**BASE_ENV, **(env or {})},
                "cwd": workdir,
                "cap": cap,
                "stream": on_output is not None,
                "report": report,
            }
            if stdin:
                payload["stdin"] = base64.b64encode(stdin).decode()
            if python is not None:
                payload["python"] = python.as_json()
            started = time.perf_counter()
            try:
                msg = self._agent(payload, timeout + _HOST_GRACE_S, on_output)
            except InfraError as exc:
                if exc.cause == "agent_died" and self._oom_kills() > self._oom_seen:
                    # The memory cgroup OOM-killed the agent (or what it waited for) while this
                    # command ran: the policy's own memory use, a model outcome like any OOM.
                    self.tainted = "oom"
                    return ExecResult(
                        137,
                        b"",
                        b"envforge: the sandbox ran out of memory; the command was killed\n",
                        time.perf_counter() - started,
                        False,
                        True,
                    )
                raise
            if not msg.get("ok"):
                raise InfraError("agent_error", msg.get("error", "unknown"))
            self._oom_seen = msg.get("oom_seen", self._oom_seen)
            if msg["oom_killed"]:
                self.tainted = self.tainted or "oom"
            live.sandbox_command(time.perf_counter() - started, "agent")
            rep = base64.b64decode(msg["report"]) if "report" in msg else None
            return ExecResult(
                msg["exit_code"],
                base64.b64decode(msg["stdout"]),
                base64.b64decode(msg["stderr"]),
                msg["duration"],
                msg["timed_out"],
                msg["oom_killed"],
                msg["stdout_truncated"],
                msg["stderr_truncated"],
                rep,
                bool(msg.get("forked")),
            )
        if report:
            raise InfraError("agent_unavailable", "a report channel needs the in-sandbox agent")
        self.stats.fallback_execs += 1
        started = time.perf_counter()
        result = self._docker_exec(command, timeout, env, workdir, stdin, cap)
        live.sandbox_command(time.perf_counter() - started, "docker_exec")
        return result

    def _agent(self, payload: dict, deadline_s: float, on_chunk=None) -> dict:
        assert self._channel is not None
        try:
            return self._channel.request(payload, deadline_s, on_chunk)
        except AgentDead as exc:
            self._agent_lost(f"agent died: {exc}")
            self._raise_if_container_gone()
            raise InfraError("agent_died", str(exc)) from None
        except AgentTimeout as exc:
            self._agent_lost(f"agent hung: {exc}")
            self._raise_if_container_gone()
            raise InfraError("agent_hung", str(exc)) from None

    def _agent_lost(self, why: str) -> None:
        self.stats.agent_alive = False
        self.stats.agent_failure = why
        self.tainted = self.tainted or why
        if self._channel is not None:
            self._channel.close()

    def _oom_kills(self) -> int:
        """The memory cgroup's OOM-kill count, read without the agent (0 when it cannot be read)."""
        try:
            code, out, _, _, _ = self._raw_docker_exec(["/bin/sh", "-c", READ_OOM_KILLS], None, BASE_ENV, "/", 30, 4096)
        except InfraError:
            return 0
        return int(out.split()[0]) if code == 0 and out.split() and out.split()[0].isdigit() else 0

    def _raise_if_container_gone(self) -> None:
        try:
            self.container.reload()
        except NotFound:
            self.tainted = "container vanished"
            raise InfraError("container_vanished", f"container {self.container.short_id} is gone") from None
        except ENGINE_ERRORS as exc:
            self.tainted = "engine error"
            raise InfraError("engine_error", f"{type(exc).__name__}: {exc}"[:500]) from None
        if self.container.status != "running":
            self.tainted = f"container {self.container.status}"
            raise InfraError("container_not_running", f"container is {self.container.status}")

    def _docker_exec(
        self, command: str, timeout: float, env: Mapping[str, str] | None, workdir: str, stdin: bytes | None, cap: int
    ) -> ExecResult:
        """The fallback path: `docker exec` as the sandbox user, wrapped in `timeout`."""
        argv = [
            "/bin/sh",
            "-c",
            OOM_FIRST_THEN_EXEC,
            "sh",
            "timeout",
            "--kill-after=2",
            f"{timeout:g}",
            "/bin/bash",
            "-c",
            command,
        ]
        started = time.perf_counter()
        code, out, err, out_t, err_t = self._raw_docker_exec(
            argv, stdin, {**BASE_ENV, **(env or {})}, workdir, timeout + _HOST_GRACE_S, cap
        )
        duration = time.perf_counter() - started
        timed_out = code == 124 or (code == 137 and duration >= timeout)
        return ExecResult(code, out, err, duration, timed_out, False, out_t, err_t)

    def _raw_docker_exec(
        self, argv: list[str], stdin: bytes | None, env: Mapping[str, str], workdir: str, deadline_s: float, cap: int
    ) -> tuple[int, bytes, bytes, bool, bool]:
        api = self.client.api
        try:
            exec_id = api.exec_create(
                self.container.id,
                argv,
                stdin=stdin is not None,
                stdout=True,
                stderr=True,
                environment=dict(env),
                workdir=workdir,
                user=f"{SANDBOX_UID}:{SANDBOX_UID}",
            )["Id"]
            sock = api.exec_start(exec_id, socket=True)
        except NotFound:
            self.tainted = "container vanished"
            raise InfraError("container_vanished", f"container {self.container.short_id} is gone") from None
        except APIError as exc:
            self.tainted = "engine error"
            cause = "container_not_running" if exc.status_code == 409 else "engine_error"
            raise InfraError(cause, str(exc)) from None
        except ENGINE_ERRORS as exc:
            self.tainted = "engine error"
            raise InfraError("engine_error", f"{type(exc).__name__}: {exc}"[:500]) from None
        raw = getattr(sock, "_sock", sock)
        bufs = {STDOUT: bytearray(), STDERR: bytearray()}
        trunc = {STDOUT: False, STDERR: False}
        try:
            raw.settimeout(deadline_s)
            if stdin is not None:
                raw.sendall(stdin)
                raw.shutdown(socket.SHUT_WR)
            for stream, data in frames_iter(sock, tty=False):
                buf = bufs.get(stream)
                if buf is None:
                    continue
                room = cap - len(buf)
                if room > 0:
                    buf += data[:room]
                if len(data) > max(room, 0):
                    trunc[stream] = True
        except (socket.timeout, TimeoutError):
            raise InfraError("exec_hung", f"no end of output after {deadline_s:.0f}s") from None
        except OSError as exc:
            raise InfraError("exec_stream_broken", str(exc)) from None
        finally:
            try:
                sock.close()
            except OSError:
                pass
        try:
            code = api.exec_inspect(exec_id).get("ExitCode")
        except ENGINE_ERRORS as exc:
            raise InfraError("engine_error", f"{type(exc).__name__}: {exc}"[:500]) from None
        if code is None:
            self._raise_if_container_gone()
            raise InfraError("exec_lost", "exec finished without an exit code")
        return code, bytes(bufs[STDOUT]), bytes(bufs[STDERR]), trunc[STDOUT], trunc[STDERR]

    # -- files ---------------------------------------------------------------------------

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        """Write a file as the sandbox user (parents created)."""
        payload = data.encode() if isinstance(data, str) else data
        q = shlex.quote(path)
        res = (
            self.exec(
                f'mkdir -p "$(dirname {q})" && cat > {q} && chmod {mode:o} {q}', stdin=payload or None, workdir="/"
            )
            if payload
            else self.exec(f'mkdir -p "$(dirname {q})" && : > {q} && chmod {mode:o} {q}', workdir="/")
        )
        if res.exit_code != 0:
            raise OSError(f"write_file {path}: {res.err_text().strip()}")

    def put_files(self, dest_dir: str, files: Mapping[str, bytes], mode: int = 0o644) -> None:
        """Write many files at once as one tar stream (one command, whatever the count)."""
        import io
        import tarfile

        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            for rel, data in sorted(files.items()):
                info = tarfile.TarInfo(rel)
                info.size, info.mode, info.mtime = len(data), mode, 0
                tf.addfile(info, io.BytesIO(data))
        q = shlex.quote(dest_dir)
        res = self.exec(f"mkdir -p {q} && tar -x --no-same-owner -C {q}", stdin=buf.getvalue(), workdir="/")
        if res.exit_code != 0:
            raise OSError(f"put_files {dest_dir}: {res.err_text().strip()}")

    def read_file(self, path: str, max_bytes: int = 64 << 20) -> bytes:
        """Read a file as the sandbox user; FileNotFoundError if it cannot be read."""
        res = self.exec(f"cat -- {shlex.quote(path)}", workdir="/", output_cap=max_bytes)
        if res.exit_code != 0:
            raise FileNotFoundError(f"read_file {path}: {res.err_text().strip()}")
        return res.stdout

    # -- the workspace (git operations: envforge.sandbox.workspace) ----------------------------

    def apply_patch(self, patch: str) -> str:
        """Apply a unified diff to the workspace; returns the method that worked (`workspace.apply_patch`)."""
        return workspace.apply_patch(self, patch)

    def diff(self, kill_processes: bool = True) -> str:
        """The workspace's changes against the task's initial state, as a binary-safe git patch
        (`workspace.diff`: by default every sandbox process is killed first)."""
        return workspace.diff(self, kill_processes)

    def diff_input_limit(self) -> int:
        """Bytes of changed files a diff may take (`workspace.diff_input_limit`)."""
        return workspace.diff_input_limit(self.options.limits)

    def changed_paths(self, patched_copy: bool = False) -> list[str]:
        """Workspace paths that differ from the task's initial state (`workspace.changed_paths`; `patched_copy`:
        only the grader wrote here since the reset, so stat data may be trusted)."""
        return workspace.changed_paths(self, patched_copy)

    def restore_paths(self, paths: list[str]) -> None:
        """Put paths back as they are in the task's initial state (`workspace.restore_paths`)."""
        workspace.restore_paths(self, paths)

    def restore_git_dir(self) -> None:
        """Replace /workspace/.git with the image's pristine copy (`workspace.restore_git_dir`)."""
        workspace.restore_git_dir(self)

    # -- grader files and processes --------------------------------------------------------

    def install_files(self, dest: str, files: Mapping[str, bytes], mode: int = 0o644) -> None:
        """Write files as root under /run/envforge-verifier: commands can read and run them, not change them."""
        if not self.agent_alive:
            raise InfraError("agent_unavailable", "installing grader files needs the in-sandbox agent")
        payload = {rel: base64.b64encode(data).decode() for rel, data in files.items()}
        msg = self._agent({"op": "install", "dest": dest, "files": payload, "mode": mode}, 120)
        if not msg.get("ok"):
            raise InfraError("install_failed", msg.get("error", ""))

    def kill_processes(self) -> int:
        """SIGKILL every process of the sandbox user (background jobs included); returns how many."""
        if not self.agent_alive:
            self._raw_docker_exec(["/bin/sh", "-c", KILL_ALL], None, BASE_ENV, "/", 60, DEFAULT_OUTPUT_CAP)
            return 0
        msg = self._agent({"op": "kill"}, 60)
        if not msg.get("ok"):
            raise InfraError("kill_failed", msg.get("error", ""))
        return int(msg.get("killed", 0))

    # -- snapshots -----------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """Record the workspace's current state (kept inside the sandbox, out of the policy's reach)."""
        if not self.agent_alive:
            raise InfraError("agent_unavailable", "snapshots need the in-sandbox agent")
        snap = Snapshot(uuid.uuid4().hex)
        msg = self._agent({"op": "snapshot", "name": snap.name}, 180)
        if not msg.get("ok"):
            raise InfraError("snapshot_failed", msg.get("error", ""))
        return snap

    def trust_until_reset(self) -> None:
        """Say that until the next reset only code that does not hide its changes runs here: the
        task's own tests and reference, envforge's mutants and probes (the gate, the derivation),
        never a policy's.

        That reset then keeps what is unchanged since the previous restore and puts back the rest
        (agent.restore_changed), a fraction of a full restore's cost. A write timed into the clock
        tick of its record could pass unseen, which a policy could aim for to carry state into the
        next episode or grading; hence it is asked for per use and lasts one reset.
        """
        self._trusted = True

    def reset(self, snapshot: Snapshot = INITIAL) -> float:
        """Kill every sandbox-user process, empty /workspace and /tmp, and restore `snapshot`.

        Returns the seconds it took. A failed reset taints the sandbox and raises InfraError.
        """
        started = time.perf_counter()
        self._restore(snapshot)
        self.stats.resets += 1
        return time.perf_counter() - started

    def _restore(self, snapshot: Snapshot) -> None:
        if snapshot.name is not None and not _SNAPSHOT_NAME.match(snapshot.name):
            raise ValueError(f"invalid snapshot name {snapshot.name!r}")
        changed_only, self._trusted = self._trusted and snapshot.name is None, False
        if self.agent_alive:
            msg = self._agent({"op": "reset", "snapshot": snapshot.name, "changed_only": changed_only}, 180)
            if not msg.get("ok"):
                self.tainted = f"reset failed: {msg.get('error')}"
                raise InfraError("reset_failed", msg.get("error", ""))
            self._oom_seen = msg.get("oom_seen", self._oom_seen)
            self.stats.changed_only_resets += bool(msg.get("changed_only"))
            return
        if snapshot.name is not None:
            raise InfraError("agent_unavailable", "resetting to a snapshot needs the in-sandbox agent")
        code, _, err, _, _ = self._raw_docker_exec(
            ["/bin/sh", "-c", RESET_TO_INITIAL], None, BASE_ENV, "/", 180, DEFAULT_OUTPUT_CAP
        )
        if code != 0:
            self.tainted = "reset failed"
            raise InfraError("reset_failed", err.decode(errors="replace")[-300:])

    def ping(self) -> bool:
        """True when the container runs and answers (through the agent, or exec if it is gone)."""
        try:
            if self.agent_alive:
                return bool(self._agent({"op": "ping"}, 10).get("ok"))
            return self._docker_exec("true", 10, None, "/", None, 1024).exit_code == 0
        except InfraError:
            return False

    # -- async ---------------------------------------------------------------------------

    async def aexec(self, command: str, **kwargs) -> ExecResult:
        return await run_blocking(self.exec, command, **kwargs)

    async def areset(self, snapshot: Snapshot = INITIAL) -> float:
        return await run_blocking(self.reset, snapshot)

    async def adiff(self) -> str:
        return await run_blocking(self.diff)

    @classmethod
    async def astart(
        cls,
        client: docker.DockerClient,
        image: str,
        options: SandboxOptions | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> "Sandbox":
        return await run_blocking(cls.start, client, image, options, labels)

    async def aclose(self) -> None:
        await run_blocking(self.close)


async def run_blocking(fn, *args, **kwargs):
    """`fn` on the sandbox thread pool, in a copy of the caller's context: log ids and the current
    span follow the work into the thread (envforge.observe)."""
    loop = asyncio.get_running_loop()
    ctx = contextvars.copy_context()
    return await loop.run_in_executor(_ASYNC_EXECUTOR, lambda: ctx.run(fn, *args, **kwargs))
