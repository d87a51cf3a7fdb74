"""The dwell-time query on Spark, as a process of its own (for crash tests,
chaos and the demo): a parquet file source of ``(user, dwell_ms, ts)``, the
snapcut aggregate per user (count, total, average), and Spark's exactly-once
parquet file sink (``--sink parquet``) or snapcut's ``ArrowSnapshotSink``
(``--sink arrow``: update mode by user, one global snapshot of state, output
and offsets per batch). Run to the end of the input with an ``availableNow``
trigger; re-running it with the same paths resumes from its checkpoint.

    python -m snapcut.jobs.spark_dwell INPUT STATE_ROOT CHECKPOINT OUTPUT [--partitions 3]
        [--sink parquet|arrow] [--step aggregate|tws] [--trigger available-now|'1 second']
        [--remote URL]

``--remote``: run on Spark Connect (``local[2]``: a local server in this
process's JVM; ``sc://host:15002``: a running one) instead of ``--master``.
"""

from __future__ import annotations

import argparse

EVENTS_SCHEMA = "user long, dwell_ms long, ts timestamp"


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
        choices=("aggregate", "tws"),
        default="aggregate",
        help="snapcut's level-1 aggregate (default), or the same figures from a "
        "StatefulProcessor through transform_with_state_in_pandas",
    )
    parser.add_argument(
        "--trigger",
        default="available-now",
        help="'available-now' (run to the end of the input, then exit) or a processing-time "
        "interval such as '1 second' (run until stopped)",
    )
    args = parser.parse_args(argv)
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
        events, "user", args.state_root, args.partitions, full_every=args.full_every
    )
    if args.step == "tws":
        from snapcut.jobs.dwell_processor import OUTPUT, DwellProcessor

        averages = state.transform_with_state_in_pandas(DwellProcessor(), OUTPUT, "Update", "None")
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
    query.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
