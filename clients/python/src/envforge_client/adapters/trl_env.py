"""TRL's documented agentic route on envforge: an `environment_factory` for `GRPOTrainer` (TRL 1.16+).

    from envforge_client.adapters.trl_env import EnvforgeEnvironments, tool_task_dataset
    with Client(url, key) as client, EnvforgeEnvironments(client, max_turns=8) as environments:
        trainer = GRPOTrainer(model=..., processing_class=tokenizer, args=GRPOConfig(...),
                              train_dataset=tool_task_dataset(client, "main"), environment_factory=environments)
        trainer.train()

TRL builds one `EnvforgeToolEnv` per concurrent rollout (calling the factory without arguments) and reuses
it across steps: `reset(**row)` gets the dataset row and opens one service session for the episode; the
public methods `run`, `read_file`, `write_file`, `apply_patch` and `submit` are the tools (TRL renders their
type hints and docstrings into the prompt's tool schema) and each is one step of that session; `get_reward`
is the verified reward (the submission's grade, else a verify of the workspace as the episode left it),
after which the session is closed. No reward function is needed: TRL logs it as `rewards/EnvforgeToolEnv`.

Infrastructure faults (the session lost, the service unreachable, a quota or key refused) are never scored:
the tool call that met one re-raises it (TRL shows the model an error), and `get_reward` then raises `EpisodeFault`,
which stops the training step. TRL turns a reward of `None` into NaN and then sums rewards with nansum, so
"no reward" would train as 0; failing loudly is the only honest answer it allows. A request the model's
own call made invalid (too large, refused as invalid) is not a fault: the model gets the error as the
tool's answer, as it gets a malformed action's.
"""

from __future__ import annotations

from typing import Any

from envforge_client.client import Client, Session
from envforge_client.errors import RequestTooLarge, ServiceError
from envforge_client.models import VerifyResult
from envforge_client.prompts import SYSTEM_PROMPT


class EpisodeFault(RuntimeError):
    """An episode met an infrastructure fault, so it has no reward (a 0 would train on the fault)."""


def tool_task_dataset(client: Client, task_set: str, split: str | None = None) -> Any:
    """A `datasets.Dataset` with one row per task of `task_set` (optionally one `split`), for
    `environment_factory`: the prompt is the system prompt and an empty user turn, which `reset` fills
    with the session's first observation (the instruction and the repository's files), as envforge's
    own rollouts do; the other columns name the exact task version that `reset` opens."""
    import datasets

    listing = client.tasks(task_set)
    rows = [
        {
            "prompt": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": ""}],
            "task_id": t.task_id,
            "content_hash": t.content_hash,
            "task_set_version": listing.task_set.version,
        }
        for t in listing.tasks
        if split is None or t.split in (split, None)
    ]
    if not rows:
        raise ValueError(f"task set {task_set!r} has no tasks" + (f" in split {split!r}" if split else ""))
    return datasets.Dataset.from_list(rows)


class EnvforgeToolEnv:
    """One rollout's environment: a service session per episode, the five envforge actions as tools.

    Only `reset`, `get_reward` and the tools are public: TRL exposes every other public method as a tool."""

    def __init__(self, client: Client, max_turns: int | None = None, episodes: list[dict[str, Any]] | None = None):
        self._client, self._max_turns = client, max_turns
        self._episodes = episodes if episodes is not None else []
        self._session: Session | None = None
        self._fault: ServiceError | None = None
        self._turns = 0

    def reset(
        self, task_id: str, content_hash: str | None = None, task_set_version: str | None = None, **row: Any
    ) -> str:
        """Open the episode's session on the row's task; its first observation becomes the user turn."""
        self._close()  # a session the previous episode left open (a step that failed before get_reward)
        self._fault, self._turns = None, 0
        self._session = self._client.create_session(
            task_id=task_id, task_set=task_set_version, content_hash=content_hash, max_turns=self._max_turns
        )
        return self._session.observation.text

    # -- the tools (their docstrings and type hints are the schema the model sees) --------------------

    def run(self, command: str, timeout_s: float | None = None) -> str:
        """Run a shell command in /workspace and see its exit code and output.

        Args:
            command: the shell command to run
            timeout_s: seconds before the command is killed (default: the task's limit)
        """
        arguments: dict[str, Any] = {"command": command}
        if timeout_s is not None:
            arguments["timeout_s"] = timeout_s
        return self._act("run", arguments)

    def read_file(self, path: str) -> str:
        """Read a text file.

        Args:
            path: the file's path, relative to /workspace
        """
        return self._act("read_file", {"path": path})

    def write_file(self, path: str, content: str) -> str:
        """Create or overwrite a file.

        Args:
            path: the file's path, relative to /workspace
            content: the file's new text
        """
        return self._act("write_file", {"path": path, "content": content})

    def apply_patch(self, patch: str) -> str:
        """Apply a unified diff to /workspace.

        Args:
            patch: the unified diff
        """
        return self._act("apply_patch", {"patch": patch})

    def submit(self) -> str:
        """Finish: the current state of /workspace is graded."""
        return self._act("submit", {})

    # -- the reward -------------------------------------------------------------------------------------

    def get_reward(self) -> float:
        """The verifier's reward for the episode; the session is closed either way."""
        session = self._session
        if session is None:
            raise RuntimeError("get_reward() before reset(): no episode to grade")
        try:
            if self._fault is not None:
                raise EpisodeFault(
                    f"session {session.id} (task {session.info.task_id}) met an infrastructure fault, so it has no "
                    f"reward: {self._fault}"
                ) from self._fault
            try:
                result = session.result if session.done and session.result is not None else session.verify().result
            except ServiceError as exc:
                raise EpisodeFault(f"session {session.id} could not be graded: {exc}") from exc
            if result.infra_error:
                raise EpisodeFault(
                    f"session {session.id} was graded through an infrastructure fault: {result.infra_error}"
                )
            self._record(session, result)
            return float(result.reward)
        finally:
            self._close()

    # -- internals --------------------------------------------------------------------------------------

    def _act(self, name: str, arguments: dict[str, Any]) -> str:
        session = self._session
        if session is None:
            raise RuntimeError("a tool call before reset(): no episode is running")
        if session.done:
            return "The episode has ended; nothing more runs. Its result is graded as it stands."
        try:
            out = session.step(name=name, arguments=arguments)
        except ServiceError as exc:
            if isinstance(exc, RequestTooLarge) or exc.code == "invalid_request":
                return f"error: {exc.message}"  # the request the model made: it sees why, and goes on
            self._fault = exc  # not the model's doing: get_reward refuses to score the episode
            raise
        self._turns = out.turn
        return out.observation.text

    def _record(self, session: Session, result: VerifyResult) -> None:
        self._episodes.append(
            {
                "session_id": session.id,
                "task_id": session.info.task_id,
                "turns": self._turns,
                "submitted": session.done,
                "reward": float(result.reward),
                "resolved": result.resolved,
                "reasons": list(result.reasons),
            }
        )

    def _close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            session.close()


class EnvforgeEnvironments:
    """The `environment_factory`: each call makes one `EnvforgeToolEnv` on a shared client.

    It remembers what it made, so `close()` (or leaving the `with` block) closes every session still open
    when training stops early; `episodes` lists what every graded episode did (session id, turns, reward)."""

    def __init__(self, client: Client, max_turns: int | None = None):
        self.client, self.max_turns = client, max_turns
        self.environments: list[EnvforgeToolEnv] = []
        self.episodes: list[dict[str, Any]] = []

    def __call__(self) -> EnvforgeToolEnv:
        environment = EnvforgeToolEnv(self.client, self.max_turns, self.episodes)
        self.environments.append(environment)
        return environment

    def close(self) -> None:
        for environment in self.environments:
            environment._close()

    def __enter__(self) -> "EnvforgeEnvironments":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
