"""Roots for the data source tests, and the check they share.

:func:`build` runs two streaming queries of eight micro-batches each: a
level-1 aggregate whose keys drift (later batches leave keys untouched, so
state files are diffs) into an update-mode sink, and a transformWithState
processor with value, list and map state and timers whose rows also clear
values and remove map keys (so the change feed has deletes).
:func:`assert_feed_matches_versions` checks the issue's rule: the change
feed of batches 3-7 equals the row-by-row difference of the versions
``batchId=2..7``, both read through ``format("snapcut")``. Used on local[2]
and Spark Connect (test_spark_source.py) and on local-cluster
(test_spark_cluster.py)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, TimerValues

from snapcut.spark import ArrowSnapshotSink, keyed_state
from spark_support import dwell_frames, run_to_end, stream, write_inputs

BATCHES = 8
TWS_SCHEMA = "id string, v long, w string"
TWS_OUT = "id string, n long"
VARIABLES = ("count", "seen", "words")
HOUR_MS = 3_600_000


class Churn(StatefulProcessor):
    """Per key: a count (value state), the values seen (list state) and a
    count per word (map state), with one timer an hour ahead (never due in
    the test, so every batch re-registers it). A row with ``v % 5 == 0``
    clears the count and the list; a word seen with ``v % 3 == 0`` is
    removed from the map."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.count = handle.getValueState("count", "n long")
        self.seen = handle.getListState("seen", "v long")
        self.words = handle.getMapState("words", "w string", "c long")

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: TimerValues) -> Any:
        frame = pd.concat(list(rows))
        vs = [int(v) for v in frame["v"]]
        if any(v % 5 == 0 for v in vs):
            self.count.clear()
            self.seen.clear()
            n = 0
        else:
            old = self.count.get()
            n = (old[0] if old else 0) + len(vs)
            self.count.update((n,))
            self.seen.appendList([(v,) for v in vs])
        for v, w in zip(vs, frame["w"], strict=True):
            if v % 3 == 0:
                self.words.removeKey((w,))
            else:
                c = self.words.getValue((w,))
                self.words.updateValue((w,), ((c[0] if c else 0) + 1,))
        for t in self.handle.listTimers():
            self.handle.deleteTimer(t)
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + HOUR_MS)
        yield pd.DataFrame({"id": [key[0]], "n": [n]})

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Any:
        raise AssertionError("no timer is due within the test")

    def close(self) -> None:
        pass


def tws_frames(seed: int = 3) -> list[pd.DataFrame]:
    rng = random.Random(seed)
    return [
        pd.DataFrame(
            [
                (f"k{rng.randrange(12)}", rng.randrange(1, 60), rng.choice("abcd"))
                for _ in range(30)
            ],
            columns=["id", "v", "w"],
        )
        for _ in range(BATCHES)
    ]


@dataclass(frozen=True)
class SourceRoots:
    level1: Path
    """A level-1 state root (count and total dwell per user, 2 partitions)."""
    sink: Path
    """The update-mode sink root of the same query (key ``user``)."""
    tws: Path
    """The transformWithState root of :class:`Churn` (2 partitions)."""


def build(spark: Any, base: Path) -> SourceRoots:
    """Runs both queries to their eighth batch under `base`, at once (each
    micro-batch waits on its own planning and commit; two overlap them)."""
    roots = SourceRoots(base / "level1", base / "sink", base / "tws")

    def level1() -> None:
        frames = dwell_frames(files=BATCHES, rows=200, users=30, seed=11, drift=4)
        events = write_inputs(base / "events", frames)
        ks = keyed_state(stream(spark, events), "user", str(roots.level1), 2, full_every=3)
        agg = ks.aggregate(count="count", total=("sum", "dwell_ms"))
        chk = str(base / "chk-level1")
        # checkpoint_location=: Spark Connect tells foreachBatch neither query id nor checkpoint.
        sink = ArrowSnapshotSink(
            str(roots.sink), output_mode="update", key="user", state=ks, checkpoint_location=chk
        )
        (
            agg.writeStream.foreachBatch(sink)
            .outputMode("update")
            .option("checkpointLocation", chk)
            .trigger(availableNow=True)
            .start()
            .awaitTermination()
        )

    def tws() -> None:
        inputs = write_inputs(base / "tws-in", tws_frames())
        df = (
            spark.readStream.schema(TWS_SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(inputs))
        )
        s = keyed_state(df, key="id", root=str(roots.tws), partitions=2, full_every=3)
        q = s.transform_with_state_in_pandas(Churn(), TWS_OUT, "Update", "ProcessingTime")
        # ProcessingTime runs no-data batches after the last file: stop after the eighth.
        run_to_end(q, base / "chk-tws", stop_after=BATCHES)

    with ThreadPoolExecutor(2) as pool:
        for done in [pool.submit(level1), pool.submit(tws)]:
            done.result()
    return roots


def read(spark: Any, root: Path, **options: Any) -> Any:
    reader = spark.read.format("snapcut")
    for k, v in options.items():
        reader = reader.option(k, str(v).lower() if isinstance(v, bool) else str(v))
    return reader.load(str(root))


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _version(spark: Any, root: Path, batch: int, **options: Any) -> dict[tuple[int, str], Any]:
    rows = read(spark, root, batchId=batch, **options).toArrow().to_pylist()
    version = {(r["partition_id"], _canon(r["key"])): r["value"] for r in rows}
    assert len(version) == len(rows), "a key twice in one version"
    return version


def assert_feed_matches_versions(
    spark: Any, root: Path, start: int = 3, end: int = 7, **options: Any
) -> dict[str, int]:
    """The change feed of `start`..`end` equals the row-by-row difference of
    the versions ``start-1..end``; returns the feed's counts per change type."""
    feed = read(
        spark,
        root,
        readChangeFeed=True,
        changeStartBatchId=start,
        changeEndBatchId=end,
        **options,
    ).toArrow()
    assert feed.column_names == ["batch_id", "change_type", "key", "value", "partition_id"]
    got = sorted(
        (r["batch_id"], r["change_type"], r["partition_id"], _canon(r["key"]), _canon(r["value"]))
        for r in feed.to_pylist()
    )
    versions = {b: _version(spark, root, b, **options) for b in range(start - 1, end + 1)}
    want = []
    for b in range(start, end + 1):
        before, after = versions[b - 1], versions[b]
        for (p, key), value in after.items():
            if (p, key) not in before or _canon(before[(p, key)]) != _canon(value):
                want.append((b, "update", p, key, _canon(value)))
        for p, key in before.keys() - after.keys():
            want.append((b, "delete", p, key, _canon(None)))
    assert got == sorted(want)
    return {kind: sum(1 for g in got if g[1] == kind) for kind in ("update", "delete")}
