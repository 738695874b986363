"""Constants that must stay written once: where a copy cannot import the original (the in-sandbox
agent is stdlib-only source sent into the container), the copy is checked equal here."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from envforge import environment, task
from envforge.config import CATALOG_FILE
from envforge.sandbox import agent, images
from envforge.verify import checkpoints


def test_the_in_sandbox_agent_uses_the_task_model_sandbox_paths():
    assert agent.WORKSPACE == task.WORKSPACE == environment.WORKSPACE == "/workspace"
    assert agent.TEMPLATE == images.TEMPLATE_DIR
    grader = PurePosixPath(agent.GRADER_DIR)
    assert PurePosixPath(task.VERIFIER_DIR).parent == grader == PurePosixPath(checkpoints.RUNNER_DIR).parent


def test_the_catalog_file_name_is_defined_once(settings, tmp_path):
    assert settings.catalog_path == settings.data_dir / CATALOG_FILE
    from assets.defs.resources import CatalogResource

    assert CatalogResource(data_dir=str(tmp_path)).catalog().path == Path(tmp_path) / CATALOG_FILE
