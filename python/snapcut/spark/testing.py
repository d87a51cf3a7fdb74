"""Unit-testing a ``StatefulProcessor`` without Spark: :class:`TwsTester`.

The same methods as PySpark's ``pyspark.sql.streaming.tws_tester.TwsTester``
(``test``, ``testInPandas``, ``setProcessingTime``, ``setWatermark``,
``peek*State``, ``update*State``, ``deleteState``), but each call runs the
code a snapcut Spark task runs — :class:`~snapcut.spark.tws.processor.
TransformWithStateProcessor` over snapcut's Rust state tables — so TTL works
and the tables can be checkpointed and restored (:meth:`TwsTester.restart`)
as a query's would. No SparkSession and no JVM.

    >>> tester = TwsTester(MyProcessor(), keySchema="id string", timeMode="ProcessingTime")
    >>> tester.testInPandas("a", pd.DataFrame({"id": ["a"], "v": [1]}))
    >>> tester.setProcessingTime(60_000)        # fires the timers due by then
    >>> tester.peekValueState("count", "a")
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from snapcut._core import ConfigError, StateTable
from snapcut.spark.keys import state_key
from snapcut.spark.state.partition import BatchInfo
from snapcut.spark.state.spec import table_vertex
from snapcut.spark.tws.processor import TIME_MODES, TransformWithStateProcessor
from snapcut.spark.tws.state import BatchState, QueryInfo
from snapcut.spark.tws.variables import TIMERS, DeclaringHandle, arrow_fields, table_specs

__all__ = ["TwsTester"]

VERTEX = "state"


class TwsTester:
    """Runs a processor key by key, as PySpark's ``TwsTester`` does, on
    snapcut's state machinery. ``keySchema``: the grouping key's columns
    (a DDL string such as ``"id string"`` or a StructType) — the tables are
    typed, so the key's type must be given; a scalar key passed to
    :meth:`test` is the one-column key ``(key,)``, as in Spark."""

    def __init__(
        self,
        processor: Any,
        keySchema: Any,
        initialStateRow: list[tuple[Any, Any]] | None = None,
        initialStatePandas: list[tuple[Any, Any]] | None = None,
        timeMode: str = "None",
        outputMode: str = "Append",
        eventTimeExtractor: Callable[[Any], int] | None = None,
        outputStructType: Any = None,
    ) -> None:
        tm = timeMode.lower() if isinstance(timeMode, str) else None
        if tm not in TIME_MODES:
            raise ConfigError(
                f"timeMode must be 'None', 'ProcessingTime' or 'EventTime', got {timeMode!r}"
            )
        if tm == "eventtime" and eventTimeExtractor is None:
            raise ConfigError(
                "timeMode='EventTime' needs eventTimeExtractor= (late rows are dropped)"
            )
        if initialStateRow is not None and initialStatePandas is not None:
            raise ConfigError("pass initialStateRow or initialStatePandas, not both")
        self.processor = processor
        self.time_mode = tm
        self.output_mode = outputMode
        self.extractor = eventTimeExtractor
        self.key_fields = arrow_fields(keySchema, "keySchema", state=False)
        self.key = tuple(f.name for f in self.key_fields)
        key_schema = pa.schema(self.key_fields)
        self.state_key = state_key(key_schema, self.key)
        declaring = DeclaringHandle(tm)
        processor.init(declaring)
        self.variables = dict(declaring.variables)
        self.specs = table_specs(list(self.variables.values()), self.key_fields, self.state_key)
        self.tables = {
            table_vertex(VERTEX, t.name): StateTable(
                t.arrow_schema,
                t.state_key,
                full_every=10,
                group=t.group,
                time_column=t.time_column,
            )
            for t in self.specs
        }
        self.output_schema = None if outputStructType is None else arrow_schema_of(outputStructType)
        self.processing_time_ms = 0
        self.watermark_ms = 0
        self.batch_id = 0
        initial = initialStatePandas if initialStatePandas is not None else initialStateRow
        if initial:
            self._initial(initial, pandas=initialStatePandas is not None)

    # -- running ---------------------------------------------------------------

    def _processor(self, pandas: bool) -> TransformWithStateProcessor:
        return TransformWithStateProcessor(
            key=self.key,
            state_key=self.state_key,
            key_fields=self.key_fields,
            vertex=VERTEX,
            tables=self.specs,
            variables=self.variables,
            output_schema=self.output_schema or pa.schema([]),
            stateful_processor=self.processor,
            time_mode=self.time_mode,
            pandas=pandas,
        )

    def _info(self) -> BatchInfo:
        return BatchInfo(
            batch_id=self.batch_id,
            partition=0,
            watermark_ms=self.watermark_ms,
            processing_time_ms=self.processing_time_ms,
            watermark_present=self.time_mode == "eventtime",
            late_watermark_ms=self.watermark_ms,
        )

    def _run(self, rows: pa.Table, pandas: bool, fire: bool) -> list[Any]:
        self._last_pandas = pandas
        proc = self._processor(pandas)
        out = proc.run_batch(self.tables, rows, self._info(), fire_timers=fire)
        self.batch_id += 1
        return out

    def _rows(self, key: Any, rows: pa.Table) -> pa.Table:
        kt = key if isinstance(key, tuple) else (key,)
        if len(kt) != len(self.key):
            raise ConfigError(f"key {key!r} does not match keySchema {list(self.key)}")
        for name, value in zip(self.key, kt, strict=True):
            if name not in rows.column_names:
                rows = rows.append_column(
                    name, pa.array([value] * rows.num_rows, self._key_type(name))
                )
        return rows

    def _key_type(self, name: str) -> pa.DataType:
        return next(f.type for f in self.key_fields if f.name == name)

    def test(self, key: Any, input: list[Any]) -> list[Any]:
        """A Row processor's ``handleInputRows`` for `key` on `input` (Rows);
        late rows dropped in EventTime mode; timers do not fire here."""
        if self.extractor is not None and self.time_mode == "eventtime":
            input = [r for r in input if self.extractor(r) > self.watermark_ms]
        rows = pa.Table.from_pylist([r.asDict(True) for r in input]) if input else None
        if rows is None:
            return []
        return self._run(self._rows(key, rows), pandas=False, fire=False)

    def testInPandas(self, key: Any, input: Any) -> Any:
        """A pandas processor's ``handleInputRows`` for `key` on a DataFrame."""
        import pandas as pd

        if self.extractor is not None and self.time_mode == "eventtime" and len(input):
            mask = input.apply(lambda r: self.extractor(r) > self.watermark_ms, axis=1)
            input = input[mask].reset_index(drop=True)
        if len(input) == 0:
            return pd.DataFrame()
        rows = pa.Table.from_pandas(input, preserve_index=False)
        return _frame(self._run(self._rows(key, rows), pandas=True, fire=False))

    def setProcessingTime(self, currentTimeMs: int) -> Any:
        """Moves processing time forward and fires the timers due by then."""
        if self.time_mode != "processingtime":
            raise ConfigError("setProcessingTime needs timeMode='ProcessingTime'")
        if currentTimeMs <= self.processing_time_ms:
            raise ConfigError(
                f"processing time must move forward: it is {self.processing_time_ms} ms, "
                f"got {currentTimeMs} ms"
            )
        self.processing_time_ms = int(currentTimeMs)
        return self._fire()

    def setWatermark(self, currentWatermarkMs: int) -> Any:
        """Moves the watermark forward and fires the event-time timers due by then."""
        if self.time_mode != "eventtime":
            raise ConfigError("setWatermark needs timeMode='EventTime'")
        if currentWatermarkMs <= self.watermark_ms:
            raise ConfigError(
                f"the watermark must move forward: it is {self.watermark_ms} ms, "
                f"got {currentWatermarkMs} ms"
            )
        self.watermark_ms = int(currentWatermarkMs)
        return self._fire()

    def _fire(self) -> Any:
        pandas = self._pandas_mode
        out = self._run(pa.table({}), pandas=pandas, fire=True)
        return _frame(out) if pandas else out

    @property
    def _pandas_mode(self) -> bool:
        return getattr(self, "_last_pandas", False)

    def _initial(self, initial: list[tuple[Any, Any]], pandas: bool) -> None:
        self._last_pandas = pandas
        state, _ = self._state()
        from pyspark.sql.streaming.stateful_processor import TimerValues

        timer_values = TimerValues(*self._processor(pandas)._timestamps(self._info()))
        keys = [k if isinstance(k, tuple) else (k,) for k, _ in initial]
        state.load(keys)
        for k, (_, value) in zip(keys, initial, strict=True):
            state.current = k
            self.processor.handleInitialState(k, value, timer_values)
        state.current = None
        state.write_back()

    # -- state -------------------------------------------------------------------

    def _state(self) -> tuple[BatchState, Any]:
        from snapcut.spark.tws.handle import SnapcutHandle

        state = BatchState(
            self.tables,
            self.specs,
            {t.name: table_vertex(VERTEX, t.name) for t in self.specs},
            self.variables,
            self.key_fields,
            self.state_key,
            self.processing_time_ms,
            self.time_mode,
            QueryInfo("tws-tester", "tws-tester", self.batch_id, 0),
        )
        handle = SnapcutHandle(state)
        self.processor.init(handle)
        handle._initialized = True
        return state, handle

    def _with(self, name: str, kind: str, key: Any, fn: Callable[[Any], Any]) -> Any:
        from snapcut.spark.tws.handle import SnapcutListState, SnapcutMapState, SnapcutValueState

        state, _ = self._state()
        k = key if isinstance(key, tuple) else (key,)
        state.load([k])
        state.current = k
        kinds = {"value": SnapcutValueState, "list": SnapcutListState, "map": SnapcutMapState}
        if name not in self.variables:
            raise ConfigError(f"no state variable {name!r} (declared: {list(self.variables)})")
        result = fn(kinds[kind](state, name))
        state.current = None
        state.write_back()
        return result

    def peekValueState(self, stateName: str, key: Any) -> Any:
        return self._with(stateName, "value", key, lambda s: s.get())

    def updateValueState(self, stateName: str, key: Any, value: tuple[Any, ...]) -> None:
        self._with(stateName, "value", key, lambda s: s.update(value))

    def peekListState(self, stateName: str, key: Any) -> list[tuple[Any, ...]]:
        items: list[tuple[Any, ...]] = self._with(stateName, "list", key, lambda s: list(s.get()))
        return items

    def updateListState(self, stateName: str, key: Any, value: list[tuple[Any, ...]]) -> None:
        self._with(stateName, "list", key, lambda s: s.put(value))

    def peekMapState(self, stateName: str, key: Any) -> dict[Any, Any]:
        entries: dict[Any, Any] = self._with(stateName, "map", key, lambda s: dict(s.iterator()))
        return entries

    def updateMapState(self, stateName: str, key: Any, value: dict[Any, Any]) -> None:
        def put(s: Any) -> None:
            s.clear()
            for k, v in value.items():
                s.updateValue(k, v)

        self._with(stateName, "map", key, put)

    def deleteState(self, stateName: str, key: Any) -> None:
        spec = next((t for t in self.specs if t.name == stateName), None)
        if spec is None or stateName == TIMERS:
            raise ConfigError(f"no state variable {stateName!r} (declared: {list(self.variables)})")
        self._with(stateName, spec.kind, key, lambda s: s.clear())

    def listTimers(self, key: Any) -> list[int]:
        """The key's registered timers (snapcut's addition: Spark's tester has none)."""
        k = key if isinstance(key, tuple) else (key,)
        state, _ = self._state()
        state.load([k])
        return sorted(state.vars[TIMERS].data.get(k, ())) if TIMERS in state.vars else []

    def restart(self) -> None:
        """Checkpoints every table and restores it into fresh tables, as a
        query restarted from its root would: the state must survive."""
        fresh = {}
        for t in self.specs:
            vertex = table_vertex(VERTEX, t.name)
            table = StateTable(
                t.arrow_schema,
                t.state_key,
                full_every=10,
                group=t.group,
                time_column=t.time_column,
            )
            table.restore([(self.batch_id, "full", self.tables[vertex].to_arrow())])
            fresh[vertex] = table
        self.tables = fresh


def _frame(out: Any) -> Any:
    import pandas as pd

    if isinstance(out, list):
        if not out:
            return pd.DataFrame()
        return pd.concat(out, ignore_index=True) if len(out) > 1 else out[0]
    return out


def arrow_schema_of(schema: Any) -> pa.Schema:
    return pa.schema(arrow_fields(schema, "outputStructType", state=False))
