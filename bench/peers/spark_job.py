"""Spark Structured Streaming: one configuration, one JSON line (snapcut's venv,
which has pyspark).

Input: the `rate-micro-batch` source (exactly `rowsPerBatch` rows per
micro-batch, 2 partitions), `user = pmod(xxhash64(value), keys)`,
`dwell_ms = pmod(xxhash64(value, 1), 10000)` — the distribution of snapcut's
generator, not the same bytes. Sink: `noop`, output mode update; local[2],
2 shuffle partitions, 2 state partitions.

APIs (`--mode`): `native` = groupBy(user).agg(count, sum) (HDFS-backed state
store); `pandas` = groupBy(user).applyInPandasWithState (a Python function
per key and batch); `snapcut` = snapcut.spark.keyed_state(...).aggregate
(level 1: the Rust kernel and state table, Arrow state files per batch).
Only the dwell job: three keyed stages that forward every record cannot be
written with Spark's stateful operators (a streaming aggregation emits one
row per key, not the records; chaining stateful operators needs append mode
and event-time watermarks), so three-shuffle is refused.

"Checkpoint" = micro-batch: every batch commits its offsets and state to the
checkpoint location (snapcut: its state root). Stateful streaming cannot run
without it, so `off` = the whole input as ONE micro-batch (one commit at the
end). `1s` / `100ms`: trigger(processingTime=interval) with micro-batches of
rate x interval rows, where rate is measured by a warm-up query in the same
session (2 batches of records/5 rows, the second timed): the stream a system
running flat out would see if it checkpointed every interval. Spark's fixed
cost per batch makes the effective interval longer than asked at 100 ms;
`effective_interval_s` reports it.

Timed: from the start of the first measured micro-batch to the end of the
last (query progress: timestamp + durationMs.triggerExecution); the Spark
session, the warm-up query and query start-up are outside the clock.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

MODES = ("native", "pandas", "snapcut")
OUT = "user long, count long, total long"
STATE = "count long, total long"


def dwell_func(key: tuple[Any, ...], pdfs: Iterator[Any], state: Any) -> Iterator[Any]:
    import pandas as pd

    count, total = state.get if state.exists else (0, 0)
    for pdf in pdfs:
        count += len(pdf)
        total += int(pdf["dwell_ms"].sum())
    state.update((count, total))
    yield pd.DataFrame({"user": [key[0]], "count": [count], "total": [total]})


def _ts(progress: dict[str, Any]) -> float:
    return datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp()


def run_query(
    spark: Any,
    args: Any,
    work: Path,
    tag: str,
    rows_per_batch: int,
    batches: int,
    interval: float | None,
) -> dict[str, Any]:
    """Runs `batches` micro-batches of `rows_per_batch` rows; their progress."""
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    events = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", rows_per_batch)
        .option("numPartitions", args.parallelism)
        .load()
        .select(
            F.pmod(F.xxhash64("value"), F.lit(args.keys)).alias("user"),
            F.pmod(F.xxhash64("value", F.lit(1)), F.lit(10_000)).alias("dwell_ms"),
        )
    )
    state_root = work / f"{tag}-state"
    if args.mode == "native":
        out = events.groupBy("user").agg(
            F.count("*").alias("count"), F.sum("dwell_ms").alias("total")
        )
    elif args.mode == "pandas":
        out = events.groupBy("user").applyInPandasWithState(
            dwell_func, OUT, STATE, "update", GroupStateTimeout.NoTimeout
        )
    else:
        from snapcut.spark import keyed_state

        ks = keyed_state(events, "user", str(state_root), args.parallelism)
        out = ks.aggregate(count="count", total=("sum", "dwell_ms"))
    chk = work / f"{tag}-chk"
    writer = (
        out.writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", str(chk))
        .queryName(tag)
    )
    if interval is not None:
        writer = writer.trigger(processingTime=f"{int(interval * 1000)} milliseconds")
    query = writer.start()
    try:
        while True:
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()))
            last = query.lastProgress
            if last is not None and last["batchId"] >= batches - 1:
                break
            time.sleep(0.01)
        progress = [p for p in query.recentProgress if p["batchId"] < batches]
    finally:
        query.stop()
    progress.sort(key=lambda p: p["batchId"])
    if len(progress) != batches:
        raise RuntimeError(f"{tag}: {len(progress)} progress reports for {batches} batches")
    start = _ts(progress[0])
    end = max(_ts(p) + p["durationMs"]["triggerExecution"] / 1000 for p in progress)
    return {
        "rows": sum(int(p["numInputRows"]) for p in progress),
        "seconds": end - start,
        "batch_s": [p["durationMs"]["triggerExecution"] / 1000 for p in progress],
        "bytes": common.dir_bytes(chk) + common.dir_bytes(state_root),
    }


def main(argv: list[str] | None = None) -> None:
    args = common.parser("spark", MODES, "native").parse_args(argv)
    if args.job != "dwell":
        common.fail(
            "Spark runs only the dwell job: its stateful operators cannot express three "
            "keyed stages that forward every record (see the module docstring)"
        )
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from importlib.metadata import version

    from pyspark.sql import SparkSession

    interval = common.INTERVAL_S[args.checkpointing]
    work = Path(tempfile.mkdtemp(prefix="peers-spark-", dir=args.workdir))
    t0 = time.perf_counter()
    spark = (
        SparkSession.builder.master(f"local[{args.parallelism}]")
        .appName("snapcut-peers")
        .config("spark.sql.shuffle.partitions", str(args.parallelism))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "4g")
        .config("spark.sql.streaming.numRecentProgressUpdates", "100000")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    startup = time.perf_counter() - t0
    try:
        warm_rows = max(args.records // 5, 1000)
        t1 = time.perf_counter()
        warm = run_query(spark, args, work, "warmup", warm_rows, 2, None)
        warmup_s = time.perf_counter() - t1
        rate = warm_rows / max(warm["batch_s"][1], 1e-3)
        if interval is None:
            rows_per_batch, batches = args.records, 1
        else:
            rows_per_batch = max(100, round(rate * interval))
            batches = max(2, -(-args.records // rows_per_batch))
        m = run_query(spark, args, work, "measured", rows_per_batch, batches, interval)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    versions = {"pyspark": version("pyspark")}
    if args.mode == "snapcut":
        versions["snapcut"] = version("snapcut") if _dist("snapcut") else _snapcut_version()
    common.emit(
        args,
        "spark",
        records=m["rows"],
        records_per_s=m["rows"] / m["seconds"],
        seconds=m["seconds"],
        timed="first measured micro-batch start to last micro-batch end (query progress)",
        startup_s=startup,
        warmup_s=warmup_s,
        calibrated_rate=rate,
        rows_per_batch=rows_per_batch,
        checkpoints=batches,
        checkpoints_note="micro-batches (each commits offsets + state)",
        effective_interval_s=m["seconds"] / batches,
        batch_s_median=sorted(m["batch_s"])[len(m["batch_s"]) // 2],
        checkpoint_bytes=m["bytes"],
        checkpoint_bytes_note="checkpointLocation (+ snapcut state root) at the end",
        versions=versions,
    )


def _dist(name: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version(name)
    except PackageNotFoundError:
        return False
    return True


def _snapcut_version() -> str:
    import snapcut

    return str(snapcut.__version__)


if __name__ == "__main__":
    main()
