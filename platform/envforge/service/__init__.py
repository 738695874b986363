"""The environment service: envforge's gated environments over HTTP, for outside trainers.

`app.create_app` builds the FastAPI app (sessions on the sandbox pool, tenants with API keys
and quotas, Prometheus metrics); `client` is the Python client (sync and async); `adapters/`
plugs the service into TRL, OpenEnv and verl. See docs/service.md.
"""
