"""A task family a small model can learn on CPU in minutes: ops chores from runbooks.

Each task is a runbook-style chore in a tiny workspace: mark a deploy ready, make a script
executable, clear a stale lock, truncate a log. The instruction varies (service names,
wording, distracting details, extra files) while the fix for a chore is always the same
command, so what a policy must learn is to read which chore the runbook asks for and act,
then submit. Held-out tasks use service names never seen in training.

Demonstrations are *operator logs*: transcripts of people doing the training chores, as
recorded. Like real shell history they hold slips next to the fixes (`touch ready` for
`touch ready.flag`, `rm -f app.log` where the runbook says keep the file, `sh run.sh`
instead of restoring the mode): `operator_logs` draws, per logged session, the chore's fix
or one of its slips (seeded, at `slip_rate`). SFT imitates the logs, slips included; the
sandbox verifier tells them apart, which is what GRPO learns from.

Tasks are built in code (no files in task_sources/): they exist for the learning demo and
its test, and are graded by the same shell checkpoints as any runbook.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from envforge.task import Task, TaskSpec


@dataclass(frozen=True)
class Chore:
    name: str
    command: str
    setup: list[str]
    checks: list[dict]
    phrasings: tuple[str, ...]
    slips: tuple[str, ...]  # what a hurried operator runs instead; none of them passes the checks


CHORES = (
    Chore(
        "ready",
        "touch ready.flag",
        [],
        [{"name": "flag", "run": "test -f ready.flag"}],
        (
            "The {svc} deploy waits for a marker file. Create `ready.flag` in the workspace so it can proceed.",
            "Runbook ({svc}): before the release window, signal readiness by creating the file ready.flag.",
            "Mark {svc} as ready to deploy: the pipeline looks for `ready.flag` in /workspace.",
        ),
        ("touch ready", "touch ready.txt"),
    ),
    Chore(
        "exec",
        "chmod +x run.sh",
        ["printf '#!/bin/sh\\necho {svc} up\\n' > run.sh", "chmod 644 run.sh"],
        [{"name": "executable", "run": "test -x run.sh"}, {"name": "runs", "run": "./run.sh"}],
        (
            "The {svc} start script `run.sh` lost its executable bit after a checkout. Make it executable again.",
            "Runbook ({svc}): `./run.sh` fails with permission denied. Restore the execute permission on run.sh.",
            "{svc} will not start: run.sh is not executable. Fix the file mode.",
        ),
        ("sh run.sh", "chmod 644 run.sh"),
    ),
    Chore(
        "lock",
        "rm -f app.lock",
        ["echo 4242 > app.lock"],
        [{"name": "no-lock", "run": "test ! -e app.lock"}],
        (
            "A crashed {svc} worker left a stale `app.lock`. Remove the lock file so the worker can start.",
            "Runbook ({svc}): the service refuses to start while app.lock exists. Delete the stale lock.",
            "{svc} is stuck on a leftover lock file (app.lock). Clear it.",
        ),
        ("cat app.lock", "rm -f app.pid"),
    ),
    Chore(
        "log",
        ": > app.log",
        ["seq 1 500 | sed 's/^/{svc} request /' > app.log"],
        [{"name": "log-empty", "run": "test -f app.log && test ! -s app.log"}],
        (
            "The {svc} log `app.log` filled the disk. Truncate it to zero bytes but keep the file.",
            "Runbook ({svc}): disk alert. Empty app.log in place (do not delete it).",
            "Free space for {svc}: truncate the application log app.log, leaving an empty file.",
        ),
        ("rm -f app.log", "tail app.log"),
    ),
)
TRAIN_SERVICES = ("billing", "search", "auth", "payments", "catalog", "mailer")
HELD_OUT_SERVICES = ("ledger", "gateway", "reports")
NOTES = ("", " The on-call engineer is away.", " This happened twice this week.", " Keep other files as they are.")


def chore_task(chore: Chore, service: str, phrasing: int, note: str, split: str) -> Task:
    instruction = chore.phrasings[phrasing].format(svc=service) + note
    spec = TaskSpec.model_validate(
        {
            "id": f"chore-{chore.name}-{service}-{phrasing}",
            "source": "runbook",
            "instruction": instruction,
            "environment": {
                "image": "base",
                "setup": [s.replace("{svc}", service) for s in chore.setup] + [f"echo '{service} service' > README.md"],
                "limits": {
                    "cpus": 0.5,
                    "memory_mb": 256,
                    "workspace_mb": 32,
                    "tmp_mb": 32,
                    "pids": 64,
                    "command_timeout_s": 20,
                    "trajectory_timeout_s": 120,
                },
            },
            "verification": {"checkpoints": chore.checks},
            "reference_solution": {"commands": [chore.command]},
            "max_turns": 3,
            "tags": ["learning-demo", chore.name],
            "metadata": {"chore": chore.name, "service": service, "split": split},
        }
    )
    task = Task(spec=spec, origin=f"envforge.demos.chores:{spec.id}", base_dir=".", workspace_digest="demo")
    return task.model_copy(update={"content_hash": task.compute_content_hash()})


def chore_family(seed: int = 0, train_per_chore: int = 4, held_out_per_chore: int = 2) -> tuple[list[Task], list[Task]]:
    """(train tasks, held-out tasks); held-out tasks use services the training set never mentions."""
    rng = random.Random(seed)
    train, held = [], []
    for chore in CHORES:
        for i in range(train_per_chore):
            train.append(
                chore_task(
                    chore, TRAIN_SERVICES[i % len(TRAIN_SERVICES)], i % len(chore.phrasings), rng.choice(NOTES), "train"
                )
            )
        for i in range(held_out_per_chore):
            held.append(
                chore_task(
                    chore,
                    HELD_OUT_SERVICES[i % len(HELD_OUT_SERVICES)],
                    rng.randrange(len(chore.phrasings)),
                    rng.choice(NOTES),
                    "held_out",
                )
            )
    return train, held


def operator_logs(tasks: list[Task], seed: int = 0, slip_rate: float = 0.5, per_task: int = 2) -> list[Task]:
    """`per_task` logged sessions of each task: copies whose reference solution is the command the
    operator ran, the chore's fix or (with probability `slip_rate`, seeded) one of its slips.

    A copy's id is `<task id>.log<n>`; its checks are the task's, so a slip is graded as the
    failure it is, but the demonstration is kept as recorded."""
    if not 0.0 <= slip_rate <= 1.0:
        raise ValueError(f"slip_rate must be in [0, 1], not {slip_rate}")
    rng = random.Random(seed * 7919 + 17)
    by_name = {c.name: c for c in CHORES}
    logs = []
    for task in tasks:
        chore = by_name[task.spec.metadata["chore"]]
        for n in range(per_task):
            command = rng.choice(chore.slips) if rng.random() < slip_rate else chore.command
            spec = task.spec.model_copy(
                update={
                    "id": f"{task.spec.id}.log{n}",
                    "reference_solution": task.spec.reference_solution.model_copy(update={"commands": [command]}),
                }
            )
            log = task.model_copy(update={"spec": spec})
            logs.append(log.model_copy(update={"content_hash": log.compute_content_hash()}))
    return logs


OUTCOMES = ("fix", "slip", "other_chore", "other_command", "malformed", "no_command")


def first_command_outcome(chore_name: str, turns: list) -> str:
    """What a chore rollout's first action was, for the demo's diagnosis: the chore's `fix`, one of
    its `slip`s, another chore's command (`other_chore`), some `other_command`, a `malformed` turn
    (no parsable tool call), or a well-formed action that is not `run` (`no_command`).

    It is why a rollout failed, not whether: the reward stays the sandbox verifier's."""
    if not turns:
        return "no_command"
    first = turns[0]
    if first.parse_error or first.action is None:
        return "malformed"
    if first.action.get("name") != "run":
        return "no_command"
    command = str(first.action.get("command", "")).strip()
    chore = next(c for c in CHORES if c.name == chore_name)
    if command == chore.command:
        return "fix"
    if command in chore.slips:
        return "slip"
    if any(command == c.command or command in c.slips for c in CHORES):
        return "other_chore"
    return "other_command"
