"""What the sink's table outputs share (:mod:`.delta`, :mod:`.iceberg`):
the :class:`TableOutput` base the sink's one table walk per batch talks to
(:class:`~.table_batch.TableBatch`), where the executors' Parquet data
files go (:class:`TableFiles`, deterministic names from query, batch,
partition and attempt), their encoding, the snapshot/commit properties that
carry the batch id, and the errors of a table library as typed errors.

The walk, per batch: ``table()`` (None: no table yet), ``check()`` (another
query's app id, an incompatible schema: refused before anything is written),
``committed_version()`` (the batch's commit already in the table: a replay
after a crash between the table commit and snapcut's manifest), ``files()``
(where the tasks write), ``commit()`` (the batch's one table commit, carrying
``snapcut.app_id`` and ``snapcut.batch``), ``record()`` (the manifest's
``output.<format>``), ``clean()`` (data files no commit references).
"""

from __future__ import annotations

import abc
import contextlib
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from snapcut._core import ConfigError, SnapshotError, StorageError
from snapcut.spark.sink.root import added_columns, schema_change

__all__ = [
    "APP_ID_KEY",
    "BATCH_KEY",
    "SCHEMA_MODES",
    "BatchCommit",
    "TableFiles",
    "TableOutput",
    "batch_dir",
    "check_schema_mode",
    "encode_parquet",
    "new_columns",
    "refuse_owner_or_schema",
    "table_errors",
    "utc_timestamps",
]

APP_ID_KEY = "snapcut.app_id"
BATCH_KEY = "snapcut.batch"
SCHEMA_MODES = (None, "merge")
"""``schema_mode``: None, the table's schema is fixed; "merge", columns the
output adds are added to the table (delta-rs' ``schema_mode="merge"``,
pyiceberg's ``union_by_name``), nothing else changes."""


def check_schema_mode(schema_mode: object, output: str) -> str | None:
    if schema_mode not in SCHEMA_MODES:
        raise ConfigError(
            f"{output}(..., schema_mode=) must be None (the table's schema is fixed) or "
            f"'merge' (columns the output adds are added to the table), got {schema_mode!r}"
        )
    return None if schema_mode is None else str(schema_mode)


@contextlib.contextmanager
def table_errors(name: str, what: str) -> Iterator[None]:
    """A table library's errors (bare Exceptions, its own, OSError) as
    StorageError naming the table; snapcut's own typed errors pass through."""
    try:
        yield
    except (ConfigError, SnapshotError, StorageError):
        raise
    except Exception as e:
        raise StorageError(
            f"output table {name}: {what} failed: {e}. Check the path or catalog, its options "
            "and credentials; nothing was committed to the table by this attempt unless its "
            "history shows the batch"
        ) from e


@dataclass(frozen=True)
class TableFiles:
    """Where a batch's tasks write their Parquet files; pickled into the tasks."""

    fs: Any
    table_path: str
    """The directory the data files' relative paths start from."""
    batch_dir: str
    """Relative to ``table_path``: this batch's files' directory."""


def batch_dir(query_id: str, batch: int) -> str:
    # Not "_"-prefixed: Delta's VACUUM skips such directories, so the files a
    # complete-mode overwrite removes would never be deleted.
    return f"snapcut-b{batch:08d}-{query_id[:8]}"


BATCH_DIR = re.compile(r"snapcut-b\d{8}-[0-9a-zA-Z-]{1,8}")
"""A `batch_dir` name: files executors wrote for a batch, whether or not a
table commit ever referenced them."""


def clean_files(files: TableFiles, keep: Sequence[str] = ()) -> None:
    """Removes the batch's data files the table does not reference (losing
    attempts, a run that failed before its commit): all but `keep`."""
    where = f"{files.table_path}/{files.batch_dir}"
    kept = set(keep)
    for info in files.fs.get_file_info(pafs.FileSelector(where, allow_not_found=True)):
        if f"{files.batch_dir}/{info.base_name}" not in kept:
            files.fs.delete_file(info.path)


def encode_parquet(table: pa.Table) -> tuple[bytes, str]:
    """One Parquet file's bytes and its Delta ``stats`` JSON: numRecords,
    nullCount, and min/max of integer columns only (exact, so a reader's
    file skipping can trust them; timestamps and strings would need Delta's
    truncation rules). Iceberg reads its statistics from the file's footer."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="snappy")
    stats: dict[str, Any] = {"numRecords": table.num_rows, "nullCount": {}}
    mins, maxs = {}, {}
    for field, column in zip(table.schema, table.columns, strict=True):
        if pa.types.is_nested(field.type):
            continue
        stats["nullCount"][field.name] = column.null_count
        if pa.types.is_integer(field.type) and column.null_count < len(column):
            low, high = pc.min_max(column).values()
            mins[field.name], maxs[field.name] = low.as_py(), high.as_py()
    if mins:
        stats["minValues"], stats["maxValues"] = mins, maxs
    return sink.getvalue().to_pybytes(), json.dumps(stats)


def utc_timestamps(schema: pa.Schema) -> pa.Schema:
    """Timestamps as the table formats store them: µs, in UTC when zoned
    (Spark's Arrow columns carry the session's time zone)."""
    fields = []
    for f in schema:
        if pa.types.is_timestamp(f.type):
            f = f.with_type(pa.timestamp("us", "UTC" if f.type.tz else None))
        fields.append(f)
    return pa.schema(fields)


@dataclass(frozen=True)
class BatchCommit:
    """What a table output commits for one batch."""

    mode: str
    key: Sequence[str]
    schema: pa.Schema
    """The output schema in the table's types."""
    files: list[dict[str, Any]]
    """The tasks' Parquet files (append, complete), paths relative to
    :attr:`TableFiles.table_path`."""
    rows: pa.Table | None
    """The batch's rows (update: the driver merges them)."""
    app_id: str
    batch: int
    counts: dict[str, int]
    """rows, files, bytes: into the commit's properties, for a replay."""
    where: TableFiles
    """Where the batch's files are (what the output's ``files`` gave)."""

    def properties(self) -> dict[str, Any]:
        """What the commit carries: the app id and batch (for a replay to
        find) and the batch's counts."""
        counts = {f"snapcut.{k}": v for k, v in self.counts.items()}
        return {APP_ID_KEY: self.app_id, BATCH_KEY: self.batch, **counts}


def counts_of(info: dict[str, Any]) -> tuple[int, int, int]:
    """(rows, files, bytes) as a commit's properties recorded them."""
    rows, files, size = (int(info.get(f"snapcut.{k}", 0)) for k in ("rows", "files", "bytes"))
    return rows, files, size


def refuse_owner_or_schema(
    output: TableOutput, owners: set[str], app_id: str, have: pa.Schema, schema: pa.Schema
) -> None:
    """The checks of an existing table before a batch writes anything:
    `owners`, the app ids its commits carry, must be this sink's only;
    `have`, its schema, must be the output's (names and types), or, with
    ``schema_mode="merge"``, the output's less the columns it adds."""
    name = output.name
    others = sorted(owners - {app_id})
    if others:
        raise ConfigError(
            f"output table {name} is written by another streaming query's sink "
            f"(app id {others[0]}; this sink's is {app_id}): one query owns a table. Write "
            "to a new table, or restart the owning query from its checkpointLocation and "
            "sink root (nothing was written)"
        )
    change = schema_change(have, schema)
    if not change:
        return
    added = added_columns(have, schema)
    if added and output.schema_mode == "merge":
        return  # the commit adds them
    if added:
        raise ConfigError(
            f"output table {name} does not have the output's column(s) {added}: pass "
            f"{output.merge_option()} to add them to the table (its older rows read null), "
            "or select the table's columns (nothing was written)"
        )
    only = "; schema_mode='merge' only adds columns" if output.schema_mode == "merge" else ""
    raise ConfigError(
        f"output table {name} does not have the output's schema: {change}{only}. "
        "select/cast the output to the table's columns, or write to a new table "
        "(nothing was written)"
    )


def new_columns(have: pa.Schema, schema: pa.Schema) -> list[pa.Field]:
    """The fields of `schema` the table (`have`) lacks, nullable: the rows
    it already has read null there."""
    return [f.with_nullable(True) for f in schema if f.name not in have.names]


class TableOutput(abc.ABC):
    """A table format as the sink's output (:class:`~.delta.DeltaOutput`,
    :class:`~.iceberg.IcebergOutput`). A commit's info is a dict with the
    commit's ``version`` (Delta: the table version; Iceberg: the snapshot id)
    and its ``snapcut.*`` properties."""

    format: str
    """The manifest's key (``output.<format>``) and the root's description's."""
    name: str
    """The table without credentials, for messages and manifests."""
    schema_mode: str | None = None
    """None or "merge" (:data:`SCHEMA_MODES`)."""

    def merge_option(self) -> str:
        """How a user opts in to adding columns, for messages."""
        return f"{type(self).__name__}(..., schema_mode='merge')"

    @abc.abstractmethod
    def describe(self) -> dict[str, Any]:
        """What the sink root's description records of the output."""

    @abc.abstractmethod
    def table_schema(self, schema: pa.Schema) -> pa.Schema:
        """The output schema in the table's types (as readers get it back)."""

    @abc.abstractmethod
    def table(self) -> Any:
        """The table, or None if there is none yet."""

    @abc.abstractmethod
    def check(self, table: Any, app_id: str, schema: pa.Schema) -> None:
        """Refuses a table another query writes or whose schema differs."""

    @abc.abstractmethod
    def committed_version(self, table: Any, app_id: str, batch: int) -> dict[str, Any] | None:
        """The info of `batch`'s commit of `app_id` if the table has it."""

    @abc.abstractmethod
    def files(self, table: Any, query_id: str, batch: int, schema: pa.Schema) -> TableFiles:
        """Where the batch's tasks write their Parquet files."""

    @abc.abstractmethod
    def commit(self, table: Any, commit: BatchCommit) -> dict[str, Any]:
        """The batch's one table commit; returns its info."""

    @abc.abstractmethod
    def record(self, info: dict[str, Any]) -> dict[str, Any]:
        """What the manifest's ``output.<format>`` records of a commit."""

    def clean(self, files: TableFiles, keep: Sequence[str] = ()) -> None:
        clean_files(files, keep)
