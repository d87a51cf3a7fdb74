"""snapcut for PySpark Structured Streaming.

``keyed_state(df, key, root, partitions)`` gives three levels of stateful
per-key processing on one state machinery (a Rust ``StateTable`` per state
partition, snapshotted per micro-batch as Arrow files under ``root``):

- ``.aggregate(...)``: built-in aggregates, updated in Rust;
- ``.map_batches(fn, state_schema, output_schema)``: a vectorised function
  called once per (micro-batch, partition) (per part of whole keys under a
  ``state_memory`` the batch outgrows);
- ``.apply_in_pandas_with_state(...)``: a drop-in for Spark's
  ``applyInPandasWithState`` with Spark's ``GroupState``.

``spark.read.format("snapcut").load(root)`` reads the state back (a
version, ``batchId`` time travel, ``readChangeFeed``), as do
``read_state(spark, root)`` and ``read_state_arrow(root)``;
``snapcut.snapshots.open(root)`` lists its batches like any snapcut
checkpoint. ``register(spark)`` makes the format known to a session
(``keyed_state`` and the sink do it themselves).

``ArrowSnapshotSink(root, ...)`` is an exactly-once ``foreachBatch`` sink
writing each batch as Arrow IPC files plus a manifest (with ``state=``, one
global snapshot of output, state and Spark's offsets per batch);
``spark.read.format("snapcut").load(root)`` (or ``read_output(spark,
root)``, ``read_output_arrow(root)``) reads the committed output back, and
``spark.readStream.format("snapcut").load(root)`` streams its committed
batches into a next query. ``foreach_batch(func, checkpoint_location=...)`` wraps
a ``foreachBatch`` function of your own so the state it writes gets the
micro-batch's id on Spark Connect too. Importing this module does not import
pyspark.
"""

from snapcut.spark.batch_identity import foreach_batch
from snapcut.spark.group_state import GroupState, GroupStateTimeout
from snapcut.spark.keyed_state import (
    RUN_CACHE_DIR_CONF,
    RUN_CACHE_SIZE_CONF,
    STATE_MEMORY_CONF,
    KeyedState,
    keyed_state,
)
from snapcut.spark.processors import (
    PRESENT_COLUMN,
    TIMED_OUT_COLUMN,
    TIMEOUT_COLUMN,
    StateUpdate,
)
from snapcut.spark.sink.arrow_sink import ArrowSnapshotSink
from snapcut.spark.sink.delta import DeltaOutput
from snapcut.spark.sink.iceberg import IcebergOutput
from snapcut.spark.sink.report import BatchReport
from snapcut.spark.sink.root import (
    CommittedBatch,
    committed_output,
    read_output_arrow,
)
from snapcut.spark.source.functions import read_output, read_state
from snapcut.spark.source.register import register
from snapcut.spark.state.partition import BatchInfo
from snapcut.spark.state.read import committed_batches, read_state_arrow
from snapcut.spark.state.rescale import RescaleReport, rescale

__all__ = [
    "PRESENT_COLUMN",
    "RUN_CACHE_DIR_CONF",
    "RUN_CACHE_SIZE_CONF",
    "STATE_MEMORY_CONF",
    "TIMED_OUT_COLUMN",
    "TIMEOUT_COLUMN",
    "ArrowSnapshotSink",
    "BatchInfo",
    "BatchReport",
    "CommittedBatch",
    "DeltaOutput",
    "GroupState",
    "GroupStateTimeout",
    "IcebergOutput",
    "KeyedState",
    "RescaleReport",
    "StateUpdate",
    "committed_batches",
    "committed_output",
    "foreach_batch",
    "keyed_state",
    "read_output",
    "read_output_arrow",
    "read_state",
    "read_state_arrow",
    "register",
    "rescale",
]
