"""A local S3-compatible server for measurements and tests: moto's server mode (``moto[server]``, the ``dev``
extra) on a free 127.0.0.1 port, with the standard AWS environment that points clients at it. Nothing reaches
the internet."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from raydist.distributed.spawn import free_port


@contextmanager
def local_s3_server(log: Path) -> Iterator[dict[str, str]]:
    """Run ``python -m moto.server`` on a free loopback port (its output to ``log``) for the ``with`` block and
    give the AWS environment for it (endpoint, keys, region); the server is stopped by its pid after."""
    port = free_port()
    with open(log, "w") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.time() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if server.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"moto's S3 server did not start: {log.read_text()[-500:]}") from None
                time.sleep(0.1)
        yield {
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }
    finally:
        server.terminate()
        server.wait(10)


def create_bucket(name: str) -> str:
    """Create bucket ``name`` on the S3 server the AWS environment points at (pyarrow's S3 filesystem, as raydist
    reads and writes it); return ``s3://name``."""
    import pyarrow.fs

    fs, _ = pyarrow.fs.FileSystem.from_uri(f"s3://{name}")
    s3 = pyarrow.fs.S3FileSystem(
        endpoint_override=os.environ.get("AWS_ENDPOINT_URL"),
        region=fs.region,
        allow_bucket_creation=True,
    )
    s3.create_dir(name)
    return f"s3://{name}"
