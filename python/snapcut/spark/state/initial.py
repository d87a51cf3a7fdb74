"""``initial_state=``: bootstrap a query's state before its first batch.

The initial rows are hash-partitioned by Spark exactly as the stream will be
(``repartition(P, *key)`` over key columns of the same types), and each
partition's rows are written once under ``<root>/_initial/``; batch 0 of each
state partition starts from its file. Spark's ``applyInPandasWithState`` has
no way to do this.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from snapcut import _fs
from snapcut._core import ConfigError
from snapcut.snapshots import file_component
from snapcut.spark.keys import KEY_COLUMN, with_state_key
from snapcut.spark.processors import TIMEOUT_COLUMN, conform
from snapcut.spark.state.root import StateRoot

INITIAL_DIR = "_initial"


@dataclass(frozen=True)
class InitialState:
    """Reads partition p's initial rows in a task (picklable)."""

    root: StateRoot

    def path(self, partition: int) -> str:
        vertex = file_component(self.root.spec.vertex)
        return f"{self.root.path}/{INITIAL_DIR}/{vertex}-{partition}.arrow"

    def __call__(self, partition: int) -> pa.Table | None:
        fs, path = self.root.fs, self.path(partition)
        if not _fs.exists(fs, path):
            return None
        return ipc.open_file(pa.BufferReader(_fs.read_bytes(fs, path))).read_all()


def state_rows(
    batches: Iterator[pa.RecordBatch],
    schema: pa.Schema,
    state_key: str,
    key: tuple[str, ...],
    what: str,
) -> pa.Table:
    """Rows of key + state columns (as a Spark task receives them) made into
    one partition's state table: the encoded key of composite keys, a null
    timeout where there is none, the state's types, sorted by the key."""
    parts = list(batches)
    rows = pa.Table.from_batches(parts) if parts else None
    if rows is None or rows.num_rows == 0:
        return schema.empty_table()
    if KEY_COLUMN in schema.names and KEY_COLUMN not in rows.column_names:
        rows = with_state_key(rows, key, -1)
    if TIMEOUT_COLUMN in schema.names and TIMEOUT_COLUMN not in rows.column_names:
        rows = rows.append_column(TIMEOUT_COLUMN, pa.nulls(rows.num_rows, pa.int64()))
    return conform(
        rows, schema, what, "give the key columns and every state column, with the state's types"
    ).sort_by(state_key if state_key in schema.names else [(k, "ascending") for k in key])


def write_initial_state(
    initial: Any, stream: Any, key: tuple[str, ...], root: StateRoot, schema: pa.Schema
) -> InitialState:
    """Writes `initial` (a DataFrame, or ``(root, batch)`` of a state root) as
    the state of the query reading `stream` grouped by `key`; the caller
    skips it on a restart (a root with a committed batch keeps its own
    state, as in Spark)."""
    spark = stream.sparkSession
    if isinstance(initial, tuple):
        from snapcut.spark.source.functions import read_state

        other, batch = initial
        initial = read_state(spark, other, batch)
    if not hasattr(initial, "mapInArrow"):
        raise ConfigError(
            "initial_state must be a Spark DataFrame (key columns + state columns) or "
            f"(root, batch) of a state root; got {type(initial).__name__}"
        )
    stream_types = {f.name: f.dataType for f in stream.schema.fields}
    have = {f.name: f.dataType for f in initial.schema.fields}
    for k in key:
        if k not in have or have[k] != stream_types[k]:
            raise ConfigError(
                f"initial_state key column {k!r} must exist with the stream's type "
                f"{stream_types[k].simpleString()} (it has {have.get(k)}): rows are placed in "
                "state partitions by the hash of the key, which depends on its type"
            )
    spec = root.spec
    target = InitialState(root)

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is None:
            raise ConfigError("initial_state is written inside a Spark task")
        partition = ctx.partitionId()
        table = state_rows(batches, schema, spec.state_key, key, "initial_state")
        sink = pa.BufferOutputStream()
        with ipc.new_file(sink, table.schema) as w:
            w.write_table(table)
        path = target.path(partition)
        _fs.write_atomic(root.fs, path, f"{path}.tmp", sink.getvalue().to_pybytes())
        yield pa.RecordBatch.from_pylist(
            [{"partition": partition, "rows": table.num_rows}],
            schema=pa.schema([("partition", pa.int64()), ("rows", pa.int64())]),
        )

    from pyspark.sql import functions as F

    parted = initial.repartition(spec.partitions, *[F.col(k) for k in key])
    parted.mapInArrow(write, "partition long, rows long").collect()
    return target
