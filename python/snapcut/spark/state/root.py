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
import time
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from snapcut import _fs
from snapcut._core import ConfigError, SnapshotError, StateRuns, StorageError
from snapcut.snapshots import (
    MANIFEST_FILE,
    FsBackend,
    SnapshotWriter,
    checkpoint_dir_name,
    file_component,
)
from snapcut.snapshots.backend import ChainFile
from snapcut.spark.roots import PROTOCOL, RootDir, schema_bytes, schema_from_bytes
from snapcut.spark.state.spec import (
    ROOT_FORMAT,
    ROOT_META_FILE,
    RootSpec,
    TableLayout,
    TableSpec,
)

__all__ = ["ACK_SUFFIX", "StateRoot", "ack_files", "read_root_meta", "spec_of"]

ACK_SUFFIX = ".ack.json"


class StateRoot:
    """Reads and writes one Spark state root (driver and tasks alike).

    One object per query: the facade builds it, and it is pickled into the
    tasks, the initial-state job and the sink, so the filesystem is resolved
    once and the spec (with its layouts) is never rebuilt from the meta file.
    The manifests it has read are not pickled (a task reads current ones)."""

    def __init__(self, spec: RootSpec, directory: RootDir | None = None) -> None:
        self.spec = spec
        self.dir = directory if directory is not None else RootDir(spec.uri, spec.filesystem)
        self._open()

    def _open(self) -> None:
        self.fs, self.path, self.name = self.dir.fs, self.dir.path, self.dir.name
        self.writer = SnapshotWriter(self.path, filesystem=self.fs, run_cache=self.spec.run_cache)
        # One reader per root object (it keeps the manifests it read). No
        # existence check: init() created the root, existing() read its meta.
        self.backend = FsBackend(self.fs, self.path, check=False, run_cache=self.spec.run_cache)
        # Its state files can be mapped (read_chain(mapped=True)) rather than
        # read: a local root's where they are, a remote one's from the run cache.
        self.mappable = self.backend.mappable

    def __getstate__(self) -> dict[str, Any]:
        return {"spec": self.spec, "dir": self.dir}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.spec, self.dir = state["spec"], state["dir"]
        self._open()

    @classmethod
    def existing(cls, uri: str, filesystem: Any = None, retain: int = 10) -> StateRoot:
        """An existing root, for readers and the sink: its spec from its meta
        file (read once, on a filesystem resolved once)."""
        directory = RootDir(uri, filesystem)
        return cls(_spec_from_meta(directory, _read_meta(directory), retain), directory)

    def meta(self) -> dict[str, Any]:
        """The description the root was created with (and its migrations)."""
        return _read_meta(self.dir)

    # -- the root's identity -------------------------------------------------

    def init(self, operator: str) -> None:
        """Driver side, before any batch: creates the root or checks that it
        holds this operator's state (same partitions, key and schema)."""
        meta_path = self.dir.file(ROOT_META_FILE)
        wanted = self.spec.describe(operator)
        what = f"state root {self.name} cannot be created"
        _fs.check_bucket(self.fs, self.path, what)
        try:
            if not _fs.is_object_store(self.fs):
                self.fs.create_dir(self.path, recursive=True)
            existing = self.dir.exists(ROOT_META_FILE)
        except OSError as e:
            raise self.dir.storage_error(e, what) from e
        if not existing:
            self.dir.write_json(ROOT_META_FILE, wanted)
            return
        have = self.dir.read_json(ROOT_META_FILE)
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
            self._evolve(have, wanted)

    def _evolve(self, have: dict[str, Any], wanted: dict[str, Any]) -> None:
        """The state schema changed since the root was created: migrates by
        :mod:`snapcut.spark.state.evolution`'s rules (recorded in the root's
        description) or refuses before any batch runs."""
        from snapcut.spark.state.evolution import plan_table

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
        self.dir.write_json(ROOT_META_FILE, updated)

    def claim(self, owner: str) -> None:
        """Task side: the root belongs to one streaming query (by Spark's
        query id, which survives restarts from the same checkpointLocation)."""
        self.dir.claim(owner, "state root")

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
        table: pa.Table | pa.RecordBatch | StateRuns,
        kind: str,
        base_runs: list[dict[str, Any]],
        layout: TableLayout | None = None,
    ) -> dict[str, Any]:
        """Writes a partition's version `batch` of one of the root's tables
        (`layout`, default the only one), a "full" or a "diff" on the
        version whose runs are `base_runs`; the entry lists its runs and
        their chain (format 2, the Rust rule). The Rust encoder sorts the
        rows by the state key, so the bytes are deterministic."""
        layout = layout or self.spec.layout()
        return self.writer.write_state(
            batch,
            layout.vertex,
            partition,
            table,
            key=layout.state_key,
            kind=kind,
            sort=True,
            base_runs=base_runs,
        )

    def write_ack(self, batch: int, partition: int, ack: dict[str, Any]) -> None:
        self.dir.write_json(f"{checkpoint_dir_name(batch)}/{self._ack_name(partition)}", ack)

    def read_ack(self, batch: int, partition: int) -> dict[str, Any] | None:
        path = self.ack_path(batch, partition)
        if not _fs.exists(self.fs, path):
            return None
        return self._listed_ack(batch, partition)

    def _listed_ack(self, batch: int, partition: int) -> dict[str, Any]:
        """An acknowledgement known to be there (no existence check)."""
        return self.dir.read_json(f"{checkpoint_dir_name(batch)}/{self._ack_name(partition)}")

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

    def manifest_at(self, batch: int | None) -> dict[str, Any]:
        """The manifest of committed batch `batch` (default: the newest), or
        SnapshotError naming the batches the root has."""
        batches = self.backend.complete()
        if not batches:
            raise SnapshotError(f"state root {self.name} has no committed batch yet")
        wanted = batches[-1] if batch is None else batch
        manifest = self.manifest(wanted)
        if manifest is None:
            raise SnapshotError(
                f"batch {wanted} is not committed (or not retained) in state root "
                f"{self.name}; committed batches: {batches}"
            )
        return manifest

    def await_committed(self, batch: int, owner: str, timeout_s: float) -> dict[str, Any]:
        """Driver side (the sink): waits at most `timeout_s` seconds for every
        partition's acknowledgement of version `batch`, checks they are this
        query's (`owner`), finalizes the batch if no task did and returns its
        manifest. One listing per poll (10 ms, doubling to 250 ms); the
        acknowledgements are read once all are listed, and only once."""
        partitions = self.spec.partitions
        deadline = time.monotonic() + timeout_s
        delay = 0.01
        while True:
            listed = set(self.acked(batch))
            missing = [p for p in range(partitions) if p not in listed]
            if not missing:
                acks = {p: self.read_ack(batch, p) for p in range(partitions)}
                missing = [p for p, a in acks.items() if a is None]
                if not missing:
                    break
            if time.monotonic() >= deadline:
                raise SnapshotError(
                    f"batch {batch}: state partition(s) {missing} of state root {self.name} "
                    f"did not acknowledge version {batch} within {timeout_s:g} s "
                    "(a worker died after its task returned, or this query's plan does not "
                    "write that state root): batch not committed, Spark re-runs it when the "
                    "query restarts"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.25)
        foreign = sorted({str(a["query_id"]) for a in acks.values() if a is not None} - {owner})
        if foreign:
            raise ConfigError(
                f"batch {batch}: state root {self.name} holds version {batch} of query "
                f"{foreign}, not of this query {owner}: give each query its own state root"
            )
        manifest = self.committed(batch, [acks[p] for p in range(partitions)])
        if manifest is None:
            raise SnapshotError(
                f"batch {batch}: every partition of state root {self.name} acknowledged, but "
                "its manifest could not be written"
            )
        return manifest

    def snapshot_record(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """How a global snapshot names this root's version (the sink's
        manifest ``state``): the manifest and state files, paths in the root."""
        batch = int(manifest["checkpoint_id"])
        chk = checkpoint_dir_name(batch)
        files = []
        for f in manifest["files"]:
            if f["role"] != "state":
                continue
            ref = {k: v for k, v in f.items() if k not in ("path", "role", "subtask", "vertex")}
            files.append({"path": f"{chk}/{f['path']}", "partition": f["subtask"], **ref})
        return {
            "root": self.name,
            "vertex": self.spec.vertex,
            "partitions": self.spec.partitions,
            "key": list(self.spec.key),
            "batch": batch,
            "manifest": f"{chk}/{MANIFEST_FILE}",
            "files": sorted(files, key=lambda f: f["partition"]),
        }

    def read_chain(
        self,
        manifest: dict[str, Any],
        partition: int,
        vertex: str | None = None,
        conform: bool = True,
        mapped: bool = False,
    ) -> list[tuple[int, str, pa.Table]]:
        """The (id, kind, table) files that rebuild a partition's state (of
        table `vertex`, default the only one) at a committed batch
        (`manifest`), each checked against its size and checksum: the
        snapshot reader's chain (``FsBackend.chain``; `mapped`: a local
        root's files mapped, not read, and a remote root's mapped from the
        run cache)."""
        from snapcut.spark.state.evolution import conform_file

        files = self.read_chain_files(manifest, partition, vertex, mapped, sidecars=False)
        chain = [(f.checkpoint, f.kind, f.table) for f in files]
        if not conform:
            return chain
        # Files written before a schema migration are read as the current schema.
        schema = schema_from_bytes(self.spec.layout(vertex).schema)
        return [(cid, kind, conform_file(t, schema)) for cid, kind, t in chain]

    def read_chain_files(
        self,
        manifest: dict[str, Any],
        partition: int,
        vertex: str | None = None,
        mapped: bool = False,
        sidecars: bool = True,
    ) -> list[ChainFile]:
        """As :meth:`read_chain` (not conformed), each file with what is
        stored beside it (``FsBackend.chain_files``: a diff's bloom filter, a
        full's time index) if `sidecars`."""
        batch = int(manifest["checkpoint_id"])
        layout = self.spec.layout(vertex)
        files = self.backend.chain_files(
            batch, (layout.vertex, partition), manifest, mapped=mapped, sidecars=sidecars
        )
        if files is None:
            if self.spec.tables and not any(
                t.get("vertex") == layout.vertex for t in manifest.get("tasks", [])
            ):
                return []  # a state variable added on restart: nothing stored yet
            raise SnapshotError(
                f"batch {batch} of state root {self.name} has no state {layout.vertex!r} for "
                f"partition {partition}: the root was written with other partitions or changed "
                "by hand"
            )
        return files


def ack_files(ack: dict[str, Any]) -> list[dict[str, Any]]:
    """The state file entries a partition's acknowledgement names (one per table)."""
    files: list[dict[str, Any]] = ack.get("files") or [ack["file"]]
    return files


def _read_meta(directory: RootDir) -> dict[str, Any]:
    if not directory.exists(ROOT_META_FILE):
        _fs.check_bucket(directory.fs, directory.path, f"reading state root {directory.name}")
        raise SnapshotError(
            f"{directory.name} is not a snapcut Spark state root: it has no {ROOT_META_FILE} "
            "(is the path right? a root is created by the first query that uses it)"
        )
    meta = directory.read_json(ROOT_META_FILE)
    meta["schema"] = schema_from_bytes(base64.b64decode(meta["state_schema_ipc"]))
    return meta


def _spec_from_meta(directory: RootDir, meta: dict[str, Any], retain: int) -> RootSpec:
    return RootSpec(
        uri=directory.uri,
        vertex=meta["vertex"],
        partitions=int(meta["partitions"]),
        key=tuple(meta["key"]),
        state_key=meta["state_key"],
        state_schema=schema_bytes(meta["schema"]),
        full_every=int(meta["full_every"]),
        retain=retain,
        filesystem=directory.filesystem,
        tables=tuple(TableSpec.from_meta(t) for t in meta.get("tables", ())),
    )


def read_root_meta(uri: str, filesystem: Any = None) -> dict[str, Any]:
    """The description a root was created with (partitions, key, schema)."""
    return _read_meta(RootDir(uri, filesystem))


def spec_of(uri: str, filesystem: Any = None, retain: int = 10) -> RootSpec:
    """The RootSpec of an existing root, for readers."""
    return StateRoot.existing(uri, filesystem, retain).spec
