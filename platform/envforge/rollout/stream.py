"""Streaming complete groups to a trainer while rollouts continue, with bounded staleness.

    stream = GroupStream(max_staleness=1, current_version=lambda: trainer.version)
    scheduler = RolloutScheduler(..., on_group=stream.put)
    producer = asyncio.create_task(stream.run(scheduler.run(items, version)))
    async for group in stream:            # complete groups only, as they finish
        trainer.step(group)               # may bump trainer.version
    report = await producer

A group is *stale* when the oldest policy checkpoint that produced it is more than
`max_staleness` versions behind the trainer's current one; stale groups are not yielded (they
stay in the store) and are counted in `stream.stale`, so off-policy drift is bounded and
visible. `max_staleness=0` is strictly on-policy.

A trainer that updates on whole rollout batches (one GRPO round) reads `stream.batches()`
instead: the producer calls `end_batch(batch_id)` after each scheduler run, and the trainer
gets (batch id, that batch's fresh groups) once all of them have arrived, so a group the
scheduler dropped (infrastructure faults) never leaves the trainer waiting for it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable

from envforge.rollout.trajectory import Trajectory

_DONE = object()


@dataclass(frozen=True)
class _BatchEnd:
    batch_id: str


class GroupStream:
    def __init__(self, max_staleness: int = 1, current_version: Callable[[], int] = lambda: 0, maxsize: int = 0):
        if max_staleness < 0:
            raise ValueError("max_staleness must be >= 0")
        self.max_staleness = max_staleness
        self.current_version = current_version
        self._queue: asyncio.Queue = asyncio.Queue(maxsize)
        self.yielded = 0
        self.stale: list[dict[str, Any]] = []

    async def put(self, group: list[Trajectory]) -> None:
        """The scheduler's `on_group` callback; with maxsize > 0 it applies back-pressure."""
        await self._queue.put(group)

    async def end_batch(self, batch_id: str) -> None:
        """Mark the end of one scheduler run's groups (for `batches()`)."""
        await self._queue.put(_BatchEnd(batch_id))

    async def close(self) -> None:
        await self._queue.put(_DONE)

    async def run(self, producer: Awaitable[Any]) -> Any:
        """Await the producer (a scheduler run) and close the stream after it, whatever happens."""
        try:
            return await producer
        finally:
            await self.close()

    def is_stale(self, group: list[Trajectory]) -> bool:
        oldest = min(t.policy_version for t in group)
        return self.current_version() - oldest > self.max_staleness

    def _fresh(self, group: list[Trajectory]) -> bool:
        if self.is_stale(group):
            self.stale.append(
                {
                    "task_id": group[0].task_id,
                    "batch_id": group[0].batch_id,
                    "policy_version": min(t.policy_version for t in group),
                    "trainer_version": self.current_version(),
                }
            )
            return False
        self.yielded += 1
        return True

    async def __aiter__(self) -> AsyncIterator[list[Trajectory]]:
        while True:
            group = await self._queue.get()
            if group is _DONE:
                return
            if isinstance(group, _BatchEnd) or not self._fresh(group):
                continue
            yield group

    async def batches(self) -> AsyncIterator[tuple[str, list[list[Trajectory]]]]:
        """(batch id, its groups that are not stale) per `end_batch`, staleness judged when the
        batch is handed over, i.e. against the trainer version that will train on it."""
        pending: list[list[Trajectory]] = []
        while True:
            item = await self._queue.get()
            if item is _DONE:
                return
            if isinstance(item, _BatchEnd):
                fresh = [g for g in pending if self._fresh(g)]
                pending = []
                yield item.batch_id, fresh
            else:
                pending.append(item)
