"""Per-micro-batch time of stateful per-key processing on Spark: snapcut's
three levels against Spark's native aggregation, ``applyInPandasWithState``
and ``transformWithStateInPandas`` (RocksDB), on the same file-source query.

Every variant computes per-user count and total of ``dwell_ms`` over a
stream of BATCHES parquet files (one per micro-batch, ROWS rows each, keys
uniform over KEYS users) into Spark's ``noop`` sink; the first batch (which
creates every key) is reported apart, the time per batch is the median of
the others (``durationMs.addBatch`` of the query progress). Variants run one
after another in one process and one Spark session (local[2], 2 shuffle
partitions, 2 state partitions). snapcut's figures also give the time its
tasks spent writing state (sync, in the task) and the bytes per batch.

Rerun:  python bench/spark_state.py --keys 10000 100000 1000000
        (--only "snapcut level 1": the variants whose name holds that text)
        (env SLOW_MAX_KEYS caps the per-key Python variants, default 100000;
        TWS_MAX_KEYS caps transformWithStateInPandas, default 10000: ~2 ms a key)
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupStateTimeout

from snapcut.experiments.spark_memory_state import in_memory
from snapcut.spark import StateUpdate, keyed_state

SCHEMA = "user long, dwell_ms long"
OUT = "user long, count long, total long"
STATE = "count long, total long"


def dwell_func(
    key: tuple[Any, ...], pdfs: Iterator[pd.DataFrame], state: Any
) -> Iterator[pd.DataFrame]:
    count, total = state.get if state.exists else (0, 0)
    for pdf in pdfs:
        count += len(pdf)
        total += int(pdf["dwell_ms"].sum())
    state.update((count, total))
    yield pd.DataFrame({"user": [key[0]], "count": [count], "total": [total]})


def dwell_batch(rows: pa.Table, state: pa.Table, info: Any) -> StateUpdate:
    agg = rows.group_by("user").aggregate([("dwell_ms", "count"), ("dwell_ms", "sum")])
    joined = agg.join(state.select(["user", "count", "total"]), "user")
    count = pc.add(pc.fill_null(joined["count"], 0), joined["dwell_ms_count"])
    total = pc.add(pc.fill_null(joined["total"], 0), joined["dwell_ms_sum"])
    new = pa.table({"user": joined["user"], "count": count, "total": total})
    return StateUpdate(output=new, state=new)


def twsp_processor() -> Any:
    from pyspark.sql.streaming import StatefulProcessor
    from pyspark.sql.types import LongType, StructField, StructType

    class Dwell(StatefulProcessor):  # type: ignore[misc]
        def init(self, handle: Any) -> None:
            schema = StructType(
                [StructField("count", LongType()), StructField("total", LongType())]
            )
            self.state = handle.getValueState("dwell", schema)

        def handleInputRows(
            self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
        ) -> Iterator[pd.DataFrame]:
            count, total = self.state.get() if self.state.exists() else (0, 0)
            for pdf in rows:
                count += len(pdf)
                total += int(pdf["dwell_ms"].sum())
            self.state.update((count, total))
            yield pd.DataFrame({"user": [key[0]], "count": [count], "total": [total]})

        def close(self) -> None:
            pass

    return Dwell()


def tws_rich_processor(pandas: bool) -> Any:
    """Value + map + list state per key: the count and total (value), counts
    per dwell second (map), the last five dwell times (list)."""
    from pyspark.sql import Row
    from pyspark.sql.streaming import StatefulProcessor

    class Rich(StatefulProcessor):  # type: ignore[misc]
        def init(self, handle: Any) -> None:
            self.totals = handle.getValueState("totals", "count long, total long")
            self.seconds = handle.getMapState("seconds", "second long", "n long")
            self.recent = handle.getListState("recent", "dwell_ms long")

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
            count, total = self.totals.get() if self.totals.exists() else (0, 0)
            dwell: list[int] = []
            for chunk in rows:
                if pandas:
                    dwell += [int(v) for v in chunk["dwell_ms"]]
                else:
                    dwell.append(int(chunk["dwell_ms"]))
            count += len(dwell)
            total += sum(dwell)
            self.totals.update((count, total))
            for sec in {d // 1000 for d in dwell}:
                n = self.seconds.getValue((sec,))
                self.seconds.updateValue((sec,), ((n[0] if n else 0) + 1,))
            recent = [v for (v,) in self.recent.get()] + dwell
            self.recent.put([(v,) for v in recent[-5:]])
            if pandas:
                yield pd.DataFrame({"user": [key[0]], "count": [count], "total": [total]})
            else:
                yield Row(user=key[0], count=count, total=total)

        def close(self) -> None:
            pass

    return Rich()


def tws_row_processor() -> Any:
    """The counting processor over Rows (``transformWithState``)."""
    from pyspark.sql import Row
    from pyspark.sql.streaming import StatefulProcessor

    class DwellRows(StatefulProcessor):  # type: ignore[misc]
        def init(self, handle: Any) -> None:
            self.state = handle.getValueState("dwell", "count long, total long")

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
            count, total = self.state.get() if self.state.exists() else (0, 0)
            for r in rows:
                count += 1
                total += int(r["dwell_ms"])
            self.state.update((count, total))
            yield Row(user=key[0], count=count, total=total)

        def close(self) -> None:
            pass

    return DwellRows()


def variants(root: Path) -> dict[str, Callable[[DataFrame, str], DataFrame]]:
    def snap(df: DataFrame, name: str, writes: str = "background") -> Any:
        return keyed_state(df, "user", str(root / name), 2, state_writes=writes)

    def level1(ks: Any) -> DataFrame:
        return ks.aggregate(count="count", total=("sum", "dwell_ms"))  # type: ignore[no-any-return]

    return {
        "spark native groupBy().agg()": lambda df, _: df.groupBy("user").agg(
            F.count("*").alias("count"), F.sum("dwell_ms").alias("total")
        ),
        "snapcut level 1 aggregate": lambda df, n: level1(snap(df, n)),
        "snapcut level 1, snapshots off": lambda df, n: level1(in_memory(df, "user", n, 2)),
        "snapcut level 1, sync state writes": lambda df, n: level1(snap(df, n, "sync")),
        "snapcut level 2 map_batches": lambda df, n: snap(df, n).map_batches(
            dwell_batch, state_schema=STATE, output_schema=OUT
        ),
        "snapcut level 3 apply_in_pandas_with_state": lambda df, n: snap(
            df, n
        ).apply_in_pandas_with_state(dwell_func, OUT, STATE, "update", "NoTimeout"),
        "spark applyInPandasWithState": lambda df, _: df.groupBy("user").applyInPandasWithState(
            dwell_func, OUT, STATE, "update", GroupStateTimeout.NoTimeout
        ),
        "spark transformWithStateInPandas (RocksDB)": lambda df, _: df.groupBy(
            "user"
        ).transformWithStateInPandas(twsp_processor(), OUT, "Update", "None"),
        "snapcut transform_with_state_in_pandas": lambda df, n: snap(
            df, n
        ).transform_with_state_in_pandas(twsp_processor(), OUT, "Update", "None"),
        "spark transformWithState Row (RocksDB)": lambda df, _: df.groupBy(
            "user"
        ).transformWithState(tws_row_processor(), OUT, "Update", "None"),
        "snapcut transform_with_state Row": lambda df, n: snap(df, n).transform_with_state(
            tws_row_processor(), OUT, "Update", "None"
        ),
        "spark transformWithStateInPandas value+map+list (RocksDB)": lambda df, _: df.groupBy(
            "user"
        ).transformWithStateInPandas(tws_rich_processor(True), OUT, "Update", "None"),
        "snapcut transform_with_state_in_pandas value+map+list": lambda df, n: snap(
            df, n
        ).transform_with_state_in_pandas(tws_rich_processor(True), OUT, "Update", "None"),
        "spark transformWithState Row value+map+list (RocksDB)": lambda df, _: df.groupBy(
            "user"
        ).transformWithState(tws_rich_processor(False), OUT, "Update", "None"),
        "snapcut transform_with_state Row value+map+list": lambda df, n: snap(
            df, n
        ).transform_with_state(tws_rich_processor(False), OUT, "Update", "None"),
    }


SLOW = (
    "level 3",
    "applyInPandasWithState",
    "transformWithState",
    "transform_with_state",
)


def write_input(directory: Path, keys: int, rows: int, batches: int) -> None:
    rng = np.random.default_rng(42)
    directory.mkdir(parents=True)
    for b in range(batches):
        frame = pd.DataFrame(
            {"user": rng.integers(0, keys, rows), "dwell_ms": rng.integers(1, 10_000, rows)}
        )
        frame.to_parquet(directory / f"part-{b:05d}.parquet", index=False)


def run(
    spark: SparkSession,
    name: str,
    build: Callable[[DataFrame, str], DataFrame],
    src: str,
    work: Path,
) -> dict[str, Any]:
    """One streaming query over ``src`` (a directory or glob), one file per batch."""
    tag = "".join(c if c.isalnum() else "_" for c in name) + f"_{time.monotonic_ns()}"
    rocks = "transformWithState" in name
    provider = "spark.sql.streaming.stateStore.providerClass"
    if rocks:
        spark.conf.set(
            provider, "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
        )
    try:
        df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(src)
        q = (
            build(df, tag)
            .writeStream.format("noop")
            .outputMode("update")
            .option("checkpointLocation", str(work / f"chk-{tag}"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()
        progress = [p for p in q.recentProgress if p.numInputRows > 0]
    finally:
        if rocks:
            spark.conf.unset(provider)
    times = [p["durationMs"]["addBatch"] / 1000 for p in progress]
    out: dict[str, Any] = {"first_s": times[0], "later_s": times[1:]}
    root = work / "state" / tag
    if root.exists():
        manifests = [json.loads(m.read_text()) for m in sorted(root.glob("chk-*/manifest.json"))]
        out["write_ms"] = [m["spark"]["write_ms"] for m in manifests[1:]]
        out["bytes"] = [
            (
                "+".join(sorted({f["kind"] for f in m["files"] if f["role"] == "state"})),
                m["spark"]["state_bytes"],
            )
            for m in manifests
        ]
    return out


def merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Rounds of one variant: the median over every later batch of every round."""
    later = [t for r in runs for t in r["later_s"]]
    out: dict[str, Any] = {
        "rounds": len(runs),
        "first_s": statistics.median(r["first_s"] for r in runs),
        "batch_s": statistics.median(later),
        "batch_min_s": min(later),
        "batch_max_s": max(later),
        "later_s": later,
    }
    if "write_ms" in runs[0]:
        out["write_ms"] = statistics.median(w for r in runs for w in r["write_ms"])
        out["bytes"] = runs[0]["bytes"]
    return out


def start_session(
    driver_memory: str = "6g", remote: str | None = None, **conf: str
) -> SparkSession:
    """The session of these benchmarks (also bench/conftest.py's): local[2],
    2 shuffle partitions, UI and console progress off; `remote`: a Spark
    Connect session instead (``local[2]``: a local server in this process)."""
    base = SparkSession.builder
    builder = (
        (base.remote(remote) if remote is not None else base.master("local[2]"))
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", driver_memory)
    )
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    if remote is None:
        spark.sparkContext.setLogLevel("ERROR")
    return spark


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--batches", type=int, default=6, help="micro-batches of a fast variant")
    parser.add_argument("--slow-batches", type=int, default=3, help="of a per-key Python variant")
    parser.add_argument("--rounds", type=int, default=2, help="fast variants, order rotated")
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="TEXT",
        help="run only the variants whose name contains one of these (default: every variant)",
    )
    # Next to this file, not the working directory: the same file from any cwd.
    default_out = Path(__file__).resolve().parent / "results" / "spark_state" / "spark_state.json"
    parser.add_argument("--out", default=str(default_out))
    parser.add_argument(
        "--remote", default=None, help="a Spark Connect URL (local[2]: a local server)"
    )
    args = parser.parse_args()
    slow_max = int(os.environ.get("SLOW_MAX_KEYS", "100000"))
    tws_max = int(os.environ.get("TWS_MAX_KEYS", "10000"))
    spark = start_session(remote=args.remote)
    results: dict[str, Any] = {
        "machine": f"{platform.node()} {os.cpu_count()} cpus, load {os.getloadavg()}",
        "python": sys.version.split()[0],
        "args": vars(args),
        "runs": {},
    }
    with tempfile.TemporaryDirectory() as d:
        # Warm-up (not recorded): JIT, Python workers and their imports.
        work = Path(d) / "warm"
        write_input(work / "in", 1000, 10_000, 3)
        for name, build in list(variants(work / "state").items())[:3]:
            run(spark, name, build, str(work / "in"), work)
    for keys in args.keys:
        rows = 1_000_000 if keys >= 1_000_000 else 200_000
        with tempfile.TemporaryDirectory() as d:
            work = Path(d)
            write_input(work / "in", keys, rows, max(args.batches, args.slow_batches))
            chosen = {
                name: build
                for name, build in variants(work / "state").items()
                if not (keys > slow_max and any(s in name for s in SLOW))
                and not (keys > tws_max and "transformWithState" in name)
                and (args.only is None or any(text in name for text in args.only))
            }
            fast = [n for n in chosen if not any(s in n for s in SLOW)]
            slow = [n for n in chosen if n not in fast]
            fast_src = str(work / "in" / "*.parquet")
            slow_src = str(work / "in" / f"part-0000[0-{args.slow_batches - 1}].parquet")
            per: dict[str, list[dict[str, Any]]] = {n: [] for n in chosen}
            for r in range(args.rounds if fast else 0):
                order = fast[r % len(fast) :] + fast[: r % len(fast)]
                for name in order:
                    per[name].append(run(spark, name, chosen[name], fast_src, work))
            for name in slow:
                per[name].append(run(spark, name, chosen[name], slow_src, work))
            for name in chosen:
                res = merge(per[name])
                res["rows_per_batch"] = rows
                results["runs"][f"{keys}|{name}"] = res
                print(
                    f"{keys:>8} keys {rows:>8} rows  {name:<45} {res['batch_s']:7.3f} s/batch"
                    f"  [{res['batch_min_s']:.3f}-{res['batch_max_s']:.3f}]"
                    f"  (first {res['first_s']:.3f} s)",
                    flush=True,
                )
    results["load_after"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(results, indent=2))
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
