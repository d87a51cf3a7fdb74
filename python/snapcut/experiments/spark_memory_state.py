"""Snapshots off, for measuring what snapshots cost on Spark: `keyed_state`'s
plan, kernel and Rust state table, kept only in the Python worker's memory
(no load, no write, no manifest). A baseline, not a feature: a partition
whose next task lands on another Python worker starts from an empty table
there (the same work per row; fine for timing, wrong for results). Used by
experiment 7 (`spark_writes.py`) and the Spark benches in bench/."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from snapcut import StateTable
from snapcut.spark.keyed_state import KeyedState
from snapcut.spark.state.partition import BatchInfo

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["InMemoryKeyedState", "in_memory"]

#: Per Python worker: (query tag, partition) -> its state table. A module
#: global, so that a worker's later tasks of one query find the table.
_MEMORY: dict[tuple[str, int], Any] = {}


class InMemoryKeyedState(KeyedState):
    """`keyed_state` whose state lives only in the Python workers' memory;
    `root` is only a tag naming the query's tables."""

    def _build(self, step: Any) -> DataFrame:
        from pyspark.sql.pandas.types import from_arrow_schema

        processor = step.processor
        tag, schema, key = self.root, processor.state_schema, processor.state_key

        def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            from pyspark import TaskContext

            ctx = TaskContext.get()
            if ctx is None:
                raise RuntimeError("InMemoryKeyedState's function runs in a Spark task only")
            p = ctx.partitionId()
            batch = int(ctx.getLocalProperty("streaming.sql.batchId") or 0)
            table = _MEMORY.setdefault((tag, p), StateTable(schema, key))
            rows = pa.Table.from_batches(list(batches))
            info = BatchInfo(batch, p, 0, int(time.time() * 1000), False)
            yield from processor.process(table, rows, info).to_batches()

        parted = self.df.repartition(self.partitions, *self.key)
        out_type = from_arrow_schema(processor.output_schema, prefer_timestamp_ntz=False)
        return parted.mapInArrow(run, out_type)


def in_memory(df: DataFrame, key: str, tag: str, partitions: int) -> InMemoryKeyedState:
    """`keyed_state(df, key, ..., partitions)` with snapshots off; `tag`
    names the query's tables (unique per query)."""
    return InMemoryKeyedState(
        df,
        (key,),
        tag,
        partitions,
        name="state",
        full_every=10,
        retain=10,
        event_time=None,
        watermark=None,
        initial_state=None,
        filesystem=None,
    )
