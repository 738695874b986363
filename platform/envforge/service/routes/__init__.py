"""The service's HTTP and WebSocket routes, one APIRouter per concern; `app.create_app` includes them.

- `health`: /healthz, /metrics (no key needed).
- `tasks`: the task sets and their tasks a key may use.
- `sessions`: open a session on a task, step, verify, close.
- `openenv`: OpenEnv 0.3's HTTP surface under /openenv (reset, step, state, health, schema, metadata, mcp).
- `envforge.service.openenv_ws`: the OpenEnv WebSocket endpoint (/openenv/ws).

What a route needs (the session manager, the tenant behind the request's key, the metrics) comes
through the dependencies in `deps`, which read what the app's lifespan put in `app.state`.
"""

from envforge.service.openenv_ws import router as openenv_ws
from envforge.service.routes import health, openenv, sessions, tasks

# In the order the app includes them (the spec lists paths in this order).
HTTP_ROUTERS = (health.router, tasks.router, sessions.router, openenv.router)
ROUTERS = (*HTTP_ROUTERS, openenv_ws)
