"""``spark.readStream.format("snapcut")`` on a sink root, chained: query A
(events → ``keyed_state`` aggregate → ``ArrowSnapshotSink``) and query B
(A's sink root as a stream → its own aggregate → its own sink). B's output
equals pandas over A's committed rows and A's input; B re-run after A
committed more reads only the new batches; B failed mid-way and restarted
from its checkpoint reads every batch of A once; a retention gap, a state
root and bad options fail with typed, named errors. The reader's offsets and
planning are also checked directly on a real sink root (no Spark). The
chain itself also runs on Spark Connect; the other cases exercise the
reader, the same on both kinds of session, on a classic one only (the
Connect tests run alone in CI, so each costs its whole time there)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
from tests.spark_support import dwell_frames, start_session, stream

from snapcut import ConfigError, SnapshotError, snapshots
from snapcut.spark import ArrowSnapshotSink, keyed_state, read_output_arrow
from snapcut.spark.sink.root import SinkRoot, read_batch_output_arrow
from snapcut.spark.source.options import parse
from snapcut.spark.source.register import register
from snapcut.spark.source.stream import SinkStreamReader

# Spark starts a Python data source's stream reader as a fresh Python
# process and gives it a fixed 10 s to connect back, which a loaded machine
# can miss; in CI these tests run with the Connect tests, alone.
pytestmark = [pytest.mark.spark, pytest.mark.connect_port]

FILES = 4
SESSION_KINDS = True  # tests/conftest.py: both_sessions tests also run on Connect


@pytest.fixture(scope="module")
def spark(request: pytest.FixtureRequest) -> Iterator[Any]:
    session = start_session("local[2,4]", kind=request.param)
    register(session)
    yield session
    session.stop()


@pytest.fixture(scope="module")
def frames() -> list[pd.DataFrame]:
    return dwell_frames(files=FILES, rows=400, users=30, seed=11)


def add_inputs(directory: Path, frames: list[pd.DataFrame], first: int) -> None:
    """Frames `first`.. as parquet files part-<i>; each file a second newer
    than the one before (the file source reads in modification order), all
    newer than files written by an earlier call."""
    directory.mkdir(parents=True, exist_ok=True)
    now = time.time()
    for i, frame in enumerate(frames[first:], start=first):
        tmp = directory / f".part-{i:05d}.tmp"
        frame.to_parquet(tmp, index=False, coerce_timestamps="us", allow_truncated_timestamps=True)
        path = directory / f"part-{i:05d}.parquet"
        tmp.rename(path)
        stamp = now - 100 + i
        os.utime(path, (stamp, stamp))


def run_query(df: Any, sink: Any, checkpoint: Path) -> None:
    """Runs `df` into the foreachBatch `sink` to the end of its input (availableNow)."""
    q = (
        df.writeStream.foreachBatch(sink)
        .outputMode("update")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    if q.exception() is not None:
        raise RuntimeError(str(q.exception()))


def failure(df: Any, sink: Any, checkpoint: Path) -> str:
    """The error of starting/running `df` into `sink` ("" if it ran)."""
    try:
        run_query(df, sink, checkpoint)
    except Exception as e:
        return str(e)
    return ""


class Chain:
    """Query A and query B of one test, in `tmp`."""

    def __init__(self, spark: Any, tmp: Path) -> None:
        self.spark, self.tmp = spark, tmp
        self.input = tmp / "events"
        self.a_out, self.b_out = tmp / "a-out", tmp / "b-out"

    def run_a(self) -> None:
        ks = keyed_state(stream(self.spark, self.input), "user", str(self.tmp / "a-state"), 2)
        averages = ks.aggregate(count="count", total=("sum", "dwell_ms"))
        chk = self.tmp / "a-chk"
        sink = ArrowSnapshotSink(
            str(self.a_out),
            output_mode="update",
            key="user",
            state=ks,
            checkpoint_location=str(chk),
        )
        run_query(averages, sink, chk)

    def b_frame(self, **options: Any) -> Any:
        return self.spark.readStream.format("snapcut").options(**options).load(str(self.a_out))

    def b_query(self, chk: str = "b-chk", **options: Any) -> tuple[Any, Any]:
        """B's aggregate over A's rows: how many rows per user, the sums of
        A's running counts and totals, and their maxima (A's final figures)."""
        ks = keyed_state(self.b_frame(**options), "user", str(self.tmp / f"{chk}-state"), 2)
        agg = ks.aggregate(
            rows="count",
            count_sum=("sum", "count"),
            total_sum=("sum", "total"),
            count_max=("max", "count"),
            total_max=("max", "total"),
        )
        return ks, agg

    def run_b(self, chk: str = "b-chk", out: Path | None = None, **options: Any) -> None:
        out = self.b_out if out is None else out
        ks, agg = self.b_query(chk, **options)
        checkpoint = self.tmp / chk
        sink = ArrowSnapshotSink(
            str(out),
            output_mode="update",
            key="user",
            state=ks,
            checkpoint_location=str(checkpoint),
        )
        run_query(agg, sink, checkpoint)

    def a_rows(self, upto: int | None = None) -> pd.DataFrame:
        """A's committed rows of every batch (up to `upto`), as written."""
        ids = [m["checkpoint_id"] for m in _manifests(self.a_out)]
        tables = [
            read_batch_output_arrow(str(self.a_out), b) for b in ids if upto is None or b <= upto
        ]
        return pa.concat_tables(tables).to_pandas()

    def b_offsets(self, chk: str = "b-chk") -> dict[int, dict[str, Any]]:
        """B's source offset of each of its micro-batches (Spark's offset log)."""
        out = {}
        for p in (self.tmp / chk / "offsets").iterdir():
            if p.name.isdigit():
                out[int(p.name)] = json.loads(p.read_text().splitlines()[2])
        return out


def sink_for(root: Path, ks: Any, checkpoint: Path) -> ArrowSnapshotSink:
    """An update sink keyed by user, committing `ks`'s state with each batch."""
    return ArrowSnapshotSink(
        str(root), output_mode="update", key="user", state=ks, checkpoint_location=str(checkpoint)
    )


def _manifests(root: Path) -> list[dict[str, Any]]:
    backend = SinkRoot(str(root)).backend()
    return [backend.manifest(b) for b in backend.complete()]


def b_expected(a_rows: pd.DataFrame) -> dict[int, tuple[int, int, int, int, int]]:
    """B's final row per user, in pandas over A's committed rows."""
    g = a_rows.groupby("user").agg(
        rows=("count", "size"),
        count_sum=("count", "sum"),
        total_sum=("total", "sum"),
        count_max=("count", "max"),
        total_max=("total", "max"),
    )
    return {int(u): tuple(int(v) for v in r) for u, r in g.iterrows()}  # type: ignore[misc]


def b_result(root: Path) -> dict[int, tuple[int, int, int, int, int]]:
    rows = read_output_arrow(str(root)).to_pylist()
    cols = ("rows", "count_sum", "total_sum", "count_max", "total_max")
    out = {r["user"]: tuple(r[c] for c in cols) for r in rows}
    assert len(out) == len(rows), "one row per user"
    return out  # type: ignore[return-value]


def totals(events: pd.DataFrame) -> dict[int, tuple[int, int]]:
    g = events.groupby("user")["dwell_ms"].agg(["count", "sum"])
    return {int(u): (int(r["count"]), int(r["sum"])) for u, r in g.iterrows()}


# --- the chain ----------------------------------------------------------------


@pytest.mark.both_sessions
def test_b_equals_pandas_over_a_and_a_rerun_reads_only_the_new_batches(
    spark: Any, frames: list[pd.DataFrame], tmp_path: Path
) -> None:
    chain = Chain(spark, tmp_path)
    add_inputs(chain.input, frames[:2], 0)
    chain.run_a()
    chain.run_b()  # B starts after A's first two batches
    assert [m["checkpoint_id"] for m in _manifests(chain.a_out)] == [0, 1]
    first = chain.a_rows()
    assert b_result(chain.b_out) == b_expected(first)
    assert chain.b_offsets() == {0: {"batch_id": 1}}

    add_inputs(chain.input, frames, 2)
    chain.run_a()
    chain.run_b()  # from B's checkpoint: A's batches 2 and 3 only
    assert [m["checkpoint_id"] for m in _manifests(chain.a_out)] == [0, 1, 2, 3]
    every = chain.a_rows()
    assert len(every) > len(first)
    assert b_result(chain.b_out) == b_expected(every)
    assert chain.b_offsets() == {0: {"batch_id": 1}, 1: {"batch_id": 3}}
    # End to end: B's maxima are A's final figures, pandas over A's input.
    result = b_result(chain.b_out)
    want = totals(pd.concat(frames, ignore_index=True))
    assert {u: (r[3], r[4]) for u, r in result.items()} == want
    # B's batch 1 holds exactly the users A's batches 2-3 touched.
    b1 = read_batch_output_arrow(str(chain.b_out), 1).to_pandas()
    assert sorted(b1["user"]) == sorted(set(every["user"][len(first) :]))
    # Nothing new: B runs no batch.
    chain.run_b()
    assert sorted(chain.b_offsets()) == [0, 1]


def test_max_batches_per_trigger_and_a_restart_from_the_checkpoint_read_each_batch_once(
    spark: Any, frames: list[pd.DataFrame], tmp_path: Path
) -> None:
    chain = Chain(spark, tmp_path)
    add_inputs(chain.input, frames, 0)
    chain.run_a()
    marker = tmp_path / "fail-after-commit"
    marker.write_text("1")
    ks, agg = chain.b_query(maxBatchesPerTrigger=1)
    checkpoint = tmp_path / "b-chk"
    sink = ArrowSnapshotSink(
        str(chain.b_out),
        output_mode="update",
        key="user",
        state=ks,
        checkpoint_location=str(checkpoint),
    )
    error = failure(agg, FailAfterCommit(sink, str(marker)), checkpoint)
    assert "injected failure after B committed batch 1" in error
    # B committed its batches 0 and 1 (A's 0 and 1); Spark committed only 0.
    assert [m["checkpoint_id"] for m in _manifests(chain.b_out)] == [0, 1]
    assert not (checkpoint / "commits" / "1").exists()
    marker.unlink()
    chain.run_b(maxBatchesPerTrigger=1)  # Spark re-runs batch 1 (the sink skips it), then 2, 3
    assert chain.b_offsets() == {b: {"batch_id": b} for b in range(FILES)}
    assert [m["checkpoint_id"] for m in _manifests(chain.b_out)] == list(range(FILES))
    assert b_result(chain.b_out) == b_expected(chain.a_rows())
    # B's batch b read A's batch b alone: its update rows are A's batch b's users.
    for b in range(FILES):
        b_users = read_batch_output_arrow(str(chain.b_out), b)["user"].to_pylist()
        a_users = read_batch_output_arrow(str(chain.a_out), b)["user"].to_pylist()
        assert sorted(b_users) == sorted(a_users)


class FailAfterCommit:
    """B's foreachBatch: the sink, then a failure once it committed the batch
    named in `marker` (while the marker exists): Spark has not committed it."""

    def __init__(self, sink: ArrowSnapshotSink, marker: str) -> None:
        self.sink, self.marker = sink, marker

    def __call__(self, df: Any, batch_id: int) -> None:
        self.sink(df, batch_id)
        if os.path.exists(self.marker) and Path(self.marker).read_text() == str(batch_id):
            raise RuntimeError(f"injected failure after B committed batch {batch_id}")


# --- errors -------------------------------------------------------------------


def test_a_retention_gap_fails_b_with_the_root_the_batch_and_the_fix(
    spark: Any, frames: list[pd.DataFrame], tmp_path: Path
) -> None:
    chain = Chain(spark, tmp_path)
    add_inputs(chain.input, frames[:2], 0)
    chain.run_a()
    chain.run_b()  # B has read A's batches 0..1
    add_inputs(chain.input, frames, 2)
    chain.run_a()
    pruned = snapshots.prune(str(chain.a_out), keep=1)
    assert pruned.kept == [3] and pruned.removed == [0, 1, 2]
    with pytest.raises(Exception) as info:
        chain.run_b()
    error = str(info.value)
    assert "SnapshotError" in error
    assert f"sink root {chain.a_out} no longer holds batch 2" in error
    assert "the oldest batch the root holds is 3" in error
    assert "needs batches 2..3" in error
    assert ".option('startingBatchId', 3)" in error and "larger --keep" in error
    # The fix: a new checkpoint starting at the oldest batch held reads batch 3 alone.
    with pytest.raises(Exception, match="no longer holds batch 0"):
        chain.run_b(chk="b-chk-new", out=tmp_path / "b-out-new")
    chain.run_b(chk="b-chk-3", out=tmp_path / "b-out-3", startingBatchId=3)
    assert chain.b_offsets("b-chk-3") == {0: {"batch_id": 3}}
    assert b_result(tmp_path / "b-out-3") == b_expected(chain.a_rows())


def test_a_state_root_and_bad_options_are_refused_naming_them(
    spark: Any, frames: list[pd.DataFrame], tmp_path: Path
) -> None:
    chain = Chain(spark, tmp_path)
    add_inputs(chain.input, frames[:1], 0)
    chain.run_a()

    def b_failure(frame: Any, name: str) -> str:
        return failure(frame, _drop, tmp_path / name)

    state = spark.readStream.format("snapcut").load(str(tmp_path / "a-state"))
    error = b_failure(state, "chk-state")
    assert "readStream.format('snapcut') reads a sink root's committed batches" in error
    assert "is a state root" in error
    error = b_failure(chain.b_frame(batchId=0), "chk-batch-id")
    assert "option 'batchId' does not apply to spark.readStream" in error
    assert "ConfigError" in error
    for options, text in (
        ({"maxBatchesPerTrigger": "0"}, "option 'maxBatchesPerTrigger' must be at least 1"),
        ({"maxBatchesPerTrigger": "x"}, "option 'maxBatchesPerTrigger' must be an integer"),
        ({"startingBatchId": "-1"}, "option 'startingBatchId' must be at least 0"),
        ({"nope": "1"}, "unknown option 'nope'"),
        ({"variable": "x"}, "option 'variable' reads a state root"),
    ):
        try:
            frame = chain.b_frame(**options)
        except Exception as e:  # schema() runs at load on a classic session
            assert text in str(e)
            continue
        assert text in b_failure(frame, "chk-" + next(iter(options))), options


def _drop(df: Any, batch_id: int) -> None:
    df.count()


# --- the reader itself, on a real sink root -----------------------------------


def test_offsets_and_partitions_on_the_reader(
    spark: Any, frames: list[pd.DataFrame], tmp_path: Path
) -> None:
    chain = Chain(spark, tmp_path)
    add_inputs(chain.input, frames, 0)
    chain.run_a()
    root = SinkRoot(str(chain.a_out))

    def reader(**options: str) -> SinkStreamReader:
        return SinkStreamReader(root, parse({"path": str(chain.a_out), **options}))

    r = reader()
    assert r.initialOffset() == {"batch_id": -1}
    assert r.latestOffset({"batch_id": -1}, None) == {"batch_id": 3}
    assert r.latestOffset() == {"batch_id": 3}  # Spark before 4.2: no start
    assert r.latestOffset({"batch_id": 3}, None) == {"batch_id": 3}  # nothing new
    assert r.reportLatestOffset() == {"batch_id": 3}
    capped = reader(maxBatchesPerTrigger="3")
    assert capped.latestOffset({"batch_id": -1}, None) == {"batch_id": 2}
    assert capped.latestOffset({"batch_id": 2}, None) == {"batch_id": 3}
    assert reader(startingBatchId="2").initialOffset() == {"batch_id": 1}
    # One partition per committed output file, in batch order; planned twice, the same.
    parts = r.partitions({"batch_id": 0}, {"batch_id": 2})
    files = [
        (m["checkpoint_id"], f)
        for m in _manifests(chain.a_out)[1:3]
        for f in m["files"]
        if f["role"] == "output"
    ]
    assert [p.value for p in parts] == files
    assert [p.value for p in r.partitions({"batch_id": 0}, {"batch_id": 2})] == [
        p.value for p in parts
    ]
    assert r.partitions({"batch_id": 2}, {"batch_id": 2}) == []
    rows = pa.Table.from_batches([b for p in parts for b in r.read(p)])
    want = pa.concat_tables(read_batch_output_arrow(str(chain.a_out), b) for b in (1, 2))
    assert rows.num_rows == want.num_rows > 0
    assert sorted(rows.to_pylist(), key=str) == sorted(want.to_pylist(), key=str)
    # availableNow: batches committed after the query started are not offered.
    r.prepareForTriggerAvailableNow()
    assert r._target == 3
    # A staged batch (no manifest) is never offered nor planned.
    (chain.a_out / snapshots.checkpoint_dir_name(4)).mkdir()  # what a batch mid-commit leaves on S3
    assert r.latestOffset({"batch_id": 3}, None) == {"batch_id": 3}
    assert reader().latestOffset({"batch_id": 3}, None) == {"batch_id": 3}
    with pytest.raises(SnapshotError, match=r"is to read batches 4\.\.4 of sink root"):
        reader().partitions({"batch_id": 3}, {"batch_id": 4})
    # A checkpoint of another source, a rolled-back root.
    with pytest.raises(SnapshotError, match="is not one of format"):
        r.partitions({"logOffset": 1}, {"batch_id": 2})
    with pytest.raises(SnapshotError, match=r"has read up to batch 9 of sink root .* newest"):
        r.latestOffset({"batch_id": 9}, None)
    with pytest.raises(ConfigError, match="option 'batchId' does not apply"):
        reader(batchId="1")
    # Retention: the gap names the root, the batch and the oldest batch held.
    snapshots.prune(str(chain.a_out), keep=2)
    gap = r"no longer holds batch 1: .* oldest batch the root holds is 2"
    with pytest.raises(SnapshotError, match=gap):
        reader().partitions({"batch_id": 0}, {"batch_id": 3})
    held = reader().partitions({"batch_id": 1}, {"batch_id": 3})
    assert [p.value for p in held] == [(b, f) for b, f in files if b == 2] + [
        (3, f) for f in _manifests(chain.a_out)[-1]["files"] if f["role"] == "output"
    ]
