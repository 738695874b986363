"""The checked-in OpenAPI spec is the one the app generates, and the live service keeps to it:
schemathesis sends generated requests (valid and invalid) to every operation over loopback and
checks that nothing answers 5xx and every response matches the spec (status, headers, body)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from envforge.config import Settings
from envforge.service.app import create_app
from tests.service.conftest import create_key

SPEC = Path(__file__).resolve().parents[2] / "docs" / "service-openapi.json"


def test_the_checked_in_spec_is_current():
    generated = json.dumps(create_app(Settings.from_env()).openapi(), indent=2, sort_keys=True) + "\n"
    assert SPEC.read_text() == generated, "docs/service-openapi.json is stale: run `envforge service openapi -o " \
                                          "docs/service-openapi.json`"


schema = schemathesis.openapi.from_path(SPEC)


@pytest.fixture(scope="module")
def fuzz_target(live_server, service_data):
    # Two sessions at most: generated requests that do name a real task start few sandboxes.
    return live_server.url, create_key(service_data.settings, "fuzzer", ["main"], max_sessions=2,
                                       steps_per_minute=10_000)


@pytest.mark.docker
@pytest.mark.slow
@schema.parametrize()
@settings(max_examples=15, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def test_every_operation_keeps_to_the_spec(case, fuzz_target):
    url, key = fuzz_target
    case.call_and_validate(base_url=url, headers={"Authorization": f"Bearer {key}"})
