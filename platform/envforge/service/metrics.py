"""Service-level Prometheus metrics, in a registry per app (so tests can run several apps).

Label values are bounded: tenants (a handful, named by operators), routes as templates (not
raw paths), end reasons and quota names from fixed sets. The sandboxes, scheduler and grader the
service drives count into envforge's process registry (envforge.observe.metrics); /metrics serves both.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from envforge.observe.metrics import LATENCY_BUCKETS


class ServiceMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Histogram(
            "envforge_service_request_seconds",
            "HTTP request latency by route and status",
            ["method", "route", "status"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.sessions_open = Gauge("envforge_service_sessions_open", "sessions open now", ["tenant"], registry=r)
        self.sessions_started = Counter(
            "envforge_service_sessions_started_total", "sessions started", ["tenant"], registry=r
        )
        self.sessions_ended = Counter(
            "envforge_service_sessions_ended_total", "sessions ended, by why", ["tenant", "end_reason"], registry=r
        )
        self.steps = Counter("envforge_service_steps_total", "environment steps", ["tenant"], registry=r)
        self.step_seconds = Histogram(
            "envforge_service_step_seconds", "environment step time (sandbox work)", buckets=LATENCY_BUCKETS, registry=r
        )
        self.verify_seconds = Histogram(
            "envforge_service_verify_seconds", "grading time on a pristine copy", buckets=LATENCY_BUCKETS, registry=r
        )
        self.rewards = Histogram(
            "envforge_service_reward", "rewards of graded sessions", buckets=(0.0, 0.25, 0.5, 0.75, 1.0), registry=r
        )
        self.quota_rejections = Counter(
            "envforge_service_quota_rejections_total", "requests refused by a quota", ["tenant", "quota"], registry=r
        )
        self.auth_failures = Counter(
            "envforge_service_auth_failures_total", "requests with a missing, unknown or revoked key", registry=r
        )
        self.infra_errors = Counter(
            "envforge_service_infra_errors_total", "sessions lost to infrastructure faults", registry=r
        )
