"""``keyed_state``: stateful per-key processing for PySpark, state in Rust,
snapshotted per micro-batch as Arrow files under a root.

    >>> from snapcut.spark import keyed_state
    >>> s = keyed_state(events, key="user", root="/data/dwell-state", partitions=4)
    >>> avg = s.aggregate(count="count", total=("sum", "dwell_ms"), avg=("mean", "dwell_ms"))

The facade: arguments checked, the plan built by calls into the rooms: each
step's processor from :mod:`~snapcut.spark.aggregates`,
:mod:`~snapcut.spark.group_functions` or :mod:`~snapcut.spark.tws`, and the
state stage around it (the query's one StateRoot, the ``mapInArrow`` stage
over the rows hash-partitioned by key) from :mod:`snapcut.spark.state.stage`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from snapcut._core import state_memory_bytes
from snapcut.snapshots.run_cache import RunCacheSpec
from snapcut.spark.aggregates import plan_aggregate
from snapcut.spark.arguments import key_columns, parse_duration_ms
from snapcut.spark.arguments import output_mode as output_mode_of
from snapcut.spark.group_functions import plan_apply_in_pandas_with_state, plan_map_batches
from snapcut.spark.group_state import GroupStateTimeout
from snapcut.spark.keyed_input import KeyedInput
from snapcut.spark.state.root import StateRoot
from snapcut.spark.state.stage import StateOptions, StepPlan, build_stage

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "RUN_CACHE_DIR_CONF",
    "RUN_CACHE_SIZE_CONF",
    "STATE_MEMORY_CONF",
    "KeyedState",
    "keyed_state",
    "parse_duration_ms",
]

STATE_MEMORY_CONF = "spark.snapcut.state.memory"
"""The Spark conf of ``keyed_state``'s default ``state_memory``."""

RUN_CACHE_SIZE_CONF = "spark.snapcut.state.runCacheSize"
"""The Spark conf of ``keyed_state``'s default ``run_cache_size``."""

RUN_CACHE_DIR_CONF = "spark.snapcut.state.runCacheDir"
"""The Spark conf of ``keyed_state``'s default ``run_cache_dir``."""


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
        state_memory: int | str | None = None,
        run_cache_size: int | str | None = None,
        run_cache_dir: str | None = None,
        compaction: bool = True,
        compaction_cpu_share: float = 1.0,
        compaction_bytes_per_s: int | None = None,
    ) -> None:
        conf = df.sparkSession.conf
        if state_memory is None:
            state_memory = conf.get(STATE_MEMORY_CONF, None)
        if run_cache_size is None:
            run_cache_size = conf.get(RUN_CACHE_SIZE_CONF, None)
        if run_cache_dir is None:
            run_cache_dir = conf.get(RUN_CACHE_DIR_CONF, None)
        self.options = StateOptions(
            root=str(root),
            partitions=partitions,
            full_every=full_every,
            retain=retain,
            filesystem=filesystem,
            state_writes=state_writes,
            initial_state=initial_state,
            state_memory=None if state_memory is None else state_memory_bytes(state_memory),
            run_cache=RunCacheSpec.parse(run_cache_size, run_cache_dir),
            compaction=compaction,
            compaction_cpu_share=compaction_cpu_share,
            compaction_bytes_per_s=compaction_bytes_per_s,
        )
        self.df = df
        self.state_root: StateRoot | None = None
        """The root's object, once a step is built (the sink's ``state=``)."""
        self.input = KeyedInput.of(
            df, key, name, event_time, watermark, has_initial_state=initial_state is not None
        )

    # Where the state lives (the sink's ``state=`` reads these); kept once, in `options`.

    @property
    def root(self) -> str:
        return self.options.root

    @property
    def filesystem(self) -> Any:
        return self.options.filesystem

    @property
    def partitions(self) -> int:
        return self.options.partitions

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
        return self._build(StepPlan(processor, "aggregate", needs_batch_ts=False))

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
        """``fn(rows, state, info)`` once per (micro-batch, partition), or,
        under ``state_memory``, once per part of whole keys of a batch larger
        than a quarter of it, then once with no rows for the timed-out keys.

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
        return self._build(StepPlan(processor, "map_batches", True, output_mode))

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
        return self._build(StepPlan(processor, "apply_in_pandas_with_state", True, output_mode))

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
            StepPlan(
                step.processor,
                step.operator,
                needs_batch_ts=True,
                output_mode=step.output_mode,
                tables=step.tables,
                timeout=step.timeout,
                tws_initial=step.initial,
            )
        )

    # -- the plan ------------------------------------------------------------

    def _build(self, step: StepPlan) -> DataFrame:
        out, self.state_root = build_stage(self.input, self.options, step)
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
    state_memory: int | str | None = None,
    run_cache_size: int | str | None = None,
    run_cache_dir: str | None = None,
    compaction: bool = True,
    compaction_cpu_share: float = 1.0,
    compaction_bytes_per_s: int | None = None,
) -> KeyedState:
    """Keys a streaming (or batch) DataFrame for stateful processing.

    ``key``: what ``groupBy`` takes — a column name or a Column, or a list of
    them; ``root``: a local path or any
    pyarrow-filesystem URI where the state of every micro-batch is written
    (Arrow IPC + manifest, readable with ``snapcut.snapshots.open``);
    ``partitions``: the number of state partitions (fixed for the root's
    life); ``full_every``: how many diffs sit on a partition's full before
    they are merged (a batch that changed every key writes a full anyway);
    ``compaction``: a local root's runs are merged by each Python worker's
    compactor thread, off the tasks' path (as Spark's providers write their
    snapshots in maintenance), and a later commit adopts the merge; a commit
    writes a full itself only once a partition's runs reach twice
    ``full_every`` (the merges fell behind). ``False``, and any remote root:
    a commit writes a full every ``full_every`` batches.
    ``compaction_cpu_share`` (0.01 to 1 of one core) and
    ``compaction_bytes_per_s`` (None: no limit) bound a worker's compactor;
    ``retain``: committed batches kept (and every base they need);
    ``event_time``/``watermark``: the event-time column and the watermark
    delay (Spark's rule: max event time of earlier batches minus the delay);
    ``initial_state``: a DataFrame of key columns + state columns, or
    ``(root, batch)`` of another state root, to start from;
    ``state_writes``: ``"background"`` writes version N on a thread while the
    task's output goes to Spark, ``"sync"`` before the task emits any output
    (either way the task ends only once version N is durable);
    ``state_memory``: bytes (or ``"256MB"``) of state rows a Python worker
    keeps in memory, the rest spilled to sorted runs in local files (default:
    the Spark conf ``spark.snapcut.state.memory``, else all in memory): half
    for the partition a task works on, shared by its tables (every state
    variable of transformWithState, and its timers, is one), a quarter for
    the input a task holds before it spills it, a quarter for the other
    partitions the worker keeps warm (the largest are flushed when a task
    ends over it); at least 2 MiB per table;
    ``run_cache_size`` / ``run_cache_dir``: a remote root's state files are
    downloaded once into a local cache on each worker machine and mapped
    from there (bytes or ``"2GB"``, least recently used files evicted past
    it; ``0``: no cache, files read into memory; default: the Spark confs
    ``spark.snapcut.state.runCacheSize`` and ``spark.snapcut.state.runCacheDir``,
    else 2 GiB under the worker's temp dir).
    """
    from snapcut.spark.source.register import register

    # The state root is then readable with spark.read.format("snapcut").
    register(df.sparkSession)
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
        state_memory=state_memory,
        run_cache_size=run_cache_size,
        run_cache_dir=run_cache_dir,
        compaction=compaction,
        compaction_cpu_share=compaction_cpu_share,
        compaction_bytes_per_s=compaction_bytes_per_s,
    )
