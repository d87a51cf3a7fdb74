"""The state stage of a keyed_state query, planned on the driver: the query's
one :class:`~snapcut.spark.state.root.StateRoot` built and prepared, the
initial state written, and the ``mapInArrow`` stage that runs the task
function of :mod:`.task` per state partition and batch over the input
hash-partitioned by key (``repartition(partitions, *key)``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from snapcut._core import ConfigError
from snapcut.snapshots.run_cache import RunCacheSpec
from snapcut.spark import metrics, no_data
from snapcut.spark.arguments import frame_arrow_schema
from snapcut.spark.group_state import GroupStateTimeout
from snapcut.spark.keyed_input import KeyedInput
from snapcut.spark.processors import BATCH_TS_COLUMN
from snapcut.spark.roots import schema_bytes
from snapcut.spark.state.initial import write_initial_state
from snapcut.spark.state.partition import Processor
from snapcut.spark.state.root import StateRoot
from snapcut.spark.state.setup import prepare_root
from snapcut.spark.state.spec import RootSpec, TableSpec
from snapcut.spark.state.task import STATE_WRITES, make_task_function
from snapcut.spark.state.worker_memory import input_held_bytes, table_memory

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


@dataclass(frozen=True)
class StateOptions:
    """Where and how a query keeps its state (``keyed_state``'s arguments)."""

    root: str
    partitions: int
    full_every: int
    retain: int
    filesystem: Any
    state_writes: str
    initial_state: Any
    state_memory: int | None = None
    """Bytes of state rows a Python worker keeps in memory (parsed and
    checked by :func:`state_memory_bytes`, split by
    :func:`snapcut.spark.state.worker_memory.table_memory`); None: all."""
    run_cache: RunCacheSpec = field(default_factory=RunCacheSpec)
    """Where workers cache a remote root's state files, and how many bytes."""
    compaction: bool = True
    """Whether workers merge a local root's runs off the tasks' path."""
    compaction_cpu_share: float = 1.0
    compaction_bytes_per_s: int | None = None

    def __post_init__(self) -> None:
        if self.state_writes not in STATE_WRITES:
            raise ConfigError(
                f"state_writes={self.state_writes!r} is not one of {STATE_WRITES}: 'background' "
                "writes version N while the task's output goes to Spark, 'sync' before any output"
            )
        if self.partitions < 1:
            raise ConfigError(f"partitions must be at least 1, got {self.partitions}")
        if self.full_every < 1:
            raise ConfigError(f"full_every must be at least 1, got {self.full_every}")
        from snapcut.snapshots.runs import check_compaction_budget

        check_compaction_budget(self.compaction_cpu_share, self.compaction_bytes_per_s)
        if self.retain < 2:
            raise ConfigError(
                f"retain must be at least 2 (a retried batch re-reads the previous one), "
                f"got {self.retain}"
            )


@dataclass(frozen=True)
class StepPlan:
    """What one step (aggregate, map_batches, a drop-in) adds to the stage."""

    processor: Processor
    operator: str
    needs_batch_ts: bool
    output_mode: str = "update"
    tables: tuple[TableSpec, ...] = ()
    timeout: str | None = None
    tws_initial: Any = None


def build_stage(
    keyed: KeyedInput, options: StateOptions, step: StepPlan
) -> tuple[DataFrame, StateRoot]:
    """The step's output DataFrame, and the query's StateRoot (pickled into
    the tasks, the initial-state job and the sink's ``state=``)."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    df = keyed.df
    processor = step.processor
    schema = processor.state_schema  # type: ignore[attr-defined]
    root = StateRoot(
        RootSpec(
            uri=options.root,
            vertex=keyed.name,
            partitions=options.partitions,
            key=keyed.key,
            state_key=keyed.state_key,
            state_schema=schema_bytes(schema),
            full_every=options.full_every,
            retain=options.retain,
            filesystem=options.filesystem,
            tables=step.tables,
            run_cache=options.run_cache,
            compaction=options.compaction,
            compaction_cpu_share=options.compaction_cpu_share,
            compaction_bytes_per_s=options.compaction_bytes_per_s,
        )
    )
    if options.state_memory is not None:
        # Refused here, on the driver, before any batch runs.
        table_memory(options.state_memory, root.spec.layouts())
    committed = prepare_root(df.sparkSession, root, step.operator)
    initial = None
    if step.tables:
        # transformWithState: the initial rows go to handleInitialState in batch 0.
        raw = step.tws_initial if step.tws_initial is not None else options.initial_state
        if raw is not None and not committed:
            processor.initial_rows = write_initial_state(  # type: ignore[attr-defined]
                raw, df, keyed.key, root, frame_arrow_schema(raw)
            )
    elif options.initial_state is not None and not committed:
        # (A restart keeps the root's own state, as Spark does.)
        initial = write_initial_state(options.initial_state, df, keyed.key, root, schema)
    src = df
    input_schema = keyed.input_schema
    if step.needs_batch_ts:
        src = src.withColumn(BATCH_TS_COLUMN, F.current_timestamp())
        input_schema = input_schema.append(pa.field(BATCH_TS_COLUMN, pa.timestamp("us", "UTC")))
    timeout = step.timeout
    if timeout is None:
        timeout = getattr(processor, "timeout", GroupStateTimeout.NoTimeout)
    with_no_data = no_data.enabled(df, timeout)
    if with_no_data:
        src = no_data.keep_tasks_in_empty_batches(src, keyed.name)
    parted = src.repartition(options.partitions, *[F.col(k) for k in keyed.key])
    output: pa.Schema = processor.output_schema  # type: ignore[attr-defined]
    stage_schema = metrics.internal_schema(output)
    # Under a worker's budget, a batch larger than its input share is applied
    # in parts of whole keys, when the step allows it and its output may go
    # before its state is written ("background").
    parts_held_bytes = (
        input_held_bytes(options.state_memory)
        if options.state_memory is not None
        and options.state_writes == "background"
        and getattr(processor, "by_key_parts", False)
        else None
    )
    udf = make_task_function(
        root,
        processor,
        keyed.delay_ms,
        initial,
        input_schema,
        stage_schema,
        options.state_writes,
        streaming=df.isStreaming,
        state_memory=options.state_memory,
        parts_held_bytes=parts_held_bytes,
    )
    stage_type = from_arrow_schema(stage_schema, prefer_timestamp_ntz=False)
    out = metrics.observe_and_strip(parted.mapInArrow(udf, stage_type), keyed.name, output)
    if with_no_data:
        out_type = from_arrow_schema(output, prefer_timestamp_ntz=False)
        out = out.unionByName(
            no_data.companion(
                df,
                keyed.key,
                keyed.event_time,
                keyed.delay_ms,
                timeout,
                step.output_mode,
                out_type,
            )
        )
    return out, root
