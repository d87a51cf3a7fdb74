"""transformWithState on snapcut in streaming queries: state variables across
micro-batches and a restart from checkpointLocation, timers firing in later
(and no-data) batches, reading the variables back, schema evolution on
restart, and bad inputs. Parity with Spark's own engine, case by case, is
test_spark_tws_parity.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, TimerValues

from snapcut import snapshots
from snapcut._core import ConfigError
from snapcut.spark import keyed_state, read_state, read_state_arrow, rescale
from spark_support import observed_progress, run_to_end, start_session, write_inputs

SCHEMA = "id string, v long, w string"
SESSION_KINDS = True  # tests/conftest.py: both_sessions tests also run on Connect


@pytest.fixture(scope="module")
def spark(request: pytest.FixtureRequest) -> Iterator[SparkSession]:
    session = start_session("local[2]", kind=request.param)
    yield session
    session.stop()


class Tally(StatefulProcessor):
    """Value, list and map state; in ProcessingTime mode a timer per key
    that reports the key's count one batch later."""

    def __init__(self, value_schema: str = "n long") -> None:
        self.value_schema = value_schema

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.count = handle.getValueState("count", self.value_schema)
        self.vs = handle.getListState("vs", "v long")
        self.ws = handle.getMapState("ws", "w string", "c long")

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: TimerValues) -> Any:
        n = 0
        for pdf in rows:
            n += len(pdf)
            self.vs.appendList([(int(v),) for v in pdf["v"]])
            for w in pdf["w"]:
                c = self.ws.getValue((w,))
                self.ws.updateValue((w,), ((c[0] if c else 0) + 1,))
        old = self.count.get()
        total = (old[0] if old else 0) + n
        self.count.update(self._value(total))
        if timerValues.getCurrentProcessingTimeInMs() >= 0:
            for t in self.handle.listTimers():
                self.handle.deleteTimer(t)
            self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + 1)
        yield pd.DataFrame({"id": [key[0]], "kind": ["data"], "n": [total]})

    def _value(self, total: int) -> tuple[Any, ...]:
        width = len(self.value_schema.split(","))
        return (total, *([None] * (width - 1)))

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Any:
        yield pd.DataFrame({"id": [key[0]], "kind": ["timer"], "n": [self.count.get()[0]]})

    def close(self) -> None:
        pass


OUT = "id string, kind string, n long"


def frames(*batches: list[tuple[str, int, str]]) -> list[pd.DataFrame]:
    return [pd.DataFrame(b, columns=["id", "v", "w"]) for b in batches]


def query(
    spark: SparkSession,
    inputs: Path,
    root: Path,
    proc: StatefulProcessor,
    mode: str,
    state_memory: str | None = None,
) -> DataFrame:
    df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(inputs))
    s = keyed_state(df, key="id", root=str(root), partitions=2, state_memory=state_memory)
    return s.transform_with_state_in_pandas(proc, OUT, "Update", mode)


def rows(batches: dict[int, Any], kind: str | None = None) -> dict[int, list[tuple[Any, ...]]]:
    out = {}
    for b, t in batches.items():
        rs = sorted(
            (r["id"], r["kind"], r["n"]) for r in t.to_pylist() if kind in (None, r["kind"])
        )
        if rs:
            out[b] = rs
    return out


@pytest.mark.both_sessions
def test_state_survives_a_restart_and_reads_back_per_variable(
    spark: SparkSession, tmp_path: Path
) -> None:
    inputs, root, chk = tmp_path / "in", tmp_path / "root", tmp_path / "chk"
    write_inputs(inputs, frames([("a", 1, "x"), ("a", 2, "y"), ("b", 3, "x")], [("a", 4, "x")]))
    first = run_to_end(query(spark, inputs, root, Tally(), "None"), chk)
    assert rows(first) == {0: [("a", "data", 2), ("b", "data", 1)], 1: [("a", "data", 3)]}
    write_inputs(
        inputs,
        frames(
            [("a", 1, "x"), ("a", 2, "y"), ("b", 3, "x")],
            [("a", 4, "x")],
            [("b", 5, "z"), ("c", 6, "z")],
        ),
    )
    second = run_to_end(query(spark, inputs, root, Tally(), "None"), chk)
    assert rows(second) == {2: [("b", "data", 2), ("c", "data", 1)]}
    count = read_state_arrow(str(root), variable="count").sort_by("id").to_pylist()
    assert count == [{"id": "a", "n": 3}, {"id": "b", "n": 2}, {"id": "c", "n": 1}]
    vs = read_state_arrow(str(root), variable="vs").sort_by(
        [("id", "ascending"), ("__seq", "ascending")]
    )
    assert [(r["id"], r["v"]) for r in vs.to_pylist()] == [
        ("a", 1),
        ("a", 2),
        ("a", 4),
        ("b", 3),
        ("b", 5),
        ("c", 6),
    ]
    ws = {(r["id"], r["w"]): r["c"] for r in read_state_arrow(str(root), variable="ws").to_pylist()}
    assert ws == {("a", "x"): 2, ("a", "y"): 1, ("b", "x"): 1, ("b", "z"): 1, ("c", "z"): 1}
    at_1 = read_state(spark, str(root), batch=1, variable="count").toPandas()
    assert sorted(map(tuple, at_1[["id", "n"]].values.tolist())) == [("a", 3), ("b", 1)]
    with pytest.raises(ConfigError, match="variable="):
        read_state_arrow(str(root))
    with pytest.raises(ConfigError, match="no state variable 'nope'"):
        read_state_arrow(str(root), variable="nope")
    # The snapshot tools name each variable (vertex <name>.<variable>).
    diffs = {d.label: d for d in snapshots.diff_checkpoints(str(root), 1, 2)}
    assert {"state.count-0", "state.count-1", "state.vs-0", "state.ws-1"} <= set(diffs)
    changed = sum(d.added.num_rows + d.changed.num_rows for t, d in diffs.items() if "count" in t)
    assert changed == 2  # b's count changed, c's was added
    snapshots.export_checkpoint(str(root), str(tmp_path / "export"), 2)
    exported = {p.name for p in (tmp_path / "export").iterdir()}
    assert any("count" in name for name in exported), exported
    with pytest.raises(ConfigError, match="not supported yet"):
        rescale(spark, str(root), str(tmp_path / "root-3"), 3)
    assert not (tmp_path / "root-3").exists()


@pytest.mark.both_sessions
def test_processing_time_timers_fire_in_a_later_batch(spark: SparkSession, tmp_path: Path) -> None:
    inputs, root, chk = tmp_path / "in", tmp_path / "root", tmp_path / "chk"
    write_inputs(inputs, frames([("a", 1, "x"), ("b", 2, "x")], [("a", 3, "x")]))
    out = run_to_end(query(spark, inputs, root, Tally(), "ProcessingTime"), chk, stop_after=3)
    by_batch = rows(out)
    assert by_batch[0] == [("a", "data", 1), ("b", "data", 1)]
    # Batch 1: a's new rows (its timer re-registered), b's timer from batch 0.
    assert by_batch[1] == [("a", "data", 2), ("b", "timer", 1)]
    # Batch 2 has no data (Spark's no-data batch): a's timer fires.
    assert by_batch[2] == [("a", "timer", 2)]


def test_list_and_map_state_spill_under_a_budget_and_read_back_as_without(
    spark: SparkSession, tmp_path: Path
) -> None:
    """``state_memory="8MB"`` per Python worker: 1 MiB for each of the four
    tables (count, list, map, timers) of the partition a task works on, so
    the list and the map of each partition flush to runs, and later batches
    read a key's list and map back from them (a group's rows are the keys
    that begin with its prefix). Every batch's output and every variable's
    state equal the same query's without a budget."""
    ids = 3000
    batches = [
        [(f"k{i}", 10 * b + j, f"w{j}") for i in range(ids) for j in range(6)] for b in range(3)
    ]
    inputs = tmp_path / "in"
    write_inputs(inputs, frames(*batches))
    want = run_to_end(
        query(spark, inputs, tmp_path / "plain", Tally(), "None"), tmp_path / "chk-plain"
    )
    spilled = query(spark, inputs, tmp_path / "root", Tally(), "None", state_memory="8MB")
    progress = observed_progress(spilled, tmp_path / "chk", "state")
    assert len(progress) == 3
    assert sum(p["state_flushes"] for p in progress) > 0, progress
    assert sum(p["state_run_probes"] for p in progress[1:]) > 0, progress
    # The budgeted query ran into the noop sink; its state is what it wrote.
    got = read_state_arrow(str(tmp_path / "root"), variable="count").sort_by("id")
    assert got.equals(read_state_arrow(str(tmp_path / "plain"), variable="count").sort_by("id"))
    assert got.num_rows == ids and set(got.column("n").to_pylist()) == {18}
    for variable, order in (("vs", ["id", "__seq"]), ("ws", ["id", "w"])):
        sort = [(c, "ascending") for c in order]
        mine = read_state_arrow(str(tmp_path / "root"), variable=variable).sort_by(sort)
        theirs = read_state_arrow(str(tmp_path / "plain"), variable=variable).sort_by(sort)
        assert mine.equals(theirs), variable
    assert rows(want)[2][:2] == [("k0", "data", 18), ("k1", "data", 18)]


def test_schema_evolution_on_restart(spark: SparkSession, tmp_path: Path) -> None:
    inputs, root, chk = tmp_path / "in", tmp_path / "root", tmp_path / "chk"
    write_inputs(inputs, frames([("a", 1, "x")]))
    run_to_end(query(spark, inputs, root, Tally("n long"), "None"), chk)
    # A field added: existing keys read it as null; the migration is recorded.
    write_inputs(inputs, frames([("a", 1, "x")], [("a", 2, "x"), ("b", 3, "y")]))
    out = run_to_end(query(spark, inputs, root, Tally("n long, note string"), "None"), chk)
    assert rows(out) == {1: [("a", "data", 2), ("b", "data", 1)]}
    count = read_state_arrow(str(root), variable="count").sort_by("id").to_pylist()
    assert count == [{"id": "a", "n": 2, "note": None}, {"id": "b", "n": 1, "note": None}]
    meta = json.loads((root / "_snapcut_state.json").read_text())
    (migration,) = meta["migrations"]
    assert migration["first_batch"] == 1
    assert migration["changes"] == [
        {"table": "count", "added": ["note"], "removed": [], "widened": []}
    ]
    manifest = json.loads(next(root.glob("chk-*1/manifest.json")).read_text())
    assert manifest["spark"]["migrated_tables"] == ["state.count"]
    # Refused before any batch runs: a rename, a narrowing, a changed kind.
    for proc, match in (
        (Tally("n long, remark string"), "looks renamed to 'remark'"),
        (Tally("n int, note string"), "not a widening"),
    ):
        with pytest.raises(ConfigError, match=match):
            query(spark, inputs, root, proc, "None")

    class CountAsList(Tally):
        def init(self, handle: StatefulProcessorHandle) -> None:
            self.vs = handle.getValueState("vs", "v long")

    with pytest.raises(ConfigError, match="was a list state and is now a value state"):
        query(spark, inputs, root, CountAsList(), "None")


def test_level_3_state_gains_a_field_on_restart(spark: SparkSession, tmp_path: Path) -> None:
    from pyspark.sql.streaming.state import GroupStateTimeout

    inputs, root, chk = tmp_path / "in", tmp_path / "root", tmp_path / "chk"

    def count(
        key: tuple[Any, ...], pdfs: Iterator[pd.DataFrame], state: Any
    ) -> Iterator[pd.DataFrame]:
        n = sum(len(p) for p in pdfs) + (state.get[0] if state.exists else 0)
        state.update((n, *([None] * extra)))
        yield pd.DataFrame({"id": [key[0]], "kind": ["data"], "n": [n]})

    def run(state_schema: str) -> dict[int, Any]:
        df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(inputs))
        s = keyed_state(df, key="id", root=str(root), partitions=2)
        out = s.applyInPandasWithState(
            count, OUT, state_schema, "Update", GroupStateTimeout.NoTimeout
        )
        return run_to_end(out, chk)

    extra = 0
    write_inputs(inputs, frames([("a", 1, "x")]))
    run("n long")
    extra = 1
    write_inputs(inputs, frames([("a", 1, "x")], [("a", 2, "x")]))
    assert rows(run("n long, seen string")) == {1: [("a", "data", 2)]}
    state = read_state_arrow(str(root)).to_pylist()
    assert state == [{"id": "a", "n": 2, "seen": None}]
    with pytest.raises(ConfigError, match="not a widening"):
        run("n int, seen string")


def test_bad_inputs_are_refused_before_the_query_starts(
    spark: SparkSession, tmp_path: Path
) -> None:
    df = spark.readStream.schema(SCHEMA).parquet(
        str(write_inputs(tmp_path / "in", frames([("a", 1, "x")])))
    )
    s = keyed_state(df, key="id", root=str(tmp_path / "root"), partitions=2)

    class WithTtl(Tally):
        def init(self, handle: StatefulProcessorHandle) -> None:
            handle.getValueState("count", "n long", 1000)

    with pytest.raises(ConfigError, match="needs timeMode='ProcessingTime'"):
        s.transform_with_state_in_pandas(WithTtl(), OUT, "Update", "None")
    with pytest.raises(ConfigError, match="timeMode must be"):
        s.transform_with_state_in_pandas(Tally(), OUT, "Update", "Sometimes")
    with pytest.raises(ConfigError, match="needs a watermark"):
        s.transform_with_state_in_pandas(Tally(), OUT, "Update", "EventTime")
    with pytest.raises(ConfigError, match="outputMode"):
        s.transform_with_state_in_pandas(Tally(), OUT, "Complete", "None")
    with pytest.raises(ConfigError, match="subclass of"):
        s.transform_with_state_in_pandas(object(), OUT, "Update", "None")
    with pytest.raises(ConfigError, match="eventTimeColumnName='ts'"):
        s.transform_with_state_in_pandas(Tally(), OUT, "Update", "None", eventTimeColumnName="ts")


# Spark's own transformWithState runs its processor's set-up in a driver-side
# Python worker (transform_with_state_driver_worker) that has Spark's fixed
# 10 s to connect back: with the Connect tests, at full priority (conftest.py).
@pytest.mark.connect_port
def test_row_variant_on_a_batch_dataframe(spark: SparkSession, tmp_path: Path) -> None:
    class RowCount(StatefulProcessor):
        def init(self, handle: StatefulProcessorHandle) -> None:
            self.count = handle.getValueState("count", "n long")

        def handleInputRows(self, key: Any, rows: Iterator[Row], timerValues: TimerValues) -> Any:
            n = sum(1 for _ in rows)
            self.count.update((n,))
            yield Row(id=key[0], n=n)

        def close(self) -> None:
            pass

    df = spark.createDataFrame([("a", 1, "x"), ("a", 2, "x"), ("b", 3, "y")], SCHEMA)
    s = keyed_state(df, key="id", root=str(tmp_path / "root"), partitions=2)
    out = s.transform_with_state(RowCount(), "id string, n long", "Update", "None")
    assert sorted(map(tuple, out.collect())) == [("a", 2), ("b", 1)]
    spark_out = df.groupBy("id").transformWithState(
        RowCount(), "id string, n long", "Update", "None"
    )
    assert sorted(map(tuple, spark_out.collect())) == [("a", 2), ("b", 1)]


def test_level_1_gains_an_aggregate_on_restart(spark: SparkSession, tmp_path: Path) -> None:
    inputs, root, chk = tmp_path / "in", tmp_path / "root", tmp_path / "chk"

    def run(**aggregates: Any) -> dict[int, Any]:
        df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(inputs))
        s = keyed_state(df, key="id", root=str(root), partitions=2)
        return run_to_end(s.aggregate(**aggregates), chk)

    write_inputs(inputs, frames([("a", 1, "x"), ("a", 2, "x")]))
    run(n="count")
    write_inputs(inputs, frames([("a", 1, "x"), ("a", 2, "x")], [("a", 5, "x"), ("b", 7, "y")]))
    out = run(n="count", top=("max", "v"))
    got = sorted((r["id"], r["n"], r["top"]) for r in out[1].to_pylist())
    # The new aggregate starts at the restart: it has seen only the later rows.
    assert got == [("a", 3, 5), ("b", 1, 7)]
