"""Staging a batch's output on the executors: each task writes its rows of
batch N as Arrow IPC files under ``<root>/_staging/`` (names carry batch,
partition, attempt and a random token) — or, for a table output's append and
complete modes, as Parquet files in the table's directory (:mod:`.table`) —
and returns their descriptions; the driver (:mod:`.arrow_sink`) commits the
winning attempts' files."""

from __future__ import annotations

import contextlib
import errno
import functools
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from snapcut import _fs
from snapcut._core import ConfigError, StorageError
from snapcut.snapshots import encode_ipc
from snapcut.spark import failpoints
from snapcut.spark.roots import schema_from_bytes
from snapcut.spark.sink.root import STAGING_DIR, SinkRoot
from snapcut.spark.sink.table import TableFiles, encode_parquet

__all__ = [
    "FILES_DDL",
    "StagingTarget",
    "files_struct",
    "no_space",
    "output_file_name",
    "stage_function",
    "stage_partition",
]

FILES_DDL = (
    "partition int, attempt int, file int, path string, rows long, bytes long, crc32c long, "
    "stats string"
)
_FILES_SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),
        ("attempt", pa.int32()),
        ("file", pa.int32()),
        ("path", pa.string()),
        ("rows", pa.int64()),
        ("bytes", pa.int64()),
        ("crc32c", pa.int64()),
        ("stats", pa.string()),  # Delta's per-file statistics (Parquet files only)
    ]
)
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


@functools.cache
def files_struct() -> Any:
    """:data:`FILES_DDL` as a pyspark StructType, built once per process
    in Python: ``mapInArrow`` given the DDL string parses it in the JVM (a
    py4j round trip) on every batch."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(_FILES_SCHEMA)


def output_file_name(partition: int, file: int) -> str:
    """Name of a committed output file inside ``chk-<N>``."""
    return f"part-{partition:05d}.arrow" if file == 0 else f"part-{partition:05d}-{file}.arrow"


@dataclass(frozen=True)
class StagingTarget:
    """What a staging task needs; pickled into the ``mapInArrow`` function."""

    root: SinkRoot
    batch: int
    schema_ipc: bytes
    max_file_bytes: int
    table: TableFiles | None = None
    """Set: Parquet files into a table's data directory, not Arrow IPC."""


def no_space(e: BaseException) -> bool:
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
    target: StagingTarget, partition: int, attempt: int, batches: Iterator[pa.RecordBatch]
) -> pa.RecordBatch:
    """Writes one partition's rows of batch N as Arrow IPC file(s) under
    ``_staging/`` and returns their descriptions (free of Spark, for tests).
    The Rust encoder writes each file and its crc32c; a new file starts once
    the rows held reach ``max_file_bytes`` of Arrow buffers."""
    failpoints.hit("sink.before_stage", target.batch, partition)
    fs, root = target.root.fs, target.root.path
    if target.table is not None:
        fs = target.table.fs
    schema = schema_from_bytes(target.schema_ipc)
    token = uuid.uuid4().hex[:12]
    out: list[dict[str, Any]] = []
    held: list[pa.RecordBatch] = []

    def finish() -> None:
        k = len(out)
        table = pa.Table.from_batches(held, schema)
        held.clear()
        stats: str | None = None
        crc: int | None = None
        if target.table is None:
            base = root
            rel = f"{STAGING_DIR}/{target.batch:08d}/part-{partition:05d}-{k}-a{attempt}-{token}"
            rel += ".arrow"
            data, rows, crc = encode_ipc(table, rel)
        else:
            base = target.table.table_path
            rel = f"{target.table.batch_dir}/part-{partition:05d}-{k}-a{attempt}-{token}.parquet"
            data, stats = encode_parquet(table)
            rows = table.num_rows
        path = f"{base}/{rel}"
        try:
            _fs.write_bytes(fs, path, data)
        except StorageError as e:
            with contextlib.suppress(OSError):
                fs.delete_file(path)  # a partial file only takes space
            if no_space(e):
                raise StorageError(
                    f"sink root {target.root.name}: no space left to stage batch {target.batch} "
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
                "stats": stats,
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


def stage_function(
    target: StagingTarget,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx is not None else 0
        attempt = ctx.attemptNumber() if ctx is not None else 0
        yield stage_partition(target, partition, attempt, batches)

    return run
