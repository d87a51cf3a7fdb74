"""The function ``mapInArrow`` runs for a keyed_state step in each Python
worker (executor side): the task's batch identity from Spark, then one
:class:`~snapcut.spark.state.partition.PartitionTask` (apply, then write
version N on a thread while the output goes to Spark), then the task's
metrics row."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from snapcut._core import TaskError
from snapcut.spark import failpoints, metrics
from snapcut.spark.batch_identity import task_batch
from snapcut.spark.processors import BATCH_TS_COLUMN
from snapcut.spark.state.key_parts import hold, key_parts
from snapcut.spark.state.partition import PartitionTask, Processor
from snapcut.spark.state.root import StateRoot

__all__ = ["STATE_WRITES", "make_task_function"]

STATE_WRITES = ("background", "sync")


def make_task_function(
    root: StateRoot,
    processor: Processor,
    delay_ms: int | None,
    initial: Any,
    input_schema: pa.Schema,
    stage_schema: pa.Schema,
    state_writes: str = "background",
    *,
    streaming: bool,
    state_memory: int | None = None,
    parts_held_bytes: int | None = None,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function ``mapInArrow`` runs in each Python worker: the output in
    `stage_schema` (:func:`snapcut.spark.metrics.internal_schema`), then the
    task's metrics row. A batch DataFrame is one epoch, batch 0; in a
    streaming query the micro-batch id must reach the task. With
    `parts_held_bytes`, a task whose input outgrows it applies the batch in
    parts of whole keys, spilled by key hash, and streams their output
    (:mod:`snapcut.spark.state.key_parts`), then writes version N."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is None:
            raise TaskError("the keyed_state step runs only inside a Spark task")
        partition = ctx.partitionId()
        batch_id, owner = task_batch(ctx, streaming)
        task = PartitionTask(
            root,
            batch_id,
            partition,
            owner,
            delay_ms,
            initial=initial,
            run_id=ctx.getLocalProperty("sql.streaming.runId"),
            state_memory=state_memory,
        )
        # A spilling table's flush and merge are Rust crash points: armed
        # for this task alone (failpoints.rust_points), as long as it runs.
        with failpoints.rust_points(batch_id, partition):
            if parts_held_bytes is None:
                batch, rest = list(batches), None
            else:
                batch, rest = hold(batches, parts_held_bytes)
            if rest is not None:
                # More input than the worker holds: applied in parts of whole
                # keys, each part's output sent as it is ready, then version N.
                schema = batch[0].schema
                batch_ts = _batch_ts(pa.Table.from_batches(batch, schema))
                parts = key_parts(batch, rest, schema, root.spec.key, batch_id)
                del batch
                for i, out in enumerate(task.apply_parts(parts, processor, batch_ts)):
                    for b in out.to_batches():
                        yield metrics.with_null_metrics(b, stage_schema)
                    if i == 0:
                        failpoints.hit("input.part_sent", batch_id, partition)
                task.commit()
            else:
                rows = pa.Table.from_batches(batch) if batch else input_schema.empty_table()
                out = task.apply(rows, processor, _batch_ts(rows))
                del batch, rows
                if state_writes == "sync":
                    task.commit()
                    for b in out.to_batches():
                        yield metrics.with_null_metrics(b, stage_schema)
                else:
                    # Version N is written while the output goes to Spark (the
                    # asynchronous phase, within the task); the task ends only
                    # once it is durable.
                    writer = _Committer(task)
                    writer.start()
                    for b in out.to_batches():
                        yield metrics.with_null_metrics(b, stage_schema)
                    writer.finish()
        yield metrics.metrics_batch(stage_schema, task.figures())

    return run


def _batch_ts(rows: pa.Table) -> int | None:
    """The batch timestamp column's first value, ms (None without it)."""
    if BATCH_TS_COLUMN not in rows.column_names or not rows.num_rows:
        return None
    ts = rows[BATCH_TS_COLUMN][0]
    # (A streaming batch timestamp is whole ms; a batch query's is not.)
    return int(pc.cast(ts, pa.timestamp("ms", "UTC"), safe=False).value)


class _Committer(threading.Thread):
    """Runs ``PartitionTask.commit`` on a thread; ``finish`` re-raises its error."""

    def __init__(self, task: PartitionTask) -> None:
        super().__init__(name="snapcut-state-commit", daemon=True)
        self.task = task
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.task.commit()
        except BaseException as e:
            self.error = e

    def finish(self) -> None:
        self.join()
        if self.error is not None:
            raise self.error
