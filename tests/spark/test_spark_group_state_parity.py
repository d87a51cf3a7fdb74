"""Spark's own cases for ``applyInPandasWithState`` run through Spark and
through snapcut's level 3 with the same function and input, compared micro-batch
by micro-batch.

Ported from ``python/pyspark/sql/tests/pandas/test_pandas_grouped_map_with_state.py``
and the Python-function cases of ``FlatMapGroupsInPandasWithStateSuite.scala``
(and the GroupState rules of ``FlatMapGroupsWithStateSuite.scala``). Spark's
``MemoryStream`` + ``AddData`` steps become one parquet file per step read with
``maxFilesPerTrigger=1`` under an ``availableNow`` trigger, so both engines see
the same micro-batches, Spark's no-data batches included; Spark's manual clock
becomes a short real one where a case needs processing time.
"""

from __future__ import annotations

import calendar
import datetime
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

from snapcut.spark import keyed_state
from spark_support import observed_progress, start_session, write_inputs

PARTITIONS = 2  # = spark.sql.shuffle.partitions of the session: the same rows meet per task
Steps = list[list[dict[str, Any]]]
PerBatch = dict[int, list[tuple[Any, ...]]]


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = start_session("local[2]")
    yield session
    session.stop()


STEP_TIMEOUT_S = 120.0
"""Bound on one step's batches (processAllAvailable has no timeout of its own)."""


class Case:
    """One of Spark's cases: input steps and the applyInPandasWithState call."""

    def __init__(
        self,
        steps: Steps,
        func: Callable[..., Any],
        output: str,
        state: str,
        timeout: str = GroupStateTimeout.NoTimeout,
        *,
        mode: str = "Update",
        key: Callable[[DataFrame], list[Any]] = lambda df: ["key"],
        event_time: bool = False,
        schema: str = "key string",
        extra: Callable[[DataFrame], DataFrame] = lambda df: df,
    ) -> None:
        self.steps, self.func, self.output, self.state = steps, func, output, state
        self.timeout, self.mode, self.key, self.event_time = timeout, mode, key, event_time
        self.schema, self.extra = schema, extra

    def source(self, spark: SparkSession, directory: Path) -> DataFrame:
        directory.mkdir(parents=True, exist_ok=True)
        df = spark.readStream.schema(self.schema).option("maxFilesPerTrigger", 1)
        frame = df.parquet(str(directory))
        if self.event_time:
            frame = frame.withColumn("eventTime", F.timestamp_seconds("t")).drop("t")
        return self.extra(frame)

    def spark_step(self, df: DataFrame, _tmp: Path) -> DataFrame:
        keys = self.key(df)
        if self.event_time:
            df = df.withWatermark("eventTime", "10 seconds")
        return df.groupBy(*keys).applyInPandasWithState(
            self.func, self.output, self.state, self.mode, self.timeout
        )

    def snapcut_step(self, df: DataFrame, tmp: Path) -> DataFrame:
        watermark = (
            {"event_time": "eventTime", "watermark": "10 seconds"} if self.event_time else {}
        )
        step = keyed_state(
            df, key=self.key(df), root=str(tmp / "state"), partitions=PARTITIONS, **watermark
        )
        return step.applyInPandasWithState(
            self.func, self.output, self.state, self.mode, self.timeout
        )

    def run(
        self, spark: SparkSession, tmp: Path, build: Callable[[DataFrame, Path], DataFrame]
    ) -> PerBatch:
        """Spark's AddData + CheckNewAnswer: one file per step, then wait until
        every batch it causes (no-data batches included) has run."""
        directory = tmp / "in"
        batches: dict[int, pa.Table] = {}

        def collect(batch_df: DataFrame, batch_id: int) -> None:
            batches[batch_id] = batch_df.toArrow()

        out = build(self.source(spark, directory), tmp)
        q = (
            out.writeStream.foreachBatch(collect)
            .outputMode(self.mode.lower())
            .option("checkpointLocation", str(tmp / "chk"))
            .start()
        )
        try:
            for i, step in enumerate(self.steps):
                tmp_file = directory / f".step-{i:03d}.parquet.tmp"
                pd.DataFrame(step).to_parquet(tmp_file, index=False)
                tmp_file.rename(directory / f"step-{i:03d}.parquet")
                wait_for_batches(q)
        finally:
            q.stop()
        if q.exception() is not None:
            raise AssertionError(str(q.exception()))
        return per_batch(batches)

    def compare(self, spark: SparkSession, tmp: Path) -> PerBatch:
        want = self.run(spark, tmp / "spark", self.spark_step)
        got = self.run(spark, tmp / "snapcut", self.snapcut_step)
        assert got == want
        return want


def wait_for_batches(q: Any) -> None:
    """``processAllAvailable``, bounded by STEP_TIMEOUT_S."""
    done = threading.Event()
    error: list[BaseException] = []

    def wait() -> None:
        try:
            q.processAllAvailable()
        except BaseException as e:
            error.append(e)
        finally:
            done.set()

    threading.Thread(target=wait, daemon=True).start()
    if not done.wait(STEP_TIMEOUT_S):
        raise AssertionError(f"the query did not finish a step's batches in {STEP_TIMEOUT_S} s")
    if error:
        raise AssertionError(f"the query failed: {error[0]}")


def per_batch(batches: dict[int, pa.Table]) -> PerBatch:
    """Non-empty batches' rows, sorted: Spark's tests check each step's new rows as a set."""
    out = {}
    for batch_id, table in sorted(batches.items()):
        rows = sorted(tuple(r.values()) for r in table.to_pylist())
        if rows:
            out[batch_id] = rows
    return out


# ---- test_pandas_grouped_map_with_state.py: basic -------------------------------------


def basic_func(key: tuple[Any, ...], pdf_iter: Iterator[pd.DataFrame], state: GroupState) -> Any:
    assert isinstance(state, GroupState)
    total_len = 0
    for pdf in pdf_iter:
        total_len += len(pdf)
    state.update((total_len,))
    assert state.get[0] == 1
    yield pd.DataFrame({"key": [key[0]], "countAsString": [str(total_len)]})


def test_basic_with_pysparks_group_state_a_column_key_and_spark_spellings(
    spark: SparkSession, tmp_path: Path
) -> None:
    case = Case(
        [[{"value": "hello"}, {"value": "this"}]],
        basic_func,
        "key string, countAsString string",
        "c long",
        mode="Update",
        key=lambda df: [df["value"]],
        schema="value string",
    )
    assert case.compare(spark, tmp_path) == {0: [("hello", "1"), ("this", "1")]}


# ---- FlatMapGroupsInPandasWithStateSuite ----------------------------------------------


def running_count_removed_at_3(
    key: tuple[Any, ...], pdf_iter: Iterator[pd.DataFrame], state: GroupState
) -> Any:
    assert state.getCurrentProcessingTimeMs() >= 0
    try:
        state.getCurrentWatermarkMs()
        raise AssertionError("no watermark: getCurrentWatermarkMs must raise")
    except RuntimeError as e:
        assert "watermark" in str(e)
    count = state.getOption
    count = 0 if count is None else count[0]
    for pdf in pdf_iter:
        count += len(pdf)
        state.update((count,))
    if count >= 3:
        state.remove()
        yield pd.DataFrame()
    else:
        yield pd.DataFrame({"key": [key[0]], "countAsString": [str(count)]})


def test_streaming_running_count_removal_and_an_empty_frame(
    spark: SparkSession, tmp_path: Path
) -> None:
    case = Case(
        [
            [{"key": "a"}],
            [{"key": "a"}, {"key": "b"}],
            [{"key": "a"}, {"key": "b"}],
            [{"key": "a"}, {"key": "c"}],
        ],
        running_count_removed_at_3,
        "key string, countAsString string",
        "count long",
    )
    assert case.compare(spark, tmp_path) == {
        0: [("a", "1")],
        1: [("a", "2"), ("b", "1")],
        2: [("b", "2")],
        3: [("a", "1"), ("c", "1")],
    }


def prev_count_func(
    key: tuple[Any, ...], pdf_iter: Iterator[pd.DataFrame], state: GroupState
) -> Any:
    prev_count = state.getOption
    prev_count = 0 if prev_count is None else prev_count[0]
    count = prev_count
    for pdf in pdf_iter:
        count += len(pdf)
        yield pdf.assign(
            valueAsString=lambda x: x.value.apply(str), prevCountAsString=str(prev_count)
        )
    state.update((count,))


def test_several_output_rows_per_key(spark: SparkSession, tmp_path: Path) -> None:
    case = Case(
        [
            [{"key": "a", "value": 1}],
            [{"key": "a", "value": 2}, {"key": "a", "value": 3}, {"key": "b", "value": 1}],
        ],
        prev_count_func,
        "key string, value long, valueAsString string, prevCountAsString string",
        "count long",
        schema="key string, value long",
    )
    assert case.compare(spark, tmp_path) == {
        0: [("a", 1, "1", "0")],
        1: [("a", 2, "2", "1"), ("a", 3, "3", "1"), ("b", 1, "1", "0")],
    }


def max_event_time_func(timestamp_as_datetime: bool) -> Callable[..., Any]:
    def func(key: tuple[Any, ...], pdf_iter: Iterator[pd.DataFrame], state: GroupState) -> Any:
        assert state.getCurrentProcessingTimeMs() >= 0
        assert state.getCurrentWatermarkMs() >= -1
        timeout_delay_sec = 5
        if state.hasTimedOut:
            state.remove()
            yield pd.DataFrame({"key": [key[0]], "maxEventTimeSec": [-1]})
        else:
            m = state.getOption
            max_event_time_sec = 0 if m is None else m[0]
            for pdf in pdf_iter:
                pser = pdf.eventTime.apply(
                    lambda dt: int(calendar.timegm(dt.utctimetuple()) + dt.microsecond)
                )
                max_event_time_sec = int(max(pser.max(), max_event_time_sec))
            state.update((max_event_time_sec,))
            timeout_sec = max_event_time_sec + timeout_delay_sec
            if timestamp_as_datetime:
                state.setTimeoutTimestamp(
                    datetime.datetime.fromtimestamp(timeout_sec, tz=datetime.UTC)
                )
            else:
                state.setTimeoutTimestamp(timeout_sec * 1000)
            yield pd.DataFrame({"key": [key[0]], "maxEventTimeSec": [max_event_time_sec]})

    return func


@pytest.mark.parametrize("as_datetime", [False, True])
def test_event_time_timeout_fires_in_a_no_data_batch_and_late_rows_follow_spark(
    spark: SparkSession, tmp_path: Path, as_datetime: bool
) -> None:
    """Max event time 15 → watermark 5 in the next batch: ("a", 4) is late,
    ("a", 10) is not (the previous batch's watermark decides); ("b", 31)
    moves the watermark to 21 and a no-data batch times "a" out."""
    case = Case(
        [
            [{"key": "a", "t": 11}, {"key": "a", "t": 13}, {"key": "a", "t": 15}],
            [{"key": "a", "t": 4}],
            [{"key": "a", "t": 10}],
            [{"key": "b", "t": 31}],
        ],
        max_event_time_func(as_datetime),
        "key string, maxEventTimeSec int",
        "maxEventTimeSec long",
        GroupStateTimeout.EventTimeTimeout,
        event_time=True,
        schema="key string, t long",
    )
    want = case.compare(spark, tmp_path)
    steps = list(want.values())
    assert steps == [[("a", 15)], [("a", 15)], [("b", 31)], [("a", -1)]]


def chunk_count_func(key: tuple[Any, ...], pdf_iter: Iterator[pd.DataFrame], _: GroupState) -> Any:
    chunk_count = 0
    for _pdf in pdf_iter:
        chunk_count += 1
    yield pd.DataFrame({"key": [key[0]], "chunkCount": [chunk_count]})


@pytest.mark.parametrize("records", [2, 4])
def test_a_keys_rows_come_in_spark_arrow_chunks(
    spark: SparkSession, tmp_path: Path, records: int
) -> None:
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(records))
    try:
        case = Case(
            [[{"key": k} for k in ["a", "b", "b", "c", "c", "c", "c", "c"]]],
            chunk_count_func,
            "key string, chunkCount int",
            "notUsed int",
        )
        got = case.compare(spark, tmp_path)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert any(n > 1 for rows in got.values() for _, n in rows)


def first_chunk_only(
    key: tuple[Any, ...], pdf_iter: Iterator[pd.DataFrame], state: GroupState
) -> Any:
    num_batches = state.getOption
    num_batches = 1 if num_batches is None else num_batches[0] + 1
    next(pdf_iter)
    state.update((num_batches,))
    yield pd.DataFrame({"key": [key[0]], "numBatches": [num_batches]})


def test_partial_consumption_of_the_iterator(spark: SparkSession, tmp_path: Path) -> None:
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "2")
    try:
        data = [{"key": "a"}] * 4 + [{"key": "b"}] * 5 + [{"key": "c"}]
        case = Case([data, data], first_chunk_only, "key string, numBatches int", "numBatches int")
        got = case.compare(spark, tmp_path)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert got == {0: [("a", 1), ("b", 1), ("c", 1)], 1: [("a", 2), ("b", 2), ("c", 2)]}


def count_or_minus_one_on_timeout(
    key: tuple[Any, ...], pdf_iter: Iterator[pd.DataFrame], state: GroupState
) -> Any:
    if state.hasTimedOut:
        state.remove()
        yield pd.DataFrame({"key1": [key[0]], "key2": [key[1]], "countAsStr": [str(-1)]})
    else:
        count = state.getOption
        count = 0 if count is None else count[0]
        for pdf in pdf_iter:
            count += len(pdf)
        state.update((count,))
        state.setTimeoutTimestamp(state.getCurrentWatermarkMs() + 1000)
        yield pd.DataFrame({"key1": [key[0]], "key2": [key[1]], "countAsStr": [str(count)]})


def test_two_column_key_of_a_timed_out_group(spark: SparkSession, tmp_path: Path) -> None:
    """SPARK-41261 with event time: the timed-out call gets its own key."""
    case = Case(
        [[{"key1": "a", "t": 1}], [{"key1": "b", "t": 30}], [{"key1": "c", "t": 60}]],
        count_or_minus_one_on_timeout,
        "key1 string, key2 string, countAsStr string",
        "count long",
        GroupStateTimeout.EventTimeTimeout,
        key=lambda df: ["key1", "key2"],
        event_time=True,
        schema="key1 string, t long",
        extra=lambda df: df.withColumn("key2", F.lit("__FAKE__")),
    )
    want = case.compare(spark, tmp_path)
    assert ("a", "__FAKE__", "-1") in [row for rows in want.values() for row in rows]


# ---- GroupState rules: timeouts on removed or absent state -----------------------------


def remove_then_time_out(
    key: tuple[Any, ...], pdf_iter: Iterator[pd.DataFrame], state: GroupState
) -> Any:
    """First call: remove (or never create) the state but set a timeout; the
    timed-out call must come, with no state."""
    rows = len(pd.concat(list(pdf_iter)))  # raises on an empty iterator: Spark passes one frame
    if not state.hasTimedOut:
        if key[0] == "a":
            state.update((1,))
            state.remove()
        state.setTimeoutTimestamp(state.getCurrentWatermarkMs() + 1000)
    yield pd.DataFrame(
        {"key": [key[0]], "timedOut": [state.hasTimedOut], "exists": [state.exists], "rows": [rows]}
    )


def test_a_timeout_on_removed_or_absent_state_fires_with_no_state(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Also: the timed-out call gets one empty frame with the input columns
    (``pd.concat(list(pdfs))`` works, 0 rows)."""
    case = Case(
        [[{"key": "a", "t": 1}, {"key": "b", "t": 1}], [{"key": "z", "t": 60}]],
        remove_then_time_out,
        "key string, timedOut boolean, exists boolean, rows long",
        "n long",
        GroupStateTimeout.EventTimeTimeout,
        event_time=True,
        schema="key string, t long",
    )
    want = case.compare(spark, tmp_path)
    fired = sorted(r for rows in want.values() for r in rows if r[1])
    assert fired == [("a", True, False, 0), ("b", True, False, 0), ("z", True, False, 0)]


# ---- processing time: a short real clock -----------------------------------------------


def expire_after_300ms(
    key: tuple[Any, ...], pdf_iter: Iterator[pd.DataFrame], state: GroupState
) -> Any:
    if state.hasTimedOut:
        state.remove()
        yield pd.DataFrame({"key": [key[0]], "countAsString": [str(-1)]})
    else:
        count = state.getOption
        count = 0 if count is None else count[0]
        for pdf in pdf_iter:
            count += len(pdf)
        state.update((count,))
        state.setTimeoutDuration(300)
        yield pd.DataFrame({"key": [key[0]], "countAsString": [str(count)]})


@pytest.mark.parametrize("engine", ["spark", "snapcut"])
def test_a_processing_time_timeout_fires_without_new_data(
    spark: SparkSession, tmp_path: Path, engine: str
) -> None:
    """Spark runs a batch on every trigger for processing-time timeouts: the
    key times out although no row arrives after its first (both engines)."""
    case = Case(
        [[{"key": "a"}]],
        expire_after_300ms,
        "key string, countAsString string",
        "count long",
        GroupStateTimeout.ProcessingTimeTimeout,
    )
    df = case.source(spark, tmp_path / "in")
    pd.DataFrame(case.steps[0]).to_parquet(tmp_path / "in" / "step-000.parquet", index=False)
    if engine == "spark":
        out = df.groupBy("key").applyInPandasWithState(
            expire_after_300ms, case.output, case.state, "Update", case.timeout
        )
    else:
        out = keyed_state(
            df, key="key", root=str(tmp_path / "state"), partitions=PARTITIONS
        ).applyInPandasWithState(
            expire_after_300ms, case.output, case.state, "Update", case.timeout
        )
    seen: list[tuple[Any, ...]] = []
    q = (
        out.writeStream.foreachBatch(lambda d, _: seen.extend(tuple(r) for r in d.collect()))
        .outputMode("update")
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    deadline = time.monotonic() + 60
    try:
        while ("a", "-1") not in seen and time.monotonic() < deadline and q.isActive:
            time.sleep(0.05)
    finally:
        q.stop()
    assert seen[:2] == [("a", "1"), ("a", "-1")]


# ---- observability ---------------------------------------------------------------------


def test_the_step_reports_its_state_figures_in_the_query_progress(
    spark: SparkSession, tmp_path: Path
) -> None:
    case = Case(
        [[{"key": k} for k in "aab"], [{"key": "c"}]],
        running_count_removed_at_3,
        "key string, countAsString string",
        "count long",
    )
    df = case.source(spark, tmp_path / "in")
    # One second apart: the file source reads by modification time.
    write_inputs(tmp_path / "in", [pd.DataFrame(step) for step in case.steps])
    out = keyed_state(
        df, key="key", root=str(tmp_path / "state"), partitions=PARTITIONS, name="counts"
    ).applyInPandasWithState(case.func, case.output, case.state, "update", case.timeout)
    progress = observed_progress(out, tmp_path / "chk", "counts")
    assert [(p["rows_in"], p["rows_out"], p["state_rows"]) for p in progress] == [
        (3, 2, 2),
        (1, 1, 3),
    ]
    assert all(p["state_bytes_written"] > 0 for p in progress)
    # Every partition's first version is a full: one run, no debt; then
    # a diff on it, which compaction would fold.
    assert progress[0]["state_fulls_written"] == PARTITIONS
    assert [p["state_stored_runs_max"] for p in progress] == [1, 2]
    assert progress[0]["state_compaction_debt_bytes"] == 0
    assert progress[1]["state_compaction_debt_bytes"] > 0


# ---- the same rules at levels 2 and 1 --------------------------------------------------


def expire_five_seconds_after(rows: Any, state: Any, info: Any) -> Any:
    """Level 2, event time: a key's timeout is its max event time + 5 s; a
    timed-out key is reported once and removed."""
    gone = state[state["__timed_out"]]["key"]
    out = [pd.DataFrame({"key": gone, "max_s": -1})]
    keep = []
    for key, group in rows.groupby("key"):
        max_s = int(group["eventTime"].max().timestamp())
        out.append(pd.DataFrame({"key": [key], "max_s": [max_s]}))
        keep.append({"key": key, "max_s": max_s, "__timeout_ms": (max_s + 5) * 1000})
    return (
        pd.concat(out, ignore_index=True),
        pd.DataFrame(keep, columns=["key", "max_s", "__timeout_ms"]),
        pd.DataFrame({"key": gone}),
    )


def test_level_2_fires_an_event_time_timeout_in_a_no_data_batch(
    spark: SparkSession, tmp_path: Path
) -> None:
    """("b", 31) moves the watermark to 21 s: "a" (timeout 16 s) fires in the
    no-data batch after it, as applyInPandasWithState's would."""
    case = Case(
        [[{"key": "a", "t": 11}], [{"key": "b", "t": 31}]],
        expire_five_seconds_after,
        "key string, max_s long",
        "max_s long",
        event_time=True,
        schema="key string, t long",
    )

    def level_2(df: DataFrame, tmp: Path) -> DataFrame:
        step = keyed_state(
            df,
            key=[df["key"]],
            root=str(tmp / "state"),
            partitions=PARTITIONS,
            event_time="eventTime",
            watermark="10 seconds",
        )
        return step.map_batches(
            expire_five_seconds_after,
            "max_s long",
            "key string, max_s long",
            timeout=GroupStateTimeout.EventTimeTimeout,
            pandas=True,
            output_mode="Update",
        )

    # Batch 1: the no-data batch of the watermark moving from 0 to 1 s.
    assert case.run(spark, tmp_path, level_2) == {0: [("a", 11)], 2: [("b", 31)], 3: [("a", -1)]}


def test_level_1_takes_a_column_key_and_spark_output_mode_spellings(
    spark: SparkSession, tmp_path: Path
) -> None:
    case = Case(
        [[{"key": "a"}, {"key": "a"}, {"key": "b"}], [{"key": "a"}]],
        chunk_count_func,
        "unused int",
        "unused int",
    )

    def level_1(df: DataFrame, tmp: Path) -> DataFrame:
        step = keyed_state(df, key=df["key"], root=str(tmp / "state"), partitions=PARTITIONS)
        return step.aggregate(output_mode="Update", n="count")

    assert case.run(spark, tmp_path, level_1) == {0: [("a", 2), ("b", 1)], 1: [("a", 3)]}


def test_bad_output_modes_and_keys_are_refused(spark: SparkSession, tmp_path: Path) -> None:
    from snapcut._core import ConfigError

    df = Case([], chunk_count_func, "unused int", "unused int").source(spark, tmp_path / "in")
    step = keyed_state(df, key="key", root=str(tmp_path / "state"), partitions=PARTITIONS)
    with pytest.raises(ConfigError, match="outputMode must be 'Update' or 'Append'"):
        step.applyInPandasWithState(
            chunk_count_func,
            "key string, chunkCount int",
            "n int",
            "Complete",
            GroupStateTimeout.NoTimeout,
        )
    with pytest.raises(ConfigError, match="key must be column names or Columns"):
        keyed_state(df, key=[3], root=str(tmp_path / "state2"), partitions=PARTITIONS)


class _Context:
    def __init__(self, **props: str) -> None:
        self.props = props

    def getLocalProperty(self, name: str) -> str | None:
        return self.props.get(name)


def test_a_streaming_task_without_its_batch_id_is_an_error_not_batch_0() -> None:
    from snapcut._core import TaskError
    from snapcut.spark.batch_identity import task_batch

    props = {"streaming.sql.batchId": "7", "sql.streaming.queryId": "q-1"}
    assert task_batch(_Context(**props), streaming=True) == (7, "q-1")
    assert task_batch(_Context(), streaming=False) == (0, "batch")
    no_batch = re.escape("lacks the local propert(ies) ['streaming.sql.batchId']")
    with pytest.raises(TaskError, match=no_batch):
        task_batch(_Context(**{"sql.streaming.queryId": "q-1"}), streaming=True)
    with pytest.raises(TaskError, match=re.escape("['sql.streaming.queryId']")):
        task_batch(_Context(**{"streaming.sql.batchId": "3"}), streaming=True)
