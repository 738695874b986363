"""A rollout batch as verl's multi-turn RL data: one row per task, the way verl's `RLHFDataset`
and its tool agent loop read them.

verl samples its own rollouts, so the rows are prompts, not trajectories: each task of the batch
once, with what the episode starts from and what grading needs:

| column | |
|---|---|
| `data_source` | `envforge/<source kind>` (verl picks the reward function by it) |
| `agent_name` | `envforge_agent`: envforge's verl agent loop (`envforge_client.adapters.verl_agent_loop`, one service session per trajectory) |
| `prompt` | the messages: envforge's system prompt with the tool definitions and the `<tool_call>` format, then the task's instruction, as the service's first observation starts |
| `tools` | the OpenAI tool definitions, as JSON text (for a verl tool config or a chat template's `tools=`) |
| `ability` | `agentic-coding` |
| `reward_model` | `{"style": "rule", "ground_truth": "<json: task_id, content_hash, task_set_version>"}` |
| `extra_info` | `index`, `split`, the task id and content hash, `service_url` (where the reward function grades), `max_turns`, and the batch's `batch_id`, `batch_samples` and `batch_pass_rate` for filtering |

The agent loop steps each tool call in a session of the exact task version (task id and content hash
from `extra_info`), returns the observations to the model and verifies at the end; the reward function
`envforge_client.adapters.verl_reward.compute_score` (or `compute_score_batch`) reads that session's
result. `tools_kwargs` stays empty: the loop, not verl's per-call tool instances, holds the session.
"""

from __future__ import annotations

import io
import json
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Mapping

import polars as pl
from envforge_client.prompts import TOOLS, system_message, user_message

from envforge.objectstore import write_url
from envforge.rollout.trajectory import Trajectory

AGENT_NAME = "envforge_agent"  # registered by envforge_client.adapters.verl_agent_loop
ABILITY = "agentic-coding"


def verl_rows(
    trajectories: Iterable[Trajectory],
    service_url: str,
    splits: Mapping[str, str] | None = None,
    max_turns: Mapping[str, int] | None = None,
) -> list[dict[str, Any]]:
    """One row per task of the trajectories (ordered by task id); `splits` by task id (from the task set's
    tiers), `max_turns` by content hash (from the catalog)."""
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        by_task[t.task_id].append(t)
    rows = []
    for index, task_id in enumerate(sorted(by_task)):
        group = by_task[task_id]
        first = group[0]
        truth = {"task_id": task_id, "content_hash": first.content_hash, "task_set_version": first.task_set_version}
        rows.append(
            {
                "data_source": f"envforge/{first.source or 'task'}",
                "agent_name": AGENT_NAME,
                "prompt": [
                    {"role": "system", "content": system_message()},
                    {"role": "user", "content": user_message(first.instruction)},
                ],
                "tools": json.dumps(TOOLS),
                "ability": ABILITY,
                "reward_model": {"style": "rule", "ground_truth": json.dumps(truth, sort_keys=True)},
                "extra_info": {
                    "index": index,
                    "split": (splits or {}).get(task_id, "train"),
                    "task_id": task_id,
                    "content_hash": first.content_hash,
                    "task_set_version": first.task_set_version,
                    "service_url": service_url,
                    "max_turns": int((max_turns or {}).get(first.content_hash, 0)),
                    "batch_id": first.batch_id,
                    "batch_samples": len(group),
                    "batch_pass_rate": sum(1 for t in group if t.resolved) / len(group),
                },
            }
        )
    return rows


def write_verl_parquet(rows: list[dict[str, Any]], path: str | Path) -> int:
    buf = io.BytesIO()
    pl.DataFrame(rows).write_parquet(buf)
    write_url(str(path), buf.getvalue())  # a path or an object-store URL, with the store's credentials
    return len(rows)
