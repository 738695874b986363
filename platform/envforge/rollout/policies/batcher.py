"""Concurrent requests of the policy server, sampled together in padded batches.

One generation per forward pass wastes the model: a batch of B rows costs little more than
one row per decoding step. Requests wait in a queue; a single worker takes what is queued
(waiting up to `wait_s` for more when fewer than `max_rows` sequences are there), runs one
`generate_batch` for all of them in a thread, and hands each request its rows back. A batch
holds the policy's lock from its first token to its last, so `/v1/reload` swaps the weights
between batches, never inside one, and every row of a batch reports the same version.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from envforge.observe import metrics as live
from envforge.rollout.policies.hf import SamplingRow, TokenCallback


class BatchSampler(Protocol):
    def generate_batch(
        self,
        rows: list[SamplingRow],
        on_token: TokenCallback | None = None,
    ) -> tuple[list[Any], int]: ...


@dataclass
class _Job:
    rows: list[SamplingRow]
    on_token: Callable[[int, int, float, list[tuple[int, float]] | None], None] | None
    done: asyncio.Future = field(repr=False)


@dataclass
class BatchStats:
    """What the batches were: how many, how many rows in all, and the largest."""

    batches: int = 0
    rows: int = 0
    max_rows: int = 0

    def as_dict(self) -> dict[str, float]:
        return {
            "batches": self.batches,
            "rows": self.rows,
            "max_rows": self.max_rows,
            "mean_rows": round(self.rows / self.batches, 3) if self.batches else 0.0,
        }


class Batcher:
    """Batches the sampling rows of concurrent requests (see the module docstring).

    `max_rows` = 1 turns batching off: one request at a time, what the server did before
    (the benchmark's serialized baseline). The worker starts on the first request's loop."""

    def __init__(self, sampler: BatchSampler, *, max_rows: int = 16, wait_s: float = 0.005) -> None:
        if max_rows < 1:
            raise ValueError("max_rows must be >= 1")
        self.sampler = sampler
        self.max_rows = max_rows
        self.wait_s = wait_s
        self.stats = BatchStats()
        self._pending: deque[_Job] = deque()
        self._arrived: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None

    async def submit(
        self,
        rows: list[SamplingRow],
        on_token: Callable[..., None] | None = None,
    ) -> tuple[list[Any], int]:
        """Sample `rows` in the next batch: (their generations, the policy version). `on_token(row, token,
        logprob, top)` is called on this event loop as each token of one of these rows is drawn."""
        loop = asyncio.get_running_loop()
        if self._worker is None or self._worker.done() or self._worker.get_loop() is not loop:
            self._arrived = asyncio.Event()
            self._worker = loop.create_task(self._run())
        job = _Job(rows, on_token, loop.create_future())
        self._pending.append(job)
        assert self._arrived is not None
        self._arrived.set()
        return await job.done

    def _take(self) -> list[_Job]:
        jobs: list[_Job] = []
        size = 0
        while self._pending and (not jobs or size + len(self._pending[0].rows) <= self.max_rows):
            job = self._pending.popleft()
            if job.done.cancelled():
                continue
            jobs.append(job)
            size += len(job.rows)
        return jobs

    async def _gather(self) -> None:
        """Wait up to `wait_s` for more requests while the queue holds fewer than `max_rows` rows."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_s
        assert self._arrived is not None
        while sum(len(j.rows) for j in self._pending) < self.max_rows:
            left = deadline - loop.time()
            if left <= 0:
                return
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), left)
            except TimeoutError:
                return

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._arrived is not None
        while True:
            if not self._pending:
                self._arrived.clear()
                await self._arrived.wait()
                continue
            if self.max_rows > 1:
                await self._gather()
            jobs = self._take()
            if not jobs:
                continue
            rows = [r for j in jobs for r in j.rows]
            owner = [(j, k) for j in jobs for k in range(len(j.rows))]

            def on_token(
                i: int, tok: int, lp: float, top: list[tuple[int, float]] | None, owner: list[tuple[_Job, int]] = owner
            ) -> None:
                job, k = owner[i]
                if job.on_token is not None:
                    loop.call_soon_threadsafe(job.on_token, k, tok, lp, top)

            self.stats.batches += 1
            self.stats.rows += len(rows)
            self.stats.max_rows = max(self.stats.max_rows, len(rows))
            live.policy_batch(len(rows))
            try:
                gens, version = await asyncio.to_thread(self.sampler.generate_batch, rows, on_token)
            except Exception as exc:  # noqa: BLE001 - every request of the batch gets the error (a 500)
                for job in jobs:
                    if not job.done.done():
                        job.done.set_exception(exc)
                continue
            start = 0
            for job in jobs:
                if not job.done.done():
                    # after the token callbacks already queued on this loop, so a stream sees every token first
                    loop.call_soon(_resolve, job.done, (gens[start : start + len(job.rows)], version))
                start += len(job.rows)


def _resolve(future: asyncio.Future, result: Any) -> None:
    if not future.done():  # a client that went away cancelled it
        future.set_result(result)
