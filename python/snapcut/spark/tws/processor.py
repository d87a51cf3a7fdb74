"""The transformWithState step of one partition's micro-batch, in Spark's order.

Per (batch, partition), as Spark's Python worker does it
(``TransformWithStateInPandasUdfUtils``): ``init(handle)``; in the first batch
``handleInitialState`` for each initial-state row (pandas: each key's frame)
just before that key's input rows; ``handleInputRows(key, rows, timerValues)``
for each grouping key in key order; then ``handleExpiredTimer`` for every
timer at or before the batch's processing time (``ProcessingTime``) or
watermark (``EventTime``), by time, each timer deleted once handled; then
``close()``. The calls run a step of keys at a time
(:mod:`snapcut.spark.tws.batch_run`): a step's state changes reach the
tables after its last call, and TTL-expired state is removed then; a batch
larger than a worker holds comes in parts of whole keys (:meth:`process_parts`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from snapcut._core import ConfigError, StateTable
from snapcut.spark.keys import KEY_COLUMN
from snapcut.spark.processors import (
    conform,
    event_time_ms,
    max_event_time_ms,
    spark_pandas,
)
from snapcut.spark.state.partition import BatchInfo
from snapcut.spark.state.spec import TableSpec
from snapcut.spark.tws.batch_run import BatchRun, Outputs
from snapcut.spark.tws.variables import Variable

__all__ = ["TIME_MODES", "TransformWithStateProcessor"]

TIME_MODES = {"none": "None", "processingtime": "ProcessingTime", "eventtime": "EventTime"}


@dataclass
class TransformWithStateProcessor:
    """Runs a user's ``StatefulProcessor`` on one partition's batch (pickled
    into Spark's UDF: plain configuration and the user's processor)."""

    key: tuple[str, ...]
    state_key: str
    key_fields: tuple[pa.Field, ...]
    vertex: str
    tables: tuple[TableSpec, ...]
    variables: dict[str, Variable]
    output_schema: pa.Schema
    stateful_processor: Any
    time_mode: str
    """"none", "processingtime" or "eventtime"."""
    pandas: bool
    event_time: str | None = None
    timezone: str = "UTC"
    max_records_per_batch: int = 10_000
    initial_rows: Callable[[int], pa.Table | None] | None = None
    max_bytes_per_batch: int = 2**31 - 1
    """Spark's ``spark.sql.execution.arrow.maxBytesPerBatch`` for a key's chunks."""
    int_to_decimal: bool = False
    """Spark's ``spark.sql.execution.pythonUDF.pandas.intToDecimalCoercionEnabled``:
    integers yielded for a decimal output column become decimals."""
    late_rows: int = field(default=0, init=False)
    timed_out_keys: int = field(default=0, init=False)

    @property
    def state_schema(self) -> pa.Schema:
        """(The root keeps each variable's schema in its tables.)"""
        return pa.schema([])

    def max_event_time_ms(self, rows: pa.Table) -> int:
        return max_event_time_ms(rows, self.event_time)

    # -- conversions -----------------------------------------------------------

    def _inputs(self, table: pa.Table) -> Callable[[int, int], Iterator[Any]]:
        """`table`'s sorted rows converted once; the returned function gives
        a key's rows [start, end) as the worker hands them: pandas frames of
        at most ``max_records_per_batch`` rows (cut from the key's first row,
        as Spark's worker re-chunks per key), or Rows."""
        if not self.pandas:
            from pyspark.sql import Row

            make = Row(*table.column_names)
            rows = [make(*r) for r in _tuples(table)]
            return lambda start, end: iter(rows[start:end])
        import pandas as pd

        frame = spark_pandas(table, self.timezone)
        size = self.max_records_per_batch if self.max_records_per_batch > 0 else 0
        if 0 < self.max_bytes_per_batch < 2**31 - 1 and table.num_rows:
            # Spark's worker cuts a key's chunk once rows x average row size
            # reaches the limit (the average of the Arrow input's buffers).
            avg = table.nbytes / table.num_rows
            by_bytes = max(1, math.ceil(self.max_bytes_per_batch / avg)) if avg else 0
            size = min(size, by_bytes) if size and by_bytes else (size or by_bytes)

        def chunk(a: int, b: int) -> Any:
            # A fresh 0-based index, as the worker's frames have; no data copy.
            part = frame.iloc[a:b]
            part.index = pd.RangeIndex(b - a)
            return part

        def chunks(start: int, end: int) -> Iterator[Any]:
            step = size if size > 0 else end - start
            return iter(chunk(a, min(a + step, end)) for a in range(start, end, step))

        return chunks

    def _output(self, out: list[Any]) -> pa.Table:
        if not out:
            return self.output_schema.empty_table()
        fix = "return rows with outputStructType's fields"
        if self.pandas:
            frame = _concat(out)
            if self.int_to_decimal:
                frame = _ints_to_decimals(frame, self.output_schema)
            if list(frame.columns) == self.output_schema.names:
                # Typed by the output schema, as Spark's worker converts (a dict
                # becomes a map, not a struct); conform() explains a misfit.
                try:
                    return pa.Table.from_pandas(
                        frame, schema=self.output_schema, preserve_index=False
                    )
                except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
                    pass
            try:
                return conform(frame, self.output_schema, "handleInputRows output", fix)
            except ConfigError as e:
                # Spark's words first: processors and tests match on them.
                bad = next((f.name for f in self.output_schema if f"{f.name!r}" in str(e)), "?")
                raise ConfigError(
                    f"Failed to convert the value of the column {bad!r} to outputStructType: {e}"
                ) from e
        fast = self._flat_rows(out)
        if fast is not None:
            return fast
        try:
            rows = [r.asDict(True) if hasattr(r, "asDict") else dict(r) for r in out]
        except (TypeError, ValueError) as e:
            raise ConfigError(f"handleInputRows must yield pyspark Rows: {e}") from e
        try:
            return pa.Table.from_pylist(rows, schema=self.output_schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise ConfigError(f"output rows do not fit outputStructType: {e}; {fix}") from e

    def _flat_rows(self, out: list[Any]) -> pa.Table | None:
        """Rows whose fields are the output schema's, in its order, and a
        schema with no nested type: the table column by column (a dict per
        row through ``asDict`` costs more than a cheap processor's call).
        None when that does not apply, or the values do not fit, so the
        general path converts them and names what is wrong."""
        schema = self.output_schema
        names = schema.names
        if not names or any(pa.types.is_nested(f.type) for f in schema):
            return None
        if not all(getattr(r, "__fields__", None) == names for r in out):
            return None
        columns = zip(*out, strict=True)
        try:
            arrays = [pa.array(c, type=f.type) for c, f in zip(columns, schema, strict=True)]
            return pa.Table.from_arrays(arrays, schema=schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError):
            return None

    # -- the batch ---------------------------------------------------------------

    def process(self, tables: dict[str, StateTable], rows: pa.Table, info: BatchInfo) -> pa.Table:
        out = Outputs(self)
        run = BatchRun(self, tables, info, out)
        run.input_rows(rows, last=True)
        run.finish(fire_timers=True)
        return out.take()

    @property
    def by_key_parts(self) -> bool:
        """A batch may be applied in parts that each hold whole keys
        (``PartitionTask.apply_parts``, :meth:`process_parts`): a key's calls
        see only its rows and state, and the timers fire after every part."""
        return True

    def process_parts(
        self, tables: dict[str, StateTable], parts: Iterable[pa.Table], info: BatchInfo
    ) -> Iterator[pa.Table]:
        """As :meth:`process` over the batch as parts of whole keys: ``init``
        once, each part's keys (with their initial state) in key order, then
        the initial-state keys without input rows, the expired timers and
        ``close``; yields the output a part at a time (the last one the
        timers'). ``late_rows`` and ``timed_out_keys`` are the batch's once
        the parts are exhausted."""
        out = Outputs(self)
        run = BatchRun(self, tables, info, out)
        for rows in parts:
            run.input_rows(rows, last=False)
            yield out.take()
        run.finish(fire_timers=True)
        yield out.take()

    def run_batch(
        self,
        tables: dict[str, StateTable],
        rows: pa.Table,
        info: BatchInfo,
        fire_timers: bool = True,
    ) -> list[Any]:
        """The batch's calls; returns what they yielded (frames or Rows).
        `fire_timers`: False only for :class:`snapcut.spark.testing.TwsTester`'s
        ``test``, where (as in Spark's tester) timers fire on a time move."""
        out = Outputs(self, raw=True)
        run = BatchRun(self, tables, info, out)
        run.input_rows(rows, last=True)
        run.finish(fire_timers)
        return out.items

    def _timestamps(self, info: BatchInfo) -> tuple[int, int]:
        """Spark's ``get_timestamps``: (-1, -1) in time mode None, else the
        batch's processing time and the watermark for eviction (-1 without one)."""
        if self.time_mode == "none":
            return -1, -1
        watermark = info.watermark_ms if info.watermark_present else -1
        return info.processing_time_ms, watermark

    def _drop_late(self, rows: pa.Table, info: BatchInfo) -> pa.Table:
        """In time mode EventTime Spark drops input rows at or before the
        watermark for late events (the previous batch's)."""
        if (
            self.time_mode != "eventtime"
            or not info.watermark_present
            or self.event_time is None
            or rows.num_rows == 0
        ):
            return rows
        late = pc.less_equal(event_time_ms(rows[self.event_time]), info.late_watermark_ms)
        self.late_rows = int(pc.sum(late).as_py() or 0)
        return rows.filter(pc.invert(late)) if self.late_rows else rows

    def _initial(self, info: BatchInfo) -> dict[tuple[Any, ...], list[Any]]:
        """Batch 0: this partition's initial-state rows by key (pandas: one
        frame per key; Row: one Row per row)."""
        if info.batch_id != 0 or self.initial_rows is None:
            return {}
        table = self.initial_rows(info.partition)
        if table is None or table.num_rows == 0:
            return {}
        table = table.drop_columns([c for c in table.column_names if c == KEY_COLUMN])
        keys = list(zip(*(table[k].to_pylist() for k in self.key), strict=True))
        out: dict[tuple[Any, ...], list[Any]] = {}
        if self.pandas:
            frame = spark_pandas(table, self.timezone)
            positions: dict[tuple[Any, ...], list[int]] = {}
            for i, k in enumerate(keys):
                positions.setdefault(k, []).append(i)
            for k, idx in positions.items():
                out[k] = [frame.iloc[idx].reset_index(drop=True)]
        else:
            from pyspark.sql import Row

            names = table.column_names
            for k, r in zip(keys, _tuples(table), strict=True):
                out.setdefault(k, []).append(Row(**dict(zip(names, r, strict=True))))
        return out


def _ints_to_decimals(frame: Any, schema: pa.Schema) -> Any:
    from decimal import Decimal

    for f in schema:
        if pa.types.is_decimal(f.type) and f.name in frame.columns:
            col = frame[f.name]
            if col.dtype.kind in "iu":
                frame = frame.assign(**{f.name: [Decimal(int(v)) for v in col]})
    return frame


def _concat(frames: list[Any]) -> Any:
    """The frames a processor yielded, as one: column by column when they
    share their columns and plain numpy dtypes (the common one-row-per-key
    case, where ``pd.concat`` costs more per frame than the processor),
    else ``pd.concat``."""
    import numpy as np
    import pandas as pd

    if len(frames) == 1:
        return frames[0]
    first = frames[0]
    cols = list(first.columns)
    dtypes = _plain_dtypes(first)
    if dtypes is None or len(set(cols)) != len(cols):
        return pd.concat(frames, ignore_index=True)
    columns: list[list[Any]] = [[] for _ in cols]
    for f in frames:
        if _plain_dtypes(f) != dtypes or list(f.columns) != cols:
            return pd.concat(frames, ignore_index=True)
        for out, array in zip(columns, _column_arrays(f), strict=True):
            out.append(array)
    return pd.DataFrame(
        {c: np.concatenate(arrays) for c, arrays in zip(cols, columns, strict=True)},
        columns=cols,
    )


def _plain_dtypes(frame: Any) -> list[Any] | None:
    """A frame's column dtypes when every one is a plain numpy dtype
    (bool, int, float, object), else None. Read from the frame's block
    manager where pandas has one: ``frame.dtypes`` builds a Series, which
    costs more than a one-row frame's processor call."""
    import numpy as np

    get = getattr(getattr(frame, "_mgr", None), "get_dtypes", None)
    dtypes = list(get()) if get is not None else list(frame.dtypes)
    plain = all(isinstance(d, np.dtype) and d.kind in "biufO" for d in dtypes)
    return dtypes if plain else None


def _column_arrays(frame: Any) -> list[Any]:
    """A frame of plain numpy dtypes' columns as numpy arrays, without
    building a Series per column (``frame[c]`` on a fresh frame does)."""
    arrays = getattr(getattr(frame, "_mgr", None), "column_arrays", None)
    if arrays is not None and len(arrays) == len(frame.columns):
        return list(arrays)
    return [frame.iloc[:, i].to_numpy() for i in range(len(frame.columns))]


def _tuples(table: pa.Table) -> Iterator[tuple[Any, ...]]:
    cols = [c.to_pylist() for c in table.columns]
    return zip(*cols, strict=True) if cols else iter(())
