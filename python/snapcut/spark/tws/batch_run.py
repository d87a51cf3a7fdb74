"""One (micro-batch, partition) of a transformWithState step, run in steps of
keys so that a batch of any size holds a bounded number of keys in Python.

The calls come in Spark's order (``init``; per grouping key in key order its
``handleInitialState`` rows, then ``handleInputRows``; the expired timers;
``close``), but a step of at most :data:`KEYS_PER_STEP` keys at a time has
its state read (one lookup per variable), its calls made and its changes
written back to the tables before the next step's keys are read. The Python
objects of a key (its state values, its input frame, what it yielded) live
for one step; the tables hold the rest, and spill under a memory budget.
A processor sees no difference: a key's state is only its own, and a key's
changes reach the tables before anything reads them again (a later step's
timers, the next batch).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from snapcut.spark.keys import KEY_COLUMN, with_state_key
from snapcut.spark.processors import BATCH_TS_COLUMN, _no_columns
from snapcut.spark.state.key_parts import KEYS_PER_STEP
from snapcut.spark.state.partition import BatchInfo
from snapcut.spark.state.spec import TableSpec, table_vertex
from snapcut.spark.tws.handle import SnapcutHandle
from snapcut.spark.tws.state import BatchState, Key, QueryInfo
from snapcut.spark.tws.variables import Variable

if TYPE_CHECKING:
    from snapcut._core import StateTable

__all__ = ["KEYS_PER_STEP", "BatchProcessor", "BatchRun", "Outputs"]

OUTPUT_ITEMS = 1 << 13
"""Yielded frames or Rows gathered before they become one Arrow table: a
processor yielding a frame per key would otherwise hold a pandas object of a
few kB per key until the batch ends."""


class BatchProcessor(Protocol):
    """What a batch's run needs of its processor
    (:class:`snapcut.spark.tws.processor.TransformWithStateProcessor`, which
    builds the run: a protocol keeps the dependency pointing one way)."""

    key: tuple[str, ...]
    state_key: str
    key_fields: tuple[pa.Field, ...]
    vertex: str
    tables: tuple[TableSpec, ...]
    variables: dict[str, Variable]
    stateful_processor: Any
    time_mode: str
    pandas: bool
    late_rows: int
    timed_out_keys: int

    def _inputs(self, table: pa.Table) -> Callable[[int, int], Iterator[Any]]: ...

    def _output(self, out: list[Any]) -> pa.Table: ...

    def _timestamps(self, info: BatchInfo) -> tuple[int, int]: ...

    def _drop_late(self, rows: pa.Table, info: BatchInfo) -> pa.Table: ...

    def _initial(self, info: BatchInfo) -> dict[tuple[Any, ...], list[Any]]: ...


class Outputs:
    """What a batch's calls yielded: Arrow tables of the output schema, made
    every :data:`OUTPUT_ITEMS` items (or, `raw`, the items themselves, for
    :class:`snapcut.spark.testing.TwsTester`)."""

    def __init__(self, proc: BatchProcessor, raw: bool = False) -> None:
        self.proc = proc
        self.raw = raw
        self.items: list[Any] = []
        self._tables: list[pa.Table] = []

    def add(self, result: Any) -> None:
        if result is None:
            return
        # pd.DataFrame() (no columns) is no rows, as in Spark.
        pandas = self.proc.pandas
        self.items.extend(item for item in result if not (pandas and _no_columns(item)))
        if not self.raw and len(self.items) >= OUTPUT_ITEMS:
            self._tables.append(self.proc._output(self.items))
            self.items = []

    def take(self) -> pa.Table:
        """The output so far as one table (emptied)."""
        if self.items or not self._tables:
            self._tables.append(self.proc._output(self.items))
            self.items = []
        tables, self._tables = self._tables, []
        return tables[0] if len(tables) == 1 else pa.concat_tables(tables)


class BatchRun:
    """The calls of one (batch, partition): begun (``init``), fed its input
    rows (:meth:`input_rows`, whole or in parts of whole keys), finished
    (:meth:`finish`: the rest of the initial state, the timers, ``close``)."""

    def __init__(
        self,
        proc: BatchProcessor,
        tables: dict[str, StateTable],
        info: BatchInfo,
        out: Outputs,
    ) -> None:
        from pyspark.sql.streaming.stateful_processor import TimerValues

        proc.late_rows = 0
        proc.timed_out_keys = 0
        self.proc, self.info, self.out = proc, info, out
        vertex_of = {t.name: table_vertex(proc.vertex, t.name) for t in proc.tables}
        self.state = BatchState(
            tables,
            proc.tables,
            vertex_of,
            proc.variables,
            proc.key_fields,
            proc.state_key,
            info.processing_time_ms,
            proc.time_mode,
            QueryInfo(info.query_id, info.run_id, info.batch_id, info.partition),
        )
        self.timer_values = TimerValues(*proc._timestamps(info))
        self.handle = SnapcutHandle(self.state)
        proc.stateful_processor.init(self.handle)
        self.handle._initialized = True
        # Batch 0's initial-state rows by key, each key's taken as it is handled.
        self.initial = proc._initial(info)

    def input_rows(self, rows: pa.Table, *, last: bool) -> None:
        """Calls for the grouping keys of `rows` (every row of each of its
        keys), a step of keys at a time in key order. `last`: these are the
        batch's last rows, so the initial-state keys without input rows come
        in key order among them; else (a part) only its keys' initial state."""
        proc = self.proc
        if BATCH_TS_COLUMN in rows.column_names:
            rows = rows.drop_columns([BATCH_TS_COLUMN])
        if rows.num_rows == 0:
            rows = pa.schema(proc.key_fields).empty_table()
        # (_drop_late sets late_rows to this call's count when it drops any.)
        late, proc.late_rows = proc.late_rows, 0
        rows = proc._drop_late(rows, self.info)
        proc.late_rows += late
        rows = with_state_key(rows, proc.key, self.info.batch_id)
        if rows.num_rows:
            # Keys are non-null here (with_state_key refuses nulls).
            order = pc.sort_indices(rows, sort_keys=[(k, "ascending") for k in proc.key])
            rows = rows.take(order)
        user = rows.drop_columns([KEY_COLUMN]) if KEY_COLUMN in rows.column_names else rows
        ends = _run_ends(rows[proc.state_key]) if rows.num_rows else np.zeros(0, np.int64)
        n = len(ends)
        for first in range(0, n, KEYS_PER_STEP):
            stop = min(first + KEYS_PER_STEP, n)
            a = int(ends[first - 1]) if first else 0
            b = int(ends[stop - 1])
            chunk = rows.slice(a, b - a)
            key_cols = [chunk[k].to_pylist() for k in proc.key]
            starts = [0, *(ends[first : stop - 1] - a).tolist()]
            stops = (ends[first:stop] - a).tolist()
            data_keys = [tuple(c[s] for c in key_cols) for s in starts]
            by_key = dict(zip(data_keys, zip(starts, stops, strict=True), strict=True))
            # A key with input rows takes its initial state in its step (_step);
            # in the batch's last rows the keys with initial state only come
            # in key order among them.
            extra: set[Key] = set()
            if last and stop == n:
                extra = set(self.initial)
            elif last:
                top = max(data_keys)
                extra = {k for k in self.initial if k <= top}
            keys = sorted(set(data_keys) | extra)  # Spark's order: by key
            self._step(keys, by_key, proc._inputs(user.slice(a, b - a)))
        if last and self.initial:
            self._initial_only()

    def finish(self, fire_timers: bool) -> None:
        """The initial-state keys without input rows, then (`fire_timers`)
        every timer due, by time, each deleted once handled; ``close``; the
        last changes to the tables."""
        from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo

        proc, state = self.proc, self.state
        self._initial_only()
        info = self.info
        if proc.time_mode != "none" and fire_timers:
            threshold = (
                info.processing_time_ms if proc.time_mode == "processingtime" else info.watermark_ms
            )
            if proc.time_mode == "processingtime" or info.watermark_present:
                due = state.expired_timers(threshold)
                proc.timed_out_keys = len({k for _, k in due})
                for first in range(0, len(due), KEYS_PER_STEP):
                    step = due[first : first + KEYS_PER_STEP]
                    state.load([k for _, k in step])
                    for ts, k in step:
                        state.current = k
                        self.out.add(
                            proc.stateful_processor.handleExpiredTimer(
                                k, self.timer_values, ExpiredTimerInfo(ts)
                            )
                        )
                        self.handle.deleteTimer(ts)
                    state.current = None
                    self._written_back()
        state.current = None
        proc.stateful_processor.close()
        state.write_back()

    def _initial_only(self) -> None:
        keys = sorted(self.initial)
        for first in range(0, len(keys), KEYS_PER_STEP):
            self._step(keys[first : first + KEYS_PER_STEP], {}, None)

    def _step(
        self,
        keys: Sequence[Key],
        by_key: dict[Key, tuple[int, int]],
        inputs: Callable[[int, int], Iterator[Any]] | None,
    ) -> None:
        proc, state, tv = self.proc.stateful_processor, self.state, self.timer_values
        state.load(keys)
        for k in keys:
            state.current = k
            for init_row in self.initial.pop(k, ()):
                proc.handleInitialState(k, init_row, tv)
            bounds = by_key.get(k)
            if bounds is not None and inputs is not None:
                self.out.add(proc.handleInputRows(k, inputs(*bounds), tv))
        state.current = None
        self._written_back()

    def _written_back(self) -> None:
        self.state.write_back()
        self.state.release()


def _run_ends(sorted_keys: pa.ChunkedArray) -> Any:
    """The end of each run of equal keys in a sorted column (numpy int64)."""
    return pc.run_end_encode(sorted_keys.combine_chunks()).run_ends.to_numpy().astype(np.int64)
