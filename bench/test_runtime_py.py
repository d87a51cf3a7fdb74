"""Python-API benchmarks (pytest-benchmark): the dwell-time job with no
checkpoints vs aligned checkpoints every 100 ms, and a Python-UDF map job.

Run: pytest bench/test_runtime_py.py --benchmark-only --benchmark-columns=min,median,max,rounds
Results and machine notes: bench/results/runtime_py.md
"""

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from snapcut import Checkpointing, Dataflow, RunReport

DWELL_RECORDS = 50_000_000
UDF_RECORDS = 2_000_000
ROUNDS = 7


def dwell_job(protocol: str) -> RunReport:
    flow = Dataflow(parallelism=2)
    events = flow.generate_dwell_events(users=1_000, count=DWELL_RECORDS, seed=7)
    events.key_by("user").aggregate(count="count", total=("sum", "dwell_ms")).collect("r")
    interval = None if protocol == "none" else 0.1
    report = flow.run(Checkpointing(protocol=protocol, interval=interval))
    assert report.records_in == DWELL_RECORDS
    assert len(report.results["r"]) == 1_000
    return report


@pytest.mark.parametrize("protocol", ["none", "aligned", "unaligned", "chandy-lamport", "sync"])
def test_dwell_job(benchmark: Any, protocol: str) -> None:
    report = benchmark.pedantic(dwell_job, args=(protocol,), rounds=ROUNDS, iterations=1)
    benchmark.extra_info["records_per_s"] = DWELL_RECORDS / benchmark.stats.stats.median
    benchmark.extra_info["checkpoints"] = len(report.completed_checkpoints)


def scale(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch.append_column("y", pc.multiply(batch["x"], 3))


@pytest.mark.parametrize("batch_rows", [1_024, 16_384])
def test_python_udf_map(benchmark: Any, batch_rows: int) -> None:
    table = pa.table({"x": pa.array(range(UDF_RECORDS), pa.int64())})
    batches = table.to_batches(max_chunksize=batch_rows)

    def job() -> RunReport:
        flow = Dataflow(parallelism=2)
        src = flow.from_batches(batches)
        src.map(scale).filter(lambda b: pc.equal(b["x"], -1)).collect("r")
        report = flow.run(Checkpointing(protocol="aligned", interval=0.1))
        assert report.records_in == UDF_RECORDS
        return report

    benchmark.pedantic(job, rounds=ROUNDS, iterations=1)
    benchmark.extra_info["records_per_s"] = UDF_RECORDS / benchmark.stats.stats.median
