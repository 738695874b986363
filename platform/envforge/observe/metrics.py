"""envforge's process-wide Prometheus metrics: sandbox pool, agent commands, scheduler, verifier,
gate and training, in one registry that every /metrics endpoint of the process exposes.

Conventions (https://prometheus.io/docs/practices/naming/): `envforge_<area>_<what>_<unit>`,
seconds for time, `_total` for counters; label values come from small fixed sets (fault causes,
outcomes, reason kinds, command paths), never task, trajectory or container ids: those belong to
logs and traces (`observe.logs`, `observe.traces`).

`ENVFORGE_METRICS=0` (or `set_enabled(False)`) turns every hook into a return: the benchmark's
"off" arm, and a way out if a process cannot afford the locks.
"""

from __future__ import annotations

from typing import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from envforge.settings import read_env

REGISTRY = CollectorRegistry(auto_describe=True)

# Container starts ~0.3 s, resets ~20 ms, agent commands ~1.5 ms, gradings seconds: one bucket set
# that resolves all of them.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
MAX_LABEL_CHARS = 48  # reason kinds are short words; anything longer is cut so a label set stays bounded

_enabled: bool = read_env().metrics


def enabled() -> bool:
    return _enabled


def set_enabled(on: bool) -> None:
    """Switch every hook on or off for this process (the registry keeps what it counted)."""
    global _enabled
    _enabled = bool(on)


def reason_kind(reason: str) -> str:
    """The bounded part of a reason: 'protected_path_modified:src/x.py' -> 'protected_path_modified'."""
    kind = (reason or "none").split(":", 1)[0].strip() or "none"
    return kind[:MAX_LABEL_CHARS]


def _h(name: str, doc: str, labels: tuple[str, ...] = ()) -> Histogram:
    return Histogram(name, doc, labels, buckets=LATENCY_BUCKETS, registry=REGISTRY)


# -- sandbox pool and runtime ------------------------------------------------------------------
POOL_IDLE = Gauge("envforge_pool_idle_sandboxes", "started sandboxes waiting warm in the pools", registry=REGISTRY)
POOL_IN_USE = Gauge("envforge_pool_in_use_sandboxes", "sandboxes handed out and not yet released", registry=REGISTRY)
POOL_ACQUIRES = Counter(
    "envforge_pool_acquires_total", "acquires, by whether a warm sandbox served them", ["result"], registry=REGISTRY
)  # result: hit | miss
POOL_START_SECONDS = _h("envforge_pool_start_seconds", "container start time (create, start, agent, initial state)")
POOL_START_FAILURES = Counter(
    "envforge_pool_start_failures_total", "container starts that failed", ["cause"], registry=REGISTRY
)
POOL_RESET_SECONDS = _h("envforge_pool_reset_seconds", "time to reset a released sandbox to its initial state")
POOL_DESTROYED = Counter(
    "envforge_pool_destroyed_total",
    "sandboxes destroyed, by why (taint kind, reset failure, pool full, trimmed, closed)",
    ["cause"],
    registry=REGISTRY,
)
SANDBOX_COMMAND_SECONDS = _h(
    "envforge_sandbox_command_seconds",
    "command latency seen by the host (agent channel, or docker exec when the agent is unavailable)",
    ("path",),
)

# -- sandbox fleet (the pool metrics above come from each node agent's own pool; these are the fleet's) --
FLEET_ALIVE_NODES = Gauge("envforge_fleet_alive_nodes", "sandbox nodes this driver can place on", registry=REGISTRY)
FLEET_NODES_LOST = Counter(
    "envforge_fleet_nodes_lost_total", "sandbox nodes this driver saw die or leave", registry=REGISTRY
)
FLEET_ACQUIRE_WAIT_SECONDS = _h(
    "envforge_fleet_acquire_wait_seconds",
    "time an acquire waited for a node with room (backpressure); 0 when one had room at once",
)
FLEET_LEASES = Gauge(
    "envforge_fleet_leased_sandboxes", "sandboxes a node agent has leased to drivers now", registry=REGISTRY
)
FLEET_LEASES_RECLAIMED = Counter(
    "envforge_fleet_leases_reclaimed_total",
    "leases a node agent took back from silent or idle drivers",
    registry=REGISTRY,
)
FLEET_IMAGES = Counter(
    "envforge_fleet_images_total", "task images a node agent got, by how", ["how"], registry=REGISTRY
)  # how: built | loaded

# -- rollout scheduler -------------------------------------------------------------------------
SCHED_QUEUED = Gauge(
    "envforge_scheduler_queued_trajectories", "trajectories waiting for a concurrency slot", registry=REGISTRY
)
SCHED_IN_FLIGHT = Gauge("envforge_scheduler_in_flight_trajectories", "trajectories running now", registry=REGISTRY)
SCHED_STEPS = Counter("envforge_scheduler_steps_total", "policy turns executed in sandboxes", registry=REGISTRY)
SCHED_TRAJECTORIES = Counter(
    "envforge_scheduler_trajectories_total", "trajectories finished, by end reason", ["end_reason"], registry=REGISTRY
)
SCHED_TRAJECTORY_SECONDS = _h("envforge_scheduler_trajectory_seconds", "a trajectory's wall time, reset to grade")
SCHED_RETRIES = Counter(
    "envforge_scheduler_retries_total",
    "trajectories restarted on a fresh sandbox, by fault class",
    ["fault"],
    registry=REGISTRY,
)
SCHED_DROPPED_GROUPS = Counter(
    "envforge_scheduler_dropped_groups_total", "groups dropped after a sample's retry budget ran out", registry=REGISTRY
)
SCHED_REWARD = Histogram(
    "envforge_scheduler_trajectory_reward",
    "rewards of finished trajectories",
    buckets=(0.0, 0.25, 0.5, 0.75, 1.0),
    registry=REGISTRY,
)

# -- verifier and gate ---------------------------------------------------------------------------
VERIFY_GRADINGS = Counter(
    "envforge_verifier_gradings_total",
    "gradings on a pristine copy, by outcome (resolved | unresolved | infra_error) and first reason kind",
    ["outcome", "reason"],
    registry=REGISTRY,
)
VERIFY_SECONDS = _h("envforge_verifier_grading_seconds", "time of one grading, sandbox acquire included")
GATE_TASKS = Counter(
    "envforge_gate_tasks_total",
    "tasks judged by the flakiness gate, by verdict and first disagreement kind",
    ["verdict", "reason"],
    registry=REGISTRY,
)

# -- training ------------------------------------------------------------------------------------
TRAIN_STEPS = Counter("envforge_train_steps_total", "optimizer updates", ["algorithm"], registry=REGISTRY)
TRAIN_TOKENS = Counter("envforge_train_tokens_total", "completion tokens trained on", ["algorithm"], registry=REGISTRY)
TRAIN_TOKENS_PER_SECOND = Gauge(
    "envforge_train_tokens_per_second",
    "throughput of the last update: tokens (prompt and completion) through the model per second of the update itself",
    ["algorithm"],
    registry=REGISTRY,
)
TRAIN_STEP_SECONDS = _h(
    "envforge_train_step_seconds", "wall time of one optimizer update (all its micro-batches)", ("algorithm",)
)
TRAIN_LOSS = Gauge("envforge_train_loss", "loss of the last update", ["algorithm"], registry=REGISTRY)
TRAIN_EVAL_LOSS = Gauge(
    "envforge_train_eval_loss", "held-out loss at the last evaluation step (SFT)", ["algorithm"], registry=REGISTRY
)
TRAIN_REWARD_MEAN = Gauge(
    "envforge_train_reward_mean", "mean reward of the last update's samples", ["algorithm"], registry=REGISTRY
)
TRAIN_STALENESS = Gauge(
    "envforge_train_policy_staleness_versions",
    "trainer version minus the oldest behaviour version in the last update",
    ["algorithm"],
    registry=REGISTRY,
)

# -- policy server -----------------------------------------------------------------------------
POLICY_REQUEST_SECONDS = _h(
    "envforge_policy_request_seconds", "chat-completion latency of the policy server", ("status",)
)
POLICY_TOKENS = Counter(
    "envforge_policy_generated_tokens_total", "completion tokens generated by the policy server", registry=REGISTRY
)
POLICY_BATCH_ROWS = Histogram(
    "envforge_policy_batch_rows",
    "sequences sampled together in one batched generation of the policy server",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128),
    registry=REGISTRY,
)


# -- hooks (what library code calls) -------------------------------------------------------------


def pool_acquired(hit: bool) -> None:
    if _enabled:
        POOL_ACQUIRES.labels("hit" if hit else "miss").inc()
        POOL_IN_USE.inc()
        if hit:
            POOL_IDLE.dec()


def pool_released(kept: bool, reset_s: float | None = None) -> None:
    if _enabled:
        POOL_IN_USE.dec()
        if reset_s is not None:
            POOL_RESET_SECONDS.observe(reset_s)
        if kept:
            POOL_IDLE.inc()


def pool_started(seconds: float | None, failure_cause: str | None = None) -> None:
    if _enabled:
        if failure_cause is None:
            POOL_START_SECONDS.observe(seconds or 0.0)
        else:
            POOL_START_FAILURES.labels(reason_kind(failure_cause)).inc()


def pool_idle_changed(delta: int) -> None:
    if _enabled and delta:
        POOL_IDLE.inc(delta)


def pool_destroyed(cause: str) -> None:
    if _enabled:
        POOL_DESTROYED.labels(reason_kind(cause)).inc()


def fleet_nodes(alive: int, lost: int = 0) -> None:
    if _enabled:
        FLEET_ALIVE_NODES.set(alive)
        if lost:
            FLEET_NODES_LOST.inc(lost)


def fleet_acquire_waited(seconds: float) -> None:
    if _enabled:
        FLEET_ACQUIRE_WAIT_SECONDS.observe(seconds)


def fleet_leases(delta: int, reclaimed: int = 0) -> None:
    if _enabled:
        FLEET_LEASES.inc(delta)
        if reclaimed:
            FLEET_LEASES_RECLAIMED.inc(reclaimed)


def fleet_image(how: str) -> None:
    if _enabled:
        FLEET_IMAGES.labels(how).inc()


def sandbox_command(seconds: float, path: str) -> None:
    if _enabled:
        SANDBOX_COMMAND_SECONDS.labels(path).observe(seconds)


def scheduler_queued(delta: int) -> None:
    if _enabled:
        SCHED_QUEUED.inc(delta)


def scheduler_in_flight(delta: int) -> None:
    if _enabled:
        SCHED_IN_FLIGHT.inc(delta)


def trajectory_finished(end_reason: str, steps: int, seconds: float, reward: float) -> None:
    if _enabled:
        SCHED_TRAJECTORIES.labels(reason_kind(end_reason)).inc()
        SCHED_STEPS.inc(steps)
        SCHED_TRAJECTORY_SECONDS.observe(seconds)
        SCHED_REWARD.observe(reward)


def trajectory_retried(fault: str) -> None:
    if _enabled:
        SCHED_RETRIES.labels(reason_kind(fault)).inc()


def group_dropped() -> None:
    if _enabled:
        SCHED_DROPPED_GROUPS.inc()


def graded(seconds: float, resolved: bool, reasons: list[str], infra_error: str | None = None) -> None:
    if _enabled:
        outcome = "infra_error" if infra_error else "resolved" if resolved else "unresolved"
        reason = reason_kind(infra_error) if infra_error else reason_kind(reasons[0]) if reasons else "none"
        VERIFY_GRADINGS.labels(outcome, reason).inc()
        VERIFY_SECONDS.observe(seconds)


def gate_judged(accepted: bool, disagreements: list[str]) -> None:
    if _enabled:
        GATE_TASKS.labels(
            "accepted" if accepted else "quarantined", reason_kind(disagreements[0]) if disagreements else "none"
        ).inc()


ALGORITHMS = frozenset({"grpo", "sft"})


def train_step(metrics: Mapping[str, float], algorithm: str = "grpo") -> None:
    """One optimizer update's figures (the dict GRPOTrainer.step and train_sft's steps make:
    tokens = completion tokens trained on, tokens_per_s, loss, step_time_s, reward_mean, eval_loss)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"training algorithm label {algorithm!r}: expected one of {sorted(ALGORITHMS)}")
    if not _enabled:
        return
    TRAIN_STEPS.labels(algorithm).inc()
    TRAIN_TOKENS.labels(algorithm).inc(float(metrics.get("tokens", 0.0)))
    if "step_time_s" in metrics:
        TRAIN_STEP_SECONDS.labels(algorithm).observe(float(metrics["step_time_s"]))
    for gauge, key in (
        (TRAIN_TOKENS_PER_SECOND, "tokens_per_s"),
        (TRAIN_LOSS, "loss"),
        (TRAIN_REWARD_MEAN, "reward_mean"),
        (TRAIN_EVAL_LOSS, "eval_loss"),
    ):
        if key in metrics:
            gauge.labels(algorithm).set(float(metrics[key]))


def train_staleness(versions: float, algorithm: str = "grpo") -> None:
    """How many policy versions the oldest sample of the last update was behind the trainer."""
    if _enabled:
        TRAIN_STALENESS.labels(algorithm).set(float(versions))


def policy_request(seconds: float, status: int, tokens: int = 0) -> None:
    if _enabled:
        POLICY_REQUEST_SECONDS.labels(str(status)).observe(seconds)
        if tokens:
            POLICY_TOKENS.inc(tokens)


def policy_batch(rows: int) -> None:
    if _enabled:
        POLICY_BATCH_ROWS.observe(rows)


def metric_names() -> set[str]:
    """Every sample name the registry can expose (for dashboards and rules to be checked against)."""
    names: set[str] = set()
    for family in REGISTRY.collect():
        names.add(family.name)
        names.update(s.name for s in family.samples)
        if family.type == "histogram":
            names.update(f"{family.name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
        if family.type == "counter":
            names.add(f"{family.name}_total")
    return names
