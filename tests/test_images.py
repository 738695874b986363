"""Image builds on the real engine: content-hash tags, cache hits, layered task images."""

from __future__ import annotations

import uuid

import pytest

from envforge.config import Settings
from envforge.errors import ImageBuildError
from envforge.sandbox.images import base_image_tag, build_base_image, build_task_image, image_exists, task_image_tag
from envforge.sources.specs import load_spec_file

pytestmark = pytest.mark.docker


def test_base_image_second_build_is_cache_hit(docker_client, base_image):
    settings = Settings.from_env()
    assert base_image == base_image_tag(settings)
    again = build_base_image(docker_client, settings)
    assert again.cache_hit and again.tag == base_image
    labels = docker_client.images.get(base_image).labels
    # Containers inherit their image's labels: a build's intermediate containers must not look managed.
    assert labels["envforge.image"] == "base" and "envforge.managed" not in labels
    user = docker_client.containers.run(base_image, ["id", "-un"], remove=True, network_mode="none")
    assert user.decode().strip() == "sandbox"


def test_task_image_cache_and_invalidation(docker_client, base_image, settings, copy_spec):
    spec_dir = copy_spec("inventory-median-even")
    task = load_spec_file(spec_dir / "task.yaml")
    first = build_task_image(docker_client, task, base_image, settings)
    second = build_task_image(docker_client, task, base_image, settings)
    assert second.cache_hit and second.tag == first.tag
    assert second.seconds < 1.0 or second.seconds < first.seconds
    # Unique content, so the changed image cannot exist from an earlier run.
    (spec_dir / "workspace" / "NOTES.md").write_text(f"a new file changes the image {uuid.uuid4()}\n")
    changed = load_spec_file(spec_dir / "task.yaml")
    assert task_image_tag(changed, base_image) != first.tag
    rebuilt = build_task_image(docker_client, changed, base_image, settings)
    assert not rebuilt.cache_hit and image_exists(docker_client, rebuilt.tag)
    # The initial state is committed, so the policy's changes are always a diff against it.
    log = docker_client.containers.run(rebuilt.tag, ["git", "-C", "/opt/envforge/task/workspace", "log",
                                                     "--oneline"], remove=True, network_mode="none")
    assert b"envforge: task initial state" in log
    docker_client.images.remove(rebuilt.tag, force=True)  # this one-off variant is not worth keeping


def test_setup_failure_names_the_task(docker_client, base_image, settings, copy_spec):
    spec_dir = copy_spec("orders-daily-summary")
    text = (spec_dir / "task.yaml").read_text().replace("  files: workspace\n",
                                                        "  files: workspace\n  setup:\n    - exit 3\n")
    (spec_dir / "task.yaml").write_text(text)
    task = load_spec_file(spec_dir / "task.yaml")
    with pytest.raises(ImageBuildError, match="task orders-daily-summary: build failed"):
        build_task_image(docker_client, task, base_image, settings)


def test_unknown_local_image_is_a_clear_error(docker_client, base_image, settings, copy_spec):
    spec_dir = copy_spec("orders-daily-summary")
    text = (spec_dir / "task.yaml").read_text().replace("  image: base\n", "  image: no-such/image:1\n")
    (spec_dir / "task.yaml").write_text(text)
    with pytest.raises(ImageBuildError, match="is not a local image"):
        build_task_image(docker_client, load_spec_file(spec_dir / "task.yaml"), base_image, settings)
