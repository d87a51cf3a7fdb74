"""The StatefulProcessors of Spark's own transformWithState tests, for
``test_spark_tws_parity.py``: each runs unchanged through Spark's
``transformWithStateInPandas`` / ``transformWithState`` and through snapcut's.

Ported from apache/spark
``python/pyspark/sql/tests/pandas/helper/helper_pandas_transform_with_state.py``:
the same state variables (names, schemas, TTLs), the same outputs, and the
same assertions on state inside the processors (a failed one fails the query).
``Pandas*`` classes get ``Iterator[pd.DataFrame]`` and yield DataFrames
(``transformWithStateInPandas``); ``Row*`` classes get ``Iterator[Row]`` and
yield Rows (``transformWithState``). No processor knows which engine runs it.

Spark's inputs are text lines ``id, temperature``; here they are parquet
columns ``id string, temperature int`` (``eventTime timestamp`` for the
event-time cases).
"""

from __future__ import annotations

import datetime
import json
import sys
from collections.abc import Iterator
from typing import Any, ClassVar, NamedTuple

import numpy as np
import pandas as pd
from pyspark.errors import PySparkRuntimeError
from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, TimerValues, ValueState
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

Key = tuple[Any, ...]
Frames = Iterator[pd.DataFrame]
Rows = Iterator[Row]

INT_VALUE = StructType([StructField("value", IntegerType(), True)])
STR_VALUE = StructType([StructField("value", StringType(), True)])

# ---- output schemas of Spark's tests ------------------------------------------------------

COUNT_OUT = "id string, countAsString string"
VALUE_OUT = "id string, value string"
TIMER_OUT = "id string, countAsString string, timeValues string"
EVENT_OUT = "id string, timestamp string"
GROWING_LIST_OUT = "id string, prevElements string, updatedElements string"
TTL_OUT = "id string, count int"
PAIR_KEY_OUT = "id1 string, id2 string, value string"
COMPOSITE_STATE_OUT = (
    "id string, value_arr string, list_state_arr string, map_state_arr string,"
    " nested_map_state_arr string"
)
LARGE_VALUE_OUT = (
    "id string, valueStateResult string, listStateResult string, mapStateResult string"
)
CHUNK_OUT = "id string, chunkCount int"
DECIMAL_OUT = StructType(
    [StructField("id", StringType(), True), StructField("decimal_result", DecimalType(10, 2), True)]
)
_INNER = StructType(
    [
        StructField("intValue", IntegerType(), True),
        StructField("doubleValue", DoubleType(), True),
        StructField("arrayValue", ArrayType(StringType()), True),
        StructField("mapValue", MapType(StringType(), StringType()), True),
    ]
)
COMPOSITE_OUT = StructType(
    [
        StructField("primitiveValue", StringType(), True),
        StructField("listOfPrimitive", ArrayType(StringType()), True),
        StructField("mapOfPrimitive", MapType(StringType(), StringType()), True),
        StructField("listOfComposite", ArrayType(_INNER), True),
        StructField("mapOfComposite", MapType(StringType(), _INNER), True),
    ]
)
RUNNING_COUNT_OUT = "key string, count int"
TOPK_OUT = "key string, score double"
WORD_FREQUENCY_OUT = "key string, word string, count int"
SESSION_OUT = "key string, result string"


def one_row(**columns: Any) -> pd.DataFrame:
    return pd.DataFrame({name: [value] for name, value in columns.items()})


def expect_deleted(state: ValueState) -> None:
    """Spark: a value state deleted with ``deleteIfExists`` raises on use."""
    try:
        state.exists()
    except PySparkRuntimeError as e:
        assert "Error checking value state exists" in str(e), str(e)
        return
    raise AssertionError("exists() on a state variable removed by deleteIfExists did not raise")


# ---- SimpleStatefulProcessor (+ the TTL one): value state, deleteIfExists -----------------


class _Violations(StatefulProcessor):
    """Counts rows; keeps the number of temperatures above 100 in a value
    state and checks it against what the two input files give."""

    EXPECTED: ClassVar[dict[int, dict[str, int]]] = {0: {"0": 1, "1": 2}, 1: {"0": 4, "1": 3}}
    TTL_MS: ClassVar[int | None] = None

    def init(self, handle: StatefulProcessorHandle) -> None:
        if self.TTL_MS is None:  # a DDL string schema; the TTL one takes a StructType
            self.violations = handle.getValueState("numViolations", "value int")
        else:
            self.violations = handle.getValueState("numViolations", INT_VALUE, self.TTL_MS)
        self.temp = handle.getValueState("tempState", INT_VALUE)
        handle.deleteIfExists("tempState")

    def _update(self, key: Key, new_violations: Any) -> None:
        if self.violations.exists():
            value = self.violations.get()
            assert value is not None
            before = value[0]
            assert before == self.EXPECTED[0][key[0]], (key, before)
            batch = 1
        else:
            before, batch = 0, 0
        total = before + new_violations
        assert total == self.EXPECTED[batch][key[0]], (key, total)
        self.violations.update((total,))

    def close(self) -> None:
        pass


class PandasViolations(_Violations):
    def handleInputRows(self, key: Key, rows: Frames, timerValues: TimerValues) -> Frames:
        expect_deleted(self.temp)
        count = new = 0
        for pdf in rows:
            count += pdf.count().get("temperature")
            new += pdf.loc[pdf["temperature"] > 100].count().get("temperature")
        self._update(key, new)
        yield one_row(id=key[0], countAsString=str(count))


class RowViolations(_Violations):
    def handleInputRows(self, key: Key, rows: Rows, timerValues: TimerValues) -> Rows:
        expect_deleted(self.temp)
        count = new = 0
        for row in rows:
            if row.temperature is not None:
                count += 1
                new += row.temperature > 100
        self._update(key, new)
        yield Row(id=key[0], countAsString=str(count))


class PandasViolationsTTL(PandasViolations):
    TTL_MS = 30_000


class RowViolationsTTL(RowViolations):
    TTL_MS = 30_000


# ---- InvalidSimpleStatefulProcessor: a value state never set ------------------------------


class _NoValue(StatefulProcessor):
    def init(self, handle: StatefulProcessorHandle) -> None:
        self.violations = handle.getValueState("numViolations", INT_VALUE)

    def _check(self) -> None:
        assert not self.violations.exists()
        assert self.violations.get() is None
        self.violations.clear()


class PandasNoValue(_NoValue):
    def handleInputRows(self, key: Key, rows: Frames, timerValues: TimerValues) -> Frames:
        self._check()
        yield one_row(id=key[0], countAsString="0")


class RowNoValue(_NoValue):
    def handleInputRows(self, key: Key, rows: Rows, timerValues: TimerValues) -> Rows:
        self._check()
        yield Row(id=key[0], countAsString="0")


# ---- ListStateProcessor (+ the large-TTL one): put, appendValue, appendList, get ----------


class _ListChecks(StatefulProcessor):
    """Rewrites two lists per input chunk (row) and reads them back through
    interleaved iterators; keeps a list of timestamps."""

    TTL_MS: ClassVar[int | None] = None

    def init(self, handle: StatefulProcessorHandle) -> None:
        element = StructType([StructField("temperature", IntegerType(), True)])
        stamp = StructType([StructField("time", TimestampType(), True)])
        ttl = () if self.TTL_MS is None else (self.TTL_MS,)
        self.list1 = handle.getListState("listState1", element, *ttl)
        self.list2 = handle.getListState("listState2", element, *ttl)
        self.stamps = handle.getListState("listStateTimestamp", stamp)

    def _rewrite(self, timer_values: TimerValues) -> tuple[datetime.datetime]:
        base = [(120,), (20,)]
        self.list1.put(base)
        self.list2.put(base)
        self.list1.appendValue((111,))
        self.list2.appendValue((222,))
        self.list1.appendList(base)
        self.list2.appendList(base)
        now = datetime.datetime.fromtimestamp(timer_values.getCurrentProcessingTimeInMs() / 1000)
        return (now + datetime.timedelta(minutes=1),)

    def _check(self, stamps: list[tuple[datetime.datetime]]) -> None:
        it1, it2 = self.list1.get(), self.list2.get()
        assert next(it1)[0] == 120
        assert next(it2)[0] == 120
        assert next(it1)[0] == 20
        assert next(it2)[0] == 20
        it3 = self.list1.get()  # a second iterator over one list does not disturb the first
        assert next(it3)[0] == 120
        assert next(it3)[0] == 20
        assert next(it1)[0] == 111
        assert next(it2)[0] == 222
        assert next(it3)[0] == 111
        for expected in (120, 20):
            assert next(it1)[0] == expected
            assert next(it2)[0] == expected
            assert next(it3)[0] == expected
        if stamps:
            self.stamps.put(stamps)

    def close(self) -> None:
        pass


class PandasListChecks(_ListChecks):
    def handleInputRows(self, key: Key, rows: Frames, timerValues: TimerValues) -> Frames:
        count, stamps = 0, []
        for pdf in rows:
            stamps.append(self._rewrite(timerValues))
            count += pdf.count().get("temperature")
        self._check(stamps)
        yield one_row(id=key[0], countAsString=str(count))


class RowListChecks(_ListChecks):
    def handleInputRows(self, key: Key, rows: Rows, timerValues: TimerValues) -> Rows:
        count, stamps = 0, []
        for row in rows:
            stamps.append(self._rewrite(timerValues))
            count += row.temperature is not None
        self._check(stamps)
        yield Row(id=key[0], countAsString=str(count))


class PandasListChecksTTL(PandasListChecks):
    TTL_MS = 30_000


class RowListChecksTTL(RowListChecks):
    TTL_MS = 30_000


# ---- ListStateLargeListProcessor: a list of 100, then 190 elements -------------------------


class _GrowingList(StatefulProcessor):
    """Key "0" rewrites its list with put, the others grow it with appendList;
    a value state holds the expected size."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        element = StructType(
            [
                StructField("value", IntegerType(), True),
                StructField("valueNull", IntegerType(), True),
            ]
        )
        self.items = handle.getListState("listState", element)
        self.size = handle.getValueState(
            "listSizeState", StructType([StructField("size", IntegerType(), True)])
        )

    def _step(self, key: Key) -> dict[str, str]:
        before = list(self.items.get())
        if not before:
            assert self.size.get() is None
            fresh = [(i, None) for i in range(100)]
            if key == ("0",):
                self.items.put(fresh)
            else:
                self.items.appendList(fresh)
            self.size.update((len(fresh),))
        else:
            size_row = self.size.get()
            assert size_row is not None
            size = size_row[0]
            assert size == len(before), (size, len(before))
            assert before == [(i, None) for i in range(size)], before
            if key == ("0",):
                self.items.put([(i, None) for i in range(size + 90)])
            else:
                self.items.appendList([(i, None) for i in range(size, size + 90)])
            self.size.update((size + 90,))
        return {
            "id": key[0],
            "prevElements": ",".join(str(e[0]) for e in before),
            "updatedElements": ",".join(str(e[0]) for e in self.items.get()),
        }


class PandasGrowingList(_GrowingList):
    def handleInputRows(self, key: Key, rows: Frames, timerValues: TimerValues) -> Frames:
        yield one_row(**self._step(key))


class RowGrowingList(_GrowingList):
    def handleInputRows(self, key: Key, rows: Rows, timerValues: TimerValues) -> Rows:
        yield Row(**self._step(key))


# ---- MapStateProcessor (+ the large-TTL one) -----------------------------------------------


class _MapChecks(StatefulProcessor):
    """Two map entries counted up, read back through keys/values/iterator,
    then removeKey and clear: every batch ends with an empty map."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.map = handle.getMapState("mapState", "name string", "count int")

    def _check(self, count: Any) -> None:
        k1, k2 = ("key1",), ("key2",)
        v1 = v2 = count
        if self.map.exists():
            if self.map.containsKey(k1):
                v1 += self.map.getValue(k1)[0]
            if self.map.containsKey(k2):
                v2 += self.map.getValue(k2)[0]
        self.map.updateValue(k1, (v1,))
        self.map.updateValue(k2, (v2,))
        keys = self.map.keys()
        assert next(keys)[0] == "key1"
        assert next(keys)[0] == "key2"
        values = self.map.values()
        assert next(values)[0] == v1
        assert next(values)[0] == v2
        entries = self.map.iterator()
        assert next(entries)[0] == k1
        assert next(entries)[1] == (v2,)
        self.map.removeKey(k1)
        assert not self.map.containsKey(k1)
        assert self.map.exists()
        self.map.clear()
        assert not self.map.exists()

    def close(self) -> None:
        pass


class PandasMapChecks(_MapChecks):
    def handleInputRows(self, key: Key, rows: Frames, timerValues: TimerValues) -> Frames:
        count = 0
        for pdf in rows:
            count += pdf.count().get("temperature")
        self._check(count)
        yield one_row(id=key[0], countAsString=str(count))


class RowMapChecks(_MapChecks):
    def handleInputRows(self, key: Key, rows: Rows, timerValues: TimerValues) -> Rows:
        count = sum(1 for row in rows if row.temperature is not None)
        self._check(count)
        yield Row(id=key[0], countAsString=str(count))


class _MapChecksTTL:
    """StructType schemas, a one-year TTL on the map and an unused list."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        name = StructType([StructField("name", StringType(), True)])
        count = StructType([StructField("count", IntegerType(), True)])
        self.map = handle.getMapState("mapState", name, count, 31_536_000_000)
        self.unused = handle.getListState("listState", name)


class PandasMapChecksTTL(_MapChecksTTL, PandasMapChecks):
    pass


class RowMapChecksTTL(_MapChecksTTL, RowMapChecks):
    pass


# ---- TTLStatefulProcessor: value, list and map state with a TTL beside a plain count ------


class _TTLCounts(StatefulProcessor):
    """Four counts per key: a plain value state, and value/list/map states
    with a TTL of ``ttl_ms`` (Spark: 10 s). Key "0" skips refreshing its TTL
    states when its TTL count reaches 2."""

    def __init__(self, ttl_ms: int) -> None:
        self.ttl_ms = ttl_ms

    def init(self, handle: StatefulProcessorHandle) -> None:
        user_key = StructType([StructField("id", StringType(), True)])
        self.ttl_count = handle.getValueState("ttl-state", INT_VALUE, self.ttl_ms)
        self.count = handle.getValueState("state", INT_VALUE)
        self.ttl_list = handle.getListState("ttl-list-state", INT_VALUE, self.ttl_ms)
        self.ttl_map = handle.getMapState("ttl-map-state", user_key, INT_VALUE, self.ttl_ms)

    def _counts(self, key: Key, n: Any) -> list[dict[str, Any]]:
        ident = key[0]
        count = self.count.get()[0] if self.count.exists() else 0
        ttl_count = self.ttl_count.get()[0] if self.ttl_count.exists() else 0
        list_count = sum(e[0] for e in self.ttl_list.get()) if self.ttl_list.exists() else 0
        map_count = self.ttl_map.getValue(key)[0] if self.ttl_map.exists() else 0
        count, ttl_count, list_count, map_count = (
            c + n for c in (count, ttl_count, list_count, map_count)
        )
        self.count.update((count,))
        if not (ttl_count == 2 and ident == "0"):
            self.ttl_count.update((ttl_count,))
            self.ttl_list.put([(list_count,), (list_count,)])
            self.ttl_map.updateValue(key, (map_count,))
        return [
            {"id": f"ttl-count-{ident}", "count": ttl_count},
            {"id": f"count-{ident}", "count": count},
            {"id": f"ttl-list-state-count-{ident}", "count": list_count},
            {"id": f"ttl-map-state-count-{ident}", "count": map_count},
        ]


class PandasTTLCounts(_TTLCounts):
    def handleInputRows(self, key: Key, rows: Frames, timerValues: TimerValues) -> Frames:
        n = sum(pdf.count().get("temperature") for pdf in rows)
        yield pd.DataFrame(self._counts(key, n))


class RowTTLCounts(_TTLCounts):
    def handleInputRows(self, key: Key, rows: Rows, timerValues: TimerValues) -> Rows:
        n = sum(1 for row in rows if row.temperature is not None)
        for out in self._counts(key, n):
            yield Row(**out)


# ---- ProcTimeStatefulProcessor: processing-time timers ------------------------------------


class _ProcTimer(StatefulProcessor):
    """A running count; key "0" registers a timer 1 ms after each batch's
    processing time, and an expired timer clears the count (output -1)."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.count = handle.getValueState("count_state", STR_VALUE)

    def _expire(self, key: Key, info: ExpiredTimerInfo) -> dict[str, str]:
        first = list(self.handle.listTimers())
        second = []
        for i, timer in enumerate(self.handle.listTimers()):  # two iterators agree
            second.append(timer)
            assert second[i] == first[i]
        if first:
            assert len(first) == 2, first
        self.count.clear()
        self.handle.deleteTimer(info.getExpiryTimeInMs())
        return {
            "id": key[0],
            "countAsString": "-1",
            "timeValues": str(info.getExpiryTimeInMs()),
        }

    def _add(self, key: Key, n: int, timer_values: TimerValues) -> dict[str, str]:
        count = int(self.count.get()[0]) if self.count.exists() else 0
        if key == ("0",):
            self.handle.registerTimer(timer_values.getCurrentProcessingTimeInMs() + 1)
        count += n
        self.count.update((str(count),))
        return {
            "id": key[0],
            "countAsString": str(count),
            "timeValues": str(timer_values.getCurrentProcessingTimeInMs()),
        }

    def close(self) -> None:
        pass


class PandasProcTimer(_ProcTimer):
    def handleExpiredTimer(
        self, key: Key, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Frames:
        yield one_row(**self._expire(key, expiredTimerInfo))

    def handleInputRows(self, key: Key, rows: Frames, timerValues: TimerValues) -> Frames:
        yield one_row(**self._add(key, sum(len(pdf) for pdf in rows), timerValues))


class RowProcTimer(_ProcTimer):
    def handleExpiredTimer(
        self, key: Key, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Rows:
        yield Row(**self._expire(key, expiredTimerInfo))

    def handleInputRows(self, key: Key, rows: Rows, timerValues: TimerValues) -> Rows:
        yield Row(**self._add(key, sum(1 for _ in rows), timerValues))


# ---- EventTimeStatefulProcessor / MinEventTimeStatefulProcessor ---------------------------


class _EventTimeMax(StatefulProcessor):
    """The max event time seen (seconds); a timer at the current watermark
    clears it when it fires."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.max = handle.getValueState("max_state", STR_VALUE)

    def _expire(self, key: Key, info: ExpiredTimerInfo) -> dict[str, str]:
        self.max.clear()
        self.handle.deleteTimer(info.getExpiryTimeInMs())
        return {"id": f"{key[0]}-expired", "timestamp": str(info.getExpiryTimeInMs())}

    def _add(self, key: Key, seconds: list[int], timer_values: TimerValues) -> dict[str, str]:
        current = int(self.max.get()[0]) if self.max.exists() else 0
        latest = str(max(current, max(seconds)))
        self.max.update((latest,))
        self.handle.registerTimer(timer_values.getCurrentWatermarkInMs())
        return {"id": key[0], "timestamp": latest}

    def close(self) -> None:
        pass


class PandasEventTimeMax(_EventTimeMax):
    def handleExpiredTimer(
        self, key: Key, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Frames:
        yield one_row(**self._expire(key, expiredTimerInfo))

    def handleInputRows(self, key: Key, rows: Frames, timerValues: TimerValues) -> Frames:
        seconds: list[int] = []
        for pdf in rows:  # datetime64[ns] as int64: nanoseconds
            seconds.extend((pdf["eventTime"].astype("int64") // 10**9).tolist())
        yield one_row(**self._add(key, seconds, timerValues))


class RowEventTimeMax(_EventTimeMax):
    def handleExpiredTimer(
        self, key: Key, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Rows:
        yield Row(**self._expire(key, expiredTimerInfo))

    def handleInputRows(self, key: Key, rows: Rows, timerValues: TimerValues) -> Rows:
        seconds = [int(row.eventTime.timestamp()) for row in rows]
        yield Row(**self._add(key, seconds, timerValues))


class _EventTimeMin(StatefulProcessor):
    """The min event time seen (seconds); no timers."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.min = handle.getValueState("min_state", STR_VALUE)

    def _add(self, key: Key, seconds: list[int]) -> dict[str, str]:
        current = int(self.min.get()[0]) if self.min.exists() else sys.maxsize
        least = str(min(current, min(seconds)))
        self.min.update((least,))
        return {"id": key[0], "timestamp": least}

    def close(self) -> None:
        pass


class PandasEventTimeMin(_EventTimeMin):
    def handleInputRows(self, key: Key, rows: Frames, timerValues: TimerValues) -> Frames:
        seconds: list[int] = []
        for pdf in rows:
            seconds.extend((pdf["eventTime"].astype("int64") // 10**9).tolist())
        yield one_row(**self._add(key, seconds))


class RowEventTimeMin(_EventTimeMin):
    def handleInputRows(self, key: Key, rows: Rows, timerValues: TimerValues) -> Rows:
        yield Row(**self._add(key, [int(row.eventTime.timestamp()) for row in rows]))


# ---- SimpleStatefulProcessorWithInitialState and its subclasses ---------------------------


class _InitialSum(StatefulProcessor):
    """Sums temperatures into a value state that the initial state seeds."""

    INITIAL: ClassVar[dict[Key, int]] = {("0",): 789, ("3",): 987}

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.value = handle.getValueState("value_state", INT_VALUE)

    def _add(self, key: Key, total: Any) -> dict[str, Any]:
        value = (self.value.get()[0] if self.value.exists() else 0) + total
        self.value.update((value,))
        if len(key) > 1:
            return {"id1": key[0], "id2": key[1], "value": str(value)}
        return {"id": key[0], "value": str(value)}

    def _seed(self, key: Key, initial: Any) -> None:
        self.value.update((initial,))
        if len(key) == 1:
            assert self.INITIAL[key] == initial, (key, initial)

    def close(self) -> None:
        pass


class PandasInitialSum(_InitialSum):
    def handleInputRows(self, key: Key, rows: Frames, timerValues: TimerValues) -> Frames:
        total = 0
        for pdf in rows:
            total += pdf["temperature"].astype(int).sum()
        yield one_row(**self._add(key, total))

    def handleInitialState(
        self, key: Key, initialState: pd.DataFrame, timerValues: TimerValues
    ) -> None:
        self._seed(key, initialState.at[0, "initVal"])


class RowInitialSum(_InitialSum):
    def handleInputRows(self, key: Key, rows: Rows, timerValues: TimerValues) -> Rows:
        yield Row(**self._add(key, sum(row.temperature for row in rows)))

    def handleInitialState(self, key: Key, initialState: Row, timerValues: TimerValues) -> None:
        self._seed(key, initialState.initVal)


class _ExpireOnce:
    """StatefulProcessorWithInitialStateTimers: each initial-state key
    registers a processing-time timer already due (now - 1 ms)."""

    handle: StatefulProcessorHandle

    def _expired(self, key: Key, info: ExpiredTimerInfo) -> dict[str, str]:
        self.handle.deleteTimer(info.getExpiryTimeInMs())
        return {"id": f"{key[0]}-expired", "value": str(info.getExpiryTimeInMs())}


class PandasInitialSumTimers(_ExpireOnce, PandasInitialSum):
    def handleExpiredTimer(
        self, key: Key, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Frames:
        yield one_row(**self._expired(key, expiredTimerInfo))

    def handleInitialState(
        self, key: Key, initialState: pd.DataFrame, timerValues: TimerValues
    ) -> None:
        super().handleInitialState(key, initialState, timerValues)
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() - 1)


class RowInitialSumTimers(_ExpireOnce, RowInitialSum):
    def handleExpiredTimer(
        self, key: Key, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Rows:
        yield Row(**self._expired(key, expiredTimerInfo))

    def handleInitialState(self, key: Key, initialState: Row, timerValues: TimerValues) -> None:
        super().handleInitialState(key, initialState, timerValues)
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() - 1)


class _ListedInitialState:
    """StatefulProcessorWithListStateInitialState: initial rows (several per
    key) go into a list state, the value state starts empty. Spark's test reads
    the list back with its state data source; here each key also outputs a
    row ``<key>-list`` with the list's elements, sorted."""

    handle: StatefulProcessorHandle

    def init(self, handle: StatefulProcessorHandle) -> None:
        super().init(handle)
        self.items = handle.getListState("list_state", INT_VALUE)

    def _listed(self, key: Key) -> dict[str, str]:
        values = sorted(int(e[0]) for e in self.items.get())
        return {"id": f"{key[0]}-list", "value": ",".join(map(str, values))}


class PandasListedInitialState(_ListedInitialState, PandasInitialSum):
    def handleInputRows(self, key: Key, rows: Frames, timerValues: TimerValues) -> Frames:
        yield from super().handleInputRows(key, rows, timerValues)
        yield one_row(**self._listed(key))

    def handleInitialState(
        self, key: Key, initialState: pd.DataFrame, timerValues: TimerValues
    ) -> None:
        for value in initialState["initVal"].tolist():
            self.items.appendValue((value,))


class RowListedInitialState(_ListedInitialState, RowInitialSum):
    def handleInputRows(self, key: Key, rows: Rows, timerValues: TimerValues) -> Rows:
        yield from super().handleInputRows(key, rows, timerValues)
        yield Row(**self._listed(key))

    def handleInitialState(self, key: Key, initialState: Row, timerValues: TimerValues) -> None:
        self.items.appendValue((initialState.initVal,))


# ---- StatefulProcessorCompositeType: nested arrays, maps and structs in state -------------


class Address(NamedTuple):
    road_id: int
    city: str


_OBJECT = StructType(
    [
        StructField("id", ArrayType(IntegerType())),
        StructField("tags", ArrayType(ArrayType(StringType()))),
        StructField(
            "metadata",
            ArrayType(
                StructType([StructField("key", StringType()), StructField("value", StringType())])
            ),
        ),
        StructField(
            "address",
            ArrayType(
                StructType(
                    [StructField("road_id", IntegerType()), StructField("city", StringType())]
                )
            ),
        ),
    ]
)
_MAP_VALUE = StructType(
    [
        StructField("id", IntegerType(), True),
        StructField("attributes", MapType(StringType(), ArrayType(IntegerType())), True),
        StructField(
            "confs", MapType(StringType(), MapType(StringType(), IntegerType()), True), True
        ),
    ]
)


def _plain(x: Any) -> Any:
    return int(x) if isinstance(x, np.integer) else x


class _CompositeState(StatefulProcessor):
    TAGS: ClassVar[list[list[str]]] = [["dummy1", "dummy2"], ["dummy3"]]
    METADATA: ClassVar[list[dict[str, str]]] = [
        {"key": "env", "value": "prod"},
        {"key": "region", "value": "us-west"},
    ]
    ATTRIBUTES: ClassVar[dict[str, list[int]]] = {"key1": [1], "key2": [10]}
    CONFS: ClassVar[dict[str, dict[str, int]]] = {"e1": {"e2": 5, "e3": 10}}
    ADDRESS: ClassVar[list[Address]] = [Address(1, "Seattle"), Address(3, "SF")]

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.obj = handle.getValueState("obj_state", _OBJECT)
        self.items = handle.getListState("list_state", _OBJECT)
        self.map = handle.getMapState("map_state", "name string", _MAP_VALUE)

    def _update(self, key: str, total: Any) -> dict[str, str]:
        if self.obj.exists():
            ids, tags, metadata, address = self.obj.get()
            assert tags == self.TAGS, tags
            assert metadata == [Row(**m) for m in self.METADATA], metadata
            assert address == [Row(**a._asdict()) for a in self.ADDRESS], address
            ids = [int(x + total) for x in ids]
        else:
            ids = [0]
        self.obj.update((ids, self.TAGS, self.METADATA, self.ADDRESS))

        rewritten = []
        for item_ids, tags, metadata, address in self.items.get():
            item_ids.append(total)
            rewritten.append((item_ids, tags, [m.asDict() for m in metadata], address))
        if not rewritten:
            rewritten.append((ids, self.TAGS, self.METADATA, self.ADDRESS))
        self.items.put(rewritten)
        flat = [i for item_ids, _, _, _ in rewritten for i in item_ids]

        if not self.map.containsKey(key):
            self.map.updateValue(key, (0, self.ATTRIBUTES, self.CONFS))
        else:
            map_id, attributes, confs = self.map.getValue(key)
            attributes[key] = [total]
            confs.setdefault("e1", {})[key] = total
            self.map.updateValue(key, (map_id, attributes, confs))
        _, attributes, confs = self.map.getValue(key)
        return {
            "id": key,
            "value_arr": ",".join(map(str, ids)),
            "list_state_arr": ",".join(map(str, flat)),
            "map_state_arr": json.dumps(attributes, default=_plain, sort_keys=True),
            "nested_map_state_arr": json.dumps(confs, default=_plain, sort_keys=True),
        }

    def close(self) -> None:
        pass


class PandasCompositeState(_CompositeState):
    def handleInputRows(self, key: Key, rows: Frames, timerValues: TimerValues) -> Frames:
        total = sum(pdf["temperature"].astype(int).sum() for pdf in rows)
        yield one_row(**self._update(key[0], total))


class RowCompositeState(_CompositeState):
    def handleInputRows(self, key: Key, rows: Rows, timerValues: TimerValues) -> Rows:
        total = sum(int(row.temperature) for row in rows)
        yield Row(**self._update(key[0], total))


# ---- CompositeOutputProcessor: arrays, maps and structs in the output ---------------------


def _inner(i: int, scale_int: int, scale_double: float) -> dict[str, Any]:
    return {
        "intValue": i * scale_int,
        "doubleValue": float(i * scale_double),
        "arrayValue": [f"elem_{i}_{j}" for j in range(i + 1)],
        "mapValue": {f"map_{i}_{j}": f"val_{i}_{j}" for j in range(i + 1)},
    }


class _CompositeOutput(StatefulProcessor):
    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count_state", INT_VALUE)

    def _output(self, key: Key, n: int) -> dict[str, Any]:
        count = (self.count.get()[0] if self.count.exists() else 0) + n
        self.count.update((count,))
        return {
            "primitiveValue": f"key_{key[0]}_count_{count}",
            "listOfPrimitive": [f"item_{i}" for i in range(count)],
            "mapOfPrimitive": {f"key{i}": f"value{i}" for i in range(count)},
            "listOfComposite": [_inner(i, 1, 1.5) for i in range(count)],
            "mapOfComposite": {f"nested_key{i}": _inner(i, 10, 2.5) for i in range(count)},
        }

    def close(self) -> None:
        pass


class PandasCompositeOutput(_CompositeOutput):
    def handleInputRows(self, key: Key, rows: Frames, timerValues: TimerValues) -> Frames:
        yield one_row(**self._output(key, sum(len(pdf) for pdf in rows)))


class RowCompositeOutput(_CompositeOutput):
    def handleInputRows(self, key: Key, rows: Rows, timerValues: TimerValues) -> Rows:
        out = self._output(key, sum(1 for _ in rows))
        out["listOfComposite"] = [Row(**c) for c in out["listOfComposite"]]
        out["mapOfComposite"] = {k: Row(**c) for k, c in out["mapOfComposite"].items()}
        yield Row(**out)


# ---- LargeValueStatefulProcessor: 512 KB strings in value, list and map state -------------


class _LargeValues(StatefulProcessor):
    def init(self, handle: StatefulProcessorHandle) -> None:
        self.value = handle.getValueState("valueState", STR_VALUE)
        self.items = handle.getListState("listState", STR_VALUE)
        self.map = handle.getMapState("mapState", "key string", "value string")

    def _round_trip(self, key: Key) -> dict[str, str]:
        big = "a" * (512 * 1024)
        self.value.update((big,))
        value = self.value.get()
        assert value is not None
        self.items.put([(big,), (big + "b",), (big + "c",)])
        self.map.updateValue(("large_string_key",), (big,))
        return {
            "id": key[0],
            "valueStateResult": value[0],
            "listStateResult": ",".join(e[0] for e in self.items.get()),
            "mapStateResult": f"large_string_key:{self.map.getValue(('large_string_key',))[0]}",
        }

    def close(self) -> None:
        pass


class PandasLargeValues(_LargeValues):
    def handleInputRows(self, key: Key, rows: Frames, timerValues: TimerValues) -> Frames:
        yield one_row(**self._round_trip(key))


class RowLargeValues(_LargeValues):
    def handleInputRows(self, key: Key, rows: Rows, timerValues: TimerValues) -> Rows:
        yield Row(**self._round_trip(key))


# ---- ChunkCountProcessor (+ with initial state): how a key's rows are chunked -------------


class PandasChunkCount(StatefulProcessor):
    def init(self, handle: StatefulProcessorHandle) -> None:
        pass

    def handleInputRows(self, key: Key, rows: Frames, timerValues: TimerValues) -> Frames:
        yield one_row(id=key[0], chunkCount=sum(1 for _ in rows))

    def close(self) -> None:
        pass


class PandasChunkCountWithInitialState(PandasChunkCount):
    def init(self, handle: StatefulProcessorHandle) -> None:
        self.value = handle.getValueState("value_state", INT_VALUE)

    def handleInitialState(
        self, key: Key, initialState: pd.DataFrame, timerValues: TimerValues
    ) -> None:
        self.value.update((initialState.at[0, "initVal"],))


# ---- test_transform_with_state_int_to_decimal_coercion's processor ------------------------


class PandasIntToDecimal(StatefulProcessor):
    """Outputs a Python int for a decimal(10, 2) column."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", INT_VALUE)

    def handleInputRows(self, key: Key, rows: Frames, timerValues: TimerValues) -> Frames:
        count = (self.count.get()[0] if self.count.exists() else 0) + len(list(rows))
        self.count.update((count,))
        yield pd.DataFrame({"id": [key[0]], "decimal_result": [12345]})

    def close(self) -> None:
        pass


# ---- TwsTester's processors (test_tws_tester.py's fuzz tests against a real query) --------


class _RunningCount(StatefulProcessor):
    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", INT_VALUE)

    def _add(self, n: int) -> int:
        count = (self.count.get()[0] if self.count.exists() else 0) + n
        self.count.update((count,))
        return count


class PandasRunningCount(_RunningCount):
    def handleInputRows(self, key: Key, rows: Frames, timerValues: TimerValues) -> Frames:
        count = self._add(sum(1 for pdf in rows for _ in pdf.iterrows()))
        yield one_row(key=key[0], count=count)


class RowRunningCount(_RunningCount):
    def handleInputRows(self, key: Key, rows: Rows, timerValues: TimerValues) -> Rows:
        yield Row(key=key[0], count=self._add(sum(1 for _ in rows)))


class _TopK(StatefulProcessor):
    """The K highest scores per key, in a list state."""

    def __init__(self, k: int) -> None:
        self.k = k

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.top = handle.getListState("topK", StructType([StructField("score", DoubleType())]))

    def _merge(self, scores: list[float]) -> list[float]:
        best = sorted([s[0] for s in self.top.get()] + scores, reverse=True)[: self.k]
        self.top.put([(s,) for s in best])
        return best


class PandasTopK(_TopK):
    def handleInputRows(self, key: Key, rows: Frames, timerValues: TimerValues) -> Frames:
        best = self._merge([row.score for pdf in rows for _, row in pdf.iterrows()])
        yield pd.DataFrame({"key": [key[0]] * len(best), "score": best})


class RowTopK(_TopK):
    def handleInputRows(self, key: Key, rows: Rows, timerValues: TimerValues) -> Rows:
        for score in self._merge([row.score for row in rows]):
            yield Row(key=key[0], score=score)


class _WordFrequency(StatefulProcessor):
    """A map state word -> count; one output row per input row."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.freq = handle.getMapState("frequencies", "key string", "value long")

    def _seen(self, word: str) -> int:
        count = self.freq.getValue((word,))[0] if self.freq.containsKey((word,)) else 0
        self.freq.updateValue((word,), (count + 1,))
        return count + 1


class PandasWordFrequency(_WordFrequency):
    def handleInputRows(self, key: Key, rows: Frames, timerValues: TimerValues) -> Frames:
        out = [
            {"key": key[0], "word": row.word, "count": self._seen(row.word)}
            for pdf in rows
            for _, row in pdf.iterrows()
        ]
        if out:
            yield pd.DataFrame(out)


class RowWordFrequency(_WordFrequency):
    def handleInputRows(self, key: Key, rows: Rows, timerValues: TimerValues) -> Rows:
        for row in rows:
            yield Row(key=key[0], word=row.word, count=self._seen(row.word))


class _EventTimeSession(StatefulProcessor):
    """EventTimeSessionProcessor: a timer 5 s after a key's last event
    (moved on each event); when it fires, the session ends."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.last = handle.getValueState(
            "lastEventTime", StructType([StructField("lastEventTime", LongType(), True)])
        )

    def _received(self, key: Key, event_time_ms: int, value: str) -> dict[str, str]:
        if self.last.exists():
            self.handle.deleteTimer(self.last.get()[0] + 5000)
        self.last.update((event_time_ms,))
        self.handle.registerTimer(event_time_ms + 5000)
        return {"key": key[0], "result": f"received:{value}@{event_time_ms}"}

    def _expired(self, key: Key) -> dict[str, str]:
        self.last.clear()
        return {"key": key[0], "result": "session-expired"}


class PandasEventTimeSession(_EventTimeSession):
    def handleInputRows(self, key: Key, rows: Frames, timerValues: TimerValues) -> Frames:
        out = [
            self._received(key, int(row.event_time_ms), row.value)
            for pdf in rows
            for _, row in pdf.iterrows()
        ]
        if out:
            yield pd.DataFrame(out)

    def handleExpiredTimer(
        self, key: Key, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Frames:
        yield one_row(**self._expired(key))


class RowEventTimeSession(_EventTimeSession):
    def handleInputRows(self, key: Key, rows: Rows, timerValues: TimerValues) -> Rows:
        for row in rows:
            yield Row(**self._received(key, row.event_time_ms, row.value))

    def handleExpiredTimer(
        self, key: Key, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Rows:
        yield Row(**self._expired(key))


# ---- the schema-evolution processors: one value state "state", its schema changed ----------


def _struct(*fields: tuple[str, Any], nullable: bool = True) -> StructType:
    return StructType([StructField(name, dtype, nullable) for name, dtype in fields])


class _Evolving(StatefulProcessor):
    """A value state named "state" whose schema each subclass changes; the
    output is the key and the value it read or made (a struct)."""

    state_schema: ClassVar[StructType]

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.state = handle.getValueState("state", self.state_schema)

    def _value(self, key: Key) -> dict[str, Any]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class _Basic(_Evolving):
    """BasicProcessor: (id int, name string), written without reading."""

    state_schema = _struct(("id", IntegerType()), ("name", StringType()))

    def _value(self, key: Key) -> dict[str, Any]:
        ident = int(key[0])
        self.state.update((ident, f"name-{ident}"))
        return {"id": ident, "name": f"name-{ident}"}


class _BasicNotNullable(_Basic):
    """BasicProcessorNotNullable: Spark refuses non-nullable state fields."""

    state_schema = _struct(("id", IntegerType()), ("name", StringType()), nullable=False)


_ADDED = ("id", "name", "count", "active", "score")


class _AddFields(_Evolving):
    """AddFieldsProcessor: three more fields (null when read from older state)."""

    state_schema = _struct(
        ("id", IntegerType()),
        ("name", StringType()),
        ("count", IntegerType()),
        ("active", BooleanType()),
        ("score", FloatType()),
    )

    def _value(self, key: Key) -> dict[str, Any]:
        ident = int(key[0])
        if self.state.exists():
            value = dict(zip(_ADDED, self.state.get(), strict=True))
        else:
            value = {"id": ident, "name": f"name-{ident}", "count": 100, "active": True}
            value["score"] = 99.9
        stored = {**value, "name": value["name"] + "0"}
        self.state.update(tuple(stored[f] for f in _ADDED))
        return value


class _RemoveFields(_Evolving):
    """RemoveFieldsProcessor: back to (id, name); keeps the stored name."""

    state_schema = _struct(("id", IntegerType()), ("name", StringType()))

    def _value(self, key: Key) -> dict[str, Any]:
        ident = int(key[0])
        name = self.state.get()[1] if self.state.exists() else f"name-{ident}"
        self.state.update((ident, name))
        return {"id": ident, "name": name}


_REORDERED = ("name", "id", "score", "count", "active")


class _ReorderedFields(_Evolving):
    """ReorderedFieldsProcessor: the fields in another order."""

    state_schema = _struct(
        ("name", StringType()),
        ("id", IntegerType()),
        ("score", FloatType()),
        ("count", IntegerType()),
        ("active", BooleanType()),
    )

    def _value(self, key: Key) -> dict[str, Any]:
        ident = int(key[0])
        if self.state.exists():
            value = dict(zip(_REORDERED, self.state.get(), strict=True))
        else:
            value = {"name": f"name-{ident}", "id": ident, "score": 99.9, "count": 100}
            value["active"] = True
        self.state.update(tuple(value[f] for f in _REORDERED))
        return value


class _Upcast(_Evolving):
    """UpcastProcessor: id widened from int to long."""

    state_schema = _struct(("id", LongType()), ("name", StringType()))

    def _value(self, key: Key) -> dict[str, Any]:
        ident = int(key[0])
        name = f"name-{ident}"
        if self.state.exists():
            ident += self.state.get()[0] + 1
        self.state.update((ident, name))
        return {"id": ident, "name": name}


class _PandasEvolving(_Evolving):
    def handleInputRows(self, key: Key, rows: Frames, timerValues: TimerValues) -> Frames:
        for _ in rows:
            pass
        yield pd.DataFrame({"id": [key[0]], "value": [self._value(key)]})


class _RowEvolving(_Evolving):
    def handleInputRows(self, key: Key, rows: Rows, timerValues: TimerValues) -> Rows:
        for _ in rows:
            pass
        yield Row(id=key[0], value=self._value(key))


class PandasBasic(_PandasEvolving, _Basic):
    pass


class RowBasic(_RowEvolving, _Basic):
    pass


class PandasBasicNotNullable(_PandasEvolving, _BasicNotNullable):
    pass


class RowBasicNotNullable(_RowEvolving, _BasicNotNullable):
    pass


class PandasAddFields(_PandasEvolving, _AddFields):
    pass


class RowAddFields(_RowEvolving, _AddFields):
    pass


class PandasRemoveFields(_PandasEvolving, _RemoveFields):
    pass


class RowRemoveFields(_RowEvolving, _RemoveFields):
    pass


class PandasReorderedFields(_PandasEvolving, _ReorderedFields):
    pass


class RowReorderedFields(_RowEvolving, _ReorderedFields):
    pass


class PandasUpcast(_PandasEvolving, _Upcast):
    pass


class RowUpcast(_RowEvolving, _Upcast):
    pass


def evolution_output(processor: type[_Evolving]) -> StructType:
    """Spark's output schema for these: the key and the state's struct."""
    return StructType(
        [StructField("id", StringType(), True), StructField("value", processor.state_schema)]
    )
