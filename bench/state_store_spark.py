"""State beyond memory on Spark (issue 37): ``keyed_state`` level 1 at KEYS keys
with and without a per-worker ``state_memory``, beside Spark's own aggregation
on the HDFS and the RocksDB state store providers, measured with
``../shared/tools/spark-big-state`` (batch 0 creates every key, then 1M-row
batches over random keys; local[2], 2 state partitions, noop sink; it prints
each batch's addBatch ms and the peak RSS, VmHWM, of the Python workers and of
the JVM).

Variants run in rounds, each round in the opposite order to the last (ABBA),
so that the guest's speed modes fall on every variant alike. Writes
``<out>/runs.jsonl`` (the tool's lines, with round and order) and prints a
Markdown table: per variant, the median over rounds of batch 0 and of the
later batches' median, and the largest worker and JVM peaks.

    python bench/state_store_spark.py --keys 20000000 --rounds 2 \\
        --variants snapcut,snapcut:256MB --out bench/results/state_store/spark

Variants ``tws-rows`` and ``tws-pandas`` run the same job with a
transformWithState(InPandas) processor keeping level 1's count and total
(``bench/spark_big_state_tws.py``), e.g. ``tws-rows:256MB``; ``tws-ttl`` the
``tws-rows`` processor with a TTL on its state (a time index of every key); variant ``l3``
the same with an ``applyInPandasWithState`` function (level 3), ``l2`` with a
``map_batches`` function of Arrow tables (level 2).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

TOOL = Path(__file__).resolve().parents[2] / "shared" / "tools" / "spark-big-state"
TWS = Path(__file__).resolve().parent / "spark_big_state_tws.py"
"""The tool's job with a transformWithState processor (variants tws-rows, tws-pandas)."""
VARIANTS = ("snapcut", "native", "rocksdb", "tws-rows", "tws-ttl", "tws-pandas", "l3", "l2")
V = TypeVar("V")


def parse_variant(text: str) -> tuple[str, str | None]:
    name, _, budget = text.partition(":")
    if name not in VARIANTS:
        raise SystemExit(f"unknown variant {name!r}: use one of {', '.join(VARIANTS)}")
    if budget and name in ("native", "rocksdb"):
        raise SystemExit(f"{text}: only snapcut's variants take a budget (snapcut:256MB)")
    return name, budget or None


def run_one(keys: int, name: str, budget: str | None, timeout_s: float) -> dict[str, Any]:
    if name.startswith("tws-") or name in ("l2", "l3"):
        cmd = [sys.executable, str(TWS), str(keys), name.removeprefix("tws-")]
    else:
        cmd = [sys.executable, str(TOOL), str(keys), name]
    return run_json(cmd + ([budget] if budget else []), timeout_s)


def run_json(cmd: list[str], timeout_s: float) -> dict[str, Any]:
    """Runs one measurement in a process of its own (PYSPARK_PYTHON: this
    interpreter); its last JSON line, with its wall time."""
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    started = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("{")][-1]
    return json.loads(line) | {"wall_s": round(time.monotonic() - started, 1)}


def label(row: dict[str, Any]) -> str:
    return row["variant"] + (f" {row['budget']}" if row.get("budget") else "")


def table(rows: list[dict[str, Any]]) -> str:
    out = [
        "| variant | batch 0 (creates the keys) ms | later batches ms (median) | "
        "Python worker peak MB | JVM peak MB | rounds |",
        "|---|---|---|---|---|---|",
    ]
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(label(r), []).append(r)
    for name, rs in by.items():
        first = [r["addBatch_ms"][0] for r in rs]
        later = [statistics.median(r["addBatch_ms"][1:]) for r in rs]
        out.append(
            f"| {name} | {statistics.median(first):,.0f} [{min(first):,}, {max(first):,}] | "
            f"{statistics.median(later):,.0f} [{min(later):,.0f}, {max(later):,.0f}] | "
            f"{max(r['py_worker_hwm_mb'] for r in rs):,} | {max(r['jvm_hwm_mb'] for r in rs):,} "
            f"| {len(rs)} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=20_000_000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--variants", default="snapcut,snapcut:256MB")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--timeout-s", type=float, default=3600.0, help="per run")
    p.add_argument(
        "--append",
        action="store_true",
        help="add to <out>/runs.jsonl (e.g. a round of Spark's own providers) and print "
        "the table of every run in it",
    )
    args = p.parse_args(argv)
    if not TOOL.exists():
        raise SystemExit(f"{TOOL} is missing: it comes with ../shared beside the checkout")
    variants = [parse_variant(v) for v in args.variants.split(",") if v]
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "runs.jsonl"
    rows: list[dict[str, Any]] = []
    if args.append and path.exists():
        rows = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
    rows += abba(
        variants,
        args.rounds,
        lambda v: run_one(args.keys, v[0], v[1], args.timeout_s),
        path,
        append=args.append,
    )
    print(table(rows))
    return 0


def abba(
    variants: list[V],
    rounds: int,
    run: Callable[[V], dict[str, Any]],
    path: Path,
    append: bool = False,
) -> list[dict[str, Any]]:
    """Runs every variant once a round, each round in the opposite order to
    the last; each row (with its round and order) is printed and written to
    `path` as it comes."""
    rows = []
    with open(path, "a" if append else "w") as f:
        for rnd in range(rounds):
            order = variants if rnd % 2 == 0 else variants[::-1]
            for i, variant in enumerate(order):
                row = run(variant) | {"round": rnd, "order": i}
                print(json.dumps(row), flush=True)
                f.write(json.dumps(row) + "\n")
                f.flush()
                rows.append(row)
    return rows


if __name__ == "__main__":
    sys.exit(main())
