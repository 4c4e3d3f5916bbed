"""A real S3-compatible server on loopback for the tests: moto's server mode (``moto[server]``), started once per
test session on a free 127.0.0.1 port (raydist.local_s3), with the standard AWS environment pointing at it (and raydist's cache of
remote files in a temporary folder). Nothing reaches the internet. Loaded by tests/conftest.py as a plugin."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from raydist.local_s3 import free_port, local_s3_server

__all__ = ["S3Server", "free_port", "s3_server", "upload"]


@dataclass(frozen=True)
class S3Server:
    """The running server: its endpoint and the environment that points the AWS clients at it."""

    endpoint: str
    env: dict[str, str]

    def create_bucket(self, name: str) -> str:
        """Create a bucket (boto3, as a user would) and return ``s3://name``."""
        import boto3

        boto3.client("s3").create_bucket(Bucket=name)
        return f"s3://{name}"


def upload(folder: Path, uri: str) -> str:
    """Copy a local folder's files to ``uri`` (boto3, independent of raydist's own reading code)."""
    from urllib.parse import urlsplit

    import boto3

    parts = urlsplit(uri)
    client = boto3.client("s3")
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        key = "/".join([parts.path.strip("/"), path.relative_to(folder).as_posix()]).lstrip("/")
        client.upload_file(str(path), parts.netloc, key)
    return uri


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> Iterator[S3Server]:
    """moto's S3 server for the whole session; the AWS environment (``AWS_ENDPOINT_URL``, keys, region) and
    ``RAYDIST_CACHE`` are set for this process and every subprocess it starts."""
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with local_s3_server(log) as aws:
        env = {**aws, "RAYDIST_CACHE": str(tmp_path_factory.mktemp("raydist-cache"))}
        patch = pytest.MonkeyPatch()
        for key, value in env.items():
            patch.setenv(key, value)
        patch.delenv("AWS_PROFILE", raising=False)
        try:
            yield S3Server(env["AWS_ENDPOINT_URL"], env)
        finally:
            patch.undo()
