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
checkpoints (A then has nothing left to do). A query that fails only because
Spark's Python worker did not connect back in time (:data:`TRANSIENT`) is
started again from its checkpoint, at most :data:`RESTARTS` times, each
logged to stderr (:data:`RESTART_MARK`); any other failure fails the job.

    python -m snapcut.jobs.spark_chain INPUT RUN_DIR [--partitions 2]
        [--files-per-batch 1] [--master local[2,4]] [--b-trigger '0.5 seconds']

Layout: ``RUN_DIR/a/{state,chk,out}``, ``RUN_DIR/b/{state,chk,out}``; marker
files for the harness: ``RUN_DIR/b-running`` (B's query started in this
process) and ``RUN_DIR/a-finished`` (A ran to the end of its input).
"""

from __future__ import annotations

import argparse
import sys
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


#: Spark starts the Python worker of a Python data source's stream (its
#: planner) as a fresh process and gives it a fixed 10 s to connect back; on
#: a loaded machine it may not, and the query fails before reading anything.
#: The job then starts that query again from its checkpoint (what an operator
#: would do; exactly-once does not depend on it), at most this many times per
#: query, each logged to stderr with RESTART_MARK for the harness to count.
TRANSIENT = "Python worker failed to connect back"
RESTARTS = 3
RESTART_MARK = "snapcut-chain: restarted query"


class Queries:
    """The job's running queries, each restarted from its checkpoint after
    a TRANSIENT failure (at most RESTARTS times); any other failure is raised."""

    def __init__(self) -> None:
        self.starters: dict[str, Callable[[], Any]] = {}
        self.running: dict[str, Any] = {}
        self.restarts: dict[str, int] = {}

    def start(self, name: str, starter: Callable[[], Any]) -> Any:
        self.starters[name], self.restarts[name] = starter, 0
        self.running[name] = starter()
        return self.running[name]

    def check(self) -> None:
        for name, q in list(self.running.items()):
            error = q.exception()
            if error is None:
                continue
            if TRANSIENT not in str(error) or self.restarts[name] >= RESTARTS:
                raise RuntimeError(f"query {name} failed: {error}")
            self.restarts[name] += 1
            print(f"{RESTART_MARK} {name} after: {TRANSIENT}", file=sys.stderr, flush=True)
            self.running[name] = self.starters[name]()

    def finished(self, name: str) -> bool:
        """Whether query `name` ran to its end (availableNow)."""
        self.check()
        return not self.running[name].isActive


def wait_for(done: Callable[[], bool], what: str, queries: Queries) -> None:
    """Polls `done` every POLL_S until true, restarting or raising failed
    `queries` meanwhile; fails after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while True:
        queries.check()
        if done():
            return
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
        conf={
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.session.timeZone": "UTC",
            # A SIGKILL between Spark's write of a query's first offset file
            # (offsets/.0.<uuid>.tmp) and its rename leaves the temp file, and
            # Spark then refuses to start that query at batch 0 (its
            # checkpoint's offsets/ "should be empty"): the operator's fix is
            # to delete the file. Spark's check, not snapcut's; off here.
            "spark.sql.streaming.verifyCheckpointDirectoryEmptyOnStart": "false",
        },
    )
    register(spark)

    def start_a() -> Any:
        events = (
            spark.readStream.schema(EVENTS_SCHEMA)
            .option("maxFilesPerTrigger", args.files_per_batch)
            .parquet(args.input)
        )
        state = keyed_state(events, "user", str(a / "state"), args.partitions, full_every=3)
        averages = state.aggregate(
            count="count", total=("sum", "dwell_ms"), avg=("mean", "dwell_ms")
        )
        sink = ArrowSnapshotSink(
            str(a / "out"),
            output_mode="update",
            key="user",
            state=state,
            checkpoint_location=str(a / "chk"),
        )
        return (
            averages.writeStream.queryName("A")
            .foreachBatch(sink)
            .outputMode("update")
            .option("checkpointLocation", str(a / "chk"))
            .trigger(availableNow=True)
            .start()
        )

    def start_b() -> Any:
        upstream = spark.readStream.format("snapcut").load(str(a / "out"))
        state = keyed_state(upstream, "user", str(b / "state"), args.partitions, full_every=3)
        figures = state.aggregate(
            rows="count",
            count_sum=("sum", "count"),
            total_sum=("sum", "total"),
            count_max=("max", "count"),
            total_max=("max", "total"),
        )
        sink = ArrowSnapshotSink(
            str(b / "out"),
            output_mode="update",
            key="user",
            state=state,
            checkpoint_location=str(b / "chk"),
        )
        return (
            figures.writeStream.queryName("B")
            .foreachBatch(sink)
            .outputMode("update")
            .option("checkpointLocation", str(b / "chk"))
            .trigger(processingTime=args.b_trigger)
            .start()
        )

    queries = Queries()
    queries.start("A", start_a)
    # B's schema is A's root's: it exists once A's first batch has started.
    wait_for(
        lambda: (a / "out" / SINK_META_FILE).exists() or queries.finished("A"),
        "A's sink root",
        queries,
    )
    queries.start("B", start_b)
    (run / B_RUNNING).touch()
    wait_for(lambda: queries.finished("A"), "A consuming its input", queries)
    (run / A_FINISHED).touch()
    committed = SinkRoot(str(a / "out")).backend().complete()
    last = committed[-1] if committed else -1
    wait_for(lambda: read_up_to(b / "chk") >= last, f"B reading A's batch {last}", queries)
    queries.running["B"].stop()
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
