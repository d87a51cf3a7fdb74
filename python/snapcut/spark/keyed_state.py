"""``keyed_state``: stateful per-key processing for PySpark, state in Rust,
snapshotted per micro-batch as Arrow files under a root.

    >>> from snapcut.spark import keyed_state
    >>> s = keyed_state(events, key="user", root="/data/dwell-state", partitions=4)
    >>> avg = s.aggregate(count="count", total=("sum", "dwell_ms"), avg=("mean", "dwell_ms"))

Spark hash-partitions the rows into ``partitions`` state partitions
(``repartition(partitions, *key)``); a ``mapInArrow`` stage then runs one
:class:`~snapcut.spark.partition.PartitionTask` per partition and batch.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from snapcut._core import ConfigError, KeyedAggregates, TaskError
from snapcut.spark import metrics, no_data
from snapcut.spark.batch_identity import task_batch
from snapcut.spark.group_state import GroupStateTimeout
from snapcut.spark.initial import write_initial_state
from snapcut.spark.keys import KEY_COLUMN, check_key_types, state_key
from snapcut.spark.partition import PartitionTask, Processor
from snapcut.spark.processors import (
    BATCH_TS_COLUMN,
    DEFINED_COLUMN,
    TIMEOUT_COLUMN,
    AggregateProcessor,
    BatchFunctionProcessor,
    PandasGroupProcessor,
)
from snapcut.spark.root import RootSpec, StateRoot, TableSpec, schema_bytes
from snapcut.spark.root_setup import prepare_root

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["KeyedState", "keyed_state", "parse_duration_ms"]

AGG_FUNCS = ("count", "sum", "min", "max", "mean", "first", "last")
OUTPUT_MODES = ("update", "append", "complete")
ARROW_BATCH_CONF = "spark.sql.execution.arrow.maxRecordsPerBatch"
STATE_WRITES = ("background", "sync")
_UNITS_MS = {
    "ms": 1,
    "millisecond": 1,
    "milliseconds": 1,
    "s": 1000,
    "second": 1000,
    "seconds": 1000,
    "minute": 60_000,
    "minutes": 60_000,
    "hour": 3_600_000,
    "hours": 3_600_000,
    "day": 86_400_000,
    "days": 86_400_000,
}


def parse_duration_ms(value: str | int, what: str) -> int:
    """Spark's interval strings ("10 seconds", "1 minute") or milliseconds."""
    if isinstance(value, int) and not isinstance(value, bool):
        ms = value
    else:
        m = re.fullmatch(r"\s*(?:interval\s+)?(\d+)\s*([a-z]+)\s*", str(value).lower())
        if m is None or m.group(2) not in _UNITS_MS:
            raise ConfigError(
                f"{what}={value!r} is not a duration: write e.g. '10 seconds', '5 minutes', "
                "'500 milliseconds', or an int of milliseconds"
            )
        ms = int(m.group(1)) * _UNITS_MS[m.group(2)]
    if ms < 0:
        raise ConfigError(f"{what} must not be negative, got {value!r}")
    return ms


def _spark_schema(schema: Any, what: str) -> Any:
    """A Spark StructType from a StructType, a DDL string or a pyarrow schema."""
    from pyspark.sql.pandas.types import from_arrow_schema
    from pyspark.sql.types import StructType, _parse_datatype_string

    if isinstance(schema, StructType):
        return schema
    if isinstance(schema, pa.Schema):
        return from_arrow_schema(schema, prefer_timestamp_ntz=False)
    if isinstance(schema, str):
        parsed = _parse_datatype_string(schema)
        if isinstance(parsed, StructType):
            return parsed
    raise ConfigError(
        f"{what} must be a pyspark StructType, a DDL string ('user string, n long') or a "
        f"pyarrow.Schema; got {schema!r}"
    )


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
        from pyspark.sql.pandas.types import to_arrow_schema

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
        self.key = tuple(key)
        self.root = str(root)
        self.partitions = partitions
        self.name = name
        self.full_every = full_every
        self.retain = retain
        self.filesystem = filesystem
        tz = df.sparkSession.conf.get("spark.sql.session.timeZone")
        self.timezone: str = tz or "UTC"
        self.input_schema = to_arrow_schema(df.schema, timezone=tz)
        check_key_types(self.input_schema, self.key)
        if (event_time is None) != (watermark is None):
            raise ConfigError(
                "event_time= and watermark= go together: name the event-time column and the "
                "delay, e.g. event_time='ts', watermark='10 seconds'"
            )
        if event_time is not None and event_time not in self.input_schema.names:
            raise ConfigError(
                f"event_time column {event_time!r} is not in the DataFrame "
                f"(columns: {', '.join(self.input_schema.names)})"
            )
        self.event_time = event_time
        self.delay_ms = None if watermark is None else parse_duration_ms(watermark, "watermark")
        self.state_key = state_key(self.input_schema, self.key)
        self.initial_state = initial_state

    # -- level 1 ---------------------------------------------------------------

    def aggregate(self, output_mode: str = "update", **aggregates: Any) -> DataFrame:
        """Built-in aggregates per key, updated in Rust: ``out=("sum", "col")``,
        ``n="count"`` (rows) or ``("count", "col")`` (non-null values); funcs:
        count, sum, min, max, mean, first, last. ``output_mode``: "update"
        (the keys changed in the batch) or "complete" (every key)."""
        output_mode = output_mode.lower() if isinstance(output_mode, str) else output_mode
        if output_mode not in ("update", "complete"):
            raise ConfigError(
                f"aggregate output_mode must be 'update' or 'complete', got {output_mode!r}"
            )
        if not aggregates:
            raise ConfigError("aggregate needs at least one output, e.g. n='count'")
        specs: list[tuple[str, str | None, str]] = []
        for out, spec in aggregates.items():
            func, col = (spec, None) if isinstance(spec, str) else tuple(spec)
            if func not in AGG_FUNCS:
                raise ConfigError(
                    f"aggregate {out}={spec!r}: unknown function; use one of {AGG_FUNCS}"
                )
            if col is None and func != "count":
                raise ConfigError(
                    f"aggregate {out}={spec!r}: {func} needs a column, e.g. ({func!r}, 'x')"
                )
            if col is not None and col not in self.input_schema.names:
                raise ConfigError(
                    f"aggregate {out}={spec!r}: column {col!r} is not in the DataFrame "
                    f"(columns: {', '.join(self.input_schema.names)})"
                )
            specs.append((func, col, out))
        if self.state_key == KEY_COLUMN:
            # The key columns ride along as constant "first" values: readable
            # in the state files and in the output.
            specs = [("first", k, k) for k in self.key] + specs
            kernel_input = self.input_schema.append(
                pa.field(KEY_COLUMN, pa.binary(), nullable=False)
            )
        else:
            kernel_input = self.input_schema
        kernel = KeyedAggregates(kernel_input, self.state_key, specs)
        output = pa.schema(
            [kernel.output_schema.field(k) for k in self.key]
            + [kernel.output_schema.field(out) for out in aggregates]
        )
        processor = AggregateProcessor(
            key=self.key,
            state_key=self.state_key,
            state_schema=kernel.state_schema,
            output_schema=output,
            event_time=self.event_time,
            specs=specs,
            output_mode=output_mode,
        )
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
        output_mode = _output_mode(output_mode, "output_mode")
        state_fields = self._state_fields(state_schema, "state_schema")
        processor = BatchFunctionProcessor(
            key=self.key,
            state_key=self.state_key,
            state_schema=self._full_state_schema(state_fields, timeout),
            output_schema=self._arrow(output_schema, "output_schema"),
            event_time=self.event_time,
            timeout=self._timeout(timeout),
            timezone=self.timezone,
            fn=fn,
            pandas=pandas,
        )
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
        output_mode = _output_mode(outputMode, "outputMode")
        state_fields = self._state_fields(stateStructType, "stateStructType")
        state_schema = self._full_state_schema(state_fields, timeoutConf)
        if TIMEOUT_COLUMN in state_schema.names:
            state_schema = state_schema.insert(
                state_schema.get_field_index(TIMEOUT_COLUMN),
                pa.field(DEFINED_COLUMN, pa.bool_(), nullable=False),
            )
        records = self.df.sparkSession.conf.get(ARROW_BATCH_CONF, "10000")
        processor = PandasGroupProcessor(
            key=self.key,
            state_key=self.state_key,
            state_schema=state_schema,
            output_schema=self._arrow(outputStructType, "outputStructType"),
            event_time=self.event_time,
            timeout=self._timeout(timeoutConf),
            timezone=self.timezone,
            func=func,
            value_columns=tuple(f.name for f in state_fields),
            max_records_per_batch=int(records or "10000"),
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
        output_mode: str,
        time_mode: str,
        initial_state: Any,
        event_time_column: str,
        *,
        pandas: bool,
    ) -> DataFrame:
        from pyspark.sql.streaming.stateful_processor import StatefulProcessor

        from snapcut.spark.tws.processor import TIME_MODES, TransformWithStateProcessor
        from snapcut.spark.tws.variables import DeclaringHandle, table_specs

        if not isinstance(processor, StatefulProcessor):
            raise ConfigError(
                "statefulProcessor must be an instance of a subclass of "
                f"pyspark.sql.streaming.StatefulProcessor, got {type(processor).__name__}"
            )
        mode = _output_mode(output_mode, "outputMode")
        tm = time_mode.lower() if isinstance(time_mode, str) else None
        if tm not in TIME_MODES:
            raise ConfigError(
                f"timeMode must be 'None', 'ProcessingTime' or 'EventTime' (any case), "
                f"got {time_mode!r}"
            )
        if tm == "eventtime" and self.delay_ms is None:
            raise ConfigError(
                "timeMode='EventTime' needs a watermark: pass event_time='ts', "
                "watermark='10 seconds' to keyed_state"
            )
        if event_time_column:
            # Spark: an output column re-declared as event time, carrying the
            # operator's watermark to a downstream stateful operator.
            raise ConfigError(
                f"eventTimeColumnName={event_time_column!r}: chaining a stateful operator on "
                "this step's output event time is not supported by snapcut yet; put "
                "withWatermark(column, delay) on the output instead, or leave it out"
            )
        if initial_state is not None and self.initial_state is not None:
            raise ConfigError(
                "pass the initial state once: initialState= here or initial_state= to "
                "keyed_state, not both"
            )
        # Spark's pre-init: init() on the driver, on a copy of the processor (as
        # Spark runs it in a worker of its own), with a handle that records the
        # state variables (names, schemas, TTLs); then close().
        from pyspark import cloudpickle

        session = self.df.sparkSession
        # Spark's own DDL parser on either session kind (under Connect, the server's).
        declaring = DeclaringHandle(tm, lambda ddl: session.createDataFrame([], ddl).schema)
        pre = cloudpickle.loads(cloudpickle.dumps(processor))  # type: ignore[no-untyped-call]
        pre.init(declaring)
        pre.close()
        key_fields = tuple(self.input_schema.field(k) for k in self.key)
        tables = table_specs(list(declaring.variables.values()), key_fields, self.state_key)
        records = self.df.sparkSession.conf.get(ARROW_BATCH_CONF, "10000")
        tws = TransformWithStateProcessor(
            key=self.key,
            state_key=self.state_key,
            key_fields=key_fields,
            vertex=self.name,
            tables=tables,
            variables=dict(declaring.variables),
            output_schema=self._arrow(output_type, "outputStructType"),
            stateful_processor=processor,
            time_mode=tm,
            pandas=pandas,
            event_time=self.event_time,
            timezone=self.timezone,
            max_records_per_batch=int(records or "10000"),
            max_bytes_per_batch=int(
                session.conf.get("spark.sql.execution.arrow.maxBytesPerBatch", str(2**31 - 1))
                or 2**31 - 1
            ),
            int_to_decimal=str(
                session.conf.get(
                    "spark.sql.execution.pythonUDF.pandas.intToDecimalCoercionEnabled", "false"
                )
            ).lower()
            == "true",
        )
        timeout = {
            "none": GroupStateTimeout.NoTimeout,
            "processingtime": GroupStateTimeout.ProcessingTimeTimeout,
            "eventtime": GroupStateTimeout.EventTimeTimeout,
        }[tm]
        return self._build(
            tws,
            "transform_with_state_in_pandas" if pandas else "transform_with_state",
            needs_batch_ts=True,
            output_mode=mode,
            tables=tables,
            timeout=timeout,
            tws_initial=_grouped_frame(initial_state, self.key),
        )

    # -- plumbing --------------------------------------------------------------

    def _timeout(self, timeout: str) -> str:
        if timeout not in GroupStateTimeout.ALL:
            raise ConfigError(
                f"timeout {timeout!r} is not one of GroupStateTimeout.NoTimeout, "
                "ProcessingTimeTimeout, EventTimeTimeout"
            )
        if timeout == GroupStateTimeout.EventTimeTimeout and self.delay_ms is None:
            raise ConfigError(
                "EventTimeTimeout needs a watermark: pass event_time='ts', watermark='10 "
                "seconds' to keyed_state"
            )
        return timeout

    def _arrow(self, schema: Any, what: str) -> pa.Schema:
        from pyspark.sql.pandas.types import to_arrow_schema

        tz = self.df.sparkSession.conf.get("spark.sql.session.timeZone")
        return to_arrow_schema(_spark_schema(schema, what), timezone=tz)

    def _state_fields(self, schema: Any, what: str) -> list[pa.Field]:
        fields = list(self._arrow(schema, what))
        clash = [f.name for f in fields if f.name in self.key or f.name.startswith("__")]
        if clash:
            raise ConfigError(
                f"{what} field(s) {clash} clash with the key columns {list(self.key)} or use the "
                "reserved '__' prefix: rename them"
            )
        return fields

    def _full_state_schema(self, fields: list[pa.Field], timeout: str) -> pa.Schema:
        key_fields = [self.input_schema.field(k).with_nullable(False) for k in self.key]
        cols: list[pa.Field] = []
        if self.state_key == KEY_COLUMN:
            cols.append(pa.field(KEY_COLUMN, pa.binary(), nullable=False))
        cols += key_fields
        cols += [f.with_nullable(True) for f in fields]
        if timeout != GroupStateTimeout.NoTimeout:
            cols.append(pa.field(TIMEOUT_COLUMN, pa.int64()))
        return pa.schema(cols)

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
        committed = prepare_root(self.df.sparkSession, spec, operator)
        initial = None
        if tables:
            # transformWithState: the initial rows go to handleInitialState in batch 0.
            raw = tws_initial if tws_initial is not None else self.initial_state
            if raw is not None and not committed:
                processor.initial_rows = write_initial_state(  # type: ignore[attr-defined]
                    raw, self.df, self.key, StateRoot(spec), _arrow_schema(raw)
                )
        elif self.initial_state is not None and not committed:
            # (A restart keeps the root's own state, as Spark does.)
            initial = write_initial_state(
                self.initial_state, self.df, self.key, StateRoot(spec), schema
            )
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
            spec,
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


def make_task_function(
    spec: RootSpec,
    processor: Processor,
    delay_ms: int | None,
    initial: Any,
    input_schema: pa.Schema,
    stage_schema: pa.Schema,
    state_writes: str = "background",
    *,
    streaming: bool,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function ``mapInArrow`` runs in each Python worker: the output in
    `stage_schema` (:func:`snapcut.spark.metrics.internal_schema`), then the
    task's metrics row. A batch DataFrame is one epoch, batch 0; in a
    streaming query the micro-batch id must reach the task."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is None:
            raise TaskError("the keyed_state step runs only inside a Spark task")
        partition = ctx.partitionId()
        batch_id, owner = task_batch(ctx, streaming)
        parts = list(batches)
        rows = pa.Table.from_batches(parts) if parts else input_schema.empty_table()
        batch_ts = None
        if BATCH_TS_COLUMN in rows.column_names and rows.num_rows:
            ts = rows[BATCH_TS_COLUMN][0]
            # (A streaming batch timestamp is whole ms; a batch query's is not.)
            batch_ts = int(pa.compute.cast(ts, pa.timestamp("ms", "UTC"), safe=False).value)
        task = PartitionTask(
            StateRoot(spec),
            batch_id,
            partition,
            owner,
            delay_ms,
            initial=initial,
            run_id=ctx.getLocalProperty("sql.streaming.runId"),
        )
        out = task.apply(rows, processor, batch_ts)
        if state_writes == "sync":
            task.commit()
            for b in out.to_batches():
                yield metrics.with_null_metrics(b, stage_schema)
        else:
            # Version N is written while the output goes to Spark (the asynchronous
            # phase, within the task); the task ends only once it is durable.
            writer = _Committer(task)
            writer.start()
            for b in out.to_batches():
                yield metrics.with_null_metrics(b, stage_schema)
            writer.finish()
        yield metrics.metrics_batch(stage_schema, task.figures())

    return run


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


def _grouped_frame(initial: Any, key: tuple[str, ...]) -> Any:
    """The DataFrame behind ``initialState`` (Spark takes ``df.groupBy(key)``;
    a plain DataFrame works too); its key columns must be named as the key."""
    if initial is None:
        return None
    frame = getattr(initial, "_df", initial)
    if not hasattr(frame, "mapInArrow"):
        raise ConfigError(
            "initialState must be a grouped DataFrame (initial_df.groupBy(key)) or a "
            f"DataFrame; got {type(initial).__name__}"
        )
    missing = [k for k in key if k not in frame.columns]
    if missing:
        raise ConfigError(
            f"initialState lacks the key column(s) {missing} (it has {frame.columns}): group it "
            "by columns named as keyed_state's key"
        )
    return frame


def _arrow_schema(frame: Any) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    tz = frame.sparkSession.conf.get("spark.sql.session.timeZone")
    return to_arrow_schema(frame.schema, timezone=tz)


def _key_columns(df: DataFrame, key: Any) -> tuple[DataFrame, tuple[str, ...]]:
    """What ``groupBy`` takes as keys — column names and Columns, alone or in
    a list — as column names of `df` (a Column that is an expression becomes a
    column of its own, named as Spark names it)."""
    items = [key] if isinstance(key, str) or _is_column(key) else list(key)
    if not items:
        raise ConfigError("key must name at least one column")
    names = []
    for item in items:
        if isinstance(item, str):
            names.append(item)
        elif _is_column(item):
            name = df.select(item).columns[0]
            if name not in df.columns:
                df = df.withColumn(name, item)
            names.append(name)
        else:
            raise ConfigError(
                f"key must be column names or Columns (as groupBy takes), got {item!r}"
            )
    return df, tuple(names)


def _is_column(value: Any) -> bool:
    from pyspark.sql import Column

    return isinstance(value, Column)


def _output_mode(value: Any, what: str) -> str:
    """Spark's output-mode spellings for a stateful step: "update" or "append", any case."""
    mode = value.lower() if isinstance(value, str) else None
    if mode not in ("update", "append"):
        raise ConfigError(f"{what} must be 'Update' or 'Append' (any case), got {value!r}")
    return mode


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
    df, keys = _key_columns(df, key)
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
