"""The dwell-time query on Spark, as a process of its own (for crash tests,
chaos and the demo): a parquet file source of ``(user, dwell_ms, ts)``, the
snapcut aggregate per user (count, total, average), and Spark's exactly-once
parquet file sink (``--sink parquet``) or snapcut's ``ArrowSnapshotSink``
(``--sink arrow``: update mode by user, one global snapshot of state, output
and offsets per batch). Run to the end of the input with an ``availableNow``
trigger; re-running it with the same paths resumes from its checkpoint.

    python -m snapcut.jobs.spark_dwell INPUT STATE_ROOT CHECKPOINT OUTPUT [--partitions 3]
        [--sink parquet|arrow] [--step STEP] [--trigger available-now|'1 second']
        [--remote URL] [--output arrow|delta|iceberg --table T [--catalog JSON]]

``--output delta --table PATH`` / ``--output iceberg --table ns.table
--catalog JSON`` (pyiceberg's ``load_catalog`` properties): the sink merges
each batch's rows by user into that table (``DeltaOutput`` / ``IcebergOutput``)
and OUTPUT, its root, keeps the manifests (``--sink arrow`` only).

``--remote``: run on Spark Connect (``local[2]``: a local server in this
process's JVM; ``sc://host:15002``: a running one) instead of ``--master``.
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path
from typing import Any

EVENTS_SCHEMA = "user long, dwell_ms long, ts timestamp"

#: The stateful steps the job can run, each giving (user, count, total, avg).
STEPS = ("aggregate", "tws", "map_batches", "apply_in_pandas_with_state")

#: The steps whose function can close a user's session (``--session-gap``).
SESSION_STEPS = ("map_batches", "apply_in_pandas_with_state")

#: The watermark delay with a session gap: event time grows file by file, so
#: no event is late (a file's events are no earlier than the files before it).
SESSION_DELAY_MS = 10_000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m snapcut.jobs.spark_dwell")
    parser.add_argument("input")
    parser.add_argument("state_root")
    parser.add_argument("checkpoint")
    parser.add_argument("output")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--full-every", type=int, default=3)
    parser.add_argument("--files-per-batch", type=int, default=1)
    parser.add_argument("--master", default="local[2,4]")
    parser.add_argument("--remote", default=None, help="a Spark Connect URL (or local[N])")
    parser.add_argument("--sink", choices=("parquet", "arrow"), default="parquet")
    parser.add_argument(
        "--step",
        choices=STEPS,
        default="aggregate",
        help="snapcut's level-1 aggregate (default), or the same figures from a "
        "StatefulProcessor through transform_with_state_in_pandas (tws), a level-2 "
        "function (map_batches) or a level-3 one (apply_in_pandas_with_state)",
    )
    parser.add_argument(
        "--output",
        dest="table_output",  # not "output": the positional OUTPUT (the sink root) is
        choices=("arrow", "delta", "iceberg"),
        default="arrow",
        help="--sink arrow: the rows into the sink root (default), a Delta or an Iceberg table",
    )
    parser.add_argument("--table", default=None, help="the Delta table's path, or 'ns.table'")
    parser.add_argument("--catalog", default=None, help="Iceberg: load_catalog properties, JSON")
    parser.add_argument(
        "--trigger",
        default="available-now",
        help="'available-now' (run to the end of the input, then exit) or a processing-time "
        "interval such as '1 second' (run until stopped)",
    )
    parser.add_argument(
        "--state-memory",
        default=None,
        help="keyed_state's state_memory: each Python worker's budget for the state "
        "(e.g. 2MB; default: all in memory)",
    )
    parser.add_argument(
        "--session-gap",
        type=int,
        default=None,
        help="levels 2 and 3 (--step map_batches, apply_in_pandas_with_state): a user's "
        "totals close once the watermark (the latest event time less 10 s) passes its "
        "last event by this many seconds: an event-time timeout whose call emits the "
        "totals and removes the state (default: no timeout)",
    )
    parser.add_argument(
        "--metrics-log",
        default=None,
        help="append each micro-batch's step figures (observedMetrics) to this file, "
        "a JSON line per batch, as the query makes progress",
    )
    args = parser.parse_args(argv)
    if args.table_output != "arrow" and (args.sink != "arrow" or args.table is None):
        parser.error(f"--output {args.table_output} needs --sink arrow and --table")
    if (args.table_output == "iceberg") != (args.catalog is not None):
        parser.error("--catalog goes with --output iceberg (and it needs one)")
    if args.session_gap is not None and (args.step not in SESSION_STEPS or args.session_gap < 1):
        parser.error(
            f"--session-gap takes a number of seconds >= 1 and --step {' or '.join(SESSION_STEPS)}"
        )
    from snapcut.jobs.spark_session import build_session, check_remote
    from snapcut.spark import ArrowSnapshotSink, keyed_state

    if args.remote is not None:
        check_remote(args.remote, "spark_dwell")
    spark = build_session(
        "snapcut-dwell",
        master=args.master,
        remote=args.remote,
        conf={"spark.sql.shuffle.partitions": "2", "spark.sql.session.timeZone": "UTC"},
    )
    events = (
        spark.readStream.schema(EVENTS_SCHEMA)
        .option("maxFilesPerTrigger", args.files_per_batch)
        .parquet(args.input)
    )
    state = keyed_state(
        events,
        "user",
        args.state_root,
        args.partitions,
        full_every=args.full_every,
        state_memory=args.state_memory,
        **session_time(args.session_gap),
    )
    gap_ms = None if args.session_gap is None else args.session_gap * 1000
    if args.step == "tws":
        from snapcut.jobs.dwell_processor import OUTPUT, DwellProcessor

        averages = state.transform_with_state_in_pandas(DwellProcessor(), OUTPUT, "Update", "None")
    elif args.step == "map_batches":
        from snapcut.jobs import dwell_functions as f

        averages = state.map_batches(
            partial(f.dwell_batch, gap_ms=gap_ms), f.STATE, f.OUTPUT, timeout=timeout(gap_ms)
        )
    elif args.step == "apply_in_pandas_with_state":
        from snapcut.jobs import dwell_functions as f

        averages = state.apply_in_pandas_with_state(
            partial(f.dwell_group, gap_ms=gap_ms), f.OUTPUT, f.STATE, "Update", timeout(gap_ms)
        )
    else:
        averages = state.aggregate(
            count="count", total=("sum", "dwell_ms"), avg=("mean", "dwell_ms")
        )
    if args.sink == "arrow":
        # checkpoint_location: Spark Connect does not tell foreachBatch the query id.
        sink = ArrowSnapshotSink(
            args.output,
            output_mode="update",
            key="user",
            state=state,
            checkpoint_location=args.checkpoint,
            output=table_output(args.table_output, args.table, args.catalog),
        )
        writer = averages.writeStream.foreachBatch(sink).outputMode("update")
    else:
        writer = (
            averages.writeStream.format("parquet").option("path", args.output).outputMode("append")
        )
    writer = writer.option("checkpointLocation", args.checkpoint)
    if args.trigger == "available-now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=args.trigger)
    query = writer.start()
    if args.metrics_log is None:
        query.awaitTermination()
    else:
        await_logging_metrics(query, Path(args.metrics_log), state.input.name)
    spark.stop()
    return 0


def session_time(gap_s: int | None) -> dict[str, Any]:
    """keyed_state's event time and watermark for a session gap (none without)."""
    if gap_s is None:
        return {}
    return {"event_time": "ts", "watermark": SESSION_DELAY_MS}


def timeout(gap_ms: int | None) -> str:
    """The step's timeout conf: event time with a session gap, else none."""
    return "NoTimeout" if gap_ms is None else "EventTimeTimeout"


#: How often the metrics log looks for new progress while the query runs.
METRICS_POLL_S = 0.5


def await_logging_metrics(query: Any, log: Path, vertex: str) -> None:
    """Waits for the query to end as ``awaitTermination()`` does, appending
    each new micro-batch's figures of step `vertex` to `log` (a JSON line:
    ``batch`` and the figures) as they appear, so a killed attempt leaves
    those of the batches it finished."""
    from snapcut.spark import metrics

    logged: set[int] = set()

    def drain() -> None:
        lines = []
        for p in query.recentProgress:
            figures = metrics.observed(p, vertex)
            if figures is None or p["batchId"] in logged:
                continue
            logged.add(p["batchId"])
            lines.append(json.dumps({"batch": p["batchId"], **figures}) + "\n")
        if lines:  # the file is opened only when a batch finished
            with log.open("a") as f:
                f.writelines(lines)

    while not query.awaitTermination(METRICS_POLL_S):
        drain()
    drain()


def table_output(output: str, table: str | None, catalog: str | None) -> Any:
    """The sink's ``output=``: None (the sink root), a DeltaOutput or an IcebergOutput."""
    if output == "delta":
        from snapcut.spark import DeltaOutput

        return DeltaOutput(str(table))
    if output == "iceberg":
        from snapcut.spark import IcebergOutput

        return IcebergOutput(json.loads(str(catalog)), str(table))
    return None


if __name__ == "__main__":
    raise SystemExit(main())
