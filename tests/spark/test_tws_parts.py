"""transformWithState over a batch of any size, driven without Spark: the calls
run a step of keys at a time (``snapcut.spark.tws.batch_run``) and, past what
a worker holds, over parts of whole keys (``process_parts``); either way a
batch leaves the same state and yields the same rows as one step over the
whole batch (value, list and map state, initial state, timers that fire in
the batch they are set, TTL)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, TimerValues
from pyspark.sql.types import LongType, StructField, StructType

import snapcut.spark.tws.batch_run as batch_run
from snapcut.spark.state.key_parts import hold, key_parts
from snapcut.spark.state.partition import BatchInfo
from snapcut.spark.state.spec import table_vertex
from snapcut.spark.testing import VERTEX, TwsTester

LONG = StructType([StructField("value", LongType(), True)])


class Mixed(StatefulProcessor):
    """Every kind of state: a count seeded by the initial state, the values a
    key saw (list), how often each value mod 3 came (map), the last value
    with a TTL; an even count registers a timer already due, whose firing
    reports and clears the list."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.count = handle.getValueState("count", LONG)
        self.items = handle.getListState("items", LONG)
        self.mods = handle.getMapState("mods", LONG, LONG)
        self.last = handle.getValueState("last", LONG, 1500)

    held = 0
    """The most grouping keys whose state the batch held at once."""
    calls: ClassVar[list[tuple[str, Any]]] = []
    """Every call, in order."""

    def handleInitialState(self, key: Any, initialState: Row, timerValues: TimerValues) -> None:
        Mixed.calls.append(("initial", key))
        self.count.update((initialState.seed,))

    def handleInputRows(self, key: Any, rows: Iterator[Row], timerValues: TimerValues) -> Any:
        Mixed.calls.append(("input", key))
        Mixed.held = max(Mixed.held, len(self.handle._state.loaded))  # type: ignore[attr-defined]
        count = self.count.get()[0] if self.count.exists() else 0
        had_last = self.last.exists()
        for r in rows:
            count += 1
            self.items.appendValue((r.v,))
            m = (r.v % 3,)
            self.mods.updateValue(m, ((self.mods.getValue(m) or (0,))[0] + 1,))
            self.last.update((r.v,))
        self.count.update((count,))
        if count % 2 == 0:
            self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() - 1)
        yield Row(id=key[0], n=count, what="input" if had_last else "fresh")

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Any:
        Mixed.calls.append(("timer", key))
        listed = sum(1 for _ in self.items.get())
        self.items.clear()
        yield Row(id=key[0], n=listed, what="timer")

    def close(self) -> None:
        pass


OUTPUT = pa.schema([("id", pa.int64()), ("n", pa.int64()), ("what", pa.string())])


def make_tester() -> TwsTester:
    return TwsTester(Mixed(), keySchema="id long", timeMode="ProcessingTime")


def batch_rows(rng: np.random.Generator, keys: int, rows: int) -> pa.Table:
    return pa.table(
        {"id": pa.array(rng.integers(0, keys, rows), pa.int64()), "v": rng.integers(0, 50, rows)}
    )


def contents(t: TwsTester) -> dict[str, list[dict[str, Any]]]:
    out = {}
    for name, table in t.tables.items():
        rows = table.to_arrow()
        out[name] = sorted(rows.to_pylist(), key=repr)
    return out


@pytest.mark.parametrize("step", [1, 7, 1000])
def test_a_batch_in_steps_and_parts_leaves_the_state_and_rows_of_one_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: int
) -> None:
    rng = np.random.default_rng(step)
    batches = [batch_rows(rng, 300, 900), batch_rows(rng, 400, 600), batch_rows(rng, 60, 300)]
    # Initial state for keys with input and keys without.
    initial = pa.table({"id": pa.array(range(250, 350), pa.int64()), "seed": range(100)})
    whole, parted = make_tester(), make_tester()
    procs = [t._processor(pandas=False) for t in (whole, parted)]
    for p in procs:
        p.output_schema = OUTPUT
        p.initial_rows = lambda partition: initial
    for batch, rows in enumerate(batches):
        info = BatchInfo(batch, 0, 0, 1000 * (batch + 1), False)
        monkeypatch.setattr(batch_run, "KEYS_PER_STEP", 1 << 20)
        want = procs[0].process(whole.tables, rows, info)
        want_figures = (procs[0].late_rows, procs[0].timed_out_keys)

        monkeypatch.setattr(batch_run, "KEYS_PER_STEP", step)
        Mixed.held = 0
        first, rest = hold(iter(rows.to_batches(max_chunksize=100)), 2000)
        assert rest is not None
        parts = key_parts(first, rest, rows.schema, ("id",), batch, str(tmp_path), buckets=5)
        outs = list(procs[1].process_parts(parted.tables, parts, info))
        assert len(outs) == 6  # five parts, then the timers'
        got = pa.concat_tables(outs)
        assert sorted(got.to_pylist(), key=repr) == sorted(want.to_pylist(), key=repr)
        assert (procs[1].late_rows, procs[1].timed_out_keys) == want_figures
        assert contents(parted) == contents(whole)
        assert 0 < Mixed.held <= step
        whats = set(want["what"].to_pylist())
        assert "timer" in whats and ("fresh" in whats)
        if batch == 0:
            # Every initial-state key was handled, those without input too.
            count = whole.tables[table_vertex(VERTEX, "count")]
            assert len(count) == len(set(rows["id"].to_pylist()) | set(range(250, 350)))


def test_a_whole_batch_in_steps_makes_the_calls_of_one_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One part (what a batch that fits is), in steps of 5 keys: the same
    rows in the same order as in one step (Spark's order: by key, then the
    timers by time)."""
    rng = np.random.default_rng(3)
    rows = batch_rows(rng, 400, 300)
    initial = pa.table({"id": pa.array(range(150, 460, 3), pa.int64()), "seed": range(104)})
    outs = []
    for step in (1 << 20, 5):
        monkeypatch.setattr(batch_run, "KEYS_PER_STEP", step)
        t = make_tester()
        p = t._processor(pandas=False)
        p.output_schema = OUTPUT
        p.initial_rows = lambda partition: initial
        Mixed.calls = []
        out = p.process(t.tables, rows, BatchInfo(0, 0, 0, 5000, False))
        outs.append((out, contents(t), Mixed.calls))
    assert outs[0][0].equals(outs[1][0])
    assert outs[0][1] == outs[1][1]
    assert outs[0][2] == outs[1][2]
    kinds = [c for c, _ in outs[0][2]]
    assert kinds.index("timer") > len(kinds) - kinds[::-1].index("input") - 1


def test_outputs_become_arrow_as_they_come(monkeypatch: pytest.MonkeyPatch) -> None:
    """Yielded Rows are gathered into Arrow tables every OUTPUT_ITEMS, not held
    until the batch ends."""
    monkeypatch.setattr(batch_run, "OUTPUT_ITEMS", 10)
    t = make_tester()
    p = t._processor(pandas=False)
    p.output_schema = OUTPUT
    out = batch_run.Outputs(p)
    for i in range(25):
        out.add(iter([Row(id=i, n=i, what="x")]))
        assert len(out.items) < 10
    table = out.take()
    assert table["id"].to_pylist() == list(range(25))
    assert out.take().num_rows == 0


def test_timers_and_ttl_of_spilling_tables_fire_as_in_memory(tmp_path: Path) -> None:
    """Under a 1 MiB budget a table (what the Spark steps give a table of a
    small worker budget), the time indexes of the timers and of the state
    with a TTL hold a few hundred entries in memory and move the rest into
    runs on disk, where timers deleted and expiries moved leave stale
    entries: every batch still yields the same rows and leaves the same
    state as tables without a budget (2,500 keys: ~700 entries of either
    index fit in memory)."""
    from snapcut import StateTable
    from snapcut.spark.state.spec import TableLayout

    plain, spilled = make_tester(), make_tester()
    spilled.tables = {
        table_vertex(VERTEX, t.name): StateTable(
            t.arrow_schema,
            t.state_key,
            full_every=10,
            group=t.group,
            group_prefix=TableLayout(VERTEX, t.state_key, t.schema, t.group).group_prefix,
            time_column=t.time_column,
            state_memory="1MB",
            spill_dir=tmp_path,
        )
        for t in spilled.specs
    }
    procs = [t._processor(pandas=False) for t in (plain, spilled)]
    for p in procs:
        p.output_schema = OUTPUT
    rng = np.random.default_rng(5)
    for batch in range(3):
        rows = batch_rows(rng, 2500, 5000)
        info = BatchInfo(batch, 0, 0, 1000 * (batch + 1), False)
        want = procs[0].process(plain.tables, rows, info)
        got = procs[1].process(spilled.tables, rows, info)
        assert sorted(got.to_pylist(), key=repr) == sorted(want.to_pylist(), key=repr)
        assert procs[1].timed_out_keys == procs[0].timed_out_keys
        assert contents(spilled) == contents(plain)
        whats = set(want["what"].to_pylist())
        assert "timer" in whats and "fresh" in whats
    # The timers' and the TTL's indexes went into runs (and were read there).
    flushed = {
        name: (table.spill_stats() or {})["time_flushes"]
        for name, table in spilled.tables.items()
        if table.time_column is not None
    }
    assert len(flushed) == 2 and all(n > 0 for n in flushed.values()), flushed
