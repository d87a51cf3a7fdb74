"""The S3 credentials of a table output's clients, and their failures as
typed errors naming the table, the credential and the fix.

A table output talks to the store through two clients that each find their
own credentials: the table library on the driver (delta-rs with its
``storage_options``; pyiceberg's FileIO with the catalog properties) and the
pyarrow filesystem the executors write data files with. A missing or refused
credential would otherwise surface as a library's own text (a 403, an IMDS
lookup, moto's 500 for an unsigned request) or as a failed Spark task, after
the executors wrote. The outputs try each client once before the batch writes
anything (:func:`checked` around that first request) and a failure that is
the credentials' becomes an :class:`~snapcut.ObjectStoreError` saying which
client sent which access key id (never the secret), or that it found none,
and what to set.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from snapcut import _fs

__all__ = [
    "S3Client",
    "catalog_client",
    "checked",
    "credential_error",
    "delta_client",
    "filesystem_client",
]

_ENV_FIX = "or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in the environment"
# Texts of a store or a client that mean "these credentials are not accepted".
_REFUSED = (
    *_fs._DENIED,
    "403 Forbidden",
    "InvalidAccessKeyId",
    "lacked the necessary privileges",
    "ExpiredToken",
    "InvalidToken",
)
# Texts of a client that looked for credentials and found none (object_store
# falls back to the instance metadata service; botocore says so).
_NOT_FOUND = (
    "169.254.169.254",
    "/latest/api/token",
    "/latest/meta-data",
    "IMDS",
    "Unable to locate credentials",
    "NoCredentials",
)
_NOT_CREDENTIALS = (*_fs._UNREACHABLE, *_fs._NO_BUCKET)


@dataclass(frozen=True)
class S3Client:
    """One client of a table output and the credentials it sends."""

    what: str
    """The client, e.g. "delta-rs (storage_options)"."""
    key_id: str | None
    """The access key id it sends, None if it was given none."""
    source: str
    """Where the credentials come from (or where none was found)."""
    fix: str
    """What to set to give it credentials."""
    found: bool = True
    """False: it has no credentials at all (none given, none in the
    environment): any failed request (an OSError other than an unreachable
    endpoint or a missing bucket) is theirs; moto, for one, answers an
    unsigned request with a 500, where S3 says 403."""


def _first(options: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    lower = {k.lower(): (k, v) for k, v in options.items()}
    for name in names:
        found = lower.get(name.lower())
        if found is not None and found[1]:
            return found
    return None


def _environment() -> tuple[str | None, str]:
    """The access key id and the source of the credential chain's
    environment (the variables, a profile, a role's token, the shared file)."""
    key = os.environ.get("AWS_ACCESS_KEY_ID")
    if key:
        return key, "AWS_ACCESS_KEY_ID in the environment"
    for name in (
        "AWS_PROFILE",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    ):
        if os.environ.get(name):
            return None, f"{name} in the environment"
    shared = os.environ.get("AWS_SHARED_CREDENTIALS_FILE", os.path.expanduser("~/.aws/credentials"))
    if os.path.exists(shared):
        return None, f"the shared credentials file {shared}"
    return None, ""


def _client(what: str, given: tuple[str, str] | None, where: str, fix: str) -> S3Client:
    if given is not None:
        return S3Client(what, given[1], f"{where}[{given[0]!r}]", fix)
    key, source = _environment()
    if not source:
        return S3Client(what, None, f"none in {where} nor in the environment", fix, False)
    return S3Client(what, key, source, fix)


def delta_client(storage_options: Mapping[str, str]) -> S3Client:
    """delta-rs on the driver: its storage_options, then the environment."""
    given = _first(storage_options, "AWS_ACCESS_KEY_ID", "ACCESS_KEY_ID")
    fix = (
        "pass DeltaOutput(..., storage_options={'AWS_ACCESS_KEY_ID': ..., "
        f"'AWS_SECRET_ACCESS_KEY': ...}}) {_ENV_FIX} of the driver"
    )
    return _client("delta-rs (storage_options)", given, "storage_options", fix)


def catalog_client(properties: Mapping[str, str]) -> S3Client:
    """pyiceberg's FileIO: the catalog properties, then the environment."""
    given = _first(properties, "s3.access-key-id", "client.access-key-id")
    fix = (
        "set the catalog properties 's3.access-key-id' and 's3.secret-access-key' "
        f"{_ENV_FIX} of the driver and the executors (spark.executorEnv.AWS_ACCESS_KEY_ID, ...)"
    )
    return _client("pyiceberg's FileIO (catalog properties)", given, "the catalog properties", fix)


def filesystem_client(fs: Any) -> S3Client | None:
    """The executors' pyarrow filesystem (None: not S3)."""
    base, _ = _fs._base(fs, "")
    if getattr(base, "type_name", None) != "s3":
        return None
    try:
        options: dict[str, Any] = base.__reduce__()[1][0]
    except Exception:
        options = {}
    fix = (
        "pass filesystem=pyarrow.fs.S3FileSystem(access_key=..., secret_key=..., ...) "
        f"{_ENV_FIX} of the driver and the executors (spark.executorEnv.AWS_ACCESS_KEY_ID, ...)"
    )
    what = "the executors' pyarrow filesystem"
    if options.get("access_key"):
        return S3Client(what, str(options["access_key"]), "its access_key", fix)
    if options.get("anonymous"):
        return S3Client(what, None, "anonymous=True: unsigned requests", fix, False)
    if options.get("role_arn"):
        return S3Client(what, None, f"role_arn {options['role_arn']}", fix)
    return _client(what, None, "its options", fix)


def credential_error(name: str, client: S3Client, e: BaseException) -> _fs.ObjectStoreError | None:
    """`e` as the credentials' failure, or None if it is another one (an
    unreachable endpoint, a missing bucket: the callers' errors say those)."""
    text = str(e).strip()
    short = text.splitlines()[0][:300] if text else type(e).__name__
    code = re.search(r"<Code>(\w+)</Code>", text)  # delta-rs puts the store's answer last
    if code is not None and code.group(1) not in short:
        short = f"{short}: {code.group(1)}"
    # Before the unreachable test: an instance metadata service that does
    # not answer is a client that found no credentials.
    if client.key_id is None and any(s in text for s in _NOT_FOUND):
        return _missing(name, client, short)
    if any(s in text for s in _NOT_CREDENTIALS):
        return None
    if client.found and any(s in text for s in _REFUSED):
        key = "" if client.key_id is None else f" {client.key_id}"
        return _fs.ObjectStoreError(
            f"output table {name}: the store refused the credentials{key} of {client.what} "
            f"(from {client.source}; {short}): the key is unknown, its secret is wrong, or it "
            f"may not use the table. Give it a key that can read and write the table: "
            f"{client.fix} (nothing was written)"
        )
    # Without credentials any failed request is theirs; a library's own
    # answer (no such table) is not a request that failed.
    if (not client.found and isinstance(e, OSError)) or any(s in text for s in _NOT_FOUND):
        return _missing(name, client, short)
    return None


def _missing(name: str, client: S3Client, short: str) -> _fs.ObjectStoreError:
    return _fs.ObjectStoreError(
        f"output table {name}: {client.what} has no S3 credentials it can use "
        f"({client.source}) and its request failed ({short}). Give it credentials: "
        f"{client.fix} (nothing was written)"
    )


@contextlib.contextmanager
def checked(name: str, client: S3Client | None) -> Iterator[None]:
    """Runs a client's request; its credentials' failure is raised as an
    ObjectStoreError naming the table, the client, the key and the fix."""
    try:
        yield
    except Exception as e:
        error = None if client is None else credential_error(name, client, e)
        if error is None:
            raise
        raise error from e
