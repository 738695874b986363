"""Where artifacts live: a local folder, or S3-compatible object storage through fsspec.

The trajectory store, exported task-set parquet and run reports take a root that is either a
path or an `s3://bucket/prefix` URL (`ENVFORGE_STORE_URL` puts all three there). Object
storage has no rename, but it has something as good for a reader: an object appears whole
when its single PUT (or its multipart upload) completes, never half-written. So `write_atomic`
renames a finished temporary file on a local disk and writes the object in one request on
object storage; either way a reader sees the old state or the new one. A group of trajectories
is one parquet object, so a group is committed by one such write.

Credentials come from the usual AWS variables; `ENVFORGE_S3_ENDPOINT_URL` points at MinIO,
Ceph or any S3-compatible server. `open_store(url, check=True)` lists the bucket once, so a
missing bucket or missing/wrong credentials fail at start with the setting named, not in
the middle of a batch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

import fsspec
from fsspec.implementations.local import LocalFileSystem

from envforge import safefs
from envforge.errors import EnvforgeError

REMOTE_SCHEMES = ("s3", "s3a")
ENDPOINT_ENV = "ENVFORGE_S3_ENDPOINT_URL"


class StoreConfigError(EnvforgeError, ValueError):
    """Object storage is misconfigured; the message names the setting to fix."""


@dataclass(frozen=True)
class S3Settings:
    """How to reach S3-compatible storage (read from the environment by `from_env`, through envforge.settings)."""

    endpoint_url: str | None = None  # ENVFORGE_S3_ENDPOINT_URL (or AWS_ENDPOINT_URL): MinIO etc.; unset = AWS
    key: str | None = None  # AWS_ACCESS_KEY_ID
    secret: str | None = None  # AWS_SECRET_ACCESS_KEY
    token: str | None = None  # AWS_SESSION_TOKEN (temporary credentials)
    region: str | None = None  # AWS_DEFAULT_REGION / AWS_REGION
    profile: str | None = None  # AWS_PROFILE: credentials from ~/.aws instead of variables
    role_source: bool = False  # AWS_WEB_IDENTITY_TOKEN_FILE / AWS_CONTAINER_CREDENTIALS_*: a pod or task role

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "S3Settings":
        from envforge.settings import read_env

        env = read_env(environ)

        def secret(value: Any) -> str | None:
            return value.get_secret_value() if value is not None else None

        return cls(
            endpoint_url=env.s3_endpoint_url or env.aws_endpoint_url,
            key=secret(env.aws_access_key_id),
            secret=secret(env.aws_secret_access_key),
            token=secret(env.aws_session_token),
            region=env.aws_default_region or env.aws_region,
            profile=env.aws_profile,
            role_source=any(
                (
                    env.aws_web_identity_token_file,
                    env.aws_container_credentials_relative_uri,
                    env.aws_container_credentials_full_uri,
                )
            ),
        )

    @property
    def has_credentials(self) -> bool:
        return bool(self.key and self.secret) or bool(self.profile) or self.role_source

    def fs_options(self) -> dict[str, Any]:
        # No listing cache: another process's commits must be visible at once. Few retries: an
        # unreachable endpoint should fail in seconds with its setting named, not after minutes.
        opts: dict[str, Any] = {
            "use_listings_cache": False,
            "skip_instance_cache": True,
            "config_kwargs": {"connect_timeout": 5, "retries": {"max_attempts": 2}},
        }
        if self.key or self.secret:
            opts.update(key=self.key, secret=self.secret, token=self.token)
        if self.profile:
            opts["profile"] = self.profile
        client_kwargs: dict[str, Any] = {}
        if self.endpoint_url:
            opts["endpoint_url"] = self.endpoint_url
        if self.region:
            client_kwargs["region_name"] = self.region
        if client_kwargs:
            opts["client_kwargs"] = client_kwargs
        return opts


def is_remote(url: str) -> bool:
    return url.split("://", 1)[0].lower() in REMOTE_SCHEMES if "://" in url else False


def join(root: str, *parts: str) -> str:
    return "/".join([root.rstrip("/"), *[p.strip("/") for p in parts]])


def open_store(url: str, s3: S3Settings | None = None, check: bool = False) -> tuple[fsspec.AbstractFileSystem, str]:
    """(filesystem, path inside it) for a root URL or path. `check=True` proves the root is reachable."""
    url = str(url).rstrip("/")
    if not is_remote(url):
        fs, path = fsspec.core.url_to_fs(url)
        return fs, path
    s3 = s3 or S3Settings.from_env()
    if bool(s3.key) != bool(s3.secret):
        missing = "AWS_SECRET_ACCESS_KEY" if s3.key else "AWS_ACCESS_KEY_ID"
        raise StoreConfigError(f"{url}: {missing} is not set (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY go together)")
    if not s3.has_credentials:
        # Refuse here rather than let boto probe an instance-metadata address for a role.
        raise StoreConfigError(
            f"{url}: no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
            "(or AWS_PROFILE, or run with a pod/task role)"
        )
    try:
        import s3fs  # noqa: F401  (the `fleet` extra)
    except ImportError:
        raise StoreConfigError(
            f"{url}: S3 storage needs s3fs; install envforge with the `fleet` extra (pip install -e '.[fleet]')"
        ) from None
    fs, path = fsspec.core.url_to_fs(url, **s3.fs_options())
    if check:
        _check_reachable(fs, path, url, s3)
    return fs, path


def _check_reachable(fs: fsspec.AbstractFileSystem, path: str, url: str, s3: S3Settings) -> None:
    bucket = path.split("/", 1)[0]
    where = (
        f"endpoint {s3.endpoint_url} ({ENDPOINT_ENV})"
        if s3.endpoint_url
        else "AWS S3 (no ENVFORGE_S3_ENDPOINT_URL set)"
    )
    try:
        fs.ls(bucket, detail=False)
    except PermissionError as exc:
        text = str(exc)
        raise StoreConfigError(
            f"{url}: the S3 credentials were refused by {where}: {text.strip()} "
            "(check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)"
        ) from None
    except FileNotFoundError:
        raise StoreConfigError(f"{url}: bucket {bucket!r} does not exist at {where}; create it first") from None
    except Exception as exc:  # noqa: BLE001 - botocore raises many types; all mean "cannot use this store"
        name = type(exc).__name__
        if name in ("NoCredentialsError", "PartialCredentialsError"):
            raise StoreConfigError(
                f"{url}: no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                f"(or AWS_PROFILE) for {where}"
            ) from None
        raise StoreConfigError(f"{url}: cannot reach {where}: {name}: {exc}") from None


def write_atomic(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    """Make `path` hold `data`, never visible half-written (rename on disk, one PUT on object storage).
    On disk without an fsync: the trajectory store writes one file per trajectory, and a resumed
    batch redoes what a crash lost (an fsync each cost the rollout benchmark 40% of its speed)."""
    if isinstance(fs, LocalFileSystem):
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        safefs.write_atomic(path, data, durable=False)
        return
    fs.pipe_file(path, data)


def write_url(url: str, data: bytes, s3: S3Settings | None = None) -> str:
    """Write one artifact (a report, a parquet file) to a path or URL atomically; returns the URL."""
    root, _, name = str(url).rstrip("/").rpartition("/")
    fs, base = open_store(root, s3)
    write_atomic(fs, f"{base}/{name}", data)
    return url


def read_url(url: str, s3: S3Settings | None = None) -> bytes:
    root, _, name = str(url).rstrip("/").rpartition("/")
    fs, base = open_store(root, s3)
    with fs.open(f"{base}/{name}", "rb") as fh:
        return fh.read()


def publish(store_url: str | None, kind: str, local_path: str | os.PathLike) -> str | None:
    """Copy a finished local artifact under `<store_url>/<kind>/` (atomically); None without a store URL.

    Stages write reports and task-set parquet locally first (MLflow logs them from there); with
    ENVFORGE_STORE_URL set, this puts the same bytes on object storage for readers elsewhere.
    """
    if not store_url:
        return None
    name = os.path.basename(os.fspath(local_path))
    with open(local_path, "rb") as fh:
        return write_url(join(store_url, kind, name), fh.read())
