"""The stateful helper's levels as processors of one partition's batch, and
what they share.

1. :class:`AggregateProcessor` — built-in aggregates, updated in Rust.
2. :class:`BatchFunctionProcessor` — a user function called once per
   (batch, partition) with the rows and the aligned state of their keys.
3. ``applyInPandasWithState``'s per-key function with Spark's ``GroupState``,
   on the same state machinery: :mod:`snapcut.spark.group_processor`.

Processors are pickled into Spark's UDF: they hold plain configuration and
build their Rust helpers lazily in the worker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from snapcut._core import ConfigError, KeyedAggregates, StateTable, TaskError
from snapcut.spark.group_state import DEFINED_COLUMN, TIMEOUT_COLUMN, GroupStateTimeout
from snapcut.spark.keys import KEY_COLUMN, distinct, with_state_key
from snapcut.spark.state.partition import NO_EVENT_TIME, BatchInfo

PRESENT_COLUMN = "__present"
TIMED_OUT_COLUMN = "__timed_out"
BATCH_TS_COLUMN = "__snapcut_batch_ts"

__all__ = [
    "DEFINED_COLUMN",
    "PRESENT_COLUMN",
    "TIMED_OUT_COLUMN",
    "TIMEOUT_COLUMN",
    "AggregateProcessor",
    "BatchFunctionProcessor",
    "StateUpdate",
]


@dataclass
class StateUpdate:
    """What a level-2 function returns (a plain tuple of the three works too).

    ``output``: rows of ``output_schema``; ``state``: rows to store (key
    columns + state columns, optionally ``__timeout_ms``); ``remove``: keys
    (a table of the key columns, or an array for a single key) to delete.
    """

    output: Any = None
    state: Any = None
    remove: Any = None


def event_time_ms(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """An event-time column (timestamp or integer milliseconds) as int64 ms."""
    t = column.type
    if pa.types.is_timestamp(t):
        return pc.cast(pc.cast(column, pa.timestamp("ms", t.tz)), pa.int64())
    if pa.types.is_integer(t):
        return pc.cast(column, pa.int64())
    raise ConfigError(
        f"event-time column has type {t}: use a timestamp or integer milliseconds column"
    )


def max_event_time_ms(rows: pa.Table, event_time: str | None) -> int:
    """The latest event time in `rows` (ms), or NO_EVENT_TIME."""
    if event_time is None or rows.num_rows == 0:
        return NO_EVENT_TIME
    m = pc.max(event_time_ms(rows[event_time])).as_py()
    return NO_EVENT_TIME if m is None else int(m)


def spark_pandas(table: pa.Table, timezone: str) -> Any:
    """`table` as PySpark hands Arrow data to pandas functions: timestamps as
    naive datetime64[ns] in the session time zone, dates as objects."""
    frame = table.to_pandas(date_as_object=True, coerce_temporal_nanoseconds=True)
    for f in table.schema:
        if pa.types.is_timestamp(f.type) and f.type.tz is not None:
            frame[f.name] = frame[f.name].dt.tz_convert(timezone).dt.tz_localize(None)
    return frame


def conform(table: Any, schema: pa.Schema, what: str, fix: str) -> pa.Table:
    """`table` (Arrow or pandas) with exactly `schema`'s columns, cast safely."""
    if table is None:
        return schema.empty_table()
    table = _arrow(table, what)
    missing = [f.name for f in schema if f.name not in table.column_names]
    if missing:
        raise ConfigError(
            f"{what} lacks column(s) {missing} (it has {table.column_names}; expected "
            f"{schema.names}): {fix}"
        )
    columns = []
    for f in schema:
        col = table[f.name]
        if col.type != f.type:
            try:
                col = pc.cast(col, f.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise ConfigError(
                    f"{what} column {f.name!r} has type {col.type}, expected {f.type}: {fix} ({e})"
                ) from e
        columns.append(col)
    return pa.Table.from_arrays(columns, schema=schema)


@dataclass
class _Base:
    key: tuple[str, ...]
    state_key: str
    state_schema: pa.Schema
    output_schema: pa.Schema
    event_time: str | None = None
    timeout: str = GroupStateTimeout.NoTimeout
    timezone: str = "UTC"
    late_rows: int = field(default=0, init=False)
    timed_out_keys: int = field(default=0, init=False)

    def to_pandas(self, table: pa.Table) -> Any:
        return spark_pandas(table, self.timezone)

    def max_event_time_ms(self, rows: pa.Table) -> int:
        return max_event_time_ms(rows, self.event_time)

    def _prepare(self, rows: pa.Table, info: BatchInfo) -> pa.Table:
        """Keyed rows without the late ones: before an event-time-timeout
        stateful step Spark drops rows at or before the watermark for late
        events, the previous batch's watermark (since Spark 3.4; the current
        one decides evictions and timeouts)."""
        self.late_rows = 0
        self.timed_out_keys = 0
        if BATCH_TS_COLUMN in rows.column_names:
            rows = rows.drop_columns([BATCH_TS_COLUMN])
        if (
            self.timeout == GroupStateTimeout.EventTimeTimeout
            and info.watermark_present
            and self.event_time is not None
            and rows.num_rows
        ):
            late = pc.less_equal(event_time_ms(rows[self.event_time]), info.late_watermark_ms)
            self.late_rows = int(pc.sum(late).as_py() or 0)
            if self.late_rows:
                rows = rows.filter(pc.invert(late))
        return with_state_key(rows, self.key, info.batch_id)

    def _expired(
        self, table: StateTable, info: BatchInfo, exclude: pa.Array | None = None
    ) -> pa.Array:
        """Keys whose timeout passed (Spark: timeout < threshold), not in `exclude`."""
        if self.timeout == GroupStateTimeout.NoTimeout or len(table) == 0:
            return pa.array([], self.state_schema.field(self.state_key).type)
        if self.timeout == GroupStateTimeout.EventTimeTimeout:
            if not info.watermark_present:
                return pa.array([], self.state_schema.field(self.state_key).type)
            threshold = info.watermark_ms
        else:
            threshold = info.processing_time_ms
        # Spark times a key out when its timeout is before the threshold:
        # at or before threshold - 1 ms, from the table's time index.
        keys = table.due(threshold - 1)
        if exclude is not None and len(exclude) and len(keys):
            keys = keys.filter(pc.invert(pc.is_in(keys, value_set=exclude)))
        self.timed_out_keys = len(keys)
        return keys


@dataclass
class AggregateProcessor(_Base):
    """Level 1: ``specs`` are (func, column or None, output name)."""

    specs: Sequence[tuple[str, str | None, str]] = ()
    output_mode: str = "update"
    _kernel: KeyedAggregates | None = field(default=None, init=False, repr=False)

    def kernel(self, input_schema: pa.Schema) -> KeyedAggregates:
        if self._kernel is None:
            self._kernel = KeyedAggregates(input_schema, self.state_key, list(self.specs))
        return self._kernel

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_kernel"] = None
        return state

    def process(self, table: StateTable, rows: pa.Table, info: BatchInfo) -> pa.Table:
        rows = self._prepare(rows, info)
        kernel = self.kernel(rows.schema)
        if self.output_mode == "complete":
            if rows.num_rows:
                kernel.apply(table, rows)
            return self._output(kernel.output(table.to_arrow()))
        if rows.num_rows == 0:
            return self.output_schema.empty_table()
        return self._output(kernel.output(kernel.apply(table, rows))).sort_by(self.state_key_sort())

    @property
    def by_key_parts(self) -> bool:
        """Whether a batch may be applied in parts that hold whole keys
        (``PartitionTask.apply_parts``): in update mode a key's output row
        depends only on its rows and state; complete mode outputs the table."""
        return self.output_mode != "complete"

    def state_key_sort(self) -> list[tuple[str, str]]:
        return [(k, "ascending") for k in self.key]

    def _output(self, out: Any) -> pa.Table:
        table = out if isinstance(out, pa.Table) else pa.Table.from_batches([out])
        return conform(table, self.output_schema, "aggregate output", "internal error")


Level2Function = Callable[[Any, Any, BatchInfo], Any]


@dataclass
class BatchFunctionProcessor(_Base):
    """Level 2: ``fn(rows, state, info)`` once per (batch, partition), or
    once per part of a batch that comes in parts (:meth:`process_parts`)."""

    fn: Level2Function | None = None
    pandas: bool = False

    def _aligned_state(self, table: StateTable, keys: pa.Array, timed_out: bool) -> pa.Table:
        batch, present = table.lookup(keys)
        state = pa.Table.from_batches([batch])
        state = state.append_column(PRESENT_COLUMN, present)
        return state.append_column(TIMED_OUT_COLUMN, pa.array([timed_out] * len(keys), pa.bool_()))

    def process(self, table: StateTable, rows: pa.Table, info: BatchInfo) -> pa.Table:
        rows = self._prepare(rows, info)
        keys = self._keys(rows)
        expired = self._expired(table, info, keys)
        if len(keys) == 0 and len(expired) == 0:
            return self.output_schema.empty_table()
        state = pa.concat_tables(
            [self._aligned_state(table, keys, False), self._aligned_state(table, expired, True)]
        )
        return self._call(table, rows, state, expired, info)

    @property
    def by_key_parts(self) -> bool:
        """A batch may come in parts of whole keys (:meth:`process_parts`)."""
        return True

    def process_parts(
        self, table: StateTable, parts: Iterable[pa.Table], info: BatchInfo
    ) -> Iterator[pa.Table]:
        """A batch larger than the worker holds, as parts of whole keys: the
        function is called once per part, with the part's rows and the state
        of their keys, and then once with no rows and the keys whose timeout
        had passed when the batch began and that had no rows in any part
        (their state as the parts' calls left it). Yields each call's output.
        ``late_rows`` and ``timed_out_keys`` are the batch's once the parts
        are exhausted."""
        key_type = self.state_schema.field(self.state_key).type
        expired = self._expired(table, info)
        late = 0
        no_rows: pa.Table | None = None
        for part in parts:
            rows = self._prepare(part, info)
            late += self.late_rows
            if no_rows is None:
                no_rows = rows.schema.empty_table()
            keys = self._keys(rows)
            if len(keys) == 0:
                continue
            if len(expired):
                expired = expired.filter(pc.invert(pc.is_in(expired, value_set=keys)))
            state = self._aligned_state(table, keys, False)
            yield self._call(table, rows, state, pa.array([], key_type), info)
        if len(expired):
            if no_rows is None:
                raise TaskError(
                    "a level-2 batch came with no part at all: its input's columns are unknown"
                )
            state = self._aligned_state(table, expired, True)
            yield self._call(table, no_rows, state, expired, info)
        self.late_rows = late
        self.timed_out_keys = len(expired)

    def _keys(self, rows: pa.Table) -> pa.Array:
        """The distinct state keys of prepared rows, sorted."""
        if rows.num_rows:
            return distinct(rows[self.state_key])
        return pa.array([], self.state_schema.field(self.state_key).type)

    def _call(
        self,
        table: StateTable,
        rows: pa.Table,
        state: pa.Table,
        expired: pa.Array,
        info: BatchInfo,
    ) -> pa.Table:
        """One call of the function, its update applied; its output."""
        user_rows = rows.drop_columns([KEY_COLUMN]) if KEY_COLUMN in rows.column_names else rows
        assert self.fn is not None
        if self.pandas:
            result = self.fn(self.to_pandas(user_rows), self.to_pandas(state), info)
        else:
            result = self.fn(user_rows, state, info)
        return self._apply(table, _as_update(result), expired, info)

    def _apply(
        self, table: StateTable, update: StateUpdate, expired: pa.Array, info: BatchInfo
    ) -> pa.Table:
        out = conform(
            update.output,
            self.output_schema,
            "the function's output",
            "return rows of output_schema",
        )
        fix = "return rows of the key columns plus state_schema"
        if update.state is not None:
            new = _arrow(update.state, "returned state")
            if self.state_key == KEY_COLUMN and KEY_COLUMN not in new.column_names:
                new = with_state_key(new, self.key, info.batch_id)
            if TIMEOUT_COLUMN in self.state_schema.names and TIMEOUT_COLUMN not in new.column_names:
                new = new.append_column(TIMEOUT_COLUMN, pa.nulls(new.num_rows, pa.int64()))
            new = conform(new, self.state_schema, "returned state", fix)
            if new.num_rows:
                table.update(new)
        # A timed-out key that was neither updated nor removed keeps its state
        # without a timeout, so it does not fire again (Spark's rule).
        handled = _keys_of(update.state, self.state_key, self.key, info.batch_id)
        removed = _keys_of(update.remove, self.state_key, self.key, info.batch_id)
        if len(expired) and TIMEOUT_COLUMN in self.state_schema.names:
            stale = expired
            if len(handled) or len(removed):
                # An empty pandas frame gives untyped (null) keys: cast to the key's type.
                key_type = self.state_schema.field(self.state_key).type
                done = pa.concat_arrays([handled.cast(key_type), removed.cast(key_type)])
                stale = expired.filter(pc.invert(pc.is_in(expired, value_set=done)))
            if len(stale):
                rows = pa.Table.from_batches([table.lookup(stale)[0]])
                rows = rows.set_column(
                    rows.schema.get_field_index(TIMEOUT_COLUMN),
                    TIMEOUT_COLUMN,
                    pa.nulls(rows.num_rows, pa.int64()),
                )
                table.update(conform(rows, self.state_schema, "state", "internal error"))
        if len(removed):
            table.delete(removed)
        return out


def _no_columns(frame: Any) -> bool:
    """``pd.DataFrame()``: Spark takes a frame without columns as no rows."""
    return hasattr(frame, "columns") and len(frame.columns) == 0 and len(frame) == 0


def _as_update(result: Any) -> StateUpdate:
    if isinstance(result, StateUpdate):
        return result
    if isinstance(result, tuple) and 1 <= len(result) <= 3:
        return StateUpdate(*result)
    raise TaskError(
        "the map_batches function must return StateUpdate(output, state, remove) or a tuple "
        f"(output, state[, remove]); got {type(result).__name__}"
    )


def _keys_of(obj: Any, state_key: str, key: Sequence[str], batch_id: int) -> pa.Array:
    if obj is None:
        return pa.array([], pa.null())
    if isinstance(obj, (pa.Array, pa.ChunkedArray)):
        return _plain_array(obj)
    obj = _arrow(obj, "keys to remove")
    if state_key not in obj.column_names:
        obj = with_state_key(obj, key, batch_id)
    return _plain_array(obj[state_key])


def _plain_array(a: pa.Array | pa.ChunkedArray) -> pa.Array:
    return a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a


def _arrow(obj: Any, what: str) -> pa.Table:
    if isinstance(obj, pa.Table):
        return obj
    if isinstance(obj, pa.RecordBatch):
        return pa.Table.from_batches([obj])
    if hasattr(obj, "iloc"):
        return pa.Table.from_pandas(obj, preserve_index=False)
    raise ConfigError(
        f"{what} must be a pyarrow Table or a pandas DataFrame, got {type(obj).__name__}"
    )
