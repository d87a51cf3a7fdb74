"""A cold Python worker's first batch at KEYS keys (issue 37): ``keyed_state``
level 1, with and without a per-worker ``state_memory``, as
``../shared/tools/spark-big-state`` builds it (batch 0 creates every key, then
1M-row batches over random keys; local[2], 2 state partitions, noop sink,
8 GB driver), but stopped after WARM batches and started again in a new
SparkContext: its Python workers are new, so the restarted query's first
batch reads every partition's state from the root (a cold worker), and the
batches after it find their partitions in their workers again (warm).

Each run is its own process (``--one``); variants run in rounds, each round in
the opposite order to the last (ABBA). Writes ``<out>/runs.jsonl`` (addBatch ms
of every batch before and after the restart) and prints a Markdown table: per
variant, the medians over rounds of the warm batches before the restart, the
cold first batch after it, the warm ones after it, and cold / warm.

    python bench/state_store_cold.py --keys 20000000 --rounds 2 \\
        --variants snapcut,snapcut:256MB --out bench/results/state_store/cold
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


def run_query(base: Path, budget: str | None) -> tuple[list[int], list[int]]:
    """Runs the query over the files there are (availableNow) in a new
    SparkContext, stops it; addBatch ms of each batch it ran, and the
    step's ``state_load_ms_max`` (the slowest task's read and restore of
    its partition from the root; 0 when every task found it warm)."""
    from pyspark.sql import SparkSession

    from snapcut.spark import keyed_state
    from snapcut.spark.metrics import observed

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "8g")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
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
        loads = [int((observed(p, "state") or {}).get("state_load_ms_max", 0)) for p in progress]
        return [int(p["durationMs"]["addBatch"]) for p in progress], loads
    finally:
        # Stops the SparkContext and with it its Python workers: the next
        # context's workers start empty.
        spark.stop()


def one(keys: int, budget: str | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="snapcut-cold-") as d:
        base = Path(d)
        write_inputs(base / "in", keys, 0, 1 + WARM)
        before, _ = run_query(base, budget)
        write_inputs(base / "in", keys, 1 + WARM, 1 + WARM)
        after, loads = run_query(base, budget)
    if len(before) != 1 + WARM or len(after) != 1 + WARM:
        raise SystemExit(f"expected {1 + WARM} batches a query, got {before} and {after}")
    return {
        "keys": keys,
        "budget": budget,
        "before_ms": before,
        "after_ms": after,
        "after_load_ms": loads,
    }


def run_one(keys: int, budget: str | None, timeout_s: float) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--one", "--keys", str(keys)]
    return run_json(cmd + (["--budget", budget] if budget else []), timeout_s)


def table(rows: list[dict[str, Any]]) -> str:
    def spread(xs: list[float]) -> str:
        return f"{statistics.median(xs):,.0f} [{min(xs):,.0f}, {max(xs):,.0f}]"

    out = [
        "| variant | warm before the restart ms | cold first batch ms | warm after it ms "
        "| cold / warm | cold: its slowest partition's load ms | rounds |",
        "|---|---|---|---|---|---|---|",
    ]
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault("snapcut" + (f" {r['budget']}" if r["budget"] else ""), []).append(r)
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
    p.add_argument("--out", type=Path)
    p.add_argument("--timeout-s", type=float, default=3600.0, help="per run")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--budget", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.keys, args.budget)), flush=True)
        return 0
    if args.out is None:
        p.error("--out is required")
    budgets: list[str | None] = []
    for v in args.variants.split(","):
        name, _, budget = v.partition(":")
        if name != "snapcut":
            raise SystemExit(f"unknown variant {v!r}: snapcut or snapcut:<budget>")
        budgets.append(budget or None)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = abba(
        budgets,
        args.rounds,
        lambda b: run_one(args.keys, b, args.timeout_s),
        args.out / "runs.jsonl",
    )
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
