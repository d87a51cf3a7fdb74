"""A real S3 server on 127.0.0.1 for the tests: moto's standalone server
(``moto[server]``, in the ``test`` extra) in a thread of the test process,
reached through pyarrow's ``S3FileSystem`` or ``s3://`` URIs
(:mod:`snapcut.chaos.s3`, shared with ``snapcut chaos``); here also a server
that checks credentials, in its own process.

The ``s3`` fixture (tests/conftest.py) starts one server per test module;
each test makes its own bucket (``s3.bucket()``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs

from snapcut.chaos.s3 import ACCESS_KEY, REGION, SECRET_KEY, S3Server, moto_server

__all__ = [
    "ACCESS_KEY",
    "REGION",
    "SECRET_KEY",
    "AuthS3Server",
    "S3Server",
    "closed_port",
    "moto_auth_server",
    "moto_server",
]

MOTO_START_TIMEOUT_S = 180
"""How long a test waits for `python -m moto.server` to answer (bounded, generous:
under CI's load its start took over 30 s once)."""


def closed_port() -> int:
    """A port of 127.0.0.1 nothing listens on (for unreachable endpoints)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@dataclass(frozen=True)
class AuthS3Server:
    """A moto S3 server that checks credentials (its own process: moto's
    auth switch is process-wide and would reach the ``s3`` fixture's server),
    with one IAM user allowed everything, its key, and one bucket."""

    endpoint: str
    access_key: str
    secret_key: str
    bucket: str

    def filesystem(self, access_key: str | None = "", secret_key: str = "") -> pafs.S3FileSystem:
        """A pyarrow S3FileSystem on this server: the user's key by default,
        `access_key`/`secret_key` if given, none at all for None (the
        credential chain of the environment)."""
        keys: dict[str, Any] = {}
        if access_key is not None:
            keys = {
                "access_key": access_key or self.access_key,
                "secret_key": secret_key or self.secret_key,
            }
        return pafs.S3FileSystem(
            region=REGION, endpoint_override=self.endpoint, scheme="http", **keys
        )

    def keys(self, prefix: str) -> list[str]:
        """Every object key under `prefix` of the bucket (read with the user's key)."""
        selector = pafs.FileSelector(
            f"{self.bucket}/{prefix}", recursive=True, allow_not_found=True
        )
        infos = self.filesystem().get_file_info(selector)
        return sorted(i.path for i in infos if i.type == pafs.FileType.File)


@contextmanager
def moto_auth_server() -> Iterator[AuthS3Server]:
    """Runs ``python -m moto.server`` on a free port, makes an IAM user with
    an allow-all policy, its access key and a bucket, then turns on moto's
    request authentication (``/moto-api/reset-auth`` with 0: every request
    from then on must be signed with a key IAM knows)."""
    import json
    import subprocess
    import sys
    import time

    import boto3
    import requests

    port = closed_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        # Its imports take a few seconds alone, but a test in CI's pool (nice
        # 10 beside a nice -5 stream) once took more than 30 s to start it (fresh28).
        # A server that took the connection but answers slowly (fresh31: a read
        # timeout of 1 s in CI's starved pool) is starting too: any request
        # error is retried until the deadline.
        deadline = time.monotonic() + MOTO_START_TIMEOUT_S
        while True:
            try:
                requests.get(f"{url}/moto-api/", timeout=10)
                break
            except requests.RequestException:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(
                        f"moto's server did not start on {url} within {MOTO_START_TIMEOUT_S} s"
                    ) from None
                time.sleep(0.1)
        setup = {
            "endpoint_url": url,
            "region_name": REGION,
            "aws_access_key_id": "setup",
            "aws_secret_access_key": "setup",
        }
        iam = boto3.client("iam", **setup)
        iam.create_user(UserName="snapcut")
        policy = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
        }
        iam.put_user_policy(UserName="snapcut", PolicyName="all", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="snapcut")["AccessKey"]
        bucket = f"snapcut-auth-{uuid.uuid4().hex[:8]}"
        boto3.client("s3", **setup).create_bucket(Bucket=bucket)
        requests.post(f"{url}/moto-api/reset-auth", data=b"0", timeout=10).raise_for_status()
        yield AuthS3Server(f"127.0.0.1:{port}", key["AccessKeyId"], key["SecretAccessKey"], bucket)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
