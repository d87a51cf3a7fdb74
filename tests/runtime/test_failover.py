"""Failover through the Python API: a failed task restarts only its region
(the tasks connected to it), or every task with failover="full"; restarts
work from durable and from in-memory checkpoints."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

from snapcut import Checkpointing, Dataflow, Restart, TaskError
from snapcut.dataflow import dwell_events

USERS, COUNT = 30, 30_000


def fail_on_call(n: int) -> Callable[[pa.RecordBatch], pa.RecordBatch]:
    """A map UDF that raises once, on its n-th call over all restarts."""
    calls = 0
    lock = threading.Lock()

    def fn(batch: pa.RecordBatch) -> pa.RecordBatch:
        nonlocal calls
        with lock:
            calls += 1
            due = calls == n
        if due:
            raise RuntimeError("injected failure")
        time.sleep(0.001)
        return batch

    return fn


def two_pipelines(fail_at: int) -> Dataflow:
    """`a` (fails once) and `b`, sharing no channel: two failover regions."""
    flow = Dataflow(parallelism=2)
    a = flow.generate_dwell_events(users=USERS, count=COUNT, seed=1, batch_size=200)
    a = a.map(fail_on_call(fail_at), name="a_map")
    a.key_by("user").aggregate(n="count", name="a_agg").collect("a")
    b = flow.generate_dwell_events(users=USERS, count=COUNT, seed=2, batch_size=200)
    b = b.map(lambda batch: batch, name="b_map")
    b.key_by("user").aggregate(n="count", name="b_agg").collect("b")
    return flow


def counts(table: pa.Table) -> dict[int, int]:
    assert table.num_rows == len(set(table["user"].to_pylist())), "one row per user"
    return dict(zip(table["user"].to_pylist(), table["n"].to_pylist(), strict=True))


def expected(seed: int) -> dict[int, int]:
    t = dwell_events(USERS, COUNT, seed).group_by("user").aggregate([("user", "count")])
    return dict(zip(t["user"].to_pylist(), t["user_count"].to_pylist(), strict=True))


def vertices(restart: Restart) -> set[str]:
    return {t.rsplit("-", 1)[0] for t in restart.tasks}


@pytest.mark.parametrize("durable", [True, False])
def test_a_failure_restarts_only_its_own_pipeline(tmp_path: Path, durable: bool) -> None:
    cfg = Checkpointing(interval=0.005, restart_attempts=1, restart_delay=0)
    root = tmp_path / "chk" if durable else None
    report = two_pipelines(fail_at=40).run(cfg, checkpoint_dir=root)
    assert len(report.restarts) == 1, report.restarts
    restart = report.restarts[0]
    assert "a_map" in restart.error and "injected failure" in restart.error
    assert restart.region is not None
    assert "a_map" in vertices(restart) and "a_agg" in vertices(restart)
    assert not any(v.startswith("b_") for v in vertices(restart)), restart.tasks
    assert counts(report.results["a"]) == expected(1)
    assert counts(report.results["b"]) == expected(2)


def test_full_failover_restarts_every_task() -> None:
    cfg = Checkpointing(interval=0.005, restart_attempts=1, restart_delay=0, failover="full")
    report = two_pipelines(fail_at=40).run(cfg)
    (restart,) = report.restarts
    assert {"a_map", "b_map", "a_agg", "b_agg"} <= vertices(restart)
    assert counts(report.results["a"]) == expected(1)
    assert counts(report.results["b"]) == expected(2)


def test_without_checkpoints_a_restart_begins_again_exactly_once() -> None:
    cfg = Checkpointing(protocol="none", restart_attempts=1, restart_delay=0)
    report = two_pipelines(fail_at=10).run(cfg)
    (restart,) = report.restarts
    assert restart.restored_from is None
    assert counts(report.results["a"]) == expected(1)
    assert counts(report.results["b"]) == expected(2)


def test_no_restarts_left_fails_the_job() -> None:
    with pytest.raises(TaskError, match="injected failure"):
        two_pipelines(fail_at=10).run(Checkpointing(interval=0.005))
