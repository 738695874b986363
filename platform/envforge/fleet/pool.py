"""The fleet behind the sandbox-pool interface the rollout scheduler, the grader and the gate use.

`FleetSandboxPool` has `SandboxPool`'s face (acquire / release / preheat, their asyncio twins,
`stats`), and hands out `RemoteSandbox`es with `Sandbox`'s face (exec, write_file, apply_patch,
diff, reset, ...). Each method is one call to the agent on the sandbox's node. So
`RolloutScheduler`, `RolloutEnv`, `Grader` and `validate_task` run on the fleet unchanged: the
stages get one per unit of work from `provider.FleetSandboxProvider`.

    dispatcher = FleetDispatcher(FleetConfig.from_env()).start()
    pool = FleetSandboxPool(dispatcher)
    pool.register(tasks_and_images)          # recipes (build on a node) and queue demand (pre-heat)
    run_batch(settings, items, policy, config, pool=pool)
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any, Iterable, Mapping, Sequence

from envforge.config import Settings
from envforge.errors import InfraError
from envforge.fleet.dispatcher import FleetDispatcher, NodeState
from envforge.fleet.images import ImageRecipe, parent_of
from envforge.sandbox.container import INITIAL, ExecResult, PythonCommand, SandboxOptions, Snapshot, run_blocking
from envforge.sandbox.pool import PoolStats
from envforge.task import Task


class RemoteSandbox:
    """A sandbox leased on a fleet node. Methods mirror `Sandbox`; faults mirror its faults."""

    def __init__(self, pool: "FleetSandboxPool", node: NodeState, lease: str, image: str, options: SandboxOptions):
        self._pool, self.node, self.lease, self.image, self.options = pool, node, lease, image, options
        self.tainted: str | None = None
        self.agent_alive = True

    @property
    def id(self) -> str:
        return f"{self.node.name}/{self.lease[:12]}"

    def _call(self, method: str, *args, **kwargs) -> Any:
        return self._pool.dispatcher.call(self.node, "call", self.lease, method, args, kwargs)

    async def _acall(self, method: str, *args, **kwargs) -> Any:
        return await self._pool.dispatcher.acall(self.node, "call", self.lease, method, args, kwargs)

    def exec(
        self,
        command: str,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
        stdin: bytes | None = None,
        on_output=None,
        output_cap: int | None = None,
        report: bool = False,
        python: PythonCommand | None = None,
    ) -> ExecResult:
        if on_output is not None:
            raise ValueError("streaming output (on_output) is not available on fleet sandboxes")
        return self._call("exec", command, **_exec_kwargs(timeout_s, env, workdir, stdin, output_cap, report, python))

    async def aexec(
        self,
        command: str,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
        stdin: bytes | None = None,
        output_cap: int | None = None,
        report: bool = False,
        python: PythonCommand | None = None,
    ) -> ExecResult:
        return await self._acall(
            "exec", command, **_exec_kwargs(timeout_s, env, workdir, stdin, output_cap, report, python)
        )

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        self._call("write_file", path, data, mode)

    def put_files(self, dest_dir: str, files: Mapping[str, bytes], mode: int = 0o644) -> None:
        self._call("put_files", dest_dir, dict(files), mode)

    def read_file(self, path: str, max_bytes: int = 64 << 20) -> bytes:
        return self._call("read_file", path, max_bytes)

    def apply_patch(self, patch: str) -> str:
        return self._call("apply_patch", patch)

    def diff(self, kill_processes: bool = True) -> str:
        return self._call("diff", kill_processes)

    async def adiff(self) -> str:
        return await self._acall("diff")

    def changed_paths(self, patched_copy: bool = False) -> list[str]:
        return self._call("changed_paths", patched_copy)

    def restore_paths(self, paths: list[str]) -> None:
        self._call("restore_paths", list(paths))

    def restore_git_dir(self) -> None:
        self._call("restore_git_dir")

    def install_files(self, dest: str, files: Mapping[str, bytes], mode: int = 0o644) -> None:
        self._call("install_files", dest, dict(files), mode)

    def kill_processes(self) -> int:
        return self._call("kill_processes")

    def snapshot(self) -> Snapshot:
        return self._call("snapshot")

    def reset(self, snapshot: Snapshot = INITIAL) -> float:
        return self._call("reset", snapshot)

    async def areset(self, snapshot: Snapshot = INITIAL) -> float:
        return await self._acall("reset", snapshot)

    def ping(self) -> bool:
        try:
            return bool(self._call("ping"))
        except InfraError:
            return False

    def close(self) -> None:
        self._pool.release(self)

    release = close

    async def aclose(self) -> None:
        await self._pool.arelease(self)


def _exec_kwargs(timeout_s, env, workdir, stdin, output_cap, report, python) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "timeout_s": timeout_s,
        "env": dict(env) if env else None,
        "stdin": stdin,
        "output_cap": output_cap,
        "report": report,
    }
    if workdir is not None:
        kwargs["workdir"] = workdir
    if python is not None:  # the command said as data: the node's agent may fork it (sandbox/forkserver.py)
        kwargs["python"] = python
    return kwargs


class FleetSandboxPool:
    """`SandboxPool`'s interface over a fleet of nodes."""

    def __init__(self, dispatcher: FleetDispatcher):
        self.dispatcher = dispatcher
        self.client = None  # no local engine: the Grader and scheduler never need one with this pool
        self.stats = PoolStats()
        self._lock = threading.Lock()
        self._demand: Counter[str] = Counter()
        self._options: dict[str, SandboxOptions] = {}
        self._released: set[str] = set()

    # -- the queue -------------------------------------------------------------------------

    def register(
        self,
        items: Iterable[tuple[Task, str]],
        samples_per_task: int = 1,
        local_client: Any = None,
        settings: Settings | None = None,
    ) -> None:
        """Learn the batch ahead: build recipes of the task images (so a node lacking one builds it) and
        the queue's demand per image (so nodes pre-heat). `local_client`, the driver's own engine when
        it has one, supplies the parent tag of each image (a base or a repository's env layer, which
        nodes receive from a holder: `auto` transfers what has no recipe); `settings` say where
        envforge's commit store is (a history task's workspace; default: from the environment)."""
        from envforge.verify.grader import options_for

        if local_client is not None and self.dispatcher.origin is None:
            self.dispatcher.origin = local_client
        for task, image in items:
            parent = parent_of(local_client, image) if local_client is not None else None
            if parent and image not in self.dispatcher.recipes:
                self.dispatcher.register_recipe(ImageRecipe.for_task(task, image, parent, settings))
            with self._lock:
                self._demand[image] += samples_per_task
                self._options[image] = options_for(task)
        self._announce()

    def _announce(self) -> None:
        with self._lock:
            demand = {img: (self._options[img], n) for img, n in self._demand.items() if n > 0}
        if demand:
            self.dispatcher.announce(demand)

    # -- SandboxPool's interface -----------------------------------------------------------

    def acquire(self, image: str, options: SandboxOptions | None = None) -> RemoteSandbox:
        options = options or SandboxOptions()
        node, lease, warm = self.dispatcher.acquire(image, options)
        with self._lock:
            if warm:
                self.stats.hits += 1
            else:
                self.stats.misses += 1
            if self._demand[image] > 0:
                self._demand[image] -= 1
            announce = self._demand[image] == 0 or (self.stats.hits + self.stats.misses) % 16 == 0
        if announce:
            self._announce()
        return RemoteSandbox(self, node, lease, image, options)

    def release(self, sandbox: RemoteSandbox) -> None:
        with self._lock:
            if sandbox.lease in self._released:
                return
            self._released.add(sandbox.lease)
        self.dispatcher.release(sandbox.node, sandbox.lease)
        with self._lock:
            self.stats.resets += 1

    def preheat(self, image: str, options: SandboxOptions | None = None, count: int = 1) -> int:
        options = options or SandboxOptions()
        with self._lock:
            self._options[image] = options
        self.dispatcher.announce({image: (options, count)})
        return 0  # nodes start them in the background

    def idle_count(self, image: str | None = None) -> int:
        self.dispatcher.refresh()
        return sum(
            n for node in self.dispatcher.alive_nodes() for img, n in node.idle.items() if image is None or img == image
        )

    def wait_for_engine(self, timeout_s: float = 120.0) -> float:
        """The scheduler's wait after an infrastructure fault. On the fleet a lost engine or node is
        the dispatcher's business (the node cools down, work goes elsewhere), so there is nothing to
        wait for here: returns 0 at once, as `SandboxPool.wait_for_engine` does when its engine answers."""
        return 0.0

    def close(self) -> None:
        self.dispatcher.close()

    def __enter__(self) -> "FleetSandboxPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    async def aacquire(self, image: str, options: SandboxOptions | None = None) -> RemoteSandbox:
        return await run_blocking(self.acquire, image, options)

    async def arelease(self, sandbox: RemoteSandbox) -> None:
        await run_blocking(self.release, sandbox)

    async def apreheat(self, image: str, options: SandboxOptions | None = None, count: int = 1) -> int:
        return self.preheat(image, options, count)


def seed_images(pool: FleetSandboxPool, local_client: Any, tags: Sequence[str]) -> int:
    """Push images from the driver's engine to nodes that have none of their own yet (first use of a
    fresh cluster): after this every node can build task layers over the base, or pass images on."""
    from envforge.fleet.images import export_image

    loaded = 0
    for tag in tags:
        missing = [n for n in pool.dispatcher.alive_nodes() if tag not in n.images]
        if missing:
            loaded += pool.dispatcher.push_image(tag, export_image(local_client, tag), missing)
    return loaded
