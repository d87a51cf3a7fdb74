"""A cold Python worker's first batch at KEYS keys (issue 37): ``keyed_state``
level 1, with and without a per-worker ``state_memory``, as
``../shared/tools/spark-big-state`` builds it (batch 0 creates every key, then
1M-row batches over random keys; local[2], 2 state partitions, noop sink,
8 GB driver), stopped after WARM batches and started again, so that its
next batch runs on new Python workers that read every partition's state
from the root (a cold worker), and the batches after it find their
partitions in their workers again (warm). Two ways to get new workers:

- ``idle``: the query starts again in the same SparkContext after
  ``IDLE_WAIT_S``, past the minute after which Spark's
  ``PythonWorkerFactory`` stops idle Python workers (``IDLE_WORKER_TIMEOUT_NS``,
  checked every 10 s): the JVM, its daemon and the query plan's code are
  warm, only the Python workers are new (the issue's "first batch on a fresh
  Python worker");
- ``restart``: a new SparkContext (the driver's JVM stays, the Python daemon
  and every worker are new, the query is planned afresh): a restarted job.

Each run is its own process (``--one``); the variants (budget x mode) run in
rounds, each round in the opposite order to the last (ABBA). Writes
``<out>/runs.jsonl`` (addBatch ms, the slowest partition's load and the
cache hits of every batch before and after) and prints a Markdown table:
per variant, the medians over rounds of the warm batches before, the cold
first batch after, the warm ones after it, and cold / warm. A cold batch in
which a task found its partition in its worker is refused (no new worker).

    python bench/state_store_cold.py --keys 20000000 --rounds 2 \\
        --variants snapcut,snapcut:256MB --modes idle,restart \\
        --out bench/results/state_store/cold
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from state_store_spark import abba, run_json

WARM = 2
"""1M-row batches before the restart (after batch 0) and after the cold one."""

IDLE_WAIT_S = 80.0
"""The ``idle`` mode's pause: Spark stops Python workers idle for a minute,
looking every 10 s."""

MODES = ("idle", "restart")


def write_inputs(directory: Path, keys: int, first: int, count: int) -> None:
    """Files `first`..`first+count-1` of the input (file 0: every key once; the
    others 1M rows over random keys), mtimes in order so the file source
    takes them one a batch."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    t0 = int(time.time()) - 3600
    for i in range(first, first + count):
        rng = np.random.default_rng(i)
        users = np.arange(keys, dtype=np.int64) if i == 0 else rng.integers(0, keys, 1_000_000)
        table = pa.table({"user": users, "dwell_ms": rng.integers(0, 10_000, len(users))})
        path = directory / f"part-{i:05d}.parquet"
        pq.write_table(table, path)
        os.utime(path, (t0 + 10 * i, t0 + 10 * i))


def session() -> Any:
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "8g")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run_query(spark: Any, base: Path, budget: str | None) -> dict[str, list[int]]:
    """Runs the query over the files there are (availableNow), stops it;
    per batch it ran: addBatch ms, the step's ``state_load_ms_max`` (the
    slowest task's read and restore of its partition from the root; 0 when
    every task found it warm) and ``state_cache_hits``."""
    from snapcut.spark import keyed_state
    from snapcut.spark.metrics import observed

    events = (
        spark.readStream.schema("user long, dwell_ms long")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(base / "in"))
    )
    kw = {"state_memory": budget} if budget else {}
    out = keyed_state(events, key="user", root=str(base / "state"), partitions=2, **kw)
    q = (
        out.aggregate(count="count", total=("sum", "dwell_ms"))
        .writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", str(base / "chk"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    if q.exception() is not None:
        raise RuntimeError(str(q.exception()))
    progress = q.recentProgress
    metrics = [observed(p, "state") or {} for p in progress]
    return {
        "ms": [int(p["durationMs"]["addBatch"]) for p in progress],
        "load_ms": [int(m.get("state_load_ms_max", 0)) for m in metrics],
        "hits": [int(m.get("state_cache_hits", 0)) for m in metrics],
    }


def one(keys: int, budget: str | None, mode: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="snapcut-cold-") as d:
        base = Path(d)
        write_inputs(base / "in", keys, 0, 1 + WARM)
        spark = session()
        before = run_query(spark, base, budget)
        write_inputs(base / "in", keys, 1 + WARM, 1 + WARM)
        if mode == "restart":
            # Stops the SparkContext and with it its Python daemon and workers:
            # the next context's workers start empty.
            spark.stop()
            spark = session()
        else:
            time.sleep(IDLE_WAIT_S)
        try:
            after = run_query(spark, base, budget)
        finally:
            spark.stop()
    if len(before["ms"]) != 1 + WARM or len(after["ms"]) != 1 + WARM:
        raise SystemExit(f"expected {1 + WARM} batches a query, got {before} and {after}")
    if after["hits"][0]:
        raise SystemExit(
            f"the first batch after the {mode} found {after['hits'][0]} partition(s) warm: its "
            "Python workers were not new"
        )
    return {
        "keys": keys,
        "budget": budget,
        "mode": mode,
        "before_ms": before["ms"],
        "before_hits": before["hits"],
        "after_ms": after["ms"],
        "after_load_ms": after["load_ms"],
        "after_hits": after["hits"],
    }


def run_one(keys: int, variant: tuple[str | None, str], timeout_s: float) -> dict[str, Any]:
    budget, mode = variant
    cmd = [sys.executable, __file__, "--one", "--keys", str(keys), "--mode", mode]
    return run_json(cmd + (["--budget", budget] if budget else []), timeout_s)


def table(rows: list[dict[str, Any]]) -> str:
    def spread(xs: list[float]) -> str:
        return f"{statistics.median(xs):,.0f} [{min(xs):,.0f}, {max(xs):,.0f}]"

    out = [
        "| variant, mode | warm before ms | cold first batch ms | warm after it ms "
        "| cold / warm | cold: its slowest partition's load ms | rounds |",
        "|---|---|---|---|---|---|---|",
    ]
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        name = "snapcut" + (f" {r['budget']}" if r["budget"] else "")
        by.setdefault(f"{name}, {r.get('mode', 'restart')}", []).append(r)
    for name, rs in by.items():
        warm_before = [statistics.median(r["before_ms"][1:]) for r in rs]
        cold = [float(r["after_ms"][0]) for r in rs]
        warm_after = [statistics.median(r["after_ms"][1:]) for r in rs]
        ratio = [
            c / statistics.median([*r["before_ms"][1:], *r["after_ms"][1:]])
            for c, r in zip(cold, rs, strict=True)
        ]
        out.append(
            f"| {name} | {spread(warm_before)} | {spread(cold)} | {spread(warm_after)} "
            f"| {statistics.median(ratio):.2f}x [{min(ratio):.2f}, {max(ratio):.2f}] "
            f"| {spread([float(r['after_load_ms'][0]) for r in rs])} | {len(rs)} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=20_000_000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--variants", default="snapcut,snapcut:256MB")
    p.add_argument("--modes", default="idle,restart", help="idle, restart or both")
    p.add_argument("--out", type=Path)
    p.add_argument("--timeout-s", type=float, default=3600.0, help="per run")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--budget", default=None, help=argparse.SUPPRESS)
    p.add_argument("--mode", default="idle", choices=MODES, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.keys, args.budget, args.mode)), flush=True)
        return 0
    if args.out is None:
        p.error("--out is required")
    budgets: list[str | None] = []
    for v in args.variants.split(","):
        name, _, budget = v.partition(":")
        if name != "snapcut":
            raise SystemExit(f"unknown variant {v!r}: snapcut or snapcut:<budget>")
        budgets.append(budget or None)
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise SystemExit(f"unknown mode(s) {unknown}: idle, restart or both")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = abba(
        [(b, m) for b in budgets for m in modes],
        args.rounds,
        lambda v: run_one(args.keys, v, args.timeout_s),
        args.out / "runs.jsonl",
    )
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
