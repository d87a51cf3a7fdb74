"""The local runtime through the Python API, one group per comparison:

- ``runtime-dwell-memory``: the dwell-time job (generated ``(user, dwell_ms)``,
  50M records, 1000 users, parallelism 2, keyed count + sum, collect) with no
  checkpoints (the baseline) and with every protocol checkpointing every
  100 ms into memory.
- ``runtime-dwell-durable``: the same job, checkpoints every 100 ms written
  durably to a fresh directory (``checkpoint_dir``: Arrow IPC, crc32c, fsync,
  manifest) per round; baseline: no checkpoints.
- ``runtime-udf-map``: a Python UDF map + filter over 2M rows in batches of
  1024 or 16384 rows, aligned checkpoints every 100 ms (the cost of crossing
  into Python per batch); baseline: 16384-row batches.

Everything but the UDFs runs in Rust with the GIL released. One round = one
whole job; ``extra_info`` has records/s (of the median) and the number of
completed checkpoints of the last round.

Run: pytest bench/test_runtime_py.py --benchmark-only
Earlier results and machine notes: bench/results/runtime_py/README.md
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from snapcut import Checkpointing, Dataflow, RunReport

DWELL_RECORDS = 50_000_000
UDF_RECORDS = 2_000_000
SMOKE_RECORDS = 1_000_000  # under --benchmark-disable (one run, as a test)
ROUNDS = 7
PROTOCOLS = ["none", "aligned", "unaligned", "chandy-lamport", "sync", "sync-capture"]


def dwell_job(protocol: str, records: int, checkpoint_dir: Path | None = None) -> RunReport:
    flow = Dataflow(parallelism=2)
    events = flow.generate_dwell_events(users=1_000, count=records, seed=7)
    events.key_by("user").aggregate(count="count", total=("sum", "dwell_ms")).collect("r")
    interval = None if protocol == "none" else 0.1
    report = flow.run(
        Checkpointing(protocol=protocol, interval=interval), checkpoint_dir=checkpoint_dir
    )
    assert report.records_in == records
    assert len(report.results["r"]) == 1_000
    return report


def _record(benchmark: Any, report: RunReport | None, records: int, baseline: bool) -> None:
    if baseline:
        benchmark.extra_info["baseline"] = True
    if benchmark.stats is not None:  # None under --benchmark-disable
        benchmark.extra_info["records_per_s"] = records / benchmark.stats.stats.median
    if report is not None:
        benchmark.extra_info["checkpoints"] = len(report.completed_checkpoints)


@pytest.mark.benchmark(group="runtime-dwell-memory")
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_dwell_job(benchmark: Any, protocol: str, smoke: bool) -> None:
    records = SMOKE_RECORDS if smoke else DWELL_RECORDS
    report = benchmark.pedantic(dwell_job, args=(protocol, records), rounds=ROUNDS, iterations=1)
    _record(benchmark, report, records, protocol == "none")


@pytest.mark.benchmark(group="runtime-dwell-durable")
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_dwell_job_durable(benchmark: Any, protocol: str, tmp_path: Path, smoke: bool) -> None:
    records = SMOKE_RECORDS if smoke else DWELL_RECORDS
    fresh = (tmp_path / f"chk-{i}" for i in itertools.count())

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (protocol, records, None if protocol == "none" else next(fresh)), {}

    report = benchmark.pedantic(dwell_job, setup=setup, rounds=ROUNDS, iterations=1)
    _record(benchmark, report, records, protocol == "none")


def scale(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch.append_column("y", pc.multiply(batch["x"], 3))


@pytest.mark.benchmark(group="runtime-udf-map")
@pytest.mark.parametrize("batch_rows", [16_384, 1_024])
def test_python_udf_map(benchmark: Any, batch_rows: int, smoke: bool) -> None:
    records = SMOKE_RECORDS // 10 if smoke else UDF_RECORDS
    table = pa.table({"x": pa.array(range(records), pa.int64())})
    batches = table.to_batches(max_chunksize=batch_rows)

    def job() -> RunReport:
        flow = Dataflow(parallelism=2)
        src = flow.from_batches(batches)
        src.map(scale).filter(lambda b: pc.equal(b["x"], -1)).collect("r")
        report = flow.run(Checkpointing(protocol="aligned", interval=0.1))
        assert report.records_in == records
        return report

    report = benchmark.pedantic(job, rounds=ROUNDS, iterations=1)
    _record(benchmark, report, records, batch_rows == 16_384)
