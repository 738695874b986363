"""One isolated, quota-bound container to act in.

Isolation is on by default and not configurable away: no network (unless the task's spec
opts into an allow-list), all capabilities dropped, no-new-privileges, a non-root user, a
read-only root filesystem with size-limited tmpfs mounts for /workspace, /tmp and
/run/envforge, and limits on CPU, memory and process count. The pristine workspace lives in
the image (TEMPLATE_DIR) and is copied into the /workspace tmpfs at start.

Commands run through `docker exec` here; stdin is streamed over the hijacked exec socket,
which is also how files are written (a read-only rootfs refuses `put_archive`).
"""

from __future__ import annotations

import io
import re
import shlex
import socket
import tarfile
import time
import uuid
from dataclasses import dataclass
from typing import Mapping

import docker
from docker.errors import APIError, DockerException, NotFound
from docker.utils.socket import STDERR, STDOUT, frames_iter

from envforge.errors import InfraError
from envforge.sandbox.engine import MANAGED_LABEL
from envforge.sandbox.images import TEMPLATE_DIR
from envforge.task import WORKSPACE, Limits, NetworkPolicy

SANDBOX_UID = 1000
DEFAULT_OUTPUT_CAP = 1 << 20  # bytes kept per stream; the rest is counted and dropped
_TIMEOUT_EXIT = 124  # coreutils `timeout` after SIGTERM
_KILLED_EXIT = 137  # SIGKILL: `timeout --kill-after`, or the OOM killer
# The sandbox's environment is built from scratch: nothing from the host leaks in.
BASE_ENV = {
    "HOME": "/tmp",
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
}


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

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def text(self) -> str:
        return self.stdout.decode("utf-8", errors="replace")

    def err_text(self) -> str:
        return self.stderr.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class SandboxOptions:
    """Container settings derived from a task's limits and network policy."""

    limits: Limits = Limits()
    network: NetworkPolicy = NetworkPolicy()
    output_cap: int = DEFAULT_OUTPUT_CAP
    runtime: str | None = None  # e.g. "runsc" for gVisor where registered

    def container_kwargs(self) -> dict:
        lim = self.limits
        uid = f"uid={SANDBOX_UID},gid={SANDBOX_UID}"
        kwargs = dict(
            user=f"{SANDBOX_UID}:{SANDBOX_UID}",
            network_mode="none",
            cap_drop=["ALL"],
            security_opt=["no-new-privileges:true"],
            read_only=True,
            tmpfs={
                WORKSPACE: f"rw,exec,nosuid,nodev,size={lim.workspace_mb}m,{uid},mode=0755",
                "/tmp": f"rw,exec,nosuid,nodev,size={lim.tmp_mb}m,mode=1777",
                "/run/envforge": f"rw,exec,nosuid,nodev,size=64m,{uid},mode=0700",
            },
            mem_limit=f"{lim.memory_mb}m",
            memswap_limit=f"{lim.memory_mb}m",
            nano_cpus=int(lim.cpus * 1e9),
            pids_limit=lim.pids,
            init=True,
            environment=dict(BASE_ENV),
            ipc_mode="private",
        )
        if self.runtime:
            kwargs["runtime"] = self.runtime
        if self.network.mode != "none":
            # Allow-listed egress is enforced by the network the caller attaches; the plain
            # bridge is never used implicitly.
            kwargs["network_mode"] = "bridge"
        return kwargs


class Sandbox:
    """A started container for one task image. Use as a context manager, or call close()."""

    def __init__(self, client: docker.DockerClient, container, options: SandboxOptions, image: str):
        self.client = client
        self.container = container
        self.options = options
        self.image = image
        self._oom_baseline = 0

    @classmethod
    def start(cls, client: docker.DockerClient, image: str, options: SandboxOptions | None = None,
              labels: Mapping[str, str] | None = None) -> "Sandbox":
        options = options or SandboxOptions()
        all_labels = {MANAGED_LABEL: "1", "envforge.image": image, **(labels or {})}
        name = f"envforge-{uuid.uuid4().hex[:12]}"
        try:
            container = client.containers.run(image, command=["sleep", "infinity"], name=name, detach=True,
                                              labels=all_labels, **options.container_kwargs())
        except docker.errors.ImageNotFound:
            raise InfraError("image_missing", f"image {image} is not built; run `envforge images build`") from None
        except (APIError, DockerException) as exc:
            raise InfraError("container_start_failed", str(exc)) from None
        sandbox = cls(client, container, options, image)
        try:
            sandbox._populate_workspace()
            sandbox._oom_baseline = sandbox._oom_kill_count()
        except BaseException:
            sandbox.close()
            raise
        return sandbox

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def id(self) -> str:
        return self.container.id

    def _populate_workspace(self) -> None:
        res = self.exec(f"cp -a {TEMPLATE_DIR}/. {WORKSPACE}/", timeout_s=120, workdir="/")
        if res.exit_code != 0:
            raise InfraError("workspace_populate_failed", res.err_text()[-500:])

    def _oom_kill_count(self) -> int:
        """The memory cgroup's OOM-kill counter (v1 oom_control or v2 memory.events)."""
        res = self._raw_exec(["/bin/sh", "-c", "cat /sys/fs/cgroup/memory/memory.oom_control "
                                               "/sys/fs/cgroup/memory.events 2>/dev/null"],
                             None, {}, "/", None, 10.0)
        m = re.search(rb"oom_kill (\d+)", res[1])
        return int(m.group(1)) if m else 0

    def exec(self, command: str, timeout_s: float | None = None, env: Mapping[str, str] | None = None,
             workdir: str = WORKSPACE, stdin: bytes | None = None, user: str | None = None) -> ExecResult:
        """Run a shell command; the whole process group is killed at the timeout.

        Raises InfraError when the container or engine fails; a non-zero exit, a timeout or
        an OOM kill of the command are ordinary results.
        """
        timeout_s = float(timeout_s if timeout_s is not None else self.options.limits.command_timeout_s)
        argv = ["timeout", "--kill-after=2", f"{timeout_s:g}", "/bin/bash", "-c", command]
        started = time.perf_counter()
        exit_code, out, err, out_trunc, err_trunc = self._raw_exec(
            argv, stdin, {**BASE_ENV, **(env or {})}, workdir, user, timeout_s + 30)
        duration = time.perf_counter() - started
        timed_out = exit_code == _TIMEOUT_EXIT or (exit_code == _KILLED_EXIT and duration >= timeout_s)
        oom = False
        if exit_code == _KILLED_EXIT and not timed_out:
            count = self._oom_kill_count()
            oom, self._oom_baseline = count > self._oom_baseline, count
        return ExecResult(exit_code, out, err, duration, timed_out, oom, out_trunc, err_trunc)

    def _raw_exec(self, argv: list[str], stdin: bytes | None, env: Mapping[str, str], workdir: str,
                  user: str | None, deadline_s: float | None,
                  cap: int | None = None) -> tuple[int, bytes, bytes, bool, bool]:
        api = self.client.api
        cap = self.options.output_cap if cap is None else cap
        try:
            exec_id = api.exec_create(self.container.id, argv, stdin=stdin is not None, stdout=True, stderr=True,
                                      environment=dict(env), workdir=workdir, user=user or "")["Id"]
            sock = api.exec_start(exec_id, socket=True)
        except NotFound:
            raise InfraError("container_vanished", f"container {self.container.short_id} is gone") from None
        except APIError as exc:
            if exc.status_code == 409:  # container is not running
                raise InfraError("container_not_running", str(exc)) from None
            raise InfraError("engine_error", str(exc)) from None
        except DockerException as exc:
            raise InfraError("engine_error", str(exc)) from None
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
        except (APIError, DockerException) as exc:
            raise InfraError("engine_error", str(exc)) from None
        if code is None:
            self._check_alive()
            raise InfraError("exec_lost", "exec finished without an exit code")
        return code, bytes(bufs[STDOUT]), bytes(bufs[STDERR]), trunc[STDOUT], trunc[STDERR]

    def _check_alive(self) -> None:
        try:
            self.container.reload()
        except NotFound:
            raise InfraError("container_vanished", f"container {self.container.short_id} is gone") from None
        if self.container.status != "running":
            raise InfraError("container_not_running", f"container is {self.container.status}")

    # -- files ---------------------------------------------------------------------------

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        """Write a file (parents created) by streaming it over exec stdin."""
        payload = data.encode() if isinstance(data, str) else data
        q = shlex.quote(path)
        res = self.exec(f"mkdir -p \"$(dirname {q})\" && cat > {q} && chmod {mode:o} {q}", stdin=payload,
                        workdir="/")
        if res.exit_code != 0:
            raise OSError(f"write_file {path}: {res.err_text().strip()}")

    def put_files(self, dest_dir: str, files: Mapping[str, bytes], mode: int = 0o644) -> None:
        """Write many files at once as one tar stream (one exec, whatever the count)."""
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
        q = shlex.quote(path)
        res = self._raw_exec(["/bin/sh", "-c", f"cat -- {q}"], None, BASE_ENV, "/", None, 60, cap=max_bytes)
        code, out, err = res[0], res[1], res[2]
        if code != 0:
            raise FileNotFoundError(f"read_file {path}: {err.decode(errors='replace').strip()}")
        return out[:max_bytes]

    def apply_patch(self, patch: str) -> str:
        """Apply a unified diff to the workspace; returns the method that worked.

        Tries `git apply`, then `git apply --reject`, then `patch --fuzz`, as the SWE-bench
        harness does. A failed `--reject` leaves hunks half-applied, so it is only tried on a
        clean tree, which is then restored before `patch` runs. Raises ValueError naming every
        method's complaint when none applies; the workspace is then as it was.
        """
        data = patch if patch.endswith("\n") else patch + "\n"
        path = "/tmp/.envforge-apply.patch"
        self.write_file(path, data)
        clean = self.exec("git status --porcelain --untracked-files=all", timeout_s=60).text().strip() == ""
        attempts = [("git_apply", f"git apply --whitespace=nowarn {path}")]
        if clean:
            attempts.append(("git_apply_reject", f"git apply --reject --whitespace=nowarn {path} "
                                                  "|| { git checkout -q -- . && git clean -fdq; exit 1; }"))
        attempts.append(("patch_fuzz", f"patch --batch --fuzz=5 -p1 --dry-run -i {path} >/dev/null "
                                       f"&& patch --batch --fuzz=5 -p1 --no-backup-if-mismatch -i {path}"))
        errors = []
        try:
            for method, cmd in attempts:
                res = self.exec(cmd, timeout_s=60)
                if res.exit_code == 0:
                    return method
                errors.append(f"{method}: {(res.err_text() or res.text()).strip()[:300]}")
        finally:
            self.exec(f"rm -f {path}", timeout_s=30, workdir="/")
        raise ValueError("patch does not apply: " + " | ".join(errors))

    def diff(self) -> str:
        """The workspace changes against the task's initial commit, as a git patch (binary-safe).

        Written to a file and read back, so the output cap on commands never truncates it.
        """
        out = "/tmp/.envforge-diff.patch"
        res = self.exec(f"git add -A && git diff --cached --binary HEAD > {out}; rc=$?; git reset -q; exit $rc",
                        timeout_s=120)
        if res.exit_code != 0:
            raise InfraError("diff_failed", res.err_text()[-300:])
        try:
            return self.read_file(out).decode("utf-8", errors="surrogateescape")
        finally:
            self.exec(f"rm -f {out}", timeout_s=30)

    def close(self) -> None:
        try:
            self.container.remove(force=True, v=True)
        except NotFound:
            pass
        except (APIError, DockerException):
            pass
