"""verl's reward functions for envforge tasks.

Multi-turn rows (`agent_name: envforge_agent`, what `envforge rollout-export --format verl` writes) are
graded during the rollout: the `envforge_agent` loop (`verl_agent_loop`) steps one session per
trajectory, verifies it and records the result in the output's `reward_scores`, which verl passes to
the reward function as `extra_info["rollout_reward_scores"]`. `compute_score` (verl's per-sample
signature, for its default reward loop) and `compute_score_batch` (the `batch` reward manager's
signature) only read that result: nothing is replayed and no sandbox is opened.

    reward.custom_reward_function.path=<this file> reward.custom_reward_function.name=compute_score
    # or, with reward_manager=batch: ...name=compute_score_batch

`compute_score_by_replay` is for single-turn data (verl's `single_turn_agent`, where one response
holds every `<tool_call>`): it opens a session on the exact task version (content hash from the
row's ground truth), replays the response's `<tool_call>` blocks in order, grades the final state on
a pristine copy, and closes the session. The episode is deterministic, so replaying the actions grades
what the model did. Its service URL comes from the row (`extra_info.service_url`) or
`ENVFORGE_SERVICE_URL`; the API key only from `ENVFORGE_API_KEY` (keys never travel in data files).
An infrastructure fault is retried on a fresh session; when the retries run out it raises rather than
score the response 0.0, because a lost sandbox is not a model failure.
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
RESULT_KEY = "envforge"  # the envforge_agent loop's entry in extra_info["rollout_reward_scores"]


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


def compute_score_by_replay(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None, **kwargs: Any
) -> dict[str, Any]:
    """verl's reward signature for single-turn data; returns {"score": reward, ...} (verl logs the other keys)."""
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


def _session_result(extra_info: dict[str, Any] | None) -> dict[str, Any]:
    """The result the envforge_agent loop recorded for this response."""
    info = extra_info or {}
    # verl hands the loop's `reward_scores` over as `rollout_reward_scores` when it scores the batch after
    # the rollout, and inside the loop's own extra fields (merged into extra_info) when it scores each
    # trajectory as it finishes (its reward-loop workers).
    recorded = (info.get("rollout_reward_scores") or {}).get(RESULT_KEY) or (info.get("reward_scores") or {}).get(
        RESULT_KEY
    )
    if not recorded:
        raise ValueError(
            f"row {info.get('index')!r} ({info.get('task_id')}): extra_info has no {RESULT_KEY!r} session result "
            "in rollout_reward_scores or reward_scores; "
            "roll it out with agent_name envforge_agent "
            "(verl_agent_loop.yaml as agent.agent_loop_config_path), or grade single-turn responses "
            "with compute_score_by_replay"
        )
    return {k: recorded[k] for k in ("score", "resolved", "steps", "submitted", "reasons")}


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None, **kwargs: Any
) -> dict[str, Any]:
    """verl's per-sample reward signature: the verified result of the response's session."""
    return _session_result(extra_info)


def compute_score_batch(
    data_sources: list[str],
    solution_strs: list[str],
    ground_truths: list[str],
    extra_infos: list[dict[str, Any] | None],
    **kwargs: Any,
) -> list[dict[str, Any]]:
    """verl's `batch` reward manager signature: one result per response, from the sessions' results."""
    return [_session_result(info) for info in extra_infos]
