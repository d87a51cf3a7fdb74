"""snapcut's Spark helper vs Spark's own stateful APIs: the time of one
micro-batch of the same streaming query (per-user count and total of
``dwell_ms`` into Spark's ``noop`` sink), the variants of
``bench/spark_state.py`` (imported from there, not copied), one group per size:

- ``spark-10k-keys`` (200k rows a batch): native ``groupBy().agg()`` (the
  baseline), snapcut level 1 ``aggregate`` (background state writes, the
  default), level 1 with sync state writes, level 1 with snapshots off (a bench
  baseline, ``InMemoryKeyedState``), level 2 ``map_batches``.
- ``spark-1k-keys`` (20k rows a batch), the variants that call Python once per
  key: native (the baseline), level 1, level 3 ``apply_in_pandas_with_state``
  and Spark's ``applyInPandasWithState`` (the same ``dwell_func``). Smaller,
  because Spark's per-key Python costs ~1-2 ms a key (9 s a batch at 10k keys).

After an untimed warm-up (a small query of native, level 1 and level 2, as
bench/spark_state.py does), one long-running query per variant over a file
source (``maxFilesPerTrigger`` 1) in the shared local[2] session
(bench/conftest.py). Its first batch (which creates every key) runs before
the benchmark; then each round's untimed set-up drops the next parquet file
into the source directory and the timed part is ``processAllAvailable()``:
the whole micro-batch as the driver sees it (file listing, planning, the
batch, the commit, plus up to one 10 ms polling delay).
``extra_info["addBatch_s"]``: Spark's own ``durationMs.addBatch`` of the timed
batches (what bench/spark_state.py reports), ``first_batch_s`` the first one.

Order: variants run one after another in file order (``--bench-reverse`` for
the other order; bench/README.md). transformWithStateInPandas and 100k/1M
keys: bench/spark_state.py.

Run: pytest bench/test_spark_py.py --benchmark-only        (~2-3 min on a busy 2-vCPU machine)
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from spark_state import SCHEMA, run, variants, write_input

pytestmark = pytest.mark.spark

NATIVE = "spark native groupBy().agg()"
FAST = {
    "native": NATIVE,
    "level1": "snapcut level 1 aggregate",
    "level1-sync-writes": "snapcut level 1, sync state writes",
    "level1-snapshots-off": "snapcut level 1, snapshots off",
    "level2": "snapcut level 2 map_batches",
}
PER_KEY = {
    "native": NATIVE,
    "level1": "snapcut level 1 aggregate",
    "level3": "snapcut level 3 apply_in_pandas_with_state",
    "applyInPandasWithState": "spark applyInPandasWithState",
}


@dataclass(frozen=True)
class Size:
    group: str
    keys: int
    rows: int
    rounds: int
    smoke_keys: int = 500
    smoke_rows: int = 5_000


FAST_SIZE = Size("spark-10k-keys", keys=10_000, rows=200_000, rounds=5)
PER_KEY_SIZE = Size("spark-1k-keys", keys=1_000, rows=20_000, rounds=3)
WARMUP = 1


@pytest.fixture(scope="module")
def staged(tmp_path_factory: pytest.TempPathFactory, smoke: bool) -> dict[str, list[Path]]:
    """Per group: the parquet files of its batches (first, warm-up, rounds)."""
    out = {}
    for size in (FAST_SIZE, PER_KEY_SIZE):
        d = tmp_path_factory.mktemp(size.group) / "staged"
        keys, rows = (size.smoke_keys, size.smoke_rows) if smoke else (size.keys, size.rows)
        write_input(d, keys, rows, 1 + WARMUP + size.rounds)
        out[size.group] = sorted(d.glob("*.parquet"))
    return out


@pytest.fixture(scope="module")
def warm(spark: Any, tmp_path_factory: pytest.TempPathFactory, smoke: bool) -> None:
    """Not timed: as bench/spark_state.py does, one small query of native,
    level 1 and level 2 first (JIT, Python workers and their imports), so the
    first variant of a group does not pay for the JVM's warm-up."""
    if smoke:
        return
    work = tmp_path_factory.mktemp("spark-warm")
    write_input(work / "in", 1_000, 10_000, 3)
    for name in (
        "spark native groupBy().agg()",
        "snapcut level 1 aggregate",
        "snapcut level 2 map_batches",
    ):
        run(spark, name, variants(work / "state")[name], str(work / "in"), work)


class Query:
    """One streaming query of a variant; ``feed()`` makes the next batch's file
    visible to the source, ``batch()`` waits until the query has processed it."""

    def __init__(self, spark: Any, name: str, files: list[Path], work: Path) -> None:
        self.files = list(files)
        self.src = work / "in"
        self.src.mkdir(parents=True)
        tag = "".join(c if c.isalnum() else "_" for c in name) + f"_{time.monotonic_ns()}"
        build = variants(work / "state")[name]
        df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(self.src))
        self.q = (
            build(df, tag)
            .writeStream.format("noop")
            .outputMode("update")
            .option("checkpointLocation", str(work / "chk"))
            .start()
        )

    def feed(self) -> None:
        f = self.files.pop(0)
        os.link(f, self.src / f.name)  # one atomic directory entry

    def batch(self) -> None:
        self.q.processAllAvailable()

    def add_batch_s(self) -> list[float]:
        return [
            p["durationMs"]["addBatch"] / 1000 for p in self.q.recentProgress if p["numInputRows"]
        ]

    def stop(self) -> None:
        self.q.stop()


def run_variant(
    benchmark: Any, spark: Any, size: Size, variant: str, files: list[Path], work: Path
) -> None:
    benchmark.group = size.group
    if variant == NATIVE:
        benchmark.extra_info["baseline"] = True
    query = Query(spark, variant, files, work)
    smoke = benchmark.disabled  # one batch only (a test, not a measurement)
    try:
        if not smoke:
            query.feed()
            query.batch()  # the first batch creates every key: not timed

        def setup() -> None:
            query.feed()

        benchmark.pedantic(query.batch, setup=setup, rounds=size.rounds, warmup_rounds=WARMUP)
        times = query.add_batch_s()
        assert query.q.exception() is None
    finally:
        query.stop()
    assert len(times) == (1 if smoke else 1 + WARMUP + size.rounds), times
    if not smoke:
        measured = times[-size.rounds :]
        benchmark.extra_info["first_batch_s"] = times[0]
        benchmark.extra_info["addBatch_s"] = measured
        benchmark.extra_info["addBatch_median_s"] = statistics.median(measured)


@pytest.mark.parametrize("variant", FAST.values(), ids=FAST.keys())
def test_spark_10k_keys(
    benchmark: Any,
    spark: Any,
    warm: None,
    staged: dict[str, list[Path]],
    variant: str,
    tmp_path: Path,
) -> None:
    run_variant(benchmark, spark, FAST_SIZE, variant, staged[FAST_SIZE.group], tmp_path)


@pytest.mark.parametrize("variant", PER_KEY.values(), ids=PER_KEY.keys())
def test_spark_1k_keys(
    benchmark: Any,
    spark: Any,
    warm: None,
    staged: dict[str, list[Path]],
    variant: str,
    tmp_path: Path,
) -> None:
    run_variant(benchmark, spark, PER_KEY_SIZE, variant, staged[PER_KEY_SIZE.group], tmp_path)
