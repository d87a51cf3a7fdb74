"""What the sink tests share (test_spark_sink.py, test_spark_sink_delta.py,
test_spark_sink_iceberg.py): the classic session with executor failpoints
and the dwell-event input (fixtures, imported by the table-output test
modules: pytest finds them in a module's namespace), a driver failure at a
crash point, a streaming run, and the row and per-key comparisons."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
from tests.spark_support import dwell_frames, is_connect, start_session, write_inputs

from snapcut import snapshots
from snapcut.spark import ArrowSnapshotSink
from snapcut.spark import failpoints as fp

FILES = 3


@pytest.fixture(scope="module")
def points(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("failpoints") / "points"
    path.write_text("")
    return path


@pytest.fixture(scope="module")
def spark(points: Path) -> Iterator[Any]:
    session = start_session(
        "local[2,4]", **{"spark.executorEnv.SNAPCUT_SPARK_FAILPOINTS": f"@{points}"}
    )
    yield session
    session.stop()


@pytest.fixture(scope="module")
def dwell(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pd.DataFrame]:
    directory = write_inputs(tmp_path_factory.mktemp("dwell") / "events", frames())
    return directory, pd.concat(frames(), ignore_index=True)


@pytest.fixture
def armed(points: Path) -> Iterator[Callable[[str], None]]:
    """Arms executor crash points for one test (`point:batch:partition:action[:attempt]`)."""
    yield lambda spec: points.write_text(spec)
    points.write_text("")


def frames() -> list[pd.DataFrame]:
    return dwell_frames(files=FILES, rows=600, users=40, seed=5)


def fail_driver_at(monkeypatch: pytest.MonkeyPatch, point: str, batch: int) -> None:
    real = fp.hit

    def hit(name: str, b: int, partition: int) -> None:
        if (name, b) == (point, batch):
            raise fp.InjectedFailure(f"injected driver failure at {point} (batch {b})")
        real(name, b, partition)

    monkeypatch.setattr(fp, "hit", hit)


def run(df: Any, sink: Callable[[Any, int], None], checkpoint: Path, mode: str = "append") -> None:
    """Runs `df` into the foreachBatch `sink` to the end of its input (availableNow)."""
    if is_connect(df.sparkSession) and isinstance(sink, ArrowSnapshotSink):
        # Under Connect the sink learns the query id from the checkpointLocation.
        sink.checkpoint_location = sink.checkpoint_location or str(checkpoint)
    q = (
        df.writeStream.foreachBatch(sink)
        .outputMode(mode)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    if q.exception() is not None:
        raise RuntimeError(str(q.exception()))


def user_totals(df: Any) -> Any:
    """The streaming count and sum of dwell_ms per user, as ``n``/``total``."""
    agg = df.groupBy("user").agg({"*": "count", "dwell_ms": "sum"})
    return agg.withColumnRenamed("count(1)", "n").withColumnRenamed("sum(dwell_ms)", "total")


def event_rows(table: pa.Table | pd.DataFrame) -> Counter[tuple[int, int, int]]:
    """(user, dwell_ms, ts in µs) of every row, as a multiset."""
    if isinstance(table, pd.DataFrame):
        table = pa.Table.from_pandas(table, preserve_index=False)
    ts = table["ts"].cast(pa.timestamp("us", "UTC")).cast(pa.int64())
    cols = (table["user"].to_pylist(), table["dwell_ms"].to_pylist(), ts.to_pylist())
    return Counter(zip(*cols, strict=True))


def totals(events: pd.DataFrame) -> dict[int, tuple[int, int]]:
    g = events.groupby("user")["dwell_ms"].agg(["count", "sum"])
    return {int(u): (int(r["count"]), int(r["sum"])) for u, r in g.iterrows()}


def as_totals(table: pa.Table, n: str = "n", total: str = "total") -> dict[int, tuple[int, int]]:
    rows = table.to_pylist()
    out = {r["user"]: (r[n], r[total]) for r in rows}
    assert len(out) == len(rows), "one row per key"
    return out


def manifest(root: Path, batch: int) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        (root / snapshots.checkpoint_dir_name(batch) / "manifest.json").read_text()
    )
    return data


def small_rows(
    mode: str,
) -> tuple[list[pd.DataFrame], list[tuple[int, int]], list[tuple[int, int]]]:
    """The empty-batch test's input (batch 0, an empty batch 1, batch 2), the
    table's (user, n) rows after batch 2 and after batch 1, per mode."""
    rows = [pd.DataFrame({"user": [1, 2], "n": [3, 4]}), pd.DataFrame({"user": [2], "n": [5]})]
    after = {
        "append": [(1, 3), (2, 4), (2, 5)],
        "update": [(1, 3), (2, 5)],
        "complete": [(2, 5)],
    }[mode]
    empty = [] if mode == "complete" else [(1, 3), (2, 4)]
    return rows, after, empty
