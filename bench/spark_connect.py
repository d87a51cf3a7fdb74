"""Classic vs Spark Connect, side by side in one run: per-micro-batch time of
snapcut's level-1 aggregate (``bench/spark_state.py``'s "snapcut level 1
aggregate" into the noop sink) and of the dwell query into the sink
(``bench/spark_sink.py``'s "ArrowSnapshotSink (state=)"), at each key count.

One session kind at a time per process (a local Connect server lives in this
process's JVM), so each round starts a classic session, runs every
(keys, variant) query, stops it, then does the same on a Connect session
(``remote("local[2]")``); the kinds' order alternates round by round. The
figure is the median per-batch time over every batch but the first of every
round (``addBatch`` for level 1 as spark_state.py reports it,
``triggerExecution`` for the sink as spark_sink.py does); session start-up
is not in it. The ratio is Connect / classic.

Rerun (nothing else running):  python bench/spark_connect.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import spark_sink
import spark_state

LEVEL1 = "snapcut level 1 aggregate"
SINK = "ArrowSnapshotSink (state=)"
KINDS = {"classic": None, "connect": "local[2]"}


def one_kind(remote: str | None, inputs: dict[int, Path], work: Path) -> dict[str, list[float]]:
    """Every (keys, variant) query on one fresh session; later batches' times."""
    spark = spark_state.start_session("4g", remote=remote)
    out: dict[str, list[float]] = {}
    try:
        warm = work / "warm"
        spark_state.write_input(warm / "in", 1000, 10_000, 2)
        spark_state.run(
            spark, LEVEL1, spark_state.variants(warm / "st")[LEVEL1], str(warm / "in"), warm
        )
        spark_sink.run(spark, SINK, spark_sink.variants()[SINK], warm / "in", warm)
        for keys, src in inputs.items():
            level1 = spark_state.variants(work / "st")[LEVEL1]
            out[f"{keys}|level 1"] = spark_state.run(spark, LEVEL1, level1, str(src), work)[
                "later_s"
            ]
            sink = spark_sink.run(spark, SINK, spark_sink.variants()[SINK], src, work)
            out[f"{keys}|sink"] = sink["trigger_s"][1:]
    finally:
        spark.stop()
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    default_out = (
        Path(__file__).resolve().parent / "results" / "spark_connect" / "spark_connect.json"
    )
    parser.add_argument("--out", default=str(default_out))
    args = parser.parse_args()
    results: dict[str, Any] = {
        "machine": f"{platform.node()} {os.cpu_count()} cpus, load before {os.getloadavg()}",
        "args": vars(args),
        "runs": {},
    }
    samples: dict[str, dict[str, list[float]]] = {k: {} for k in KINDS}
    with tempfile.TemporaryDirectory() as d:
        base = Path(d)
        inputs = {}
        for keys in args.keys:
            inputs[keys] = base / f"in-{keys}"
            spark_state.write_input(inputs[keys], keys, args.rows, args.batches)
        for r in range(args.rounds):
            order = list(KINDS) if r % 2 == 0 else list(reversed(KINDS))
            for kind in order:
                got = one_kind(KINDS[kind], inputs, base / f"work-{r}-{kind}")
                for cell, times in got.items():
                    samples[kind].setdefault(cell, []).extend(times)
                print(f"round {r} {kind}: done", flush=True)
    for cell in samples["classic"]:
        classic, connect = samples["classic"][cell], samples["connect"][cell]
        row = {
            "classic_s": statistics.median(classic),
            "classic_range_s": [min(classic), max(classic)],
            "connect_s": statistics.median(connect),
            "connect_range_s": [min(connect), max(connect)],
            "connect_over_classic": statistics.median(connect) / statistics.median(classic),
            "classic_samples": classic,
            "connect_samples": connect,
        }
        results["runs"][cell] = row
        print(
            f"{cell:<22} classic {row['classic_s']:.3f} s [{min(classic):.3f}-{max(classic):.3f}]"
            f"  connect {row['connect_s']:.3f} s [{min(connect):.3f}-{max(connect):.3f}]"
            f"  ratio {row['connect_over_classic']:.2f}",
            flush=True,
        )
    results["load_after"] = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
