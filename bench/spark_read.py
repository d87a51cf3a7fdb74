"""Reading a state root into Spark: the data source (``format("snapcut")``)
against the reader it replaced, on one root of KEYS keys.

The root: one level-1 micro-batch (count and total per user over KEYS rows,
one per key, 2 state partitions), written by ``keyed_state`` in a streaming
query. Each variant reads the newest version whole into Spark's ``noop``
sink (every row and column materialised in the executors):

- ``data source (key/value structs)``: ``spark.read.format("snapcut")``;
- ``data source, columns=flat``: the same with ``columns=flat`` (what
  ``read_state`` now is);
- ``mapInArrow (the previous read_state)``: partition ids through
  ``mapInArrow`` calling the same per-partition reader, the code
  ``read_state`` ran before the data source (kept as ``read_planned`` for
  roots on a filesystem object);
- ``pyarrow, no Spark``: ``read_state_arrow`` (for scale).

Variants run interleaved, ROUNDS rounds in one Spark session (local[2]);
reported: the median and range per variant, and each Spark variant's ratio
to the previous reader within the same round (median and range).

Rerun:  python bench/spark_read.py --keys 1000000 --rounds 5 --out bench/results/spark_read
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

import numpy as np
import pandas as pd

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark.sql import SparkSession

import snapcut.spark
from snapcut.spark import keyed_state, read_state_arrow
from snapcut.spark.source.data_source import read_planned
from snapcut.spark.source.options import parse
from snapcut.spark.source.state_plan import plan_state
from snapcut.spark.state.root import StateRoot


def session() -> SparkSession:
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("snapcut-bench-read")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    snapcut.spark.register(spark)
    return spark


def build_root(spark: SparkSession, base: Path, keys: int) -> Path:
    inputs = base / "in"
    inputs.mkdir()
    rng = np.random.default_rng(1)
    frame = pd.DataFrame(
        {"user": rng.permutation(keys).astype("int64"), "dwell_ms": rng.integers(1, 10_000, keys)}
    )
    frame.to_parquet(inputs / "part-0.parquet")
    root = base / "root"
    df = spark.readStream.schema("user long, dwell_ms long").parquet(str(inputs))
    ks = keyed_state(df, "user", str(root), 2)
    agg = ks.aggregate(count="count", total=("sum", "dwell_ms"))
    (
        agg.writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", str(base / "chk"))
        .trigger(availableNow=True)
        .start()
        .awaitTermination()
    )
    return root


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    spark = session()
    base = Path(tempfile.mkdtemp(prefix="snapcut-bench-read-"))
    t0 = time.perf_counter()
    root = build_root(spark, base, args.keys)
    build_s = time.perf_counter() - t0
    state = StateRoot.existing(str(root))
    flat_plan = plan_state(state, parse({"path": str(root), "columns": "flat"}))

    def noop(df: Any) -> None:
        df.write.format("noop").mode("overwrite").save()

    variants: dict[str, Callable[[], Any]] = {
        "data source (key/value structs)": lambda: noop(
            spark.read.format("snapcut").load(str(root))
        ),
        "data source, columns=flat": lambda: noop(
            spark.read.format("snapcut").option("columns", "flat").load(str(root))
        ),
        "mapInArrow (the previous read_state)": lambda: noop(read_planned(spark, flat_plan)),
        "pyarrow, no Spark": lambda: read_state_arrow(str(root)),
    }
    baseline = "mapInArrow (the previous read_state)"
    # One warm-up each (JIT, Python workers), then interleaved rounds, the order rotating.
    for fn in variants.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            times[name].append(timed(variants[name]))
    ratios = {
        name: [t / b for t, b in zip(times[name], times[baseline], strict=True)]
        for name in names
        if name != baseline
    }
    load = Path("/proc/loadavg").read_text().split()[:3]
    report = {
        "keys": args.keys,
        "rounds": args.rounds,
        "build_s": round(build_s, 2),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load": load},
        "seconds": {n: [round(t, 3) for t in ts] for n, ts in times.items()},
        "median_s": {n: round(statistics.median(ts), 3) for n, ts in times.items()},
        "ratio_to_previous_reader": {
            n: {
                "median": round(statistics.median(rs), 3),
                "min": round(min(rs), 3),
                "max": round(max(rs), 3),
            }
            for n, rs in ratios.items()
        },
    }
    print(json.dumps(report, indent=2))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    spark.stop()


if __name__ == "__main__":
    main()
