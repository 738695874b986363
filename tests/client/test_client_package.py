"""envforge-client on its own: retries against a loopback stub server (429 with Retry-After, a 503
storm, a connection that breaks mid-request), the ENVFORGE_SERVICE_URL / ENVFORGE_API_KEY defaults,
and its models checked against the service's checked-in OpenAPI spec."""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import envforge_client.models as client_models
import pytest
from envforge_client import AsyncClient, Client, QuotaExceededError, RetryPolicy, ServiceUnavailable
from envforge_client.client import DEFAULT_URL
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[2]
SPEC = Path(__file__).resolve().parents[2] / "docs" / "service-openapi.json"
HEALTH = {"status": "ok", "boot_id": "0123abcd", "sessions_open": 0, "backend": {"backend": "stub"}}
FAST = RetryPolicy(attempts=3, max_total_s=20, backoff_initial_s=0.01, backoff_max_s=0.05)


class Stub:
    """A loopback HTTP server answering from a script: each request takes the next (status, headers)
    (200 answers HEALTH; "drop" closes the connection without an answer); the last entry repeats."""

    def __init__(self, script: list[Any]):
        self.script, self.requests = list(script), []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                stub.requests.append((self.command, self.path, dict(self.headers), body, time.monotonic()))
                entry = stub.script.pop(0) if len(stub.script) > 1 else stub.script[0]
                if entry == "drop":
                    self.close_connection = True
                    return
                status, headers = entry
                payload = (
                    HEALTH
                    if status == 200
                    else {"error": {"code": "quota_exceeded" if status == 429 else "unavailable", "message": "later"}}
                )
                data = json.dumps(payload).encode()
                self.send_response(status)
                for k, v in {**headers, "content-type": "application/json", "content-length": str(len(data))}.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "Stub":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_429_is_retried_after_its_retry_after():
    with Stub([(429, {"Retry-After": "1"}), (200, {})]) as server, Client(server.url, "k", retries=FAST) as client:
        assert client.health().boot_id == "0123abcd"
    assert len(server.requests) == 2
    waited = server.requests[1][4] - server.requests[0][4]
    assert 0.95 <= waited < 5, f"waited {waited:.2f}s: Retry-After says 1s (the backoff alone is 0.01s)"


def test_the_async_client_retries_the_same_way():
    async def main() -> str:
        async with AsyncClient(server.url, "k", retries=FAST) as client:
            return (await client.health()).boot_id

    with Stub([(503, {"Retry-After": "1"}), (429, {"Retry-After": "0"}), (200, {})]) as server:
        assert asyncio.run(main()) == "0123abcd"
    assert len(server.requests) == 3
    assert server.requests[1][4] - server.requests[0][4] >= 0.95


def test_a_503_storm_gives_up_with_a_typed_error_after_the_attempts():
    with Stub([(503, {})]) as server, Client(server.url, "k", retries=FAST) as client:
        with pytest.raises(ServiceUnavailable) as exc:
            client.health()
    assert exc.value.status == 503 and exc.value.code == "unavailable"
    assert len(server.requests) == FAST.attempts


def test_a_retry_after_past_the_time_budget_is_raised_at_once():
    policy = RetryPolicy(attempts=5, max_total_s=10)
    with Stub([(429, {"Retry-After": "120"}), (200, {})]) as server, Client(server.url, "k", retries=policy) as c:
        started = time.monotonic()
        with pytest.raises(QuotaExceededError) as exc:
            c.health()
    assert exc.value.retry_after_s == 120 and len(server.requests) == 1 and time.monotonic() - started < 5


def test_never_retries_once():
    with Stub([(503, {}), (200, {})]) as server, Client(server.url, "k", retries=RetryPolicy.never()) as client:
        with pytest.raises(ServiceUnavailable):
            client.health()
    assert len(server.requests) == 1


def test_a_connection_broken_mid_request_repeats_only_what_is_harmless_to_repeat():
    with Stub(["drop", (200, {})]) as server, Client(server.url, "k", retries=FAST) as client:
        assert client.health().status == "ok"  # GET: asked again
    assert len(server.requests) == 2
    with Stub(["drop", (200, {})]) as server, Client(server.url, "k", retries=FAST) as client:
        with pytest.raises(ServiceUnavailable) as exc:  # a step may have run: not repeated
            client._call("POST", "/sessions/s-1/step", {"text": "hi"})
    assert exc.value.may_have_run and "cannot reach the envforge service" in str(exc.value)
    assert len(server.requests) == 1


def test_an_unreachable_service_is_retried_then_raised():
    from tests.service.conftest import free_port

    with Client(f"http://127.0.0.1:{free_port()}", "k", retries=FAST) as client:
        started = time.monotonic()
        with pytest.raises(ServiceUnavailable) as exc:
            client.create_session(task_set="main", index=0)  # not sent at all: safe to repeat even a POST
    assert exc.value.status == 0 and not exc.value.may_have_run and time.monotonic() - started < 5


def test_url_and_key_default_to_the_environment(monkeypatch):
    with Stub([(200, {})]) as server:
        monkeypatch.setenv("ENVFORGE_SERVICE_URL", server.url + "/")
        monkeypatch.setenv("ENVFORGE_API_KEY", "key-from-env")
        with Client() as client:
            assert client.base_url == server.url
            client.health()
        assert server.requests[0][2]["Authorization"] == "Bearer key-from-env"
        with Client(api_key="explicit") as client:  # an argument wins over the variable
            client.health()
        assert server.requests[1][2]["Authorization"] == "Bearer explicit"
    monkeypatch.delenv("ENVFORGE_SERVICE_URL")
    monkeypatch.delenv("ENVFORGE_API_KEY")
    with pytest.raises(ValueError, match="set ENVFORGE_API_KEY"):
        Client()
    with Client(api_key="k") as client:
        assert client.base_url == DEFAULT_URL


def test_the_default_url_is_envforges_default():
    from envforge.settings import read_env

    assert read_env({}).service_url == DEFAULT_URL


def test_a_policy_refuses_nonsense():
    with pytest.raises(ValueError, match="attempts"):
        RetryPolicy(attempts=0)


# -- drift: the client's models against docs/service-openapi.json --------------------------------

_SHAPE_KEYS = {
    "type",
    "$ref",
    "items",
    "anyOf",
    "oneOf",
    "allOf",
    "enum",
    "const",
    "additionalProperties",
    "format",
    "required",
    "properties",
}


def _shape(schema: Any) -> Any:
    """What a schema says about types and required fields, without titles, descriptions or defaults."""
    if isinstance(schema, dict):
        return {
            k: (sorted(v) if k == "required" else _shape(v))
            for k, v in schema.items()
            if k in _SHAPE_KEYS or not isinstance(v, (dict, list, str, int, float, bool, type(None)))
        }
    if isinstance(schema, list):
        return [_shape(v) for v in schema]
    return schema


def _client_models() -> dict[str, type[BaseModel]]:
    return {
        name: cls
        for name, cls in vars(client_models).items()
        if inspect.isclass(cls)
        and issubclass(cls, BaseModel)
        and not name.startswith("_")
        and cls.__module__ == client_models.__name__
    }


def test_every_client_model_matches_its_schema_in_the_spec():
    schemas = json.loads(SPEC.read_text())["components"]["schemas"]
    models = _client_models()
    assert len(models) >= 20
    for name, model in models.items():
        assert name in schemas, f"{SPEC.name}: no schema {name} (the client models it)"
        ours = model.model_json_schema(ref_template="#/components/schemas/{model}")
        ours.pop("$defs", None)
        theirs = schemas[name]
        assert sorted(ours.get("required", [])) == sorted(theirs.get("required", [])), f"{name}: required fields"
        assert set(ours.get("properties", {})) == set(theirs.get("properties", {})), f"{name}: fields"
        for field, prop in ours.get("properties", {}).items():
            assert _shape(prop) == _shape(theirs["properties"][field]), f"{name}.{field}: type differs from the spec"
    # ... and every schema of the API is one the client knows (FastAPI's own 422 body aside)
    unmodelled = set(schemas) - set(models) - {"HTTPValidationError", "ValidationError"}
    assert not unmodelled, f"{SPEC.name} has schemas the client does not model: {sorted(unmodelled)}"


def test_the_drift_check_sees_a_changed_field():
    theirs = json.loads(SPEC.read_text())["components"]["schemas"]["Observation"]["properties"]["exit_code"]
    assert _shape(theirs) != _shape({"type": "string"})


def test_prompts_are_the_ones_envforge_rolls_out_with():
    """One copy: the rollout code, the service and the verl export use the client's prompts and tools."""
    from envforge_client import prompts

    from envforge.environment import WORKSPACE
    from envforge.rollout import actions
    from envforge.service.openenv_ws import PATH

    assert actions.TOOLS is prompts.TOOLS and actions.SYSTEM_PROMPT is prompts.SYSTEM_PROMPT
    assert prompts.WORKSPACE == WORKSPACE
    names = {t["function"]["name"] for t in prompts.TOOLS}
    assert names == {"run", "read_file", "write_file", "apply_patch", "submit"}
    reply = 'thinking <tool_call>{"name": "run", "arguments": {"command": "ls"}}</tool_call> then <tool_call>{"name": "submit"}</tool_call>'
    blocks = prompts.tool_call_blocks(reply)
    assert [actions.parse_text(b).name for b in blocks] == ["run", "submit"]
    assert prompts.user_message("  Fix it. ").startswith("Fix it.\n") and WORKSPACE in prompts.user_message("x")
    openenv_source = (ROOT / "clients/python/src/envforge_client/adapters/openenv.py").read_text()
    assert f'PATH = "{PATH}"' in openenv_source


def test_the_client_package_imports_nothing_of_envforge():
    """The adapters and the client run in a trainer's venv without the platform."""
    package = ROOT / "clients/python/src/envforge_client"
    offenders = [
        f"{p.relative_to(package)}:{n}"
        for p in package.rglob("*.py")
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if line.lstrip().startswith(("import envforge", "from envforge ", "from envforge.", "import envforge."))
    ]
    assert offenders == []
