"""Per-micro-batch time of the dwell query (snapcut level-1 aggregate per
user: count, total, average) with different sinks, and with the state's
snapshots on and off, side by side in one Spark session:

- parquet file sink: Spark's own exactly-once file sink (append; ``_spark_metadata``)
- ArrowSnapshotSink: snapcut's foreachBatch sink, update mode by user, with
  ``state=`` (one global snapshot of state + output + offsets per batch) —
  the demo's query
- collect + pyarrow: a ``foreachBatch`` that collects the batch to the driver
  (``toArrow``) and writes one Arrow IPC file (no exactly-once bookkeeping)
- ArrowSnapshotSink, state snapshots off: the same sink without ``state=``,
  over the in-memory state of ``snapcut.experiments.spark_memory_state``'s ``InMemoryKeyedState``

The figure is ``durationMs.triggerExecution`` (the whole micro-batch: plan,
state, sink commit), median over every batch but the first, pooled over
rounds with the variants' order rotated; ``addBatch`` is kept in the JSON.

Rerun (nothing else running):  python bench/spark_sink.py --keys 10000 100000
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.ipc as ipc

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark.sql import DataFrame, SparkSession

from snapcut.experiments.spark_memory_state import in_memory
from snapcut.spark import ArrowSnapshotSink, foreach_batch, keyed_state
from spark_state import start_session, write_input

SCHEMA = "user long, dwell_ms long"
AGGS: dict[str, Any] = {"count": "count", "total": ("sum", "dwell_ms"), "avg": ("mean", "dwell_ms")}

Start = Callable[[DataFrame, Path, str], Any]


def variants() -> dict[str, Start]:
    def parquet(df: DataFrame, work: Path, tag: str) -> Any:
        out = keyed_state(df, "user", str(work / "state" / tag), 2).aggregate(**AGGS)
        return out.writeStream.format("parquet").option("path", str(work / "out" / tag))

    def arrow_sink(df: DataFrame, work: Path, tag: str) -> Any:
        ks = keyed_state(df, "user", str(work / "state" / tag), 2)
        sink = ArrowSnapshotSink(
            str(work / "out" / tag),
            output_mode="update",
            key="user",
            state=ks,
            checkpoint_location=str(work / f"chk-{tag}"),  # Connect: the query id is there
        )
        return ks.aggregate(**AGGS).writeStream.foreachBatch(sink).outputMode("update")

    def collect(df: DataFrame, work: Path, tag: str) -> Any:
        out_dir = work / "out" / tag
        out_dir.mkdir(parents=True)

        def write(batch: DataFrame, batch_id: int) -> None:
            table = batch.toArrow()
            with ipc.new_file(str(out_dir / f"batch-{batch_id}.arrow"), table.schema) as w:
                w.write_table(table)

        out = keyed_state(df, "user", str(work / "state" / tag), 2).aggregate(**AGGS)
        # foreach_batch: the state's batch id on Spark Connect too.
        chk = str(work / f"chk-{tag}")
        return out.writeStream.foreachBatch(
            foreach_batch(write, checkpoint_location=chk)
        ).outputMode("update")

    def arrow_sink_off(df: DataFrame, work: Path, tag: str) -> Any:
        sink = ArrowSnapshotSink(
            str(work / "out" / tag),
            output_mode="update",
            key="user",
            checkpoint_location=str(work / f"chk-{tag}"),
        )
        out = in_memory(df, "user", tag, 2).aggregate(**AGGS)
        return out.writeStream.foreachBatch(sink).outputMode("update")

    return {
        "parquet file sink": parquet,
        "ArrowSnapshotSink (state=)": arrow_sink,
        "collect + pyarrow foreachBatch": collect,
        "ArrowSnapshotSink, state snapshots off": arrow_sink_off,
    }


def run(spark: SparkSession, name: str, start: Start, src: Path, work: Path) -> dict[str, Any]:
    tag = "".join(c if c.isalnum() else "_" for c in name) + f"_{time.monotonic_ns()}"
    df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(src))
    q = (
        start(df, work, tag)
        .option("checkpointLocation", str(work / f"chk-{tag}"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    progress = [p for p in q.recentProgress if p.numInputRows > 0]
    return {
        "trigger_s": [p["durationMs"]["triggerExecution"] / 1000 for p in progress],
        "add_batch_s": [p["durationMs"]["addBatch"] / 1000 for p in progress],
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    # Next to this file, not the working directory: the same file from any cwd.
    default_out = Path(__file__).resolve().parent / "results" / "spark_sink" / "spark_sink.json"
    parser.add_argument("--out", default=str(default_out))
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=list(variants()),
        default=list(variants()),
        help="run only these (e.g. the two state-snapshot variants, for more rounds)",
    )
    parser.add_argument(
        "--remote", default=None, help="a Spark Connect URL (local[2]: a local server)"
    )
    args = parser.parse_args()
    spark = start_session("4g", remote=args.remote)
    results: dict[str, Any] = {
        "machine": f"{platform.node()} {os.cpu_count()} cpus, load {os.getloadavg()}",
        "args": vars(args),
        "runs": {},
    }
    names = list(args.variants)
    with tempfile.TemporaryDirectory() as d:
        warm = Path(d)
        write_input(warm / "in", 1000, 10_000, 2)
        for name in names:  # warm-up, not recorded
            run(spark, name, variants()[name], warm / "in", warm)
    for keys in args.keys:
        with tempfile.TemporaryDirectory() as d:
            work = Path(d)
            write_input(work / "in", keys, args.rows, args.batches)
            per: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
            for r in range(args.rounds):
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    per[name].append(run(spark, name, variants()[name], work / "in", work))
            for name in names:
                later = [t for x in per[name] for t in x["trigger_s"][1:]]
                add = [t for x in per[name] for t in x["add_batch_s"][1:]]
                res = {
                    "batch_s": statistics.median(later),
                    "batch_min_s": min(later),
                    "batch_max_s": max(later),
                    "add_batch_s": statistics.median(add),
                    "round_medians_s": [statistics.median(x["trigger_s"][1:]) for x in per[name]],
                    "later_s": later,
                }
                results["runs"][f"{keys}|{name}"] = res
                print(
                    f"{keys:>8} keys  {name:<42} {res['batch_s']:7.3f} s/batch"
                    f"  [{res['batch_min_s']:.3f}-{res['batch_max_s']:.3f}]",
                    flush=True,
                )
            on, off = "ArrowSnapshotSink (state=)", "ArrowSnapshotSink, state snapshots off"
            if on in per and off in per:
                ratios = [
                    statistics.median(a["trigger_s"][1:]) / statistics.median(b["trigger_s"][1:])
                    for a, b in zip(per[on], per[off], strict=True)
                ]
                results["runs"][f"{keys}|snapshots on/off per round"] = ratios
                print(
                    f"{keys:>8} keys  state snapshots on/off, per round: "
                    + ", ".join(f"{x:.3f}" for x in ratios)
                    + f"  (median {statistics.median(ratios):.3f})",
                    flush=True,
                )
    results["load_after"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(results, indent=2))
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
