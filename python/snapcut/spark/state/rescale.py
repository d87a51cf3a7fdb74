"""Rescaling a state root to another number of partitions.

Spark cannot change the number of state partitions of a streaming query.
:func:`rescale` copies a committed version of a root into a new root with M
partitions: a Spark job reads the state (each old partition by an executor),
hash-partitions it with Spark's own ``repartition(M, *key)`` — exactly how
the stream's rows will be placed — and writes each new partition's rows as a
full state file of the same batch id, acknowledged and committed with a
manifest as the query itself would. The query then restarts from its
checkpointLocation with ``root=<new root>, partitions=M`` and continues from
that batch. The old root is only read.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from snapcut._core import ConfigError, TaskError
from snapcut.spark.roots import BATCH_OWNER
from snapcut.spark.source.functions import read_state
from snapcut.spark.state.initial import state_rows
from snapcut.spark.state.partition import NO_EVENT_TIME
from snapcut.spark.state.root import StateRoot
from snapcut.spark.state.spec import ROOT_META_FILE

__all__ = ["RescalePlan", "RescaleReport", "plan_rescale", "rescale"]

_RESULT = pa.schema([("partition", pa.int64()), ("rows", pa.int64()), ("bytes", pa.int64())])


@dataclass(frozen=True)
class RescaleReport:
    """What :func:`rescale` wrote."""

    batch: int
    source: str
    target: str
    partitions_before: int
    partitions_after: int
    rows: int
    rows_per_partition: list[int]
    bytes: int


@dataclass(frozen=True)
class RescalePlan:
    """A rescale checked against both roots, before any Spark job runs."""

    old: StateRoot
    new: StateRoot
    manifest: dict[str, Any]
    version: int


def plan_rescale(
    root: str,
    to: str,
    partitions: int,
    *,
    batch: int | None = None,
    filesystem: Any = None,
    to_filesystem: Any = None,
) -> RescalePlan:
    """Every check :func:`rescale` makes before it writes, without Spark: the
    command line calls it before it starts a session, so bad input fails in
    a second, not after a JVM started. Raises ConfigError (or the reader's
    error for a batch that is not committed); changes nothing."""
    if partitions < 1:
        raise ConfigError(f"partitions must be at least 1, got {partitions}")
    old = StateRoot.existing(root, filesystem)
    spec = old.spec
    if spec.tables:
        raise ConfigError(
            f"{root} holds transformWithState state variables; rescaling such a root is not "
            "supported yet (nothing was changed): restart the query with the same partitions"
        )
    manifest = old.manifest_at(batch)
    version = int(manifest["checkpoint_id"])
    new_spec = dataclasses.replace(spec, uri=to, partitions=partitions, filesystem=to_filesystem)
    new = StateRoot(new_spec)
    _refuse_existing(new, to)
    return RescalePlan(old, new, manifest, version)


def rescale(
    spark: Any,
    root: str,
    to: str,
    partitions: int,
    *,
    batch: int | None = None,
    filesystem: Any = None,
    to_filesystem: Any = None,
) -> RescaleReport:
    """Writes committed batch ``batch`` (default: the newest) of state root
    ``root`` into the new root ``to`` with ``partitions`` partitions."""
    plan = plan_rescale(
        root, to, partitions, batch=batch, filesystem=filesystem, to_filesystem=to_filesystem
    )
    old, new, manifest, version = plan.old, plan.new, plan.manifest, plan.version
    spec = old.spec
    new.init(old.meta()["operator"])
    owner = old.dir.owner()
    if owner is not None:
        new.claim(owner)
    else:
        owner = manifest.get("spark", {}).get("query_id", BATCH_OWNER)
    record = dict(manifest.get("spark", {}))
    write = _partition_writer(new, version, owner, record)
    from pyspark.sql import functions as F

    rows = read_state(spark, old, version)
    parted = rows.repartition(partitions, *[F.col(k) for k in spec.key])
    written = {r["partition"]: r for r in parted.mapInArrow(write, _spark_type()).collect()}
    # A partition Spark ran no task for (none today; cheap to be sure) gets an empty full.
    for p in range(partitions):
        if p not in written:
            done = _write_one(new, version, owner, record, p, iter([]))
            written[p] = next(done).to_pylist()[0]
    committed = new.finalize(version)
    if committed is None:
        raise TaskError(
            f"rescale wrote batch {version} into {to} but a partition's acknowledgement is "
            "missing; run it again on an empty target"
        )
    counts = [int(written[p]["rows"]) for p in range(partitions)]
    return RescaleReport(
        batch=version,
        source=root,
        target=to,
        partitions_before=spec.partitions,
        partitions_after=partitions,
        rows=sum(counts),
        rows_per_partition=counts,
        bytes=sum(int(written[p]["bytes"]) for p in range(partitions)),
    )


def _refuse_existing(new: StateRoot, to: str) -> None:
    """Nothing is overwritten: the target must hold no root yet."""
    if new.dir.exists(ROOT_META_FILE):
        raise ConfigError(
            f"rescale target {to} already holds a state root; pass a new, empty location "
            "(nothing was changed)"
        )


def _spark_type() -> Any:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(_RESULT)


def _partition_writer(root: StateRoot, version: int, owner: str, record: dict[str, Any]) -> Any:
    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is None:
            raise TaskError("rescale writes partitions inside a Spark task")
        yield from _write_one(root, version, owner, record, ctx.partitionId(), batches)

    return write


def _write_one(
    root: StateRoot,
    version: int,
    owner: str,
    record: dict[str, Any],
    partition: int,
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """Partition ``partition`` of the new root at ``version``: a full state
    file and the acknowledgement the query's own task would have written."""
    started = int(time.time() * 1000)
    t0 = time.perf_counter()
    spec = root.spec
    table = state_rows(batches, spec.schema, spec.state_key, spec.key, "rescaled state")
    entry = root.write_state(version, partition, table, "full", [])
    ack = {
        "query_id": owner,
        "file": entry,
        "watermark_ms": int(record.get("watermark_ms", 0)),
        "max_event_time_ms": int(record.get("max_event_time_ms", NO_EVENT_TIME)),
        "batch_timestamp_ms": int(record.get("batch_timestamp_ms", started)),
        "rows_in": 0,
        "rows_out": 0,
        "late_rows": 0,
        "state_keys": table.num_rows,
        "write_ms": round((time.perf_counter() - t0) * 1000, 3),
        "from_cache": False,
        "started_ms": started,
        "finished_ms": int(time.time() * 1000),
    }
    root.write_ack(version, partition, ack)
    yield pa.RecordBatch.from_pylist(
        [{"partition": partition, "rows": table.num_rows, "bytes": int(entry["bytes"])}],
        schema=_RESULT,
    )
