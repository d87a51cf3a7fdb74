"""snapcut.spark.testing.TwsTester: a StatefulProcessor run key by key on
snapcut's state tables, without Spark — the methods of PySpark's TwsTester,
plus TTL, timers listing and a restart from checkpointed tables."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd
import pytest
from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, TimerValues

from snapcut._core import ConfigError
from snapcut.spark.testing import TwsTester


class Counting(StatefulProcessor):
    """Value + list + map state; a timer 1 s after each key's rows."""

    def __init__(self, ttl_ms: int | None = None) -> None:
        self.ttl_ms = ttl_ms

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.count = handle.getValueState("count", "n long", self.ttl_ms)
        self.seen = handle.getListState("seen", "v long")
        self.words = handle.getMapState("words", "w string", "c long")

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: TimerValues) -> Any:
        n = 0
        for pdf in rows:
            n += len(pdf)
            self.seen.appendList([(int(v),) for v in pdf["v"]])
            for w in pdf["w"]:
                c = self.words.getValue((w,))
                self.words.updateValue((w,), ((c[0] if c else 0) + 1,))
        total = (self.count.get() or (0,))[0] + n
        self.count.update((total,))
        if timerValues.getCurrentProcessingTimeInMs() >= 0:
            self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + 1000)
        yield pd.DataFrame({"id": [key[0]], "count": [total]})

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Any:
        yield pd.DataFrame({"id": [key[0]], "count": [-expiredTimerInfo.getExpiryTimeInMs()]})

    def close(self) -> None:
        pass


class RowCounting(StatefulProcessor):
    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", "n long")

    def handleInputRows(self, key: Any, rows: Iterator[Row], timerValues: TimerValues) -> Any:
        total = (self.count.get() or (0,))[0] + sum(1 for _ in rows)
        self.count.update((total,))
        yield Row(id=key[0], count=total)

    def close(self) -> None:
        pass


def frame(*values: tuple[int, str]) -> pd.DataFrame:
    return pd.DataFrame({"v": [v for v, _ in values], "w": [w for _, w in values]})


def test_pandas_processor_counts_and_keeps_every_kind_of_state() -> None:
    t = TwsTester(Counting(), keySchema="id string")
    out = t.testInPandas("a", frame((1, "x"), (2, "y"), (3, "x")))
    assert out.to_dict("records") == [{"id": "a", "count": 3}]
    out = t.testInPandas("a", frame((4, "x")))
    assert out.to_dict("records") == [{"id": "a", "count": 4}]
    assert t.peekValueState("count", "a") == (4,)
    assert t.peekListState("seen", "a") == [(1,), (2,), (3,), (4,)]
    assert t.peekMapState("words", "a") == {("x",): (3,), ("y",): (1,)}
    assert t.peekValueState("count", "b") is None
    assert t.peekListState("seen", "b") == []


def test_state_set_by_hand_and_deleted_is_what_the_processor_sees() -> None:
    t = TwsTester(Counting(), keySchema="id string")
    t.updateValueState("count", "a", (10,))
    t.updateListState("seen", "a", [(7,), (8,)])
    t.updateMapState("words", "a", {("z",): (5,)})
    out = t.testInPandas("a", frame((9, "z")))
    assert out.to_dict("records") == [{"id": "a", "count": 11}]
    assert t.peekListState("seen", "a") == [(7,), (8,), (9,)]
    assert t.peekMapState("words", "a") == {("z",): (6,)}
    t.deleteState("words", "a")
    assert t.peekMapState("words", "a") == {}
    assert t.peekValueState("count", "a") == (11,)


def test_state_survives_a_restart_from_checkpointed_tables() -> None:
    t = TwsTester(Counting(), keySchema="id string")
    t.testInPandas("a", frame((1, "x"), (2, "x")))
    t.testInPandas("b", frame((3, "y")))
    t.restart()
    assert t.peekValueState("count", "a") == (2,)
    assert t.peekListState("seen", "a") == [(1,), (2,)]
    assert t.peekMapState("words", "b") == {("y",): (1,)}
    out = t.testInPandas("a", frame((4, "x")))
    assert out.to_dict("records") == [{"id": "a", "count": 3}]


def test_row_processor() -> None:
    t = TwsTester(RowCounting(), keySchema="id string")
    assert t.test("k", [Row(id="k", v=1), Row(id="k", v=2)]) == [Row(id="k", count=2)]
    assert t.test("k", [Row(id="k", v=3)]) == [Row(id="k", count=3)]


def test_processing_time_timers_fire_when_time_passes_and_are_deleted() -> None:
    t = TwsTester(Counting(), keySchema="id string", timeMode="ProcessingTime")
    t.testInPandas("a", frame((1, "x")))  # at time 0: timer at 1000
    assert t.listTimers("a") == [1000]
    assert len(t.setProcessingTime(999)) == 0
    fired = t.setProcessingTime(1000)  # at or before the time: fires (Spark's <=)
    assert fired.to_dict("records") == [{"id": "a", "count": -1000}]
    assert t.listTimers("a") == []
    assert len(t.setProcessingTime(5000)) == 0


def test_ttl_expires_a_value_at_its_expiry_time() -> None:
    t = TwsTester(Counting(ttl_ms=500), keySchema="id string", timeMode="ProcessingTime")
    t.testInPandas("a", frame((1, "x")))  # updated at 0: expires at 500
    t.setProcessingTime(499)
    assert t.peekValueState("count", "a") == (1,)
    t.setProcessingTime(500)
    assert t.peekValueState("count", "a") is None
    out = t.testInPandas("a", frame((2, "x")))
    assert out.to_dict("records") == [{"id": "a", "count": 1}]


class EventTimers(StatefulProcessor):
    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.last = handle.getValueState("last", "t long")

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: TimerValues) -> Any:
        latest = max(int(t) for pdf in rows for t in pdf["t"])
        self.last.update((latest,))
        self.handle.registerTimer(latest + 100)
        yield pd.DataFrame({"id": [key[0]], "t": [latest]})

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Any:
        self.last.clear()
        yield pd.DataFrame({"id": [key[0]], "t": [-timerValues.getCurrentWatermarkInMs()]})

    def close(self) -> None:
        pass


def test_event_time_timers_and_late_rows() -> None:
    t = TwsTester(
        EventTimers(),
        keySchema="id string",
        timeMode="EventTime",
        eventTimeExtractor=lambda r: r["t"],
    )
    out = t.testInPandas("a", pd.DataFrame({"t": [50, 70]}))
    assert out.to_dict("records") == [{"id": "a", "t": 70}]
    fired = t.setWatermark(170)
    assert fired.to_dict("records") == [{"id": "a", "t": -170}]
    assert t.peekValueState("last", "a") is None
    # At or before the watermark: late, dropped before the processor.
    assert len(t.testInPandas("a", pd.DataFrame({"t": [160, 170]}))) == 0


def test_bad_uses_are_refused_with_the_fix() -> None:
    class TimerAlways(Counting):
        def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: TimerValues) -> Any:
            self.handle.registerTimer(1)
            yield from ()

    with pytest.raises(ConfigError, match="timeMode"):
        TwsTester(TimerAlways(), keySchema="id string").testInPandas("a", frame((1, "x")))
    t = TwsTester(Counting(), keySchema="id string")
    with pytest.raises(ConfigError, match="TTL, which needs"):
        TwsTester(Counting(ttl_ms=10), keySchema="id string", timeMode="None")
    with pytest.raises(ConfigError, match="no state variable"):
        t.deleteState("nope", "a")
    with pytest.raises(ConfigError, match="schema has 1 field"):
        t.updateValueState("count", "a", (1, 2))
    with pytest.raises(ConfigError, match="takes a tuple"):
        t.updateValueState("count", "a", 5)  # type: ignore[arg-type]

    class Twice(Counting):
        def init(self, handle: StatefulProcessorHandle) -> None:
            handle.getValueState("x", "n long")
            handle.getValueState("x", "n long")

    with pytest.raises(ConfigError, match="declared twice"):
        TwsTester(Twice(), keySchema="id string")

    class Reserved(Counting):
        def init(self, handle: StatefulProcessorHandle) -> None:
            handle.getValueState("$x", "n long")

    with pytest.raises(ConfigError, match="reserves"):
        TwsTester(Reserved(), keySchema="id string")

    class TimerInInit(Counting):
        def init(self, handle: StatefulProcessorHandle) -> None:
            handle.registerTimer(1)

    with pytest.raises(ConfigError, match="not in init"):
        TwsTester(TimerInInit(), keySchema="id string")

    class RunId(Counting):
        def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: TimerValues) -> Any:
            yield pd.DataFrame({"id": [self.handle.getQueryInfo().getRunId()], "count": [0]})

    # Where Spark does not tell the task the run id (here: no Spark at all).
    with pytest.raises(ConfigError, match="run id does not reach"):
        TwsTester(RunId(), keySchema="id string").testInPandas("a", frame((1, "x")))
