"""Several checkpoints in flight (`Checkpointing(max_concurrent=...)`) with
incremental keyed state and a timeout short enough to abort some of them:
every checkpoint left in the store restores to exactly the aggregate of the
records its sources had emitted, and no checkpoint fails for lack of a base."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import snapcut.snapshots
from snapcut import Checkpointing, Dataflow
from snapcut.dataflow import dwell_events

# More users than a checkpoint interval touches: captures are diffs (one of
# every key would be stored full).
USERS, COUNT, SEED = 20_000, 60_000, 9


def slow(batch: pa.RecordBatch) -> pa.RecordBatch:
    time.sleep(0.001)
    return batch


def expected_at(events: pa.Table, offsets: dict[int, int]) -> dict[int, tuple[int, int]]:
    """Aggregate of what each source subtask (records i with i % 2 == subtask)
    emitted before its barrier."""
    i = np.arange(events.num_rows)
    emitted = i // 2 < np.where(i % 2 == 0, offsets[0], offsets[1])
    g = events.filter(pa.array(emitted)).group_by("user")
    g = g.aggregate([("dwell_ms", "count"), ("dwell_ms", "sum")])
    return {
        u: (n, t)
        for u, n, t in zip(
            g["user"].to_pylist(),
            g["dwell_ms_count"].to_pylist(),
            g["dwell_ms_sum"].to_pylist(),
            strict=True,
        )
    }


# The short timeout aborts some checkpoints while later ones are in flight
# (how many depends on the machine's load, so only correctness is asserted).
# retained=1 (the default) removes bases that diffs in flight were captured on.
@pytest.mark.parametrize(
    ("max_concurrent", "timeout", "retained"),
    [(2, 600.0, 100_000), (3, 600.0, 100_000), (3, 0.08, 100_000), (3, 600.0, 1)],
)
def test_every_stored_checkpoint_restores_exactly(
    tmp_path: Path, max_concurrent: int, timeout: float, retained: int
) -> None:
    # A timeout short enough to abort some checkpoints can abort all of them on
    # a loaded machine, leaving nothing to check: it is doubled until one completes.
    while True:
        root = tmp_path / f"chk-{timeout}"
        report = run(root, max_concurrent, timeout, retained)
        if report.completed_checkpoints or timeout >= 600.0:
            break
        timeout = min(timeout * 4, 600.0)
    for c in report.checkpoints:
        if c.status != "completed":
            reason = c.abort_reason or ""
            assert "expired" in reason or "ended before" in reason, (c.id, reason)
    events = dwell_events(USERS, COUNT, SEED)
    snaps = snapcut.snapshots.open(root)
    ids = snaps.list()
    completed = [c.id for c in report.completed_checkpoints]
    if retained > len(completed):
        assert ids == completed
    else:
        assert set(ids) <= set(completed) and ids[-1] == completed[-1], (ids, completed)
    kinds: set[str] = set()
    for cid in ids:
        cp = snaps[cid]
        offsets = {sub: off for (v, sub), off in cp.source_offsets().items()}
        got: dict[int, tuple[int, int]] = {}
        for (vertex, _), table in cp.states().items():
            if not vertex.startswith("aggregate"):
                continue
            for u, n, t in zip(
                table["user"].to_pylist(),
                table["n"].to_pylist(),
                table["total"].to_pylist(),
                strict=True,
            ):
                assert u not in got, f"user {u} in two subtasks"
                got[u] = (n, t)
        assert got == expected_at(events, offsets), f"checkpoint {cid}"
        kinds |= {f["kind"] for f in cp.files if f["role"] == "state" and "kind" in f}
    assert len(ids) >= 1 and "full" in kinds, (ids, kinds)
    if timeout > 1 and retained > len(completed):
        assert len(ids) >= 3 and "diff" in kinds, (ids, kinds)


def run(root: Path, max_concurrent: int, timeout: float, retained: int) -> Any:
    flow = Dataflow(parallelism=2)
    ev = flow.generate_dwell_events(users=USERS, count=COUNT, seed=SEED, batch_size=50)
    ev.map(slow).key_by("user").aggregate(n="count", total=("sum", "dwell_ms")).collect("r")
    cfg = Checkpointing(
        interval=0.001,
        max_concurrent=max_concurrent,
        timeout=timeout,
        tolerable_failures=100_000,
        full_every=20,
        retained=retained,
    )
    return flow.run(cfg, checkpoint_dir=root)
