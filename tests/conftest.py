"""Shared fixtures. Docker tests use the real engine started by platform/deploy/docker-engine.sh;
if it is not running they fail with the reason, they are never skipped or mocked."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from envforge.config import Settings

REPO = Path(__file__).resolve().parents[1]
BUNDLED_SPECS = REPO / "task_sources" / "specs"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Settings with a private data directory (catalog, MLflow store) for one test."""
    s = Settings.from_env().with_data_dir(tmp_path / "data")
    s.ensure_dirs()
    return s


@pytest.fixture
def allow_tmp_sources(tmp_path: Path, monkeypatch) -> Path:
    """Allow sources under this test's tmp_path to name paths anywhere under it (a deployment does
    this with ENVFORGE_SOURCE_ROOTS): tests keep repositories beside, not inside, their sources."""
    monkeypatch.setenv("ENVFORGE_SOURCE_ROOTS", str(tmp_path))
    return tmp_path


@pytest.fixture(scope="session")
def docker_client():
    from envforge.sandbox.engine import docker_client as make_client

    script = REPO / "platform" / "deploy" / "docker-engine.sh"
    proc = subprocess.run([str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, f"Docker engine could not be started:\n{proc.stderr}"
    return make_client(Settings.from_env())


@pytest.fixture(scope="session")
def base_image(docker_client) -> str:
    from envforge.sandbox.images import build_base_image

    return build_base_image(docker_client, Settings.from_env()).tag


@pytest.fixture
def copy_spec(tmp_path: Path):
    """Copy a bundled spec folder to a temp dir so a test can change it freely."""

    def _copy(name: str) -> Path:
        dest = tmp_path / "specs" / name
        shutil.copytree(BUNDLED_SPECS / name, dest)
        return dest

    return _copy


@pytest.fixture(scope="session")
def task_image(docker_client, base_image, tmp_path_factory) -> str:
    """The image of the bundled inventory task (a small Python package with tests)."""
    from envforge.sandbox.images import build_task_image
    from envforge.sources.specs import load_spec_file

    settings = Settings.from_env().with_data_dir(tmp_path_factory.mktemp("images"))
    task = load_spec_file(BUNDLED_SPECS / "inventory-median-even" / "task.yaml")
    return build_task_image(docker_client, task, base_image, settings).tag


@pytest.fixture(scope="session")
def bundled_images(docker_client, base_image, tmp_path_factory):
    """{task id: (Task, image tag)} for the bundled specs and the flaky example."""
    from envforge.sandbox.images import build_task_image
    from envforge.sources import load_specs

    settings = Settings.from_env().with_data_dir(tmp_path_factory.mktemp("bundled"))
    tasks = load_specs([BUNDLED_SPECS, REPO / "task_sources" / "examples"]).tasks
    return {t.id: (t, build_task_image(docker_client, t, base_image, settings).tag) for t in tasks}


@pytest.fixture(scope="session")
def grader(docker_client):
    from envforge.verify.grader import Grader

    with Grader(docker_client) as g:
        yield g


@pytest.fixture(scope="session")
def s3_server():
    """A real S3 API (moto's server mode) on loopback, with authentication on: yields
    (endpoint URL, access key, secret key) of an IAM user allowed everything."""
    import json

    import boto3
    from moto import settings as moto_settings
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    iam = boto3.client("iam", endpoint_url=endpoint, aws_access_key_id="AKIAIOSFODNN7EXAMPLE",
                       aws_secret_access_key="bootstrap", region_name="us-east-1")
    iam.create_user(UserName="envforge")
    iam.put_user_policy(UserName="envforge", PolicyName="all", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
    key = iam.create_access_key(UserName="envforge")["AccessKey"]
    previous = moto_settings.INITIAL_NO_AUTH_ACTION_COUNT
    moto_settings.INITIAL_NO_AUTH_ACTION_COUNT = 0  # from now on every request is authenticated
    try:
        yield endpoint, key["AccessKeyId"], key["SecretAccessKey"]
    finally:
        moto_settings.INITIAL_NO_AUTH_ACTION_COUNT = previous
        server.stop()


@pytest.fixture
def s3_bucket(s3_server, monkeypatch):
    """A fresh bucket on the loopback S3 server, with the AWS variables set for it; yields its name."""
    import uuid

    import boto3

    endpoint, key, secret = s3_server
    for var, value in {"ENVFORGE_S3_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": key,
                       "AWS_SECRET_ACCESS_KEY": secret, "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(var, value)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    bucket = f"envforge-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=key, aws_secret_access_key=secret,
                 region_name="us-east-1").create_bucket(Bucket=bucket)
    return bucket
