"""Observability: Prometheus metrics, JSON logs, OpenTelemetry traces, and the infra-vs-policy verdict.

Library code calls the small hooks here (cheap no-ops when switched off); the process decides
where they go: a /metrics endpoint (`observe.http`), a log handler (`observe.logs`), a span
exporter (`observe.traces`). See docs/observability.md.
"""
