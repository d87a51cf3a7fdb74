"""``ArrowSnapshotSink``: an exactly-once ``foreachBatch`` sink writing each
micro-batch's output as Arrow IPC files plus a manifest (docs/format.md).

    >>> sink = ArrowSnapshotSink("/data/dwell-out", output_mode="update", key="user",
    ...                          state=averages_state)          # optional: one global snapshot
    >>> q = avg.writeStream.foreachBatch(sink).option("checkpointLocation", chk).start()
    >>> read_output_arrow("/data/dwell-out")                  # committed batches only

Layout of a sink root (a local path or any pyarrow-filesystem URI)::

    <root>/_snapcut_sink.json            output mode, key columns, schema (fixed for the root)
    <root>/_snapcut_owner.json           the streaming query that writes the root
    <root>/_staging/...                  files of batches not (yet) committed: never read
    <root>/chk-<N>/manifest.json         the commit of batch N (docs/format.md)
    <root>/chk-<N>/sources.arrow         (Spark's offsets are in the manifest's "spark")
    <root>/chk-<N>/part-<p>[-<k>].arrow  batch N's output rows of Spark partition p

**Committed data.** Every ``chk-<N>/part-*.arrow`` file of a directory that
has its ``manifest.json`` is committed output, and nothing else is. On a
local (or any POSIX) filesystem the whole ``chk-<N>`` directory appears at
once: executors stage files under ``_staging/`` (names carry batch id,
partition, attempt and a random token); the driver moves the winning
attempts' files into a directory under ``_staging/``, writes the manifest
there (temp + fsync + rename) and then renames that directory to
``chk-<N>`` — one atomic rename is the commit. So the glob
``<root>/chk-*/part-*.arrow`` sees exactly the committed batches; ``_``-prefixed
paths are also skipped by Spark's and pyarrow.dataset's directory discovery.
On object stores (no directory rename) the files are moved into ``chk-<N>``
first and the manifest is written last: there, read through the manifest
(:func:`read_output_arrow`, :func:`read_output`), or take ``chk-<N>/part-*``
only where ``chk-<N>/manifest.json`` exists.

**Exactly once.** A batch whose ``chk-<N>/manifest.json`` exists is skipped
(Spark re-delivers the last batch after a restart: Delta's ``txnVersion``
idea); anything under ``_staging/`` (uncommitted batches, losing attempts) is
removed when the next batch starts, and the manifest names only the files
of the attempt whose result Spark returned.

**One global snapshot per batch.** With ``state=`` (a ``keyed_state`` root
written by the same query), the commit of batch N waits for every state
partition's acknowledgement of version N, then writes one manifest naming
the state files (paths in the state root, sizes, checksums), the output files
and Spark's source offsets for N (the query's ``checkpointLocation``
``offsets/<N>``): batch N is barrier N.

**Schemas.** A root holds one schema (names and types; nullability may
vary): readers such as pyarrow.dataset and DuckDB then see one table. A batch
whose schema differs fails with a ConfigError naming the change, before
anything is written; write the new schema to a new root.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.ipc as ipc

from snapcut import _fs
from snapcut._core import ConfigError, SnapshotError, StorageError
from snapcut.snapshots import (
    MANIFEST_FILE,
    FsBackend,
    SnapshotWriter,
    checkpoint_dir_name,
    encode_ipc,
    file_entry,
)
from snapcut.spark import failpoints
from snapcut.spark.batch_identity import announced, checkpoint_fs, is_connect, query_id
from snapcut.spark.root import (
    BATCH_OWNER,
    PROTOCOL,
    StateRoot,
    claim_root,
    schema_bytes,
    schema_from_bytes,
    schema_to_json,
    spec_of,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "OUTPUT_ROLE",
    "ArrowSnapshotSink",
    "BatchReport",
    "CommittedBatch",
    "committed_output",
    "read_batch_output_arrow",
    "read_output",
    "read_output_arrow",
    "read_sink_meta",
]

SINK_META_FILE = "_snapcut_sink.json"
STAGING_DIR = "_staging"
SINK_FORMAT = "snapcut-spark-sink"
SINK_FORMAT_VERSION = 1
OUTPUT_ROLE = "output"
OUTPUT_MODES = ("append", "update", "complete")
ORDER_COLUMN = "__order"
FILES_DDL = "partition int, attempt int, file int, path string, rows long, bytes long, crc32c long"
_FILES_SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),
        ("attempt", pa.int32()),
        ("file", pa.int32()),
        ("path", pa.string()),
        ("rows", pa.int64()),
        ("bytes", pa.int64()),
        ("crc32c", pa.int64()),
    ]
)
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def output_file_name(partition: int, file: int) -> str:
    """Name of a committed output file inside ``chk-<N>``."""
    return f"part-{partition:05d}.arrow" if file == 0 else f"part-{partition:05d}-{file}.arrow"


@dataclass(frozen=True)
class _Target:
    """What a staging task needs; pickled into the ``mapInArrow`` function."""

    uri: str
    filesystem: Any
    batch: int
    schema_ipc: bytes
    max_file_bytes: int


def _no_space(e: BaseException) -> bool:
    while e is not None:
        if isinstance(e, OSError) and e.errno in _NO_SPACE:
            return True
        if isinstance(e, OSError) and "No space left" in str(e):
            return True  # pyarrow's IOError text for ENOSPC
        e = e.__cause__  # type: ignore[assignment]
    return False


def _conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    if batch.schema.equals(schema, check_metadata=False):
        return batch
    if batch.schema.names != schema.names:
        raise ConfigError(
            f"a task's rows have columns {batch.schema.names}, the batch DataFrame has "
            f"{schema.names}"
        )
    return batch.cast(schema)


def stage_partition(
    target: _Target, partition: int, attempt: int, batches: Iterator[pa.RecordBatch]
) -> pa.RecordBatch:
    """Writes one partition's rows of batch N as Arrow IPC file(s) under
    ``_staging/`` and returns their descriptions (free of Spark, for tests).
    The Rust encoder writes each file and its crc32c; a new file starts once
    the rows held reach ``max_file_bytes`` of Arrow buffers."""
    failpoints.hit("sink.before_stage", target.batch, partition)
    fs, root = _fs.resolve(target.uri, target.filesystem)
    schema = schema_from_bytes(target.schema_ipc)
    token = uuid.uuid4().hex[:12]
    out: list[dict[str, Any]] = []
    held: list[pa.RecordBatch] = []

    def finish() -> None:
        k = len(out)
        rel = f"{STAGING_DIR}/{target.batch:08d}/part-{partition:05d}-{k}-a{attempt}-{token}.arrow"
        data, rows, crc = encode_ipc(pa.Table.from_batches(held, schema), rel)
        held.clear()
        path = f"{root}/{rel}"
        try:
            _fs.write_bytes(fs, path, data)
        except StorageError as e:
            with contextlib.suppress(OSError):
                fs.delete_file(path)  # a partial file only takes space
            if _no_space(e):
                raise StorageError(
                    f"sink root {target.uri}: no space left to stage batch {target.batch} "
                    f"(partition {partition}, {len(data)} bytes): {e}. Nothing committed was "
                    f"touched; free space and restart the query, Spark re-runs batch "
                    f"{target.batch}"
                ) from e
            raise
        out.append(
            {
                "partition": partition,
                "attempt": attempt,
                "file": k,
                "path": rel,
                "rows": rows,
                "bytes": len(data),
                "crc32c": crc,
            }
        )

    size = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        held.append(_conform(batch, schema))
        size += held[-1].nbytes
        if size >= target.max_file_bytes:
            finish()
            size = 0
    if held:
        finish()
    failpoints.hit("sink.after_stage", target.batch, partition)
    return pa.RecordBatch.from_pylist(out, schema=_FILES_SCHEMA)


def _stage_function(
    target: _Target,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx is not None else 0
        attempt = ctx.attemptNumber() if ctx is not None else 0
        yield stage_partition(target, partition, attempt, batches)

    return run


@dataclass
class BatchReport:
    """What the sink did with one batch (``sink.reports``)."""

    batch_id: int
    committed: bool
    """False: the batch was already committed and skipped (a re-delivery)."""
    rows: int = 0
    files: int = 0
    bytes: int = 0
    stage_ms: float = 0.0
    state_wait_ms: float = 0.0
    commit_ms: float = 0.0
    total_ms: float = 0.0


@dataclass(frozen=True)
class CommittedBatch:
    """One committed batch of a sink root, as its manifest records it
    (``sink.history()``): readable from anywhere the root is, including a
    Spark Connect client, whose copy of the sink never runs a batch."""

    batch_id: int
    query_id: str
    rows: int
    files: int
    bytes: int
    stage_ms: float
    state_wait_ms: float
    started_ms: int
    finished_ms: int
    state_batch: int | None
    """The state root's version committed with it (``state=``), else None."""

    @classmethod
    def of(cls, manifest: dict[str, Any]) -> CommittedBatch:
        spark, output, state = manifest["spark"], manifest["output"], manifest.get("state")
        return cls(
            batch_id=int(manifest["checkpoint_id"]),
            query_id=str(spark["query_id"]),
            rows=int(output["rows"]),
            files=int(output["files"]),
            bytes=int(output["bytes"]),
            stage_ms=float(spark["stage_ms"]),
            state_wait_ms=float(spark["state_wait_ms"]),
            started_ms=int(manifest["started_ms"]),
            finished_ms=int(manifest["finished_ms"]),
            state_batch=None if state is None else int(state["batch"]),
        )


@dataclass
class _StateRef:
    uri: str
    filesystem: Any


class ArrowSnapshotSink:
    """An exactly-once ``foreachBatch`` sink: ``q = df.writeStream.foreachBatch(sink)``.

    ``root``: a local path or pyarrow-filesystem URI (or a path inside
    ``filesystem``); ``output_mode``: "append" (each batch adds rows),
    "update" (each batch upserts rows by ``key``; readers keep the newest row
    per key) or "complete" (each batch is the whole table; readers take the
    newest batch); ``key``: column(s), needed for "update"; ``state``: a
    ``keyed_state`` root (path/URI) or the ``KeyedState`` whose state this
    query writes: batch N then commits as one global snapshot with the
    state's version N; ``state_timeout``: seconds to wait for the state
    partitions' acknowledgements; ``checkpoint_location``: where Spark's
    ``offsets/`` are, if the running query cannot tell (e.g. Spark Connect);
    ``max_file_bytes``: a task starts a new file beyond this many bytes.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        output_mode: str = "append",
        key: str | Sequence[str] | None = None,
        state: Any = None,
        filesystem: Any = None,
        checkpoint_location: str | None = None,
        state_timeout: float = 120.0,
        max_file_bytes: int = 128 << 20,
    ) -> None:
        if output_mode not in OUTPUT_MODES:
            raise ConfigError(f"output_mode must be one of {OUTPUT_MODES}, got {output_mode!r}")
        keys = () if key is None else ((key,) if isinstance(key, str) else tuple(key))
        if output_mode == "update" and not keys:
            raise ConfigError(
                "output_mode='update' needs key= (the column(s) whose newest row readers keep), "
                "e.g. ArrowSnapshotSink(root, output_mode='update', key='user')"
            )
        if state_timeout <= 0:
            raise ConfigError(f"state_timeout must be positive seconds, got {state_timeout!r}")
        if max_file_bytes < 1:
            raise ConfigError(f"max_file_bytes must be positive, got {max_file_bytes!r}")
        self.uri = os.fspath(root) if not isinstance(root, str) else root
        self.filesystem = filesystem
        self.output_mode = output_mode
        self.key = keys
        self.checkpoint_location = checkpoint_location
        self.state_timeout = float(state_timeout)
        self.max_file_bytes = int(max_file_bytes)
        self._state = _state_ref(state)
        # The root's URI without credentials, for messages and manifests.
        self.name = _fs.redact(self.uri)
        self.fs, self.path = _fs.resolve(self.uri, filesystem)
        self.local = _fs.local_path(self.fs, self.path) is not None
        self.reports: list[BatchReport] = []
        what = f"sink root {self.name} cannot be created"
        _fs.check_bucket(self.fs, self.path, what)
        if not _fs.is_object_store(self.fs):
            _refuse_below_a_file(self.fs, self.path, what)
        # The root is created by the first batch, where foreachBatch runs (the
        # driver, or Spark Connect's server-side worker), not where the sink is
        # built: a Connect client's local paths are not the server's.
        self._root_ready = False

    def _ensure_root(self) -> None:
        if self._root_ready or _fs.is_object_store(self.fs):
            return  # object stores: a prefix exists once a file is under it
        try:
            self.fs.create_dir(self.path, recursive=True)
        except OSError as e:
            raise StorageError(
                f"sink root {self.name} cannot be created: {e}; pass a root you can write to"
            ) from e
        self._root_ready = True

    # -- the batch -----------------------------------------------------------

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        self.write_batch(batch_df, int(batch_id))

    def history(self) -> list[CommittedBatch]:
        """Every committed batch of this root, oldest first, from the
        manifests. ``reports`` fills in the process that runs
        ``foreachBatch`` (under Spark Connect, the server's worker), this
        reads the root, so a Connect client sees what was committed."""
        backend = FsBackend(self.fs, self.path)
        return [CommittedBatch.of(backend.manifest(b)) for b in backend.complete()]

    def committed(self, batch_id: int) -> bool:
        """Whether batch `batch_id` is committed in this root."""
        return _fs.exists(self.fs, f"{self._chk(batch_id)}/{MANIFEST_FILE}")

    def write_batch(self, batch_df: DataFrame, batch_id: int) -> BatchReport:
        """Writes and commits one batch (what ``foreachBatch`` calls)."""
        from pyspark.sql.pandas.types import to_arrow_schema

        t0 = time.perf_counter()
        started_ms = _now_ms()
        self._ensure_root()
        owner = query_id(batch_df, batch_id, self.checkpoint_location, f"sink root {self.name}")
        tz = batch_df.sparkSession.conf.get("spark.sql.session.timeZone")
        schema = to_arrow_schema(batch_df.schema, timezone=tz)
        # Checks first: a refused batch touches nothing in the root.
        self._writable(lambda: claim_root(self.fs, self.path, self.name, owner, "sink root"))
        if self.committed(batch_id):
            report = BatchReport(batch_id, committed=False)
            self.reports.append(report)
            return report
        self._check_meta(schema, batch_id)
        state = self._state_root()
        checkpoint = self._checkpoint_location(batch_df, owner)
        self._writable(self._clean_staging)

        target = _Target(
            self.uri, self.filesystem, batch_id, schema_bytes(schema), self.max_file_bytes
        )
        t1 = time.perf_counter()
        # The batch's one Spark action: executors write the data, the driver
        # gets their file descriptions.
        with announced(batch_df.sparkSession, owner, batch_id):
            staged = batch_df.mapInArrow(_stage_function(target), FILES_DDL).collect()
        files = [r.asDict() for r in staged]
        t2 = time.perf_counter()
        state_record = None if state is None else self._await_state(state, batch_id, owner)
        t3 = time.perf_counter()
        offsets = None if checkpoint is None else read_offsets(checkpoint, batch_id)
        failpoints.hit("sink.before_commit", batch_id, 0)
        files.sort(key=lambda f: (f["partition"], f["file"]))
        report = BatchReport(
            batch_id,
            committed=True,
            rows=sum(f["rows"] for f in files),
            files=len(files),
            bytes=sum(f["bytes"] for f in files),
            stage_ms=round((t2 - t1) * 1000, 3),
            state_wait_ms=round((t3 - t2) * 1000, 3),
        )
        extra: dict[str, Any] = {
            "output": {
                "mode": self.output_mode,
                "key": list(self.key),
                "schema": schema_to_json(schema),
                "rows": report.rows,
                "files": report.files,
                "bytes": report.bytes,
            },
            "spark": {
                "query_id": owner,
                "batch_id": batch_id,
                "checkpoint_location": None if checkpoint is None else _fs.redact(checkpoint),
                "offsets": offsets,
                "stage_ms": report.stage_ms,
                "state_wait_ms": report.state_wait_ms,
            },
        }
        if state_record is not None:
            extra["state"] = state_record
        self._writable(lambda: self._commit(batch_id, files, extra, started_ms))
        # Committed. What is left under _staging/ (losing attempts) is garbage.
        with contextlib.suppress(OSError):
            self.fs.delete_dir(f"{self.path}/{STAGING_DIR}")
        report.commit_ms = round((time.perf_counter() - t3) * 1000, 3)
        report.total_ms = round((time.perf_counter() - t0) * 1000, 3)
        self.reports.append(report)
        failpoints.hit("sink.after_commit", batch_id, 0)
        return report

    # -- checks ----------------------------------------------------------------

    def _writable(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except (StorageError, OSError) as e:
            if _no_space(e):
                raise StorageError(
                    f"sink root {self.name}: no space left ({e}). Nothing committed was "
                    "touched; free space and restart the query, Spark re-runs the batch"
                ) from e
            if isinstance(e, StorageError) and str(e).startswith("sink root"):
                raise
            store: StorageError | None = e if isinstance(e, _fs.ObjectStoreError) else None
            if isinstance(e, OSError) and _fs.is_object_store(self.fs):
                store = _fs.storage_error(e, self.fs, "a request", self.path)
            if store is not None:
                raise _fs.ObjectStoreError(
                    f"sink root {self.name}: {store} (nothing committed was touched)"
                ) from e
            raise StorageError(
                f"sink root {self.name} is not writable ({e}): pass a root this query can write "
                "to (nothing committed was touched)"
            ) from e

    def _meta_path(self) -> str:
        return f"{self.path}/{SINK_META_FILE}"

    def _check_meta(self, schema: pa.Schema, batch_id: int) -> None:
        missing = [k for k in self.key if k not in schema.names]
        if missing:
            raise ConfigError(
                f"key column(s) {missing} are not in batch {batch_id}'s DataFrame "
                f"(columns: {', '.join(schema.names)})"
            )
        path = self._meta_path()
        if not _fs.exists(self.fs, path):
            meta = {
                "format": SINK_FORMAT,
                "format_version": SINK_FORMAT_VERSION,
                "output_mode": self.output_mode,
                "key": list(self.key),
                "schema": schema_to_json(schema),
                "schema_ipc": base64.b64encode(schema_bytes(schema)).decode(),
                "first_batch": batch_id,
                "created_ms": _now_ms(),
            }
            body = json.dumps(meta, indent=2, sort_keys=True).encode()
            self._writable(
                lambda: _fs.write_atomic(self.fs, path, f"{path}.{uuid.uuid4().hex}.tmp", body)
            )
            return
        have = read_sink_meta(self.uri, self.filesystem)
        for what, mine in (("output_mode", self.output_mode), ("key", list(self.key))):
            if have[what] != mine:
                raise ConfigError(
                    f"sink root {self.name} was created with {what}={have[what]!r}; this sink "
                    f"has {what}={mine!r}: use the same, or a new root (nothing in the root "
                    "was changed)"
                )
        change = schema_change(have["arrow_schema"], schema)
        if change:
            raise ConfigError(
                f"batch {batch_id}'s DataFrame does not have the schema of sink root {self.name} "
                f"(fixed by batch {have['first_batch']}): {change}. A root holds one schema so "
                "that its readers see one table: select/cast to the root's schema, or write to "
                "a new root (the committed batches are untouched)"
            )

    def _state_root(self) -> StateRoot | None:
        if self._state is None:
            return None
        return StateRoot(spec_of(self._state.uri, self._state.filesystem))

    def _checkpoint_location(self, batch_df: DataFrame, owner: str) -> str | None:
        if self.checkpoint_location is not None:
            return self.checkpoint_location
        if owner == BATCH_OWNER:
            return None  # a plain DataFrame, no streaming query: no offsets
        found = _query_checkpoint(batch_df, owner)
        if found is None:
            raise ConfigError(
                f"cannot find the checkpointLocation of streaming query {owner} (needed for "
                "Spark's source offsets of each batch): pass "
                "ArrowSnapshotSink(..., checkpoint_location=<the query's checkpointLocation>)"
            )
        return found

    def _await_state(self, state: StateRoot, batch_id: int, owner: str) -> dict[str, Any]:
        spec = state.spec
        deadline = time.monotonic() + self.state_timeout
        delay = 0.01
        while True:
            # One listing per poll; the acknowledgements are read once all are listed.
            listed = set(state.acked(batch_id))
            missing = [p for p in range(spec.partitions) if p not in listed]
            if not missing:
                acks = {p: state.read_ack(batch_id, p) for p in range(spec.partitions)}
                missing = [p for p, a in acks.items() if a is None]
                if not missing:
                    break
            if time.monotonic() >= deadline:
                raise SnapshotError(
                    f"batch {batch_id}: state partition(s) {missing} of state root {state.name} "
                    f"did not acknowledge version {batch_id} within {self.state_timeout:g} s "
                    "(a worker died after its task returned, or this query's plan does not "
                    "write that state root): batch not committed, Spark re-runs it when the "
                    "query restarts"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.25)
        foreign = sorted({str(a["query_id"]) for a in acks.values() if a is not None} - {owner})
        if foreign:
            raise ConfigError(
                f"batch {batch_id}: state root {state.name} holds version {batch_id} of query "
                f"{foreign}, not of this query {owner}: give each query its own state root"
            )
        # The acknowledgements just read finalize the batch if no task did:
        # not read a second time.
        manifest = state.committed(batch_id, [acks[p] for p in range(spec.partitions)])
        if manifest is None:
            raise SnapshotError(
                f"batch {batch_id}: every partition of state root {state.name} acknowledged, but "
                "its manifest could not be written"
            )
        chk = checkpoint_dir_name(batch_id)
        files = []
        for f in manifest["files"]:
            if f["role"] != "state":
                continue
            ref = {k: v for k, v in f.items() if k not in ("path", "role", "subtask", "vertex")}
            files.append({"path": f"{chk}/{f['path']}", "partition": f["subtask"], **ref})
        return {
            "root": state.name,
            "vertex": spec.vertex,
            "partitions": spec.partitions,
            "key": list(spec.key),
            "batch": batch_id,
            "manifest": f"{chk}/{MANIFEST_FILE}",
            "files": sorted(files, key=lambda f: f["partition"]),
        }

    # -- commit ----------------------------------------------------------------

    def _chk(self, batch_id: int) -> str:
        return f"{self.path}/{checkpoint_dir_name(batch_id)}"

    def _clean_staging(self) -> None:
        """Removes every staged file (uncommitted batches, losing attempts) and,
        where directories are not renamed atomically, uncommitted chk dirs."""
        staging = f"{self.path}/{STAGING_DIR}"
        if _fs.exists(self.fs, staging):
            self.fs.delete_dir(staging)
        if not self.local:
            SnapshotWriter(self.path, filesystem=self.fs).cleanup_partial(below=2**62)

    def _commit(
        self, batch_id: int, files: list[dict[str, Any]], extra: dict[str, Any], now: int
    ) -> None:
        # The entries' shape is the format's (Rust); the sink adds its own fields.
        entries = [
            file_entry(
                output_file_name(f["partition"], f["file"]),
                OUTPUT_ROLE,
                f["rows"],
                f["bytes"],
                f["crc32c"],
                {k: f[k] for k in ("partition", "file", "attempt")},
            )
            for f in files
        ]
        final = self._chk(batch_id)
        if self.local:
            pending_root = f"{self.path}/{STAGING_DIR}/commit-{batch_id:08d}-{uuid.uuid4().hex}"
            target = f"{pending_root}/{checkpoint_dir_name(batch_id)}"
        else:
            pending_root, target = self.path, final
        if not _fs.is_object_store(self.fs):
            self.fs.create_dir(target, recursive=True)
        for f, e in zip(files, entries, strict=True):
            self.fs.move(f"{self.path}/{f['path']}", f"{target}/{e['path']}")
        SnapshotWriter(pending_root, filesystem=self.fs).commit(
            batch_id,
            entries,
            protocol=PROTOCOL,
            graph_fingerprint=f"spark-sink:{extra['spark']['query_id']}",
            started_ms=now,
            finished_ms=_now_ms(),
            extra=extra,
        )
        if not self.local:
            return
        local_target = _fs.local_path(self.fs, target)
        local_final = _fs.local_path(self.fs, final)
        assert local_target is not None and local_final is not None
        try:
            os.rename(local_target, local_final)
        except OSError as e:
            if e.errno in (errno.EEXIST, errno.ENOTEMPTY) and self.committed(batch_id):
                return  # committed meanwhile by another run of the same batch
            raise
        _fsync_dir(os.path.dirname(local_final))
        with contextlib.suppress(OSError):
            self.fs.delete_dir(pending_root)


def _refuse_below_a_file(fs: Any, path: str, what: str) -> None:
    """Fails early, where the sink is built, if the root cannot ever be a
    directory (an ancestor is a file); creates nothing there."""
    parent = path
    while True:
        info = fs.get_file_info(parent)
        if info.type == pafs.FileType.File:
            raise StorageError(f"{what}: {parent} is a file; pass a root you can write to")
        if info.type == pafs.FileType.Directory:
            return
        up = parent.rsplit("/", 1)[0]
        if up in ("", parent):
            return
        parent = up


def _state_ref(state: Any) -> _StateRef | None:
    if state is None:
        return None
    if isinstance(state, str | os.PathLike):
        return _StateRef(os.fspath(state), None)
    root = getattr(state, "root", None)
    if isinstance(root, str):
        return _StateRef(root, getattr(state, "filesystem", None))
    raise ConfigError(
        f"state= must be a keyed_state root (a path or URI) or the KeyedState it came from, "
        f"got {state!r}"
    )


def _query_checkpoint(batch_df: DataFrame, qid: str) -> str | None:
    """The running query's resolved checkpointLocation (PySpark classic)."""
    from pyspark.sql import SparkSession

    if is_connect(batch_df.sparkSession):
        return None  # no py4j: checkpoint_location= is required there
    for session in (SparkSession.getActiveSession(), batch_df.sparkSession):
        if session is None:
            continue
        try:
            query = session.streams.get(qid)
            if query is not None:
                return str(query._jsq.streamingQuery().resolvedCheckpointRoot())
        except Exception:
            continue
    try:
        jvm = batch_df.sparkSession._jvm
        if jvm is None:
            return None
        default = jvm.org.apache.spark.sql.SparkSession.getDefaultSession()
        if default.isDefined():
            jquery = default.get().streams().get(qid)
            if jquery is not None:
                return str(jquery.streamingQuery().resolvedCheckpointRoot())
    except Exception:
        pass
    return None


def read_offsets(checkpoint_location: str, batch_id: int) -> dict[str, Any]:
    """Spark's offset log entry of `batch_id`: ``offsets/<N>`` of the query's
    checkpointLocation (version line, batch metadata, one line per source)."""
    fs, path = checkpoint_fs(checkpoint_location)
    log = f"{path}/offsets/{batch_id}"
    try:
        text = _fs.read_bytes(fs, log).decode()
    except (OSError, FileNotFoundError) as e:
        raise SnapshotError(
            f"Spark's offset log has no readable entry for batch {batch_id} ({log}: {e}); is "
            f"{checkpoint_location} this query's checkpointLocation?"
        ) from e
    lines = text.splitlines()
    if len(lines) < 2 or not lines[0].startswith("v"):
        raise SnapshotError(f"{log} is not a Spark offset log entry")
    meta = json.loads(lines[1])
    sources: list[Any] = []
    for line in lines[2:]:
        if line.strip() == "-":
            sources.append(None)
            continue
        try:
            sources.append(json.loads(line))
        except ValueError:
            sources.append(line)
    return {
        "log": f"offsets/{batch_id}",
        "version": lines[0],
        "batch_watermark_ms": meta.get("batchWatermarkMs"),
        "batch_timestamp_ms": meta.get("batchTimestampMs"),
        "sources": sources,
    }


def schema_change(old: pa.Schema, new: pa.Schema) -> str:
    """How `new` differs from `old` in names and types ("" if it does not)."""
    parts = []
    added = [n for n in new.names if n not in old.names]
    removed = [n for n in old.names if n not in new.names]
    changed = [
        f"{n} {old.field(n).type} -> {new.field(n).type}"
        for n in new.names
        if n in old.names and old.field(n).type != new.field(n).type
    ]
    if added:
        parts.append(f"added {added}")
    if removed:
        parts.append(f"removed {removed}")
    if changed:
        parts.append("changed " + ", ".join(changed))
    if not parts and old.names != new.names:
        parts.append(f"column order {old.names} -> {new.names}")
    return "; ".join(parts)


# -- readers -------------------------------------------------------------------


def read_sink_meta(root: str | os.PathLike[str], filesystem: Any = None) -> dict[str, Any]:
    """What a sink root holds: output mode, key and schema (``arrow_schema``)."""
    fs, path = _fs.resolve(root, filesystem)
    meta_path = f"{path}/{SINK_META_FILE}"
    if not _fs.exists(fs, meta_path):
        _fs.check_bucket(fs, path, f"reading sink root {_fs.redact(root)}")
        raise SnapshotError(
            f"{_fs.redact(root)} is not a snapcut sink root: it has no {SINK_META_FILE} (is the "
            "path right? the first batch a sink writes creates it)"
        )
    meta: dict[str, Any] = json.loads(_fs.read_bytes(fs, meta_path))
    if meta.get("format") != SINK_FORMAT:
        raise SnapshotError(
            f"{meta_path} is not a snapcut sink root (format {meta.get('format')!r})"
        )
    meta["arrow_schema"] = schema_from_bytes(base64.b64decode(meta["schema_ipc"]))
    return meta


def committed_output(
    root: str | os.PathLike[str], batch: int | None = None, filesystem: Any = None
) -> list[dict[str, Any]]:
    """The manifests whose output files make the table as of `batch`
    (default: the newest committed): every committed batch up to it for
    append and update, the newest one for complete."""
    fs, path = _fs.resolve(root, filesystem)
    meta = read_sink_meta(root, filesystem)
    backend = FsBackend(fs, path)
    ids = backend.complete()
    if batch is not None:
        if batch not in ids:
            raise SnapshotError(
                f"batch {batch} is not committed in sink root {_fs.redact(root)}; committed: {ids}"
            )
        ids = [i for i in ids if i <= batch]
    if meta["output_mode"] == "complete":
        ids = ids[-1:]
    return [backend.manifest(i) for i in ids]


def _output_files(manifests: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    return [
        (int(m["checkpoint_id"]), f)
        for m in manifests
        for f in m["files"]
        if f["role"] == OUTPUT_ROLE
    ]


def _read_file(backend: FsBackend, batch: int, entry: dict[str, Any]) -> pa.Table:
    data = backend.read_checked(batch, entry)
    return ipc.open_file(pa.BufferReader(data)).read_all()


def _newest_per_key(table: pa.Table, key: Sequence[str]) -> pa.Table:
    order = pa.array(range(table.num_rows), pa.int64())
    table = table.append_column(ORDER_COLUMN, order)
    newest = table.group_by(list(key), use_threads=False).aggregate([(ORDER_COLUMN, "max")])
    idx = pc.sort_indices(newest[f"{ORDER_COLUMN}_max"])
    rows = table.take(pc.take(newest[f"{ORDER_COLUMN}_max"], idx))
    return rows.drop_columns([ORDER_COLUMN])


def read_output_arrow(
    root: str | os.PathLike[str], batch: int | None = None, filesystem: Any = None
) -> pa.Table:
    """The committed output as of `batch` (default: the newest committed) as
    pyarrow, every file checked against its size and checksum: append → all
    rows; update → the newest row per key; complete → the newest batch."""
    fs, path = _fs.resolve(root, filesystem)
    meta = read_sink_meta(root, filesystem)
    backend = FsBackend(fs, path)
    manifests = committed_output(root, batch, filesystem)
    if not manifests:
        raise SnapshotError(f"sink root {_fs.redact(root)} has no committed batch yet")
    schema = meta["arrow_schema"]
    tables = [_read_file(backend, b, f) for b, f in _output_files(manifests)]
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    if meta["output_mode"] == "update":
        table = _newest_per_key(table, meta["key"])
    return table


def read_batch_output_arrow(
    root: str | os.PathLike[str], batch: int, filesystem: Any = None
) -> pa.Table:
    """The rows committed batch `batch` wrote, alone (not merged with other
    batches whatever the output mode), every file checked."""
    fs, path = _fs.resolve(root, filesystem)
    meta = read_sink_meta(root, filesystem)
    backend = FsBackend(fs, path)
    if batch not in backend.complete():
        raise SnapshotError(f"batch {batch} is not committed in sink root {root}")
    tables = [_read_file(backend, b, f) for b, f in _output_files([backend.manifest(batch)])]
    schema: pa.Schema = meta["arrow_schema"]
    return pa.concat_tables(tables) if tables else schema.empty_table()


@dataclass(frozen=True)
class _ReadSpec:
    uri: str
    filesystem: Any
    order: bool
    files: list[tuple[int, int, dict[str, Any]]] = field(default_factory=list)


def read_output(
    spark: Any, root: str | os.PathLike[str], batch: int | None = None, filesystem: Any = None
) -> DataFrame:
    """The committed output (as :func:`read_output_arrow`) as a Spark
    DataFrame; executors read the files, one task per file."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    meta = read_sink_meta(root, filesystem)
    manifests = committed_output(root, batch, filesystem)
    if not manifests:
        raise SnapshotError(f"sink root {_fs.redact(root)} has no committed batch yet")
    schema: pa.Schema = meta["arrow_schema"]
    update = meta["output_mode"] == "update"
    files = [(i, b, f) for i, (b, f) in enumerate(_output_files(manifests))]
    spec = _ReadSpec(str(root), filesystem, update, files)
    out_schema = schema.append(pa.field(ORDER_COLUMN, pa.int64())) if update else schema

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fs, path = _fs.resolve(spec.uri, spec.filesystem)
        backend = FsBackend(fs, path)
        for b in batches:
            for i in b.column(0).to_pylist():
                index, batch_id, entry = spec.files[i]
                table = _read_file(backend, batch_id, entry)
                if spec.order:
                    base = index << 32
                    order = pa.array(range(base, base + table.num_rows), pa.int64())
                    table = table.append_column(ORDER_COLUMN, order)
                yield from table.to_batches()

    spark_schema = from_arrow_schema(out_schema, prefer_timestamp_ntz=False)
    n = max(1, len(files))
    ids = spark.createDataFrame([(i,) for i in range(len(files))], "i int")
    df: DataFrame = ids.repartition(n).mapInArrow(read, spark_schema)
    if update:
        cols = [F.col(c) for c in schema.names]
        newest = F.max_by(F.struct(*cols), F.col(ORDER_COLUMN)).alias("__row")
        df = df.groupBy(*meta["key"]).agg(newest).select("__row.*")
    return df


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _now_ms() -> int:
    return int(time.time() * 1000)
