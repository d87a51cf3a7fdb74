"""The PySpark stateful helper, levels 1-3, against Spark itself: the same
streaming input through snapcut and through Spark's native aggregation and
``applyInPandasWithState`` gives the same output, batch by batch, including
event-time and processing-time timeouts; the state reads back with no Spark
(``snapshots.open``) and with Spark (``read_state``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupStateTimeout as SparkTimeout
from tests.spark_support import (
    concat,
    dwell_frames,
    observed_progress,
    rows_of,
    run_to_end,
    start_session,
    stream,
    write_inputs,
)

from snapcut import snapshots
from snapcut.spark import (
    GroupStateTimeout,
    StateUpdate,
    keyed_state,
    metrics,
    read_state,
    read_state_arrow,
)

FILES = 3
SESSION_KINDS = True  # tests/conftest.py: both_sessions tests also run on Connect


@pytest.fixture(scope="module")
def spark(request: pytest.FixtureRequest) -> Iterator[Any]:
    session = start_session(kind=request.param)
    yield session
    session.stop()


@pytest.fixture(scope="module")
def dwell(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pd.DataFrame]:
    frames = dwell_frames(files=FILES, rows=3000, users=300)
    directory = write_inputs(tmp_path_factory.mktemp("dwell") / "events", frames)
    return directory, pd.concat(frames, ignore_index=True)


def expected_totals(events: pd.DataFrame) -> dict[int, tuple[int, int]]:
    g = events.groupby("user")["dwell_ms"].agg(["count", "sum"])
    return {int(u): (int(r["count"]), int(r["sum"])) for u, r in g.iterrows()}


def dwell_func(
    key: tuple[Any, ...], pdfs: Iterator[pd.DataFrame], state: Any
) -> Iterator[pd.DataFrame]:
    count, total = state.get if state.exists else (0, 0)
    for pdf in pdfs:
        count += len(pdf)
        total += int(pdf["dwell_ms"].sum())
    state.update((count, total))
    yield pd.DataFrame({"user": [key[0]], "count": [count], "total": [total]})


def dwell_batch(rows: pa.Table, state: pa.Table, info: Any) -> StateUpdate:
    agg = rows.group_by("user").aggregate([("dwell_ms", "count"), ("dwell_ms", "sum")])
    joined = agg.join(state.select(["user", "count", "total"]), "user").sort_by("user")
    count = pc.add(pc.fill_null(joined["count"], 0), joined["dwell_ms_count"])
    total = pc.add(pc.fill_null(joined["total"], 0), joined["dwell_ms_sum"])
    new = pa.table({"user": joined["user"], "count": count, "total": total})
    return StateUpdate(output=new, state=new)


@pytest.mark.both_sessions
@pytest.mark.parametrize("state_writes", ["background", "sync"])
def test_aggregate_matches_spark_native_batch_by_batch(
    spark: Any, dwell: tuple[Path, pd.DataFrame], tmp_path: Path, state_writes: str
) -> None:
    directory, events = dwell
    root = tmp_path / "state"
    ours = keyed_state(
        stream(spark, directory),
        key="user",
        root=str(root),
        partitions=3,
        state_writes=state_writes,
    ).aggregate(
        count="count",
        total=("sum", "dwell_ms"),
        avg=("mean", "dwell_ms"),
        lo=("min", "dwell_ms"),
        hi=("max", "dwell_ms"),
    )
    native = (
        stream(spark, directory)
        .groupBy("user")
        .agg(
            F.count("*").alias("count"),
            F.sum("dwell_ms").alias("total"),
            F.avg("dwell_ms").alias("avg"),
            F.min("dwell_ms").alias("lo"),
            F.max("dwell_ms").alias("hi"),
        )
    )
    got = run_to_end(ours, tmp_path / "chk")
    want = run_to_end(native, tmp_path / "chk-native")
    assert sorted(got) == sorted(want) == list(range(FILES))
    for b in range(FILES):
        g, w = rows_of(got[b], ["user"]), rows_of(want[b], ["user"])
        assert [r["user"] for r in g] == [r["user"] for r in w]
        for a, e in zip(g, w, strict=True):
            assert (a["count"], a["total"], a["lo"], a["hi"]) == (
                e["count"],
                e["total"],
                e["lo"],
                e["hi"],
            )
            assert a["avg"] == pytest.approx(e["avg"], rel=1e-12)
    state = read_state_arrow(str(root))
    model = expected_totals(events)
    have = {
        r["user"]: (r["count"], r["total__sum"] if "total__sum" in r else r["total"])
        for r in state.to_pylist()
    }
    assert have == model


@pytest.mark.both_sessions
def test_a_batch_past_the_workers_input_share_is_applied_in_parts_of_whole_keys(
    spark: Any, tmp_path: Path
) -> None:
    """``state_memory="2MB"``: a task holds 512 KiB of its input. Batches of
    100k rows over 2 partitions (~1.6 MB a partition) spill to local files by
    key hash and are applied a file at a time: each user still gets one output
    row a batch, equal to Spark's own aggregation, and the progress counts
    every input row as spilled; the state equals pandas."""
    frames = dwell_frames(files=3, rows=100_000, users=50_000, seed=41)
    directory = write_inputs(tmp_path / "events", frames)
    ours = keyed_state(
        stream(spark, directory),
        "user",
        str(tmp_path / "state"),
        2,
        name="parts",
        state_memory="2MB",
    ).aggregate(count="count", total=("sum", "dwell_ms"), first=("first", "dwell_ms"))
    native = (
        stream(spark, directory)
        .groupBy("user")
        .agg(F.count("*").alias("count"), F.sum("dwell_ms").alias("total"))
    )
    progress: list[Any] = []
    got = run_to_end(ours, tmp_path / "chk", progress=progress)
    want = run_to_end(native, tmp_path / "chk-native")
    assert sorted(got) == sorted(want) == [0, 1, 2]
    for b in range(3):
        g, w = rows_of(got[b], ["user"]), rows_of(want[b], ["user"])
        assert [(r["user"], r["count"], r["total"]) for r in g] == [
            (r["user"], r["count"], r["total"]) for r in w
        ]
    # "first" keeps the first row's value a key ever had: its rows kept their order.
    events = pd.concat(frames, ignore_index=True)
    firsts = events.groupby("user")["dwell_ms"].first()
    last_rows = {r["user"]: r["first"] for b in range(3) for r in got[b].to_pylist()}
    assert last_rows == {int(u): int(v) for u, v in firsts.items()}
    figures = [metrics.observed(p, "parts") for p in progress]
    assert len(figures) == 3 and all(f is not None for f in figures), progress
    for f in figures:
        assert f is not None and f["input_rows_spilled"] == f["rows_in"] == 100_000, f
    state = read_state_arrow(str(tmp_path / "state")).to_pylist()
    have = {r["user"]: (r["count"], r.get("total__sum", r.get("total"))) for r in state}
    assert have == expected_totals(events)


@pytest.mark.both_sessions
@pytest.mark.parametrize("level", [2, 3])
def test_levels_2_and_3_past_the_workers_input_share_come_in_parts(
    spark: Any, tmp_path: Path, level: int
) -> None:
    """Level 2 (a function of per-key rows and state) and level 3 under
    ``state_memory="2MB"`` (a task holds 512 KiB of its input): batches of
    60k rows over 2 partitions (~720 KB a partition) are applied in parts of
    whole keys, and give each user the same output row a batch, and the same
    state, as the same query with no budget (taken whole; its parity with
    Spark's own ``applyInPandasWithState`` is tested below and in
    test_spark_group_state_parity). 3,000 users: a part's size is the
    input's, and level 3 calls Python once a key (at 10,000 this test took
    133 s in CI's pool)."""
    frames = dwell_frames(files=3, rows=60_000, users=3_000, seed=43)
    directory = write_inputs(tmp_path / "events", frames)
    out_schema = "user long, count long, total long"
    runs = {}
    progress: dict[str, list[Any]] = {"parts": [], "whole": []}
    for name, memory in (("parts", "2MB"), ("whole", None)):
        keyed = keyed_state(
            stream(spark, directory),
            "user",
            str(tmp_path / name),
            2,
            name=name,
            state_memory=memory,
        )
        if level == 2:
            df = keyed.map_batches(
                dwell_batch, state_schema="count long, total long", output_schema=out_schema
            )
        else:
            df = keyed.apply_in_pandas_with_state(
                dwell_func,
                out_schema,
                "count long, total long",
                "update",
                GroupStateTimeout.NoTimeout,
            )
        runs[name] = run_to_end(df, tmp_path / f"chk-{name}", progress=progress[name])
    assert sorted(runs["parts"]) == sorted(runs["whole"]) == [0, 1, 2]
    for b in range(3):
        got, want = rows_of(runs["parts"][b], ["user"]), rows_of(runs["whole"][b], ["user"])
        assert got == want and len(got) == len(set(frames[b]["user"]))
    for name, spilled in (("parts", 60_000), ("whole", 0)):
        figures = [metrics.observed(p, name) for p in progress[name]]
        assert len(figures) == 3, progress[name]
        for f in figures:
            assert f is not None and f["rows_in"] == 60_000, f
            assert f["input_rows_spilled"] == spilled, f
    have = {
        r["user"]: (r["count"], r["total"])
        for r in read_state_arrow(str(tmp_path / "parts")).to_pylist()
    }
    assert have == expected_totals(pd.concat(frames, ignore_index=True))


@pytest.mark.both_sessions
def test_three_levels_and_apply_in_pandas_with_state_agree(
    spark: Any, dwell: tuple[Path, pd.DataFrame], tmp_path: Path
) -> None:
    directory, events = dwell
    out_schema = "user long, count long, total long"
    level1 = keyed_state(stream(spark, directory), "user", str(tmp_path / "l1"), 2).aggregate(
        count="count", total=("sum", "dwell_ms")
    )
    level2 = keyed_state(stream(spark, directory), "user", str(tmp_path / "l2"), 2).map_batches(
        dwell_batch, state_schema="count long, total long", output_schema=out_schema
    )
    level3 = keyed_state(
        stream(spark, directory), "user", str(tmp_path / "l3"), 2
    ).apply_in_pandas_with_state(
        dwell_func, out_schema, "count long, total long", "update", GroupStateTimeout.NoTimeout
    )
    spark_native = (
        stream(spark, directory)
        .groupBy("user")
        .applyInPandasWithState(
            dwell_func, out_schema, "count long, total long", "update", SparkTimeout.NoTimeout
        )
    )
    runs = {
        name: run_to_end(df, tmp_path / f"chk-{name}")
        for name, df in [("l1", level1), ("l2", level2), ("l3", level3), ("spark", spark_native)]
    }
    for b in range(FILES):
        reference = rows_of(runs["spark"][b], ["user"])
        for name in ("l1", "l2", "l3"):
            assert rows_of(runs[name][b], ["user"]) == reference, (name, b)
    model = expected_totals(events)
    for name in ("l2", "l3"):
        state = read_state_arrow(str(tmp_path / name))
        assert {r["user"]: (r["count"], r["total"]) for r in state.to_pylist()} == model


def sessions(
    key: tuple[Any, ...], pdfs: Iterator[pd.DataFrame], state: Any
) -> Iterator[pd.DataFrame]:
    """Sessionization: a session closes after 90 s of event-time inactivity."""
    if state.hasTimedOut:
        start, end, n = state.get
        state.remove()
        yield pd.DataFrame({"user": [key[0]], "start_ms": [start], "end_ms": [end], "events": [n]})
        return
    start, end, n = state.get if state.exists else (None, None, 0)
    for pdf in pdfs:
        ms = pdf["ts"].astype("datetime64[ns]").astype("int64") // 1_000_000
        lo, hi = int(ms.min()), int(ms.max())
        start = lo if start is None else min(start, lo)
        end = hi if end is None else max(end, hi)
        n += len(pdf)
    state.update((start, end, n))
    state.setTimeoutTimestamp(end + 90_000)
    return
    yield


SESSION_OUT = "user long, start_ms long, end_ms long, events long"
SESSION_STATE = "start_ms long, end_ms long, events long"


@pytest.mark.both_sessions
def test_event_time_sessions_match_apply_in_pandas_with_state(spark: Any, tmp_path: Path) -> None:
    # Users come for two one-minute files and stay away for three, so the
    # watermark passes their sessions' timeouts mid-stream.
    frames = dwell_frames(files=7, rows=400, users=60, seed=11)
    for i, f in enumerate(frames):
        frames[i] = f[(f["user"] + i) % 5 >= 3]
    directory = write_inputs(tmp_path / "events", frames)
    ours = keyed_state(
        stream(spark, directory),
        "user",
        str(tmp_path / "state"),
        3,
        event_time="ts",
        watermark="30 seconds",
    ).apply_in_pandas_with_state(
        sessions, SESSION_OUT, SESSION_STATE, "append", GroupStateTimeout.EventTimeTimeout
    )
    theirs = (
        stream(spark, directory)
        .withWatermark("ts", "30 seconds")
        .groupBy("user")
        .applyInPandasWithState(
            sessions, SESSION_OUT, SESSION_STATE, "append", SparkTimeout.EventTimeTimeout
        )
    )
    got = run_to_end(ours, tmp_path / "chk", "append")
    want = run_to_end(theirs, tmp_path / "chk-spark", "append")
    closed = 0
    # Spark runs one more, data-less batch at the end to fire the last
    # timeouts; snapcut's step runs in data batches only, so compare those.
    for b in range(7):
        assert rows_of(got.get(b, pa.table({})), ["user", "start_ms"]) == rows_of(
            want[b], ["user", "start_ms"]
        ), b
        closed += want[b].num_rows
    assert closed > 20


def expiring(
    key: tuple[Any, ...], pdfs: Iterator[pd.DataFrame], state: Any
) -> Iterator[pd.DataFrame]:
    if state.hasTimedOut:
        (n,) = state.get
        state.remove()
        yield pd.DataFrame({"user": [key[0]], "n": [n], "expired": [True]})
        return
    n = (state.get[0] if state.exists else 0) + sum(len(p) for p in pdfs)
    state.update((n,))
    state.setTimeoutDuration(1)
    yield pd.DataFrame({"user": [key[0]], "n": [n], "expired": [False]})


@pytest.mark.both_sessions
def test_processing_time_timeout_matches_apply_in_pandas_with_state(
    spark: Any, tmp_path: Path
) -> None:
    frames = [
        pd.DataFrame({"user": [1, 2, 3], "dwell_ms": [1, 2, 3]}),
        pd.DataFrame({"user": [2, 4], "dwell_ms": [5, 6]}),
        pd.DataFrame({"user": [4], "dwell_ms": [7]}),
    ]
    directory = write_inputs(tmp_path / "events", frames)
    schema = "user long, dwell_ms long"
    out = "user long, n long, expired boolean"
    ours = keyed_state(
        stream(spark, directory, schema), "user", str(tmp_path / "state"), 2
    ).apply_in_pandas_with_state(
        expiring, out, "n long", "update", GroupStateTimeout.ProcessingTimeTimeout
    )
    theirs = (
        stream(spark, directory, schema)
        .groupBy("user")
        .applyInPandasWithState(
            expiring, out, "n long", "update", SparkTimeout.ProcessingTimeTimeout
        )
    )
    # Both run a batch on every trigger from then on (Spark's no-data batches
    # for processing-time timeouts): the three batches of data are compared.
    got = run_to_end(ours, tmp_path / "chk", stop_after=3)
    want = run_to_end(theirs, tmp_path / "chk-spark", stop_after=3)
    for b in range(3):
        assert rows_of(got[b], ["user", "expired"]) == rows_of(want[b], ["user", "expired"]), b
    expired = [r["user"] for r in concat(got, lambda b: b < 3).to_pylist() if r["expired"]]
    assert sorted(expired) == [1, 2, 3]


def expire_batch(rows: pa.Table, state: pa.Table, info: Any) -> StateUpdate:
    """Level 2 with processing-time timeouts: counts per key, a key with no
    rows for one batch expires (reported once, then removed)."""
    timed_out = state.filter(state["__timed_out"])
    live = state.filter(pc.invert(state["__timed_out"]))
    agg = rows.group_by("user").aggregate([("dwell_ms", "count")])
    joined = agg.join(live.select(["user", "n"]), "user")
    n = pc.add(pc.fill_null(joined["n"], 0), joined["dwell_ms_count"])
    new = pa.table(
        {
            "user": joined["user"],
            "n": n,
            "__timeout_ms": pa.array([info.processing_time_ms + 1] * len(n), pa.int64()),
        }
    )
    output = pa.concat_tables(
        [
            pa.table(
                {"user": joined["user"], "n": n, "expired": pa.array([False] * len(n), pa.bool_())}
            ),
            pa.table(
                {
                    "user": timed_out["user"],
                    "n": timed_out["n"],
                    "expired": pa.array([True] * timed_out.num_rows, pa.bool_()),
                }
            ),
        ]
    )
    return StateUpdate(output=output, state=new, remove=timed_out.select(["user"]))


def test_map_batches_timeouts_flag_expired_keys(spark: Any, tmp_path: Path) -> None:
    """Without Spark's no-data batches (switched off, as Spark allows), timeouts
    fire in the batches that have data."""
    frames = [
        pd.DataFrame({"user": [1, 2, 3, 3], "dwell_ms": [1, 2, 3, 4]}),
        pd.DataFrame({"user": [2, 4], "dwell_ms": [5, 6]}),
        pd.DataFrame({"user": [4], "dwell_ms": [7]}),
    ]
    directory = write_inputs(tmp_path / "events", frames)
    spark.conf.set("spark.sql.streaming.noDataMicroBatches.enabled", "false")
    try:
        ours = keyed_state(
            stream(spark, directory, "user long, dwell_ms long"), "user", str(tmp_path / "state"), 2
        ).map_batches(
            expire_batch,
            state_schema="n long",
            output_schema="user long, n long, expired boolean",
            timeout=GroupStateTimeout.ProcessingTimeTimeout,
        )
        got = run_to_end(ours, tmp_path / "chk")
    finally:
        spark.conf.unset("spark.sql.streaming.noDataMicroBatches.enabled")
    expired = {b: sorted(r["user"] for r in t.to_pylist() if r["expired"]) for b, t in got.items()}
    assert expired == {0: [], 1: [1, 3], 2: [2]}
    assert {r["user"]: r["n"] for r in got[1].to_pylist() if r["expired"]} == {1: 1, 3: 2}
    state = read_state_arrow(str(tmp_path / "state"))
    assert state.column("user").to_pylist() == [4]


def test_batch_dataframe_is_one_epoch(
    spark: Any, dwell: tuple[Path, pd.DataFrame], tmp_path: Path
) -> None:
    _, events = dwell
    df = spark.createDataFrame(events[["user", "dwell_ms"]])
    root = tmp_path / "state"
    out = keyed_state(df, "user", str(root), 2).aggregate(n="count", total=("sum", "dwell_ms"))
    rows = out.toArrow()
    model = expected_totals(events)
    assert {r["user"]: (r["n"], r["total"]) for r in rows.to_pylist()} == model
    snaps = snapshots.open(root)
    assert snaps.list() == [0]


@pytest.mark.both_sessions
def test_composite_keys_and_state_reads_back_with_and_without_spark(
    spark: Any, tmp_path: Path
) -> None:
    frames = dwell_frames(files=FILES, rows=3000, users=300, drift=100)
    directory = write_inputs(tmp_path / "events", frames)
    events = pd.concat(frames, ignore_index=True)
    root = tmp_path / "state"
    df = stream(spark, directory).withColumn("day", F.to_date("ts"))
    out = keyed_state(df, ["user", "day"], str(root), 3, full_every=2).aggregate(
        n="count", first_ms=("first", "dwell_ms")
    )
    got = run_to_end(out, tmp_path / "chk")
    assert set(got[FILES - 1].column_names) == {"user", "day", "n", "first_ms"}
    events = events.assign(day=events["ts"].dt.date)
    model = events.groupby(["user", "day"]).size().to_dict()
    # The state with no Spark: every committed batch is a snapcut checkpoint.
    snaps = snapshots.open(root)
    assert snaps.list() == list(range(FILES))
    latest = snaps.latest()
    assert latest.protocol == "spark-microbatch"
    assert latest.manifest["spark"]["partitions"] == 3
    kinds = [f["kind"] for c in snaps for f in c.files if f["role"] == "state"]
    assert "diff" in kinds and "full" in kinds
    parts = [latest.state("state", p) for p in range(3)]
    no_spark = pa.concat_tables(parts)
    assert {(r["user"], r["day"]): r["n"] for r in no_spark.to_pylist()} == model
    # ... and read in parallel by Spark.
    with_spark = read_state(spark, str(root)).toArrow()
    assert {(r["user"], r["day"]): r["n"] for r in with_spark.to_pylist()} == model
    # An older batch is there too.
    first = read_state_arrow(str(root), batch=0)
    assert pc.sum(first["n"]).as_py() == 3000 < pc.sum(no_spark["n"]).as_py()


@pytest.mark.both_sessions
def test_initial_state_bootstraps_the_query(spark: Any, tmp_path: Path) -> None:
    frames = [pd.DataFrame({"user": [1, 2], "dwell_ms": [10, 20]})]
    directory = write_inputs(tmp_path / "events", frames)
    initial = spark.createDataFrame(
        pd.DataFrame({"user": [1, 3], "count": [100, 7], "total": [1000, 70]})
    )
    ours = keyed_state(
        stream(spark, directory, "user long, dwell_ms long"),
        "user",
        str(tmp_path / "state"),
        3,
        initial_state=initial,
    ).apply_in_pandas_with_state(
        dwell_func,
        "user long, count long, total long",
        "count long, total long",
        "update",
        GroupStateTimeout.NoTimeout,
    )
    got = run_to_end(ours, tmp_path / "chk")
    assert rows_of(got[0], ["user"]) == [
        {"user": 1, "count": 101, "total": 1010},
        {"user": 2, "count": 1, "total": 20},
    ]
    state = read_state_arrow(str(tmp_path / "state"))
    assert {r["user"]: r["count"] for r in state.to_pylist()} == {1: 101, 2: 1, 3: 7}
    # From another root's batch, through Spark's partitioning of this root.
    again = keyed_state(
        stream(spark, directory, "user long, dwell_ms long"),
        "user",
        str(tmp_path / "state2"),
        2,
        initial_state=(str(tmp_path / "state"), 0),
    ).apply_in_pandas_with_state(
        dwell_func,
        "user long, count long, total long",
        "count long, total long",
        "update",
        GroupStateTimeout.NoTimeout,
    )
    got2 = run_to_end(again, tmp_path / "chk2")
    assert {r["user"]: r["count"] for r in got2[0].to_pylist()} == {1: 102, 2: 2}


def test_bad_keys_and_options_fail_before_any_batch(
    spark: Any, dwell: tuple[Path, pd.DataFrame], tmp_path: Path
) -> None:
    from snapcut import ConfigError

    directory, _ = dwell
    events = stream(spark, directory)
    with pytest.raises(ConfigError, match="key column 'nope' is not in the DataFrame"):
        keyed_state(events, "nope", str(tmp_path / "s"), 2)
    with pytest.raises(ConfigError, match=r"cannot key state.*cast floats"):
        keyed_state(events.withColumn("f", F.col("dwell_ms") / 2), "f", str(tmp_path / "s"), 2)
    with pytest.raises(ConfigError, match="event_time= and watermark= go together"):
        keyed_state(events, "user", str(tmp_path / "s"), 2, event_time="ts")
    with pytest.raises(ConfigError, match="state_writes='later' is not one of"):
        keyed_state(events, "user", str(tmp_path / "s"), 2, state_writes="later")
    ks = keyed_state(events, "user", str(tmp_path / "s"), 2)
    with pytest.raises(ConfigError, match="unknown function"):
        ks.aggregate(x=("median", "dwell_ms"))
    with pytest.raises(ConfigError, match="EventTimeTimeout needs a watermark"):
        ks.apply_in_pandas_with_state(
            dwell_func, "user long", "n long", "update", GroupStateTimeout.EventTimeTimeout
        )
    ks.aggregate(n="count")
    with pytest.raises(ConfigError, match="partitions=2; this query asks partitions=3"):
        keyed_state(events, "user", str(tmp_path / "s"), 3).aggregate(n="count")
    with pytest.raises(ConfigError, match="'n' changed from int64 not null to int64"):
        keyed_state(events, "user", str(tmp_path / "s"), 2).aggregate(n=("max", "dwell_ms"))


def test_bad_data_fails_the_query_with_a_clear_message(spark: Any, tmp_path: Path) -> None:
    frames = [pd.DataFrame({"user": pd.array([1, None, 3], dtype="Int64"), "dwell_ms": [1, 2, 3]})]
    directory = write_inputs(tmp_path / "events", frames)
    events = stream(spark, directory, "user long, dwell_ms long")
    nulls = keyed_state(events, "user", str(tmp_path / "nulls"), 2).aggregate(n="count")
    with pytest.raises(Exception, match=r"null.*isNotNull"):
        run_to_end(nulls, tmp_path / "chk-nulls")

    def wrong(rows: pa.Table, state: pa.Table, info: Any) -> StateUpdate:
        return StateUpdate(output=pa.table({"user": rows["user"]}))

    clean = write_inputs(tmp_path / "clean", [pd.DataFrame({"user": [1, 2], "dwell_ms": [1, 2]})])
    events = stream(spark, clean, "user long, dwell_ms long")
    bad_output = keyed_state(events, "user", str(tmp_path / "wrong"), 2).map_batches(
        wrong, state_schema="n long", output_schema="user long, n long"
    )
    with pytest.raises(Exception, match=r"lacks column\(s\) \['n'\]"):
        run_to_end(bad_output, tmp_path / "chk-wrong")


def test_a_second_query_on_the_same_root_is_refused(spark: Any, tmp_path: Path) -> None:
    directory = write_inputs(tmp_path / "events", [pd.DataFrame({"user": [1], "dwell_ms": [1]})])
    root = str(tmp_path / "state")

    def query() -> Any:
        events = stream(spark, directory, "user long, dwell_ms long")
        return keyed_state(events, "user", root, 2).aggregate(n="count")

    run_to_end(query(), tmp_path / "chk-a")
    with pytest.raises(Exception, match="belongs to query"):
        run_to_end(query(), tmp_path / "chk-b")
    assert snapshots.open(root).list() == [0]


@pytest.mark.both_sessions
def test_a_memory_budget_spills_state_and_reports_it(spark: Any, tmp_path: Path) -> None:
    """``state_memory="2MB"`` per Python worker (1 MiB for the table of the
    partition a task works on): each partition's table (~30k keys, a few MB)
    flushes to local runs and reads them back; the state and the output
    equal pandas, and the query progress counts the rows flushed and the
    keys looked up in the runs. The Spark conf gives the default, and a
    budget that cannot work fails before any batch."""
    from snapcut import ConfigError
    from snapcut.snapshots.run_cache import DEFAULT_RUN_CACHE_BYTES, RunCacheSpec
    from snapcut.spark import RUN_CACHE_DIR_CONF, RUN_CACHE_SIZE_CONF, STATE_MEMORY_CONF

    frames = dwell_frames(files=3, rows=40_000, users=60_000, seed=37)
    directory = write_inputs(tmp_path / "events", frames)
    events = pd.concat(frames, ignore_index=True)
    ks = keyed_state(
        stream(spark, directory), "user", str(tmp_path / "state"), 2, name="big", state_memory="2MB"
    )
    assert ks.options.state_memory == 2 << 20
    out = ks.aggregate(count="count", total=("sum", "dwell_ms"))
    progress = observed_progress(out, tmp_path / "chk", "big")
    assert len(progress) == 3
    assert sum(p["state_rows_flushed"] for p in progress) > 0, progress
    assert sum(p["state_run_probes"] for p in progress) > 0, progress
    assert max(p["state_runs_max"] for p in progress) >= 1, progress
    assert sum(p["state_cache_hits"] + p["state_cache_misses"] for p in progress) == 3 * 2
    state = read_state_arrow(str(tmp_path / "state")).to_pylist()
    have = {r["user"]: (r["count"], r.get("total__sum", r.get("total"))) for r in state}
    assert have == expected_totals(events)
    spark.conf.set(STATE_MEMORY_CONF, "64MB")
    try:
        fresh = keyed_state(stream(spark, directory), "user", str(tmp_path / "s2"), 2)
        assert fresh.options.state_memory == 64 << 20
        spark.conf.set(STATE_MEMORY_CONF, "12 parsecs")
        with pytest.raises(ConfigError, match="not a size"):
            keyed_state(stream(spark, directory), "user", str(tmp_path / "s3"), 2)
    finally:
        spark.conf.unset(STATE_MEMORY_CONF)
    with pytest.raises(ConfigError, match="below the minimum of 1048576 bytes"):
        keyed_state(stream(spark, directory), "user", str(tmp_path / "s4"), 2, state_memory=4096)
    # 1 MiB parses, but half of it cannot hold a table.
    small = keyed_state(
        stream(spark, directory), "user", str(tmp_path / "s5"), 2, state_memory="1MB"
    )
    with pytest.raises(ConfigError, match="below the minimum of 2097152 bytes"):
        small.aggregate(count="count")
    # The run cache of remote roots: 2 GiB under each worker's temp dir unless
    # the confs or the arguments say otherwise; a size that does not parse fails.
    assert ks.options.run_cache == RunCacheSpec(None, DEFAULT_RUN_CACHE_BYTES)
    spark.conf.set(RUN_CACHE_SIZE_CONF, "512MB")
    spark.conf.set(RUN_CACHE_DIR_CONF, str(tmp_path / "run-cache"))
    try:
        cached = keyed_state(stream(spark, directory), "user", str(tmp_path / "s6"), 2)
        assert cached.options.run_cache == RunCacheSpec(str(tmp_path / "run-cache"), 512 << 20)
        spark.conf.set(RUN_CACHE_SIZE_CONF, "lots")
        with pytest.raises(ConfigError, match="run cache size 'lots' is not a size"):
            keyed_state(stream(spark, directory), "user", str(tmp_path / "s7"), 2)
    finally:
        spark.conf.unset(RUN_CACHE_SIZE_CONF)
        spark.conf.unset(RUN_CACHE_DIR_CONF)
    off = keyed_state(stream(spark, directory), "user", str(tmp_path / "s8"), 2, run_cache_size=0)
    assert not off.options.run_cache.enabled
