"""``keyed_state``: stateful per-key processing for PySpark, state in Rust,
snapshotted per micro-batch as Arrow files under a root.

    >>> from snapcut.spark import keyed_state
    >>> s = keyed_state(events, key="user", root="/data/dwell-state", partitions=4)
    >>> avg = s.aggregate(count="count", total=("sum", "dwell_ms"), avg=("mean", "dwell_ms"))

The facade: arguments checked, the plan built by calls into the rooms. Spark
hash-partitions the rows into ``partitions`` state partitions
(``repartition(partitions, *key)``); a ``mapInArrow`` stage then runs the
task function of :mod:`snapcut.spark.state.task` per partition and batch,
against the query's one :class:`~snapcut.spark.state.root.StateRoot`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from snapcut._core import ConfigError
from snapcut.spark import metrics, no_data
from snapcut.spark.aggregates import plan_aggregate
from snapcut.spark.arguments import frame_arrow_schema, key_columns, parse_duration_ms
from snapcut.spark.arguments import output_mode as output_mode_of
from snapcut.spark.group_functions import plan_apply_in_pandas_with_state, plan_map_batches
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

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["KeyedState", "keyed_state", "parse_duration_ms"]


class KeyedState:
    """A DataFrame keyed for stateful processing, with its state root."""

    def __init__(
        self,
        df: DataFrame,
        key: Sequence[str],
        root: str,
        partitions: int,
        *,
        name: str,
        full_every: int,
        retain: int,
        event_time: str | None,
        watermark: str | int | None,
        initial_state: Any,
        filesystem: Any,
        state_writes: str = "background",
    ) -> None:
        if state_writes not in STATE_WRITES:
            raise ConfigError(
                f"state_writes={state_writes!r} is not one of {STATE_WRITES}: 'background' writes "
                "version N while the task's output goes to Spark, 'sync' before any output"
            )
        self.state_writes = state_writes
        if partitions < 1:
            raise ConfigError(f"partitions must be at least 1, got {partitions}")
        if full_every < 1:
            raise ConfigError(f"full_every must be at least 1, got {full_every}")
        if retain < 2:
            raise ConfigError(
                f"retain must be at least 2 (a retried batch re-reads the previous one), "
                f"got {retain}"
            )
        self.df = df
        self.root = str(root)
        self.partitions = partitions
        self.full_every = full_every
        self.retain = retain
        self.filesystem = filesystem
        self.state_root: StateRoot | None = None
        """The root's object, once a step is built (the sink's ``state=``)."""
        self.initial_state = initial_state
        self.input = KeyedInput.of(
            df, key, name, event_time, watermark, has_initial_state=initial_state is not None
        )

    # What the keyed input says; kept once, in `input`.

    @property
    def key(self) -> tuple[str, ...]:
        return self.input.key

    @property
    def name(self) -> str:
        return self.input.name

    @property
    def state_key(self) -> str:
        return self.input.state_key

    @property
    def input_schema(self) -> pa.Schema:
        return self.input.input_schema

    @property
    def event_time(self) -> str | None:
        return self.input.event_time

    @property
    def delay_ms(self) -> int | None:
        return self.input.delay_ms

    @property
    def timezone(self) -> str:
        return self.input.timezone

    # -- level 1 ---------------------------------------------------------------

    def aggregate(self, output_mode: str = "update", **aggregates: Any) -> DataFrame:
        """Built-in aggregates per key, updated in Rust: ``out=("sum", "col")``,
        ``n="count"`` (rows) or ``("count", "col")`` (non-null values); funcs:
        count, sum, min, max, mean, first, last. ``output_mode``: "update"
        (the keys changed in the batch) or "complete" (every key)."""
        processor = plan_aggregate(self.input, output_mode, aggregates)
        return self._build(processor, "aggregate", needs_batch_ts=False)

    # -- level 2 ---------------------------------------------------------------

    def map_batches(
        self,
        fn: Callable[[Any, Any, Any], Any],
        state_schema: Any,
        output_schema: Any,
        *,
        timeout: str = GroupStateTimeout.NoTimeout,
        pandas: bool = False,
        output_mode: str = "update",
    ) -> DataFrame:
        """``fn(rows, state, info)`` once per (micro-batch, partition).

        ``rows``: this partition's new rows; ``state``: one row per key in
        ``rows`` and per timed-out key — the key columns, ``state_schema``'s
        columns (null where absent), ``__timeout_ms``, ``__present`` and
        ``__timed_out``; ``info``: batch id, partition, watermark and
        processing time. Returns ``StateUpdate(output, state, remove)`` (or
        that tuple): output rows of ``output_schema``, state rows to store
        (a ``__timeout_ms`` column sets each key's timeout; null = none),
        keys to remove. Arrow tables, or pandas with ``pandas=True``.
        ``output_mode``: the query's output mode ("update" or "append"), which
        Spark requires of the state operator that schedules the no-data batches
        of a processing-time timeout (see :mod:`snapcut.spark.no_data`)."""
        output_mode = output_mode_of(output_mode, "output_mode")
        processor = plan_map_batches(self.input, fn, state_schema, output_schema, timeout, pandas)
        return self._build(processor, "map_batches", needs_batch_ts=True, output_mode=output_mode)

    # -- level 3 ---------------------------------------------------------------

    def apply_in_pandas_with_state(
        self,
        func: Callable[[tuple[Any, ...], Iterator[Any], Any], Iterator[Any]],
        outputStructType: Any,
        stateStructType: Any,
        outputMode: str,
        timeoutConf: str,
    ) -> DataFrame:
        """Drop-in for ``groupBy(key).applyInPandasWithState``: the same
        ``func(key, Iterator[pd.DataFrame], GroupState)`` and arguments
        (``outputMode`` "Update" or "Append" in any case, as Spark takes them)."""
        output_mode = output_mode_of(outputMode, "outputMode")
        processor = plan_apply_in_pandas_with_state(
            self.input, func, outputStructType, stateStructType, timeoutConf
        )
        return self._build(
            processor, "apply_in_pandas_with_state", needs_batch_ts=True, output_mode=output_mode
        )

    applyInPandasWithState = apply_in_pandas_with_state

    # -- transformWithState ------------------------------------------------------

    def transform_with_state_in_pandas(
        self,
        statefulProcessor: Any,
        outputStructType: Any,
        outputMode: str,
        timeMode: str,
        initialState: Any = None,
        eventTimeColumnName: str = "",
    ) -> DataFrame:
        """Drop-in for ``groupBy(key).transformWithStateInPandas``: the same
        ``StatefulProcessor`` (pandas frames in, pandas frames out) and
        arguments; each state variable is a table of the root."""
        return self._transform_with_state(
            statefulProcessor,
            outputStructType,
            outputMode,
            timeMode,
            initialState,
            eventTimeColumnName,
            pandas=True,
        )

    def transform_with_state(
        self,
        statefulProcessor: Any,
        outputStructType: Any,
        outputMode: str,
        timeMode: str,
        initialState: Any = None,
        eventTimeColumnName: str = "",
    ) -> DataFrame:
        """Drop-in for ``groupBy(key).transformWithState``: the same
        ``StatefulProcessor`` over ``Row`` objects, and arguments."""
        return self._transform_with_state(
            statefulProcessor,
            outputStructType,
            outputMode,
            timeMode,
            initialState,
            eventTimeColumnName,
            pandas=False,
        )

    transformWithStateInPandas = transform_with_state_in_pandas
    transformWithState = transform_with_state

    def _transform_with_state(
        self,
        processor: Any,
        output_type: Any,
        mode: str,
        time_mode: str,
        initial_state: Any,
        event_time_column: str,
        *,
        pandas: bool,
    ) -> DataFrame:
        # (Lazy: the tws room imports pyspark's StatefulProcessor API.)
        from snapcut.spark.tws.entry import plan_transform_with_state

        step = plan_transform_with_state(
            self.input,
            processor,
            output_type,
            mode,
            time_mode,
            initial_state,
            event_time_column,
            pandas=pandas,
        )
        return self._build(
            step.processor,
            step.operator,
            needs_batch_ts=True,
            output_mode=step.output_mode,
            tables=step.tables,
            timeout=step.timeout,
            tws_initial=step.initial,
        )

    # -- the plan ------------------------------------------------------------

    def _build(
        self,
        processor: Processor,
        operator: str,
        needs_batch_ts: bool,
        output_mode: str = "update",
        tables: tuple[TableSpec, ...] = (),
        timeout: str | None = None,
        tws_initial: Any = None,
    ) -> DataFrame:
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import from_arrow_schema

        schema = processor.state_schema  # type: ignore[attr-defined]
        spec = RootSpec(
            uri=self.root,
            vertex=self.name,
            partitions=self.partitions,
            key=self.key,
            state_key=self.state_key,
            state_schema=schema_bytes(schema),
            full_every=self.full_every,
            retain=self.retain,
            filesystem=self.filesystem,
            tables=tables,
        )
        # The query's one StateRoot: pickled into the tasks, the initial-state
        # job and the sink (``state=`` this object).
        root = StateRoot(spec)
        committed = prepare_root(self.df.sparkSession, root, operator)
        self.state_root = root
        initial = None
        if tables:
            # transformWithState: the initial rows go to handleInitialState in batch 0.
            raw = tws_initial if tws_initial is not None else self.initial_state
            if raw is not None and not committed:
                processor.initial_rows = write_initial_state(  # type: ignore[attr-defined]
                    raw, self.df, self.key, root, frame_arrow_schema(raw)
                )
        elif self.initial_state is not None and not committed:
            # (A restart keeps the root's own state, as Spark does.)
            initial = write_initial_state(self.initial_state, self.df, self.key, root, schema)
        src = self.df
        input_schema = self.input_schema
        if needs_batch_ts:
            src = src.withColumn(BATCH_TS_COLUMN, F.current_timestamp())
            input_schema = input_schema.append(pa.field(BATCH_TS_COLUMN, pa.timestamp("us", "UTC")))
        if timeout is None:
            timeout = getattr(processor, "timeout", GroupStateTimeout.NoTimeout)
        with_no_data = no_data.enabled(self.df, timeout)
        if with_no_data:
            src = no_data.keep_tasks_in_empty_batches(src, self.name)
        parted = src.repartition(self.partitions, *[F.col(k) for k in self.key])
        output: pa.Schema = processor.output_schema  # type: ignore[attr-defined]
        stage_schema = metrics.internal_schema(output)
        udf = make_task_function(
            root,
            processor,
            self.delay_ms,
            initial,
            input_schema,
            stage_schema,
            self.state_writes,
            streaming=self.df.isStreaming,
        )
        stage_type = from_arrow_schema(stage_schema, prefer_timestamp_ntz=False)
        out = metrics.observe_and_strip(parted.mapInArrow(udf, stage_type), self.name, output)
        if with_no_data:
            out_type = from_arrow_schema(output, prefer_timestamp_ntz=False)
            out = out.unionByName(
                no_data.companion(
                    self.df,
                    self.key,
                    self.event_time,
                    self.delay_ms,
                    timeout,
                    output_mode,
                    out_type,
                )
            )
        return out


def keyed_state(
    df: DataFrame,
    key: Any,
    root: str,
    partitions: int,
    *,
    name: str = "state",
    full_every: int = 10,
    retain: int = 10,
    event_time: str | None = None,
    watermark: str | int | None = None,
    initial_state: Any = None,
    filesystem: Any = None,
    state_writes: str = "background",
) -> KeyedState:
    """Keys a streaming (or batch) DataFrame for stateful processing.

    ``key``: what ``groupBy`` takes — a column name or a Column, or a list of
    them; ``root``: a local path or any
    pyarrow-filesystem URI where the state of every micro-batch is written
    (Arrow IPC + manifest, readable with ``snapcut.snapshots.open``);
    ``partitions``: the number of state partitions (fixed for the root's
    life); ``full_every``: a full state file every so many batches, diffs
    between (a batch that changed every key writes a full file anyway);
    ``retain``: committed batches kept (and every base they need);
    ``event_time``/``watermark``: the event-time column and the watermark
    delay (Spark's rule: max event time of earlier batches minus the delay);
    ``initial_state``: a DataFrame of key columns + state columns, or
    ``(root, batch)`` of another state root, to start from;
    ``state_writes``: ``"background"`` writes version N on a thread while the
    task's output goes to Spark, ``"sync"`` before the task emits any output
    (either way the task ends only once version N is durable).
    """
    df, keys = key_columns(df, key)
    return KeyedState(
        df,
        keys,
        root,
        partitions,
        name=name,
        full_every=full_every,
        retain=retain,
        event_time=event_time,
        watermark=watermark,
        initial_state=initial_state,
        filesystem=filesystem,
        state_writes=state_writes,
    )
