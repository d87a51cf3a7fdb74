"""Two chained streaming queries in one Spark driver, as a process of its
own (for the chained chaos campaign, :mod:`snapcut.chaos.spark_chain`):

- **A**: the dwell-time query of :mod:`snapcut.jobs.spark_dwell` (parquet
  events → ``keyed_state`` aggregate count/total/avg per user →
  ``ArrowSnapshotSink`` in update mode with ``state=``), ``availableNow``;
- **B**: A's sink root as a stream (``spark.readStream.format("snapcut")``)
  → its own ``keyed_state`` aggregate per user over A's update rows (``rows``
  = how many rows A committed for the user, ``count_sum``/``total_sum`` = the
  sums of A's running count and total, ``count_max``/``total_max`` = their
  maxima, A's final figures) → its own ``ArrowSnapshotSink``.

B runs while A runs (a processing-time trigger, so it reads A's batches as A
commits them), once A's root exists. When A has consumed its input, the job
waits until B has read A's newest committed batch, then stops B and exits 0.
Re-running it with the same paths resumes both queries from their
checkpoints (A then has nothing left to do).

    python -m snapcut.jobs.spark_chain INPUT RUN_DIR [--partitions 2]
        [--files-per-batch 1] [--master local[2,4]] [--b-trigger '0.5 seconds']

Layout: ``RUN_DIR/a/{state,chk,out}``, ``RUN_DIR/b/{state,chk,out}``; marker
files for the harness: ``RUN_DIR/b-running`` (B's query started in this
process) and ``RUN_DIR/a-finished`` (A ran to the end of its input).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

EVENTS_SCHEMA = "user long, dwell_ms long, ts timestamp"
B_RUNNING = "b-running"
A_FINISHED = "a-finished"
POLL_S = 0.2
#: How long B may take to read A's newest batch once A is done, and A to
#: create its root (its first batch): a bound, so a stuck query fails the job
#: instead of hanging it (the harness has its own, longer, attempt timeout).
WAIT_S = 240.0


def wait_for(done: Callable[[], bool], what: str, queries: list[Any]) -> None:
    """Polls `done` every POLL_S until true; fails after WAIT_S, or as soon
    as one of `queries` failed."""
    deadline = time.monotonic() + WAIT_S
    while not done():
        for q in queries:
            if q.exception() is not None:
                raise RuntimeError(f"query {q.name} failed: {q.exception()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not happen within {WAIT_S:.0f} s")
        time.sleep(POLL_S)


def read_up_to(checkpoint: Path) -> int:
    """The A batch up to which B's Spark has committed its reads (-1: none)."""
    from snapcut.spark.query_checkpoint import read_offsets

    commits = checkpoint / "commits"
    done = [int(p.name) for p in commits.iterdir() if p.name.isdigit()] if commits.is_dir() else []
    if not done:
        return -1
    sources = read_offsets(str(checkpoint), max(done))["sources"]
    return int(sources[0]["batch_id"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m snapcut.jobs.spark_chain")
    parser.add_argument("input")
    parser.add_argument("run_dir")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--files-per-batch", type=int, default=1)
    parser.add_argument("--master", default="local[2,4]")
    parser.add_argument("--b-trigger", default="0.5 seconds")
    args = parser.parse_args(argv)
    from snapcut.jobs.spark_session import build_session
    from snapcut.spark import ArrowSnapshotSink, keyed_state
    from snapcut.spark.sink.root import SINK_META_FILE, SinkRoot
    from snapcut.spark.source.register import register

    run = Path(args.run_dir)
    a, b = run / "a", run / "b"
    spark = build_session(
        "snapcut-chain",
        master=args.master,
        conf={"spark.sql.shuffle.partitions": "2", "spark.sql.session.timeZone": "UTC"},
    )
    register(spark)

    events = (
        spark.readStream.schema(EVENTS_SCHEMA)
        .option("maxFilesPerTrigger", args.files_per_batch)
        .parquet(args.input)
    )
    a_state = keyed_state(events, "user", str(a / "state"), args.partitions, full_every=3)
    averages = a_state.aggregate(count="count", total=("sum", "dwell_ms"), avg=("mean", "dwell_ms"))
    a_sink = ArrowSnapshotSink(
        str(a / "out"),
        output_mode="update",
        key="user",
        state=a_state,
        checkpoint_location=str(a / "chk"),
    )
    a_query = (
        averages.writeStream.queryName("A")
        .foreachBatch(a_sink)
        .outputMode("update")
        .option("checkpointLocation", str(a / "chk"))
        .trigger(availableNow=True)
        .start()
    )
    # B's schema is A's root's: it exists once A's first batch has started.
    wait_for(
        lambda: (a / "out" / SINK_META_FILE).exists() or not a_query.isActive,
        "A's sink root",
        [a_query],
    )
    if a_query.exception() is not None:
        raise RuntimeError(f"query A failed: {a_query.exception()}")

    upstream = spark.readStream.format("snapcut").load(str(a / "out"))
    b_state = keyed_state(upstream, "user", str(b / "state"), args.partitions, full_every=3)
    figures = b_state.aggregate(
        rows="count",
        count_sum=("sum", "count"),
        total_sum=("sum", "total"),
        count_max=("max", "count"),
        total_max=("max", "total"),
    )
    b_sink = ArrowSnapshotSink(
        str(b / "out"),
        output_mode="update",
        key="user",
        state=b_state,
        checkpoint_location=str(b / "chk"),
    )
    b_query = (
        figures.writeStream.queryName("B")
        .foreachBatch(b_sink)
        .outputMode("update")
        .option("checkpointLocation", str(b / "chk"))
        .trigger(processingTime=args.b_trigger)
        .start()
    )
    (run / B_RUNNING).touch()

    a_query.awaitTermination()
    if a_query.exception() is not None:
        raise RuntimeError(f"query A failed: {a_query.exception()}")
    (run / A_FINISHED).touch()
    committed = SinkRoot(str(a / "out")).backend().complete()
    last = committed[-1] if committed else -1
    wait_for(lambda: read_up_to(b / "chk") >= last, f"B reading A's batch {last}", [b_query])
    b_query.stop()
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
