"""Restoring a Python-API job from a mid-run snapshot finishes as if it had
never stopped: state restored, sources resumed at their offsets, in-flight
records replayed."""

from collections import defaultdict
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from snapcut import Checkpointing, ConfigError, Dataflow, RunReport, SnapshotError


def dwell_flow(parallelism: int = 2) -> Dataflow:
    flow = Dataflow(parallelism=parallelism)
    events = flow.generate_dwell_events(users=200, count=400_000, seed=11, batch_size=256)
    events.key_by("user").aggregate(n="count", total=("sum", "dwell_ms")).collect("r")
    return flow


def as_dict(t: pa.Table, key: str, *cols: str) -> dict[Any, tuple[Any, ...]]:
    d = t.to_pydict()
    return {k: tuple(d[c][i] for c in cols) for i, k in enumerate(d[key])}


def mid_snapshot(report: RunReport, leave: int = 1) -> Any:
    """A periodic snapshot from the middle of the run whose every source still
    had at least `leave` records to read (a checkpoint can complete after a
    source has read everything and still not be the final one)."""
    ends = report.snapshots[-1].source_offsets
    mids = [
        s
        for s, c in zip(report.snapshots, report.completed_checkpoints, strict=True)
        if not c.is_final and all(s.source_offsets[k] <= ends[k] - leave for k in ends)
    ]
    if not mids:
        pytest.skip("the run ended before any periodic checkpoint (machine too fast)")
    return mids[len(mids) // 2]


@pytest.mark.parametrize("protocol", ["aligned", "unaligned", "chandy-lamport", "sync"])
def test_dwell_job_restored_from_a_mid_run_snapshot(protocol: str) -> None:
    cp = Checkpointing(protocol=protocol, interval=0.001, min_pause=0.001)
    first = dwell_flow().run(cp)
    snap = mid_snapshot(first)
    assert 0 < sum(snap.source_offsets.values()) < 400_000
    again = dwell_flow().run(cp, restore_from=snap)
    want = as_dict(first.results["r"], "user", "n", "total")
    assert as_dict(again.results["r"], "user", "n", "total") == want
    assert again.records_in == 400_000 - sum(snap.source_offsets.values())


def running(key: int, rows: pa.RecordBatch, state: int | None) -> tuple[pa.RecordBatch, int]:
    total = (state or 0) + pc.sum(rows["v"]).as_py()
    return pa.RecordBatch.from_pydict({"k": [key], "total": [total]}), total


def python_flow() -> Dataflow:
    flow = Dataflow(parallelism=2)
    rows = [{"k": i % 13, "v": i} for i in range(8_000)]
    src = flow.from_iterable(rows, batch_size=50, parallelism=2)
    src.map(lambda b: b).key_by("k").process(running).collect("sums")
    return flow


@pytest.mark.parametrize("protocol", ["aligned", "unaligned"])
def test_python_source_and_keyed_state_restore_exactly_once(protocol: str) -> None:
    cp = Checkpointing(protocol=protocol, interval=0.001, min_pause=0.001)
    first = python_flow().run(cp)
    # Each subtask reads every other item; 13 more of them cover all 13 keys,
    # so the restored run emits every key's final total.
    snap = mid_snapshot(first, leave=13)
    again = python_flow().run(cp, restore_from=snap)
    want: dict[int, int] = defaultdict(int)
    for i in range(8_000):
        want[i % 13] += i
    # The last running total per key after the restore is the full sum: no
    # record was lost or counted twice across the snapshot.
    got = again.results["sums"].group_by("k").aggregate([("total", "max")]).to_pydict()
    assert dict(zip(got["k"], got["total_max"], strict=True)) == want


def test_restore_into_another_graph_is_refused() -> None:
    first = dwell_flow().run(Checkpointing(protocol="aligned"))
    with pytest.raises(SnapshotError, match="restore into the same vertices"):
        dwell_flow(parallelism=3).run(Checkpointing(), restore_from=first.snapshots[-1])


def test_restore_from_needs_a_snapshot() -> None:
    with pytest.raises(ConfigError, match="restore_from takes a Snapshot"):
        dwell_flow().run(Checkpointing(), restore_from="chk-1")  # type: ignore[arg-type]
