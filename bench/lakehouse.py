"""Per-micro-batch time of the exactly-once sink's table outputs (issue 40):
``ArrowSnapshotSink(output=DeltaOutput(...))`` and ``output=IcebergOutput(...)``
against the sink's Arrow IPC output and against a hand-written
``foreachBatch`` that writes the batch with delta-rs and no exactly-once
bookkeeping (``write_deltalake`` for append; ``DeltaTable.merge`` for update,
the first batch ``write_deltalake``), on the same keyed query in one Spark
session:

- ``update``: Spark's native ``groupBy("user")`` count and total of
  ``dwell_ms`` in update mode (each batch: the keys it touched), the sink
  keyed on ``user`` (Delta: MERGE on the driver; Iceberg: copy-on-write of
  the files holding the batch's keys);
- ``append``: the raw events (``user``, ``dwell_ms``), every batch appended.

The figure is ``durationMs.triggerExecution`` (the whole micro-batch: plan,
the aggregation, the sink), the median over every batch but the first (it
creates the table), pooled over rounds; the outputs run interleaved, their
order rotated each round. Ratios are to the hand-written one: pooled medians,
and per round. The snapcut sinks' own split of a batch (``stage_ms``: the
Spark job that stages or writes the rows; ``commit_ms``: the table commit
and the manifest) is kept per output (``sink.reports``).

Rerun:  python bench/lakehouse.py --keys 10000 100000
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import platform
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from snapcut.spark import ArrowSnapshotSink, DeltaOutput, IcebergOutput
from spark_state import SCHEMA, start_session, write_input

OUTPUTS = ("arrow", "delta", "iceberg", "hand-written write_deltalake")
HAND = "hand-written write_deltalake"
MODES = ("update", "append")

Sink = Callable[[DataFrame, int], None]


def query(df: DataFrame, mode: str) -> DataFrame:
    """The keyed query of `mode`: per-user totals (update) or the events (append)."""
    if mode == "update":
        return df.groupBy("user").agg(F.count("*").alias("n"), F.sum("dwell_ms").alias("total"))
    return df


def hand_written(table: Path, mode: str) -> Sink:
    """What a user writes without snapcut: the batch to the driver, then one
    delta-rs write; a replayed batch is written twice (no app transaction)."""
    import deltalake

    def write(batch: DataFrame, batch_id: int) -> None:
        rows = batch.toArrow()
        if mode == "append" or not (table / "_delta_log").exists():
            deltalake.write_deltalake(str(table), rows, mode="append")
            return
        deltalake.DeltaTable(str(table)).merge(
            rows, "t.user = s.user", source_alias="s", target_alias="t"
        ).when_matched_update_all().when_not_matched_insert_all().execute()

    return write


def catalog(work: Path) -> dict[str, str]:
    """The Iceberg output's catalog: SQLite, the warehouse beside it."""
    (work / "warehouse").mkdir(exist_ok=True)
    return {
        "type": "sql",
        "uri": f"sqlite:///{work}/catalog.db",
        "warehouse": f"file://{work}/warehouse",
    }


def sink_for(output: str, mode: str, work: Path, tag: str) -> tuple[Sink, Any, str]:
    """The foreachBatch function of `output`, the snapcut sink (None for
    the hand-written one) whose reports split its batches, and where the
    rows go (a path, or the Iceberg identifier)."""
    if output == HAND:
        where = str(work / f"hand-{tag}")
        return hand_written(Path(where), mode), None, where
    table: Any = None
    where = str(work / f"root-{tag}")
    if output == "delta":
        where = str(work / f"delta-{tag}")
        table = DeltaOutput(where)
    elif output == "iceberg":
        where = f"bench.t_{tag}"
        table = IcebergOutput(catalog(work), where)
    key = "user" if mode == "update" else None
    sink = ArrowSnapshotSink(str(work / f"root-{tag}"), output_mode=mode, key=key, output=table)
    return sink, sink, where


def profiled(write: Sink, profiler: cProfile.Profile) -> Sink:
    """`write` with `profiler` on during each call (foreachBatch runs it in
    a py4j callback thread, which a profiler started elsewhere misses)."""

    def call(batch: DataFrame, batch_id: int) -> None:
        profiler.enable()
        try:
            write(batch, batch_id)
        finally:
            profiler.disable()

    return call


def run(
    spark: SparkSession,
    output: str,
    mode: str,
    src: Path,
    work: Path,
    profiler: cProfile.Profile | None = None,
) -> dict[str, Any]:
    """One availableNow query of `output` over `src` (one file a batch)."""
    tag = f"{output.split()[0].replace('-', '_')}_{mode}_{time.monotonic_ns()}"
    df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(src))
    write, sink, where = sink_for(output, mode, work, tag)
    if profiler is not None:
        write = profiled(write, profiler)
    q = (
        query(df, mode)
        .writeStream.foreachBatch(write)
        .outputMode(mode)
        .option("checkpointLocation", str(work / f"chk-{tag}"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    if q.exception() is not None:
        raise RuntimeError(f"{output} ({mode}): {q.exception()}")
    progress = [p for p in q.recentProgress if p.numInputRows > 0]
    reports = [] if sink is None else [r for r in sink.reports if r.committed]
    return {
        "trigger_s": [p["durationMs"]["triggerExecution"] / 1000 for p in progress],
        "add_batch_s": [p["durationMs"]["addBatch"] / 1000 for p in progress],
        "stage_s": [r.stage_ms / 1000 for r in reports],
        "commit_s": [r.commit_ms / 1000 for r in reports],
        "rows": [r.rows for r in reports],
        "where": where,
    }


def summary(per: list[dict[str, Any]]) -> dict[str, Any]:
    """Pooled over rounds, every batch but the first."""
    later = [t for x in per for t in x["trigger_s"][1:]]
    res: dict[str, Any] = {
        "batch_s": statistics.median(later),
        "batch_min_s": min(later),
        "batch_max_s": max(later),
        "round_medians_s": [statistics.median(x["trigger_s"][1:]) for x in per],
        "later_s": later,
        "add_batch_s": statistics.median(t for x in per for t in x["add_batch_s"][1:]),
    }
    stage = [t for x in per for t in x["stage_s"][1:]]
    if stage:
        res["stage_s"] = statistics.median(stage)
        res["commit_s"] = statistics.median(t for x in per for t in x["commit_s"][1:])
    return res


def machine() -> dict[str, Any]:
    try:
        uptime = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout
    except OSError:
        uptime = ""
    cpu = ""
    with contextlib.suppress(OSError, StopIteration):
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    return {
        "node": platform.node(),
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "uptime": uptime.strip(),
        "load": os.getloadavg(),
    }


def measure(
    spark: SparkSession,
    keys: int,
    rows: int,
    batches: int,
    rounds: int,
    modes: list[str],
    outputs: list[str],
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Every output of every mode at `keys`, interleaved, `rounds` rounds."""
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        write_input(work / "in", keys, rows, batches)
        for mode in modes:
            per: dict[str, list[dict[str, Any]]] = {o: [] for o in outputs}
            for r in range(rounds):
                for output in outputs[r % len(outputs) :] + outputs[: r % len(outputs)]:
                    per[output].append(run(spark, output, mode, work / "in", work))
            for output in outputs:
                res = summary(per[output])
                if HAND in per and output != HAND:
                    hand = summary(per[HAND])
                    res["vs_hand"] = res["batch_s"] / hand["batch_s"]
                    res["vs_hand_per_round"] = [
                        a / b
                        for a, b in zip(
                            res["round_medians_s"], hand["round_medians_s"], strict=True
                        )
                    ]
                results[f"{keys}|{mode}|{output}"] = res
                ratio = f"  {res['vs_hand']:.2f}x hand-written" if "vs_hand" in res else ""
                split = (
                    f"  (stage {res['stage_s']:.3f}, commit {res['commit_s']:.3f})"
                    if "stage_s" in res
                    else ""
                )
                log(
                    f"{keys:>8} keys  {mode:<6} {output:<30} {res['batch_s']:7.3f} s/batch"
                    f"  [{res['batch_min_s']:.3f}-{res['batch_max_s']:.3f}]{ratio}{split}"
                )
    return results


def profile(spark: SparkSession, args: argparse.Namespace) -> int:
    """Where one output's batches spend the driver's time (after a warm-up
    query): cumulative time of the foreachBatch call's functions."""
    output, mode = args.profile
    text = [f"# {output}, {mode}: cProfile of the foreachBatch calls; {machine()['uptime']}"]
    for keys in args.keys:
        with tempfile.TemporaryDirectory() as d:
            work = Path(d)
            write_input(work / "in", keys, args.rows, args.batches)
            run(spark, output, mode, work / "in", work)  # warm-up
            profiler = cProfile.Profile()
            res = run(spark, output, mode, work / "in", work, profiler)
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(40)
        text += [
            f"## {keys} keys: {len(res['trigger_s'])} batches, triggerExecution "
            f"{[round(t, 3) for t in res['trigger_s']]} s, stage {res['stage_s']} s, "
            f"commit {res['commit_s']} s",
            out.getvalue(),
        ]
    Path(args.out).write_text("\n".join(text))
    spark.stop()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--outputs", nargs="+", choices=OUTPUTS, default=list(OUTPUTS))
    default_out = Path(__file__).resolve().parent / "results" / "lakehouse" / "lakehouse.json"
    parser.add_argument("--out", default=str(default_out))
    parser.add_argument(
        "--profile",
        nargs=2,
        metavar=("OUTPUT", "MODE"),
        help="instead: one query of OUTPUT in MODE per --keys under cProfile (the "
        "foreachBatch call), the top functions by cumulative time to --out (text)",
    )
    args = parser.parse_args()
    spark = start_session("3g")
    if args.profile:
        return profile(spark, args)
    results: dict[str, Any] = {"machine_before": machine(), "args": vars(args), "runs": {}}
    with tempfile.TemporaryDirectory() as d:  # warm-up, not recorded
        warm = Path(d)
        write_input(warm / "in", 1000, 10_000, 2)
        for output in args.outputs:
            for mode in args.modes:
                run(spark, output, mode, warm / "in", warm)
    for keys in args.keys:
        results["runs"].update(
            measure(
                spark,
                keys,
                args.rows,
                args.batches,
                args.rounds,
                args.modes,
                args.outputs,
                lambda s: print(s, flush=True),
            )
        )
    results["machine_after"] = machine()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
