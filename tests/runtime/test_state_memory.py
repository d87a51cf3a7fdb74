"""Checkpointing(state_memory=): a job's keyed aggregates spill past a memory
budget and answer, checkpoint and restore exactly as without one."""

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from tests.runtime_support import state_files_by_subtask

from snapcut import Checkpointing, ConfigError, Dataflow, TaskFailure

USERS = 60_000
COUNT = 400_000


def dwell_flow(count: int = COUNT, users: int = USERS) -> Dataflow:
    flow = Dataflow(parallelism=2)
    events = flow.generate_dwell_events(users=users, count=count, seed=5, batch_size=1024)
    events.key_by("user").aggregate(
        n="count", total=("sum", "dwell_ms"), avg=("mean", "dwell_ms")
    ).collect("r")
    return flow


def by_user(t: pa.Table) -> dict[int, tuple[Any, ...]]:
    d = t.to_pydict()
    return {u: (d["n"][i], d["total"][i], round(d["avg"][i], 6)) for i, u in enumerate(d["user"])}


def budget(spill: Path, **kw: Any) -> Checkpointing:
    return Checkpointing(interval=0.02, state_memory="1MB", spill_dir=spill, **kw)


def test_a_budget_spills_and_the_answer_is_the_same(tmp_path: Path) -> None:
    want = by_user(dwell_flow().run(Checkpointing(interval=0.02)).results["r"])
    assert len(want) > 50_000
    report = dwell_flow().run(budget(tmp_path / "spill"))
    assert by_user(report.results["r"]) == want
    spilled = {t: s for t, s in report.spill.items() if t.startswith("aggregate")}
    assert len(spilled) == 2, report.spill
    for stats in spilled.values():
        assert stats["flushes"] >= 2 and stats["rows_flushed"] > 0 and stats["run_probes"] > 0
        assert stats["memtable_bytes"] <= 2 << 20
    # The tables' runs go with them.
    assert list((tmp_path / "spill").iterdir()) == []


@pytest.mark.parametrize("first_spills", [True, False])
def test_a_snapshot_restores_with_or_without_a_budget(tmp_path: Path, first_spills: bool) -> None:
    want = by_user(dwell_flow().run(Checkpointing()).results["r"])
    plain = Checkpointing(interval=0.001, min_pause=0.001)
    spilling = budget(tmp_path / "spill")
    # A checkpoint taken mid-run is what is restored. When (for every
    # periodic one) depends on the scheduler: on a loaded machine (CI's pool,
    # fcc90) the sources once finished before the coordinator's first
    # trigger. Up to 5 runs, each a new chance.
    mids: list[Any] = []
    for _ in range(5):
        first = dwell_flow().run(spilling if first_spills else plain)
        mids = [
            s
            for s, c in zip(first.snapshots, first.completed_checkpoints, strict=True)
            if not c.is_final and 0 < sum(s.source_offsets.values()) < COUNT
        ]
        if mids:
            break
    assert mids, "no periodic checkpoint fell inside any of 5 runs"
    snap = mids[len(mids) // 2]
    again = dwell_flow().run(plain if first_spills else spilling, restore_from=snap)
    assert by_user(again.results["r"]) == want


def test_a_durable_run_with_a_budget_resumes_to_the_same_answer(tmp_path: Path) -> None:
    want = by_user(dwell_flow().run(Checkpointing()).results["r"])
    cp = budget(tmp_path / "spill", full_every=3)
    dwell_flow().run(cp, checkpoint_dir=str(tmp_path / "chk"))
    # Resuming the finished run from its last checkpoint re-reads nothing
    # and ends with the same state: the store's chain of diffs restored.
    again = dwell_flow().run(cp, checkpoint_dir=str(tmp_path / "chk"), resume=True)
    assert by_user(again.results["r"]) == want


def test_a_restart_opens_the_stored_runs_lazily(tmp_path: Path) -> None:
    """A failed aggregate restarts from the durable root with its state files
    mapped as the table's runs (the full as its base, the diffs after it), not
    rebuilt in memory first, then checkpoints a diff on the restored
    checkpoint (not a full), and the answer is the failure-free run's."""
    # Long enough that the failure at the third commit comes mid-run; many
    # more users than records, so the table grows by about what an interval
    # changes and captures after the second are diffs (a capture of half the
    # keys or more is a full).
    count, users = 5 * COUNT, 20 * COUNT
    want = by_user(dwell_flow(count, users).run(Checkpointing()).results["r"])
    root = tmp_path / "chk"
    cp = budget(
        tmp_path / "spill", full_every=1000, retained=1000, failover="full", restart_attempts=1
    )
    report = dwell_flow(count, users).run(
        cp, checkpoint_dir=str(root), inject_failure=TaskFailure("aggregate", 0, "commit", 3)
    )
    assert by_user(report.results["r"]) == want
    assert len(report.restarts) == 1, report.restarts
    restored = report.restarts[0].restored_from
    assert restored is not None and restored >= 3, report.restarts
    files = state_files_by_subtask(root, "aggregate")
    spilled = {t: s for t, s in report.spill.items() if t.startswith("aggregate")}
    assert len(spilled) == 2, report.spill
    for task, stats in spilled.items():
        subtask = int(task.rsplit("-", 1)[1])
        chain = [c for c, (kind, _) in files[subtask].items() if c <= restored and kind == "full"]
        diffs = restored - max(chain)
        assert diffs >= 1, (task, restored, files[subtask])
        assert stats["bases_mapped"] == 1, (task, stats)
        # The diffs since the full are runs too, with the filters stored
        # beside their files (format 3), not rebuilt.
        assert stats["diffs_mapped"] == diffs == stats["filters_stored"], (task, stats)
        # The first capture on the restored table is a diff whose base is
        # the checkpoint restored.
        after = [v for c, v in files[subtask].items() if c > restored]
        assert ("diff", restored) in after, (task, restored, files[subtask])


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"state_memory": 1000}, "below the minimum"),
        ({"state_memory": "12 parsecs"}, "256MB"),
        ({"state_memory": -1}, "state_memory must be bytes"),
        ({"spill_dir": "/tmp"}, "needs state_memory"),
    ],
)
def test_bad_budgets_are_refused_naming_the_fix(kw: dict[str, Any], message: str) -> None:
    with pytest.raises((ConfigError, ValueError), match=message):
        Checkpointing(**kw)


def test_a_spill_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "file"
    file.write_text("x")
    with pytest.raises(ConfigError, match="is not a directory"):
        Checkpointing(state_memory="1MB", spill_dir=file)
