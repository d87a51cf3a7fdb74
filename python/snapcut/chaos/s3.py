"""A real S3 server on 127.0.0.1: moto's standalone server (``moto[server]``,
in the ``test`` extra) in a thread of this process, reached through pyarrow's
``S3FileSystem`` or ``s3://`` URIs. The tests' ``s3`` fixture
(tests/conftest.py) and ``snapcut chaos --engine spark --state-root s3`` (state
roots on an object store under kills) run it."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pyarrow.fs as pafs

from snapcut._core import ConfigError

__all__ = ["ACCESS_KEY", "REGION", "SECRET_KEY", "S3Server", "moto_server"]

ACCESS_KEY = "snapcut-test-key"
SECRET_KEY = "snapcut-test-secret"
REGION = "us-east-1"


@dataclass(frozen=True)
class S3Server:
    """Where the server listens and how to name its objects."""

    endpoint: str
    """host:port, e.g. 127.0.0.1:41234"""

    def filesystem(self, **options: Any) -> pafs.S3FileSystem:
        """A pyarrow S3FileSystem on this server with explicit credentials
        (picklable: Spark tasks get the same filesystem)."""
        return pafs.S3FileSystem(
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            region=REGION,
            endpoint_override=self.endpoint,
            scheme="http",
            **options,
        )

    def uri(self, path: str, credentials: bool = False) -> str:
        """``s3://<path>?endpoint_override=...&scheme=http``; credentials
        from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (see :meth:`env`), or
        with `credentials` in the URI (``s3://KEY:SECRET@<path>...``)."""
        auth = f"{ACCESS_KEY}:{SECRET_KEY}@" if credentials else ""
        return (
            f"s3://{auth}{path.strip('/')}?endpoint_override={quote(self.endpoint, safe='')}"
            f"&scheme=http&region={REGION}"
        )

    def bucket(self, prefix: str = "snapcut") -> str:
        """Creates a new empty bucket and returns its name."""
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.filesystem(allow_bucket_creation=True).create_dir(name)
        return name

    def upload(self, local: Path) -> str:
        """Copies a local directory (a snapshot root) into a new bucket;
        returns its bucket/path."""
        path = f"{self.bucket()}/{local.name}"
        pafs.copy_files(
            str(local),
            path,
            source_filesystem=pafs.LocalFileSystem(),
            destination_filesystem=self.filesystem(),
        )
        return path

    def keys(self, path: str) -> list[str]:
        """Every object key under `path` (bucket/prefix), relative to it."""
        fs = self.filesystem()
        selector = pafs.FileSelector(path.strip("/"), recursive=True, allow_not_found=True)
        base = path.strip("/") + "/"
        return sorted(
            i.path.removeprefix(base)
            for i in fs.get_file_info(selector)
            if i.type == pafs.FileType.File
        )

    @staticmethod
    def env() -> dict[str, str]:
        """What a process needs to open ``s3://`` URIs on this server."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_EC2_METADATA_DISABLED": "true",
        }


@contextmanager
def moto_server() -> Iterator[S3Server]:
    """Runs moto's S3 server on a free port of 127.0.0.1, with the AWS
    variables of :meth:`S3Server.env` set in this process (Spark sessions
    started meanwhile pass them on to their Python workers)."""
    try:
        from moto.server import ThreadedMotoServer
    except ImportError as e:  # moto[server] is in the test extra
        raise ConfigError(
            "an S3 server on 127.0.0.1 needs moto[server]: pip install 'snapcut[test]'"
        ) from e

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    saved = {k: os.environ.get(k) for k in S3Server.env()}
    os.environ.update(S3Server.env())
    try:
        host, port = server.get_host_and_port()
        yield S3Server(f"{host}:{port}")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()
