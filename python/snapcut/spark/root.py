"""A Spark state root: the snapshot format (docs/format.md), one checkpoint per micro-batch.

Layout (any local path or pyarrow-filesystem URI)::

    <root>/_snapcut_state.json          what the root holds: partitions, key, schema
    <root>/_snapcut_owner.json          the streaming query that writes it
    <root>/chk-<batch id>/<vertex>-<p>.state.arrow   version N of partition p
    <root>/chk-<batch id>/<vertex>-<p>.ack.json      partition p's acknowledgement
    <root>/chk-<batch id>/manifest.json              written once every partition acked

Every file of batch N has a deterministic name and content, so a task retry,
a speculative duplicate or a re-run of N after a driver restart rewrites the
same bytes. Acknowledgements are read once per batch, not once per task: a
task that has acknowledged lists ``chk-N/`` (one request) and only the task
that finds every acknowledgement there (the last one, or a few finishing at
once) reads them and writes the manifest. Batch N+1 only runs after Spark
committed N, so its tasks (and the sink's driver) finalize N's manifest the
same way if the task that would have written it died first.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from snapcut import _fs
from snapcut._core import ConfigError, SnapshotError, StorageError
from snapcut.snapshots import (
    FsBackend,
    SnapshotWriter,
    checkpoint_dir_name,
    file_component,
)

ROOT_META_FILE = "_snapcut_state.json"
OWNER_FILE = "_snapcut_owner.json"
ACK_SUFFIX = ".ack.json"
PROTOCOL = "spark-microbatch"
ROOT_FORMAT = "snapcut-spark-state"
ROOT_FORMAT_VERSION = 1
BATCH_OWNER = "batch"

__all__ = ["RootSpec", "StateRoot", "TableSpec", "claim_root", "read_root_meta", "spec_of"]


def schema_to_json(schema: pa.Schema) -> list[dict[str, Any]]:
    """A readable, comparable description of a schema (names, types, nullability)."""
    return [{"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in schema]


def schema_bytes(schema: pa.Schema) -> bytes:
    return bytes(schema.serialize().to_pybytes())


def schema_from_bytes(data: bytes) -> pa.Schema:
    return ipc.read_schema(pa.py_buffer(data))


@dataclass(frozen=True)
class TableSpec:
    """One of several state tables of a root: a transformWithState operator
    keeps each state variable (and its timers) in a table of its own, written
    per partition as vertex ``<name>.<table>`` of the same checkpoints."""

    name: str
    kind: str
    """"value", "list", "map" or "timers"."""
    state_key: str
    schema: bytes
    group: str | None = None
    """The column whose rows are read and deleted together (the grouping key
    of a composite key); None for a table keyed by the grouping key itself."""
    ttl_ms: int | None = None
    key_columns: tuple[str, ...] = ()
    """The columns that key a row (they may not change on restart)."""

    @property
    def arrow_schema(self) -> pa.Schema:
        return schema_from_bytes(self.schema)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "state_key": self.state_key,
            "group": self.group,
            "ttl_ms": self.ttl_ms,
            "key_columns": list(self.key_columns),
            "schema": schema_to_json(self.arrow_schema),
            "schema_ipc": base64.b64encode(self.schema).decode(),
        }

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> TableSpec:
        return cls(
            name=meta["name"],
            kind=meta["kind"],
            state_key=meta["state_key"],
            schema=base64.b64decode(meta["schema_ipc"]),
            group=meta.get("group"),
            ttl_ms=meta.get("ttl_ms"),
            key_columns=tuple(meta.get("key_columns", ())),
        )


@dataclass(frozen=True)
class TableLayout:
    """Where one state table of a root lives: its vertex in the checkpoints."""

    vertex: str
    state_key: str
    schema: bytes
    group: str | None = None


@dataclass(frozen=True)
class RootSpec:
    """What every task needs to know about a root; pickled into the UDF."""

    uri: str
    vertex: str
    partitions: int
    key: tuple[str, ...]
    state_key: str
    state_schema: bytes
    full_every: int
    retain: int
    filesystem: Any = field(default=None, compare=False)
    tables: tuple[TableSpec, ...] = ()
    """Several state tables (transformWithState's variables); empty for the
    one table of `state_schema` keyed by `state_key`."""

    @property
    def schema(self) -> pa.Schema:
        return schema_from_bytes(self.state_schema)

    def layouts(self) -> list[TableLayout]:
        """The root's state tables: vertex ``<vertex>`` alone, or
        ``<vertex>.<table>`` for each of `tables`."""
        if not self.tables:
            return [TableLayout(self.vertex, self.state_key, self.state_schema)]
        return [
            TableLayout(table_vertex(self.vertex, t.name), t.state_key, t.schema, t.group)
            for t in self.tables
        ]

    def table(self, name: str) -> TableSpec:
        for t in self.tables:
            if t.name == name:
                return t
        known = [t.name for t in self.tables] or ["(none: the root holds one table)"]
        raise ConfigError(
            f"state root {_fs.redact(self.uri)} has no state variable {name!r}; it has "
            f"{', '.join(known)}"
        )

    def describe(self, operator: str) -> dict[str, Any]:
        return {
            "format": ROOT_FORMAT,
            "format_version": ROOT_FORMAT_VERSION,
            "operator": operator,
            "vertex": self.vertex,
            "partitions": self.partitions,
            "key": list(self.key),
            "state_key": self.state_key,
            "state_schema": schema_to_json(self.schema),
            "state_schema_ipc": base64.b64encode(self.state_schema).decode(),
            "full_every": self.full_every,
            **({"tables": [t.describe() for t in self.tables]} if self.tables else {}),
        }


def table_vertex(vertex: str, table: str) -> str:
    """The vertex of one of an operator's several state tables."""
    return f"{vertex}.{table}"


class StateRoot:
    """Reads and writes one Spark state root (driver and tasks alike)."""

    def __init__(self, spec: RootSpec) -> None:
        self.spec = spec
        self.fs, self.path = _fs.resolve(spec.uri, spec.filesystem)
        # The root's URI without credentials, for messages and manifests.
        self.name = _fs.redact(spec.uri)
        self.writer = SnapshotWriter(self.path, filesystem=self.fs)
        # One reader per root object (it keeps the manifests it read). No
        # existence check: init() created the root, spec_of() read its meta.
        self.backend = FsBackend(self.fs, self.path, check=False)

    # -- the root's identity -------------------------------------------------

    def init(self, operator: str) -> None:
        """Driver side, before any batch: creates the root or checks that it
        holds this operator's state (same partitions, key and schema)."""
        meta_path = f"{self.path}/{ROOT_META_FILE}"
        wanted = self.spec.describe(operator)
        what = f"state root {self.name} cannot be created"
        _fs.check_bucket(self.fs, self.path, what)
        try:
            if not _fs.is_object_store(self.fs):
                self.fs.create_dir(self.path, recursive=True)
            existing = _fs.exists(self.fs, meta_path)
        except OSError as e:
            if _fs.is_object_store(self.fs):
                raise _fs.storage_error(e, self.fs, what, self.path) from e
            raise StorageError(f"{what}: {e}; pass a root you can write to") from e
        if not existing:
            _fs.write_atomic(
                self.fs, meta_path, f"{meta_path}.{uuid.uuid4().hex}.tmp", _dump(wanted)
            )
            return
        have = json.loads(_fs.read_bytes(self.fs, meta_path))
        if have.get("format") != ROOT_FORMAT:
            raise ConfigError(
                f"{meta_path} is not a snapcut Spark state root (format {have.get('format')!r})"
            )
        for what, fix in (
            ("partitions", "use the same number, or rescale the root first"),
            ("key", "use the same key columns, or a new root"),
            ("operator", "each root holds one operator's state: use a new root"),
            ("vertex", "use the same name=, or a new root"),
            ("state_key", "use the same key columns, or a new root"),
        ):
            if have.get(what) != wanted.get(what):
                raise ConfigError(
                    f"state root {self.name} was created with {what}={have.get(what)!r}; "
                    f"this query asks {what}={wanted.get(what)!r}: {fix} "
                    "(nothing in the root was changed)"
                )
        if have.get("state_schema") != wanted["state_schema"] or have.get("tables") != wanted.get(
            "tables"
        ):
            self._evolve(have, wanted, meta_path)

    def _evolve(self, have: dict[str, Any], wanted: dict[str, Any], meta_path: str) -> None:
        """The state schema changed since the root was created: migrates by
        :mod:`snapcut.spark.evolution`'s rules (recorded in the root's
        description) or refuses before any batch runs."""
        from snapcut.spark.evolution import plan_table

        changes = []
        if self.spec.tables:
            old = {t["name"]: TableSpec.from_meta(t) for t in have.get("tables", ())}
            for t in self.spec.tables:
                before = old.get(t.name)
                if before is None:
                    changes.append({"table": t.name, "added_table": True})
                    continue
                if before.kind != t.kind:
                    raise ConfigError(
                        f"state root {self.name}: state variable {t.name!r} was a {before.kind} "
                        f"state and is now a {t.kind} state: keep its kind, or give the new "
                        "variable another name"
                    )
                keys = set(before.key_columns) | set(t.key_columns)
                m = plan_table(t.name, before.arrow_schema, t.arrow_schema, keys, self.name)
                if m:
                    changes.append(m.describe())
            for name in old:
                if name not in {t.name for t in self.spec.tables}:
                    changes.append({"table": name, "removed_table": True})
        else:
            if "tables" in have:
                raise ConfigError(
                    f"state root {self.name} holds transformWithState state variables: "
                    "use a new root for this operator"
                )
            before_schema = schema_from_bytes(base64.b64decode(have["state_schema_ipc"]))
            keys = {self.spec.state_key, *self.spec.key}
            m = plan_table(self.spec.vertex, before_schema, self.spec.schema, keys, self.name)
            if m:
                changes.append(m.describe())
        first = max(self.backend.complete(), default=-1) + 1
        updated = dict(wanted)
        updated["migrations"] = [
            *have.get("migrations", []),
            {"first_batch": first, "changes": changes},
        ]
        _fs.write_atomic(self.fs, meta_path, f"{meta_path}.{uuid.uuid4().hex}.tmp", _dump(updated))

    def claim(self, owner: str) -> None:
        """Task side: the root belongs to one streaming query (by Spark's
        query id, which survives restarts from the same checkpointLocation)."""
        claim_root(self.fs, self.path, self.name, owner, "state root")

    # -- per-batch files -----------------------------------------------------

    def _dir(self, batch: int) -> str:
        return f"{self.path}/{checkpoint_dir_name(batch)}"

    def _ack_name(self, partition: int) -> str:
        return f"{file_component(self.spec.vertex)}-{partition}{ACK_SUFFIX}"

    def ack_path(self, batch: int, partition: int) -> str:
        return f"{self._dir(batch)}/{self._ack_name(partition)}"

    def write_state(
        self,
        batch: int,
        partition: int,
        table: pa.Table | pa.RecordBatch,
        kind: str,
        base_chain: list[int],
        layout: TableLayout | None = None,
    ) -> dict[str, Any]:
        """Writes a partition's version `batch` of one of the root's tables
        (`layout`, default the only one), a "full" or a "diff" on the
        version whose chain is `base_chain`; the entry carries its chain
        (the Rust rule). The Rust encoder sorts the rows by the state key,
        so the bytes are deterministic."""
        layout = layout or self.spec.layouts()[0]
        return self.writer.write_state(
            batch,
            layout.vertex,
            partition,
            table,
            key=layout.state_key,
            kind=kind,
            sort=True,
            base_chain=base_chain,
        )

    def write_ack(self, batch: int, partition: int, ack: dict[str, Any]) -> None:
        path = self.ack_path(batch, partition)
        _fs.write_atomic(self.fs, path, f"{path}.{os.getpid()}.{uuid.uuid4().hex}.tmp", _dump(ack))

    def read_ack(self, batch: int, partition: int) -> dict[str, Any] | None:
        path = self.ack_path(batch, partition)
        if not _fs.exists(self.fs, path):
            return None
        return self._listed_ack(batch, partition)

    def _listed_ack(self, batch: int, partition: int) -> dict[str, Any]:
        """An acknowledgement known to be there (no existence check)."""
        ack: dict[str, Any] = json.loads(_fs.read_bytes(self.fs, self.ack_path(batch, partition)))
        return ack

    def acked(self, batch: int) -> list[int]:
        """The partitions whose acknowledgement of `batch` is there: one
        listing of ``chk-N/``, whatever the number of partitions."""
        from pyarrow.fs import FileSelector

        infos = self.fs.get_file_info(FileSelector(self._dir(batch), allow_not_found=True))
        names = {info.base_name for info in infos}
        return [p for p in range(self.spec.partitions) if self._ack_name(p) in names]

    def manifest(self, batch: int) -> dict[str, Any] | None:
        return self.backend.complete_manifest(batch)

    def finalize(
        self, batch: int, acks: Sequence[dict[str, Any] | None] | None = None
    ) -> dict[str, Any] | None:
        """Writes batch N's manifest if every partition acknowledged it (any
        process may, and several may at once: the content is the same).
        `acks`: every partition's acknowledgement, when the caller has read
        them (else read here). Returns the manifest, or None while an
        acknowledgement is missing."""
        if acks is None:
            acks = [self.read_ack(batch, p) for p in range(self.spec.partitions)]
        if len(acks) != self.spec.partitions or any(a is None for a in acks):
            return None
        done = [a for a in acks if a is not None]
        entries = [e for a in done for e in ack_files(a)]
        spark = {
            "query_id": done[0]["query_id"],
            "batch_id": batch,
            "partitions": self.spec.partitions,
            "key": list(self.spec.key),
            "watermark_ms": max(a["watermark_ms"] for a in done),
            "max_event_time_ms": max(a["max_event_time_ms"] for a in done),
            "batch_timestamp_ms": max(a["batch_timestamp_ms"] for a in done),
            "rows_in": sum(a["rows_in"] for a in done),
            "rows_out": sum(a["rows_out"] for a in done),
            "late_rows": sum(a["late_rows"] for a in done),
            "state_keys": sum(a["state_keys"] for a in done),
            "state_bytes": sum(e["bytes"] for e in entries),
            "write_ms": max(a["write_ms"] for a in done),
        }
        migrated = sorted({m for a in done for m in a.get("migrated", [])})
        if migrated:
            spark["migrated_tables"] = migrated
        manifest = self.writer.commit(
            batch,
            entries,
            tasks=[
                (layout.vertex, p)
                for layout in self.spec.layouts()
                for p in range(self.spec.partitions)
            ],
            protocol=PROTOCOL,
            started_ms=min(a["started_ms"] for a in done),
            finished_ms=max(a["finished_ms"] for a in done),
            extra={"spark": spark},
            replace=True,
        )
        # Best effort: another finalize may remove the same old batch first,
        # and an object store may fail a request (the next batch's finalize
        # retries).
        with contextlib.suppress(OSError, StorageError):
            self.writer.apply_retention(self.spec.retain)
        return manifest

    def finalize_if_acked(self, batch: int) -> dict[str, Any] | None:
        """Task side, after this task's own acknowledgement: one listing; only
        when every partition's acknowledgement is there are they read and the
        manifest written. Listings see every write completed before them
        (local filesystems, S3), so of P tasks at least the last to
        acknowledge finds all P: each batch's acknowledgements are read about
        once (P reads), not by every task (P² reads)."""
        if len(self.acked(batch)) < self.spec.partitions:
            return None
        return self.finalize(
            batch, [self._listed_ack(batch, p) for p in range(self.spec.partitions)]
        )

    def committed(
        self, batch: int, acks: Sequence[dict[str, Any] | None] | None = None
    ) -> dict[str, Any] | None:
        """Batch N's manifest, finalizing it if needed: from `acks` when the
        caller has read them, else from the acknowledgements if all are there."""
        manifest = self.manifest(batch)
        if manifest is not None:
            return manifest
        return self.finalize_if_acked(batch) if acks is None else self.finalize(batch, acks)

    def read_chain(
        self,
        manifest: dict[str, Any],
        partition: int,
        vertex: str | None = None,
        conform: bool = True,
    ) -> list[tuple[int, str, pa.Table]]:
        """The (id, kind, table) files that rebuild a partition's state (of
        table `vertex`, default the only one) at a committed batch
        (`manifest`), each checked against its size and checksum: the
        snapshot reader's chain (``FsBackend.chain``)."""
        from snapcut.spark.evolution import conform_file

        batch = int(manifest["checkpoint_id"])
        layout = next(
            (x for x in self.spec.layouts() if vertex is None or x.vertex == vertex), None
        )
        if layout is None:
            raise SnapshotError(f"state root {self.name} has no state table {vertex!r}")
        chain = self.backend.chain(batch, (layout.vertex, partition), manifest)
        if chain is None:
            if self.spec.tables and not any(
                t.get("vertex") == layout.vertex for t in manifest.get("tasks", [])
            ):
                return []  # a state variable added on restart: nothing stored yet
            raise SnapshotError(
                f"batch {batch} of state root {self.name} has no state {layout.vertex!r} for "
                f"partition {partition}: the root was written with other partitions or changed "
                "by hand"
            )
        if not conform:
            return chain
        # Files written before a schema migration are read as the current schema.
        schema = schema_from_bytes(layout.schema)
        return [(cid, kind, conform_file(t, schema)) for cid, kind, t in chain]


def ack_files(ack: dict[str, Any]) -> list[dict[str, Any]]:
    """The state file entries a partition's acknowledgement names (one per table)."""
    files: list[dict[str, Any]] = ack.get("files") or [ack["file"]]
    return files


def claim_root(fs: Any, path: str, uri: str, owner: str, what: str) -> None:
    """Records `owner` (a streaming query id) as the writer of the root at
    `path`, or raises ConfigError if another query owns it."""
    owner_path = f"{path}/{OWNER_FILE}"
    if not _fs.exists(fs, owner_path):
        body = _dump({"query_id": owner, "claimed_ms": _now_ms()})
        _fs.write_atomic(fs, owner_path, f"{owner_path}.{uuid.uuid4().hex}.tmp", body)
    have = json.loads(_fs.read_bytes(fs, owner_path)).get("query_id")
    if have != owner:
        raise ConfigError(
            f"{what} {uri} belongs to query {have}, and query {owner} is trying to write it: "
            "give each query its own root (a query keeps its id when restarted from the same "
            "checkpointLocation; a new checkpointLocation is a new query)"
        )


def read_root_meta(uri: str, filesystem: Any = None) -> dict[str, Any]:
    """The description a root was created with (partitions, key, schema)."""
    fs, path = _fs.resolve(uri, filesystem)
    meta_path = f"{path}/{ROOT_META_FILE}"
    if not _fs.exists(fs, meta_path):
        _fs.check_bucket(fs, path, f"reading state root {_fs.redact(uri)}")
        raise SnapshotError(
            f"{_fs.redact(uri)} is not a snapcut Spark state root: it has no {ROOT_META_FILE} "
            "(is the path right? a root is created by the first query that uses it)"
        )
    meta: dict[str, Any] = json.loads(_fs.read_bytes(fs, meta_path))
    meta["schema"] = schema_from_bytes(base64.b64decode(meta["state_schema_ipc"]))
    return meta


def spec_of(uri: str, filesystem: Any = None, retain: int = 10) -> RootSpec:
    """The RootSpec of an existing root, for readers."""
    meta = read_root_meta(uri, filesystem)
    return RootSpec(
        uri=uri,
        vertex=meta["vertex"],
        partitions=int(meta["partitions"]),
        key=tuple(meta["key"]),
        state_key=meta["state_key"],
        state_schema=schema_bytes(meta["schema"]),
        full_every=int(meta["full_every"]),
        retain=retain,
        filesystem=filesystem,
        tables=tuple(TableSpec.from_meta(t) for t in meta.get("tables", ())),
    )


def _dump(obj: Any) -> bytes:
    return json.dumps(obj, indent=2, sort_keys=True).encode()


def _now_ms() -> int:
    return int(time.time() * 1000)
