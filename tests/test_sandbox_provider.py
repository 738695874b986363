"""Where sandboxes come from: the provider chosen once per process (`envforge.runtime.sandbox_provider`)
and handed down to the stages. The fleet's provider on a real cluster: tests/test_fleet.py."""

from __future__ import annotations

import pytest

from envforge.runtime import sandbox_provider
from envforge.sandbox.provider import LocalSandboxProvider, or_local
from tests.conftest import BUNDLED_SPECS


def test_the_environment_chooses_the_local_engine_by_default_and_the_fleet_by_address_without_joining_it():
    assert isinstance(sandbox_provider({}), LocalSandboxProvider)
    assert sandbox_provider({"ENVFORGE_RAY_ADDRESS": "  "}).kind == "local"  # blank is unset
    fleet = sandbox_provider({"ENVFORGE_RAY_ADDRESS": "ray-head:6379"})
    assert fleet.kind == "fleet" and fleet._dispatcher is None  # joined at the first unit of work, not here
    assert or_local(None).kind == "local" and or_local(fleet) is fleet


def test_a_local_lease_needs_its_engine():
    with pytest.raises(ValueError, match="needs the engine"):
        LocalSandboxProvider().lease([], 2)


def test_the_cli_hands_its_stages_the_provider_the_environment_chooses(monkeypatch):
    from envforge.cli.common import run_stage

    seen = []

    class Stage:
        @staticmethod
        def tracked(*args, context, **kwargs):
            seen.append(context.sandboxes)

    monkeypatch.delenv("ENVFORGE_RAY_ADDRESS", raising=False)
    run_stage(Stage, progress=False)
    monkeypatch.setenv("ENVFORGE_RAY_ADDRESS", "ray-head:6379")
    run_stage(Stage, progress=False)
    assert [p.kind for p in seen] == ["local", "fleet"]


class CountingProvider:
    """The local provider, recording each lease it gives and whether it was closed."""

    kind = "counting"

    def __init__(self):
        self.leases = []

    def start(self):
        return self

    def lease(self, items, sandboxes_per_task, **kwargs):
        lease = LocalSandboxProvider().lease(items, sandboxes_per_task, **kwargs)
        record = {"items": list(items), "per_task": sandboxes_per_task, "closed": False}
        self.leases.append(record)
        close = lease.close

        def closing():
            record["closed"] = True
            close()

        lease.close = closing
        return lease


@pytest.mark.docker
def test_the_same_stage_calls_run_on_the_provider_handed_down(settings, docker_client, task_image):
    """The rollout and gate stages, given a provider in their context, lease one pool each from it for
    their work (told the tasks and what each acquires) and close it; the batch is registered in the catalog."""
    from envforge.catalog import Catalog
    from envforge.rollout.config import RolloutConfig
    from envforge.sources.specs import load_spec_file
    from envforge.stages.base import StageContext
    from envforge.stages.gate import gate
    from envforge.stages.images import ImageSet
    from envforge.stages.rollout import rollout
    from envforge.verify.config import GateConfig

    task = load_spec_file(BUNDLED_SPECS / "inventory-median-even" / "task.yaml")
    images = ImageSet("", {task.content_hash: task_image})
    provider = CountingProvider()
    context = StageContext(sandboxes=provider)
    result = rollout(settings, RolloutConfig(n_samples=2, concurrency=2), [task], "replay", "v-provider", images,
                     "provider-batch", context=context)
    assert [t.resolved for t in result.batch.store.trajectories()] == [True, True]
    assert provider.leases == [{"items": [(task, task_image)], "per_task": 4, "closed": True}]
    assert list(Catalog(settings.catalog_path).rollout_batches()["batch_id"]) == ["provider-batch"]
    gated = gate(settings, GateConfig(runs=1, shuffle=False, probes=False, concurrency=1), [task], images,
                 context=context)
    assert [r.verdict for r in gated.reports] == ["accepted"]
    assert provider.leases[-1] == {"items": [(task, task_image)], "per_task": 4, "closed": True}
