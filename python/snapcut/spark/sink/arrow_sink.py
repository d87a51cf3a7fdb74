"""``ArrowSnapshotSink``: an exactly-once ``foreachBatch`` sink writing each
micro-batch's output as Arrow IPC files plus a manifest (docs/format.md).

    >>> sink = ArrowSnapshotSink("/data/dwell-out", output_mode="update", key="user",
    ...                          state=averages_state)          # optional: one global snapshot
    >>> q = avg.writeStream.foreachBatch(sink).option("checkpointLocation", chk).start()
    >>> read_output_arrow("/data/dwell-out")                  # committed batches only

Layout of a sink root (a local path or any pyarrow-filesystem URI)::

    <root>/_snapcut_sink.json            output mode, key columns, schema (fixed; a table
                                         output's grows by schema_mode="merge")
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
idea), its DataFrame still run to its end into nothing, as Spark's state
store commit check needs (:mod:`.replay`); anything under ``_staging/``
(uncommitted batches, losing attempts) is removed when the next batch
starts, and the manifest names only the files of the attempt whose result
Spark returned.

**One global snapshot per batch.** With ``state=`` (a ``keyed_state`` root
written by the same query), the commit of batch N waits for every state
partition's acknowledgement of version N, then writes one manifest naming
the state files (paths in the state root, sizes, checksums), the output files
and Spark's source offsets for N (the query's ``checkpointLocation``
``offsets/<N>``): batch N is barrier N.

**Table outputs.** With ``output=DeltaOutput(uri)`` or
``output=IcebergOutput(catalog_properties, "ns.table")`` the rows go to a
Delta Lake or Apache Iceberg table instead (:mod:`.table`, :mod:`.delta`,
:mod:`.iceberg`): one table commit per batch carrying the app id
(``snapcut:<query id>:<root>``) and the batch id (Delta: an app transaction;
Iceberg: snapshot summary properties), made after every state partition
acknowledged and before the batch's manifest, which records the commit
(``output.delta.version``, ``output.iceberg.snapshot_id``); the root keeps
the manifests.

**Schemas.** A root holds one schema (names and types; nullability may
vary): readers such as pyarrow.dataset and DuckDB then see one table. A batch
whose schema differs fails with a ConfigError naming the change, before
anything is written; write the new schema to a new root. A table output with
``schema_mode="merge"`` takes a batch that adds columns: the table gets them
(nullable) in the batch's commit, then the root's description records the
new schema (``columns_added``).
"""

from __future__ import annotations

import base64
import contextlib
import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs

from snapcut import _fs
from snapcut._core import ConfigError, StorageError
from snapcut.spark import failpoints
from snapcut.spark.arguments import frame_arrow_schema
from snapcut.spark.batch_identity import announced, query_id
from snapcut.spark.query_checkpoint import read_offsets, running_checkpoint
from snapcut.spark.roots import BATCH_OWNER, schema_bytes, schema_to_json
from snapcut.spark.sink.commit import clean_staging, commit_batch, now_ms
from snapcut.spark.sink.replay import run_replayed_batch
from snapcut.spark.sink.report import BatchReport
from snapcut.spark.sink.root import (
    OUTPUT_MODES,
    SINK_FORMAT,
    SINK_FORMAT_VERSION,
    SINK_META_FILE,
    STAGING_DIR,
    CommittedBatch,
    SinkRoot,
    added_columns,
    schema_change,
)
from snapcut.spark.sink.staging import StagingTarget, files_struct, no_space, stage_function
from snapcut.spark.sink.table import TableOutput
from snapcut.spark.sink.table_batch import TableBatch
from snapcut.spark.source.register import register
from snapcut.spark.state.root import StateRoot

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

__all__ = ["ArrowSnapshotSink", "BatchReport", "CommittedBatch"]


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
    ``max_file_bytes``: a task starts a new file beyond this many bytes;
    ``output``: a :class:`~.delta.DeltaOutput` or
    :class:`~.iceberg.IcebergOutput`, the table the rows go to (the root then
    holds the manifests only).
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
        output: TableOutput | None = None,
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
        if output is not None and not isinstance(output, TableOutput):
            raise ConfigError(
                f"output= must be a DeltaOutput or an IcebergOutput (e.g. "
                f"DeltaOutput('s3://bucket/table'), IcebergOutput(catalog_properties, "
                f"'ns.table')), got {output!r}"
            )
        self.output = output
        self.root = SinkRoot(root, filesystem)
        self.uri, self.filesystem = self.root.uri, filesystem
        self.output_mode = output_mode
        self.key = keys
        self.checkpoint_location = checkpoint_location
        self.state_timeout = float(state_timeout)
        self.max_file_bytes = int(max_file_bytes)
        self._state = _state_source(state)
        self._opened_state: StateRoot | None = None
        # The root's URI without credentials, for messages and manifests.
        self.name, self.fs, self.path = self.root.name, self.root.fs, self.root.path
        self.local = self.root.local
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
        return self.root.history()

    def committed(self, batch_id: int) -> bool:
        """Whether batch `batch_id` is committed in this root."""
        return self.root.committed(batch_id)

    def write_batch(self, batch_df: DataFrame, batch_id: int) -> BatchReport:
        """Writes and commits one batch (what ``foreachBatch`` calls)."""
        t0 = time.perf_counter()
        started_ms = now_ms()
        self._ensure_root()
        # The root is then readable with spark.read(Stream).format("snapcut").
        register(batch_df.sparkSession)
        owner = query_id(batch_df, batch_id, self.checkpoint_location, f"sink root {self.name}")
        schema = frame_arrow_schema(batch_df)
        # Checks first: a refused batch touches nothing in the root.
        self._writable(lambda: self.root.dir.claim(owner, "sink root"))
        if self.committed(batch_id):
            # Announced as the batch's own action is: under Spark Connect a
            # keyed_state task knows its batch only so.
            with announced(batch_df.sparkSession, owner, batch_id):
                run_replayed_batch(batch_df)
            report = BatchReport(batch_id, committed=False)
            self.reports.append(report)
            return report
        evolved = self._check_meta(schema, batch_id)
        table = None
        if self.output is not None:
            table = TableBatch(
                self.output,
                self.output_mode,
                self.key,
                self.root.path,
                owner,
                schema,
                batch_id,
                self._writable,
            )
        state = self._state_root()
        checkpoint = self._checkpoint_location(batch_df, owner)
        self._writable(lambda: clean_staging(self.root))

        target = StagingTarget(self.root, batch_id, schema_bytes(schema), self.max_file_bytes)
        if table is not None:
            target = table.target(target)
        t1 = time.perf_counter()
        files: list[dict[str, Any]] = []
        rows: pa.Table | None = None
        if table is None or table.done is None:
            # The batch's one Spark action, announced so that a keyed_state
            # step in its plan writes state version `batch_id` (state=). Not
            # for a batch whose table commit is already there: only its
            # manifest is missing.
            with announced(batch_df.sparkSession, owner, batch_id):
                if table is not None and table.takes_rows:
                    rows = batch_df.toArrow()
                else:
                    # Executors write the data, the driver gets their files.
                    stage = stage_function(target)
                    staged = batch_df.mapInArrow(stage, files_struct()).collect()
                    files = [r.asDict() for r in staged]
        t2 = time.perf_counter()
        state_record = None
        if state is not None:
            manifest = state.await_committed(batch_id, owner, self.state_timeout)
            state_record = state.snapshot_record(manifest)
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
        if rows is not None:
            # Taken on the driver: no file was staged; bytes are the rows'
            # Arrow buffers (what the staged IPC files' size was, less framing).
            report.rows, report.bytes = rows.num_rows, rows.nbytes
        if table is not None:
            report.table_version = table.commit(files, report, rows)
            files = []  # the rows are in the table, the root names none
        if evolved is not None:
            # After the table's commit, before the manifest: the root's
            # schema follows the table's (a crash in between re-runs the
            # batch, which finds its commit and evolves the root again).
            self._writable(lambda: self.root.dir.write_json(SINK_META_FILE, evolved))
        extra: dict[str, Any] = {
            "output": {
                "mode": self.output_mode,
                "key": list(self.key),
                "schema": schema_to_json(schema),
                "rows": report.rows,
                "files": report.files,
                "bytes": report.bytes,
                **({} if table is None else {table.output.format: table.record()}),
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
        self._writable(lambda: commit_batch(self.root, batch_id, files, extra, started_ms))
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
            if no_space(e):
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

    def _check_meta(self, schema: pa.Schema, batch_id: int) -> dict[str, Any] | None:
        """Refuses a batch the root cannot take; returns the root's new
        description if the batch adds columns to a table output that
        takes them (``schema_mode="merge"``), to write once the table has
        them."""
        missing = [k for k in self.key if k not in schema.names]
        if missing:
            raise ConfigError(
                f"key column(s) {missing} are not in batch {batch_id}'s DataFrame "
                f"(columns: {', '.join(schema.names)})"
            )
        if not self.root.dir.exists(SINK_META_FILE):
            meta = {
                "format": SINK_FORMAT,
                "format_version": SINK_FORMAT_VERSION,
                "output_mode": self.output_mode,
                "key": list(self.key),
                "schema": schema_to_json(schema),
                "schema_ipc": base64.b64encode(schema_bytes(schema)).decode(),
                "first_batch": batch_id,
                "created_ms": now_ms(),
            }
            if self.output is not None:
                meta["output"] = self._output_meta()
            self._writable(lambda: self.root.dir.write_json(SINK_META_FILE, meta))
            return None
        have = self.root.meta()
        for what, mine in (
            ("output_mode", self.output_mode),
            ("key", list(self.key)),
            ("output", self._output_meta()),
        ):
            if have.get(what) != mine:
                raise ConfigError(
                    f"sink root {self.name} was created with {what}={have.get(what)!r}; this sink "
                    f"has {what}={mine!r}: use the same, or a new root (nothing in the root "
                    "was changed)"
                )
        change = schema_change(have["arrow_schema"], schema)
        if not change:
            return None
        added = added_columns(have["arrow_schema"], schema)
        if added and self.output is not None and self.output.schema_mode == "merge":
            evolved = {k: v for k, v in have.items() if k != "arrow_schema"}
            evolved["schema"] = schema_to_json(schema)
            evolved["schema_ipc"] = base64.b64encode(schema_bytes(schema)).decode()
            evolved["columns_added"] = [
                *have.get("columns_added", []),
                {"batch": batch_id, "columns": added},
            ]
            return evolved
        fix = (
            "A root holds one schema so that its readers see one table: select/cast to the "
            "root's schema, or write to a new root"
        )
        if added and self.output is not None:
            fix = (
                f"To add the column(s) to the table (its older rows read null) and to the "
                f"root's schema, pass {self.output.merge_option()}; or select the root's columns"
            )
        raise ConfigError(
            f"batch {batch_id}'s DataFrame does not have the schema of sink root {self.name} "
            f"(fixed by batch {have['first_batch']}): {change}. {fix} (the committed batches "
            "are untouched)"
        )

    def _output_meta(self) -> dict[str, Any] | None:
        return None if self.output is None else self.output.describe()

    def _state_root(self) -> StateRoot | None:
        """The state root of ``state=``: the KeyedState's own object, or one
        opened from a path once (at the first batch: the query creates it)."""
        if self._state is None:
            return None
        if self._opened_state is None:
            source = self._state
            root = source if isinstance(source, StateRoot) else getattr(source, "state_root", None)
            if root is None:
                uri, filesystem = _state_location(source)
                root = StateRoot.existing(uri, filesystem)
            self._opened_state = root
        return self._opened_state

    def _checkpoint_location(self, batch_df: DataFrame, owner: str) -> str | None:
        if self.checkpoint_location is not None:
            return self.checkpoint_location
        if owner == BATCH_OWNER:
            return None  # a plain DataFrame, no streaming query: no offsets
        found = running_checkpoint(batch_df, owner)
        if found is None:
            raise ConfigError(
                f"cannot find the checkpointLocation of streaming query {owner} (needed for "
                "Spark's source offsets of each batch): pass "
                "ArrowSnapshotSink(..., checkpoint_location=<the query's checkpointLocation>)"
            )
        return found


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


def _state_source(state: Any) -> Any:
    """``state=`` as given, checked: a path/URI, a StateRoot, or a KeyedState."""
    if state is None or isinstance(state, str | os.PathLike | StateRoot):
        return state
    if isinstance(getattr(state, "root", None), str):
        return state  # a KeyedState: its StateRoot exists once its step is built
    raise ConfigError(
        f"state= must be a keyed_state root (a path or URI) or the KeyedState it came from, "
        f"got {state!r}"
    )


def _state_location(source: Any) -> tuple[str, Any]:
    if isinstance(source, str | os.PathLike):
        return os.fspath(source), None
    return str(source.root), getattr(source, "filesystem", None)
