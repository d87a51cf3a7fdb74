"""What the Spark wing's roots share (a state root, a sink root): the
filesystem resolved once, the root's name without credentials, its JSON
files written atomically, and the owner claim (the one streaming query that
may write the root). Also the schema encodings both roots record.

Layout pieces common to both kinds of root::

    <root>/_snapcut_owner.json     the streaming query that writes it
    <root>/<meta file>             what the root holds (each kind names its own)
"""

from __future__ import annotations

import json
import os
import time
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from snapcut import _fs
from snapcut._core import ConfigError, StorageError

__all__ = ["BATCH_OWNER", "OWNER_FILE", "PROTOCOL", "RootDir"]

OWNER_FILE = "_snapcut_owner.json"
PROTOCOL = "spark-microbatch"
BATCH_OWNER = "batch"
"""The owner of a root written by a batch (not streaming) DataFrame."""


class RootDir:
    """One root directory: `uri` resolved once into (filesystem, path).
    Picklable (pyarrow filesystems are), so tasks get it without resolving
    the URI again."""

    def __init__(self, uri: str | os.PathLike[str], filesystem: Any = None) -> None:
        self.uri = os.fspath(uri) if not isinstance(uri, str) else uri
        self.filesystem = filesystem
        self.fs, self.path = _fs.resolve(self.uri, filesystem)
        # For messages and manifests.
        self.name = _fs.redact(self.uri)

    def file(self, name: str) -> str:
        return f"{self.path}/{name}"

    def exists(self, name: str) -> bool:
        return _fs.exists(self.fs, self.file(name))

    def read_json(self, name: str) -> dict[str, Any]:
        """A JSON file of the root known to be there."""
        body: dict[str, Any] = json.loads(_fs.read_bytes(self.fs, self.file(name)))
        return body

    def write_json(self, name: str, obj: Any) -> None:
        """Writes `name` atomically (a temp file of its own, then a rename)."""
        path = self.file(name)
        tmp = f"{path}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
        _fs.write_atomic(self.fs, path, tmp, dump_json(obj))

    def owner(self) -> str | None:
        """The query that claimed the root, if one has."""
        if not self.exists(OWNER_FILE):
            return None
        return str(self.read_json(OWNER_FILE).get("query_id"))

    def claim(self, owner: str, what: str) -> None:
        """Records `owner` (a streaming query id) as the writer of the root,
        or raises ConfigError if another query owns it. `what` names the kind
        of root in the message ("state root", "sink root")."""
        if not self.exists(OWNER_FILE):
            self.write_json(OWNER_FILE, {"query_id": owner, "claimed_ms": now_ms()})
        have = self.owner()
        if have != owner:
            raise ConfigError(
                f"{what} {self.name} belongs to query {have}, and query {owner} is trying to "
                "write it: give each query its own root (a query keeps its id when restarted "
                "from the same checkpointLocation; a new checkpointLocation is a new query)"
            )

    def storage_error(self, e: OSError, what: str) -> StorageError:
        """An OSError of this root's filesystem as the typed error, with the fix."""
        if _fs.is_object_store(self.fs):
            return _fs.storage_error(e, self.fs, what, self.path)
        return StorageError(f"{what}: {e}; pass a root you can write to")


def schema_to_json(schema: pa.Schema) -> list[dict[str, Any]]:
    """A readable, comparable description of a schema (names, types, nullability)."""
    return [{"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in schema]


def schema_bytes(schema: pa.Schema) -> bytes:
    return bytes(schema.serialize().to_pybytes())


def schema_from_bytes(data: bytes) -> pa.Schema:
    return ipc.read_schema(pa.py_buffer(data))


def dump_json(obj: Any) -> bytes:
    return json.dumps(obj, indent=2, sort_keys=True).encode()


def now_ms() -> int:
    return int(time.time() * 1000)
