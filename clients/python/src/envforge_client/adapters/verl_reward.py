"""verl's reward function for envforge tasks: grade a response on the environment service.

Point verl at it (``custom_reward_function.path=<this file>``, ``custom_reward_function.name=
compute_score``) with data from ``envforge rollout-export --format verl``. For each response it
opens a session on the exact task version (content hash from the row's ground truth), replays the
response's ``<tool_call>`` blocks in order, grades the final state on a pristine copy, and closes
the session. The episode is deterministic, so replaying the actions grades what the model did.

The service URL comes from the row (``extra_info.service_url``) or ``ENVFORGE_SERVICE_URL``; the
API key only from ``ENVFORGE_API_KEY`` (keys never travel in data files). An infrastructure fault is
retried on a fresh session; when the retries run out it raises rather than score the response 0.0,
because a lost sandbox is not a model failure.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from envforge_client.client import KEY_VARIABLE
from envforge_client.client import Client as EnvforgeClient
from envforge_client.errors import ServiceUnavailable, SessionLost
from envforge_client.prompts import tool_call_blocks

INFRA_RETRIES = 3


def _grade_once(client: EnvforgeClient, truth: dict[str, Any], blocks: list[str]) -> dict[str, Any]:
    with client.create_session(task_id=truth.get("task_id"), content_hash=truth.get("content_hash")) as session:
        steps = 0
        for block in blocks:
            if session.done:
                break
            session.step(text=block)
            steps += 1
        result = session.result if session.done else session.verify().result
    return {
        "score": float(result.reward),
        "resolved": bool(result.resolved),
        "steps": steps,
        "submitted": bool(session.done),
        "reasons": ";".join(result.reasons),
    }


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None, **kwargs: Any
) -> dict[str, Any]:
    """verl's reward signature; returns {"score": reward, ...} (verl logs the other keys)."""
    truth = json.loads(ground_truth) if isinstance(ground_truth, str) else dict(ground_truth)
    if not os.environ.get(KEY_VARIABLE):
        raise RuntimeError(f"{KEY_VARIABLE} is not set: the reward function needs an envforge service key")
    blocks = tool_call_blocks(solution_str)
    last: Exception | None = None
    with EnvforgeClient((extra_info or {}).get("service_url")) as client:  # else ENVFORGE_SERVICE_URL
        for attempt in range(INFRA_RETRIES):
            try:
                return _grade_once(client, truth, blocks)
            except (SessionLost, ServiceUnavailable) as exc:
                last = exc
                time.sleep(min(8.0, 0.5 * 2**attempt))
    raise RuntimeError(
        f"envforge could not grade {truth.get('task_id')} after {INFRA_RETRIES} attempts "
        f"(infrastructure, not the model): {last}"
    )
