"""Durable checkpoints and recovery through the Python API: checkpoint_dir,
resume, restart_attempts, the exactly-once write_arrow sink."""

from __future__ import annotations

import itertools
import json
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from snapcut import (
    Checkpointing,
    ConfigError,
    Dataflow,
    JobControl,
    SnapshotError,
    TaskError,
)
from snapcut.dataflow import dwell_events

# More users than a checkpoint interval touches: captures are diffs (one of
# every key would be stored full).
USERS, COUNT, SEED = 20_000, 40_000, 5


def failing_once(marker: Path, root: Path) -> Callable[[pa.RecordBatch], pa.RecordBatch]:
    """A map UDF that raises once, on its first call after a checkpoint has
    completed under `root`, if `marker` is absent (creating it); otherwise
    it passes the batch through (slowly, so that checkpoints happen)."""

    def fn(batch: pa.RecordBatch) -> pa.RecordBatch:
        if marker.exists():
            time.sleep(0.002)
            return batch
        if any(root.glob("chk-*/manifest.json")):
            marker.write_text("failed once")
            raise RuntimeError("injected UDF failure")
        # No checkpoint yet: go slowly, so that on a loaded machine one
        # completes before the input runs out (else the job never fails).
        time.sleep(0.02)
        return batch

    return fn


def once_started(control: JobControl, act: Callable[[], None]) -> threading.Thread:
    """A running thread that waits for the job under `control` to start, then calls `act`."""

    def run() -> None:
        while not control.started:
            time.sleep(0.001)
        act()

    t = threading.Thread(target=run)
    t.start()
    return t


def build(
    marker: Path,
    out: Path | None = None,
    parallelism: int = 2,
    root: Path | None = None,
    users: int = USERS,
    count: int = COUNT,
) -> Dataflow:
    flow = Dataflow(parallelism=parallelism)
    ev = flow.generate_dwell_events(users=users, count=count, seed=SEED, batch_size=200)
    passed = ev.map(failing_once(marker, root or marker.parent / "chk"))
    passed.key_by("user").aggregate(n="count", total=("sum", "dwell_ms")).collect("r")
    if out is not None:
        passed.write_arrow(out)
    return flow


def expected() -> dict[int, tuple[int, int]]:
    t = dwell_events(USERS, COUNT, SEED)
    g = t.group_by("user").aggregate([("dwell_ms", "count"), ("dwell_ms", "sum")])
    return {
        u: (n, s)
        for u, n, s in zip(
            g["user"].to_pylist(),
            g["dwell_ms_count"].to_pylist(),
            g["dwell_ms_sum"].to_pylist(),
            strict=True,
        )
    }


def got(table: pa.Table) -> dict[int, tuple[int, int]]:
    assert table.num_rows == len(set(table["user"].to_pylist())), "one row per user"
    return {
        u: (n, s)
        for u, n, s in zip(
            table["user"].to_pylist(),
            table["n"].to_pylist(),
            table["total"].to_pylist(),
            strict=True,
        )
    }


CFG = Checkpointing(interval=0.005, full_every=3, retained=3)


def test_udf_failure_then_resume_recovers(tmp_path: Path) -> None:
    marker, root = tmp_path / "marker", tmp_path / "chk"
    with pytest.raises(TaskError, match="injected UDF failure"):
        build(marker).run(CFG, checkpoint_dir=root)
    report = build(marker).run(CFG, checkpoint_dir=root, resume=True)
    assert report.restored_from is not None
    assert report.skipped == []
    assert got(report.results["r"]) == expected()


def test_restart_attempts_restart_from_the_last_checkpoint(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    cfg = Checkpointing(interval=0.005, restart_attempts=1, restart_delay=0)
    report = build(marker).run(cfg, checkpoint_dir=tmp_path / "chk")
    assert marker.exists()
    assert len(report.restarts) == 1
    assert "injected UDF failure" in report.restarts[0].error
    assert report.restarts[0].region == 0 and "map-0" in report.restarts[0].tasks
    assert got(report.results["r"]) == expected()


def test_write_arrow_is_exactly_once_across_failure_and_resume(tmp_path: Path) -> None:
    marker, root, out = tmp_path / "marker", tmp_path / "chk", tmp_path / "out"
    with pytest.raises(TaskError):
        build(marker, out).run(CFG, checkpoint_dir=root)
    partial = ds.dataset(out, format="arrow").to_table()
    assert partial.num_rows < COUNT  # only committed files are visible
    build(marker, out).run(CFG, checkpoint_dir=root, resume=True)
    table = ds.dataset(out, format="arrow").to_table()
    want = dwell_events(USERS, COUNT, SEED)
    keys = [("user", "ascending"), ("dwell_ms", "ascending")]
    assert table.num_rows == COUNT
    assert table.sort_by(keys).equals(want.sort_by(keys))
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]


def test_corrupt_newest_checkpoint_falls_back_with_a_warning(tmp_path: Path) -> None:
    marker, root = tmp_path / "marker", tmp_path / "chk"
    marker.write_text("never fail")
    build(marker).run(CFG, checkpoint_dir=root)
    dirs = sorted(p for p in root.iterdir() if (p / "manifest.json").exists())
    assert len(dirs) >= 2
    newest = dirs[-1]
    manifest = json.loads((newest / "manifest.json").read_text())
    state = next(f["path"] for f in manifest["files"] if f["role"] == "state")
    (newest / state).write_bytes(b"garbage")
    with pytest.warns(RuntimeWarning, match=f"checkpoint {manifest['checkpoint_id']}"):
        report = build(marker).run(CFG, checkpoint_dir=root, resume=True)
    assert [i for i, _ in report.skipped] == [manifest["checkpoint_id"]]
    assert report.restored_from is not None and report.restored_from < manifest["checkpoint_id"]
    assert got(report.results["r"]) == expected()


def test_resume_with_other_parallelism_names_both_shapes(tmp_path: Path) -> None:
    marker, root = tmp_path / "marker", tmp_path / "chk"
    marker.write_text("never fail")
    build(marker).run(CFG, checkpoint_dir=root)
    with pytest.raises(SnapshotError, match=r"x2.*x3|x3.*x2"):
        build(marker, parallelism=3).run(CFG, checkpoint_dir=root, resume=True)


def test_resume_on_empty_dir_starts_fresh(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    marker.write_text("never fail")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = build(marker).run(CFG, checkpoint_dir=tmp_path / "chk", resume=True)
    assert report.restored_from is None
    assert got(report.results["r"]) == expected()


def test_diff_checkpoints_on_disk(tmp_path: Path) -> None:
    marker, root = tmp_path / "marker", tmp_path / "chk"
    marker.write_text("never fail")
    cfg = Checkpointing(interval=0.005, full_every=3, retained=50)
    # About one record per user: the table grows by what an interval
    # changes, so from the third checkpoint on a capture changes under half
    # of it: a diff. (20,000 users over 40,000 records: most intervals
    # change half the table or more, and a full beats such a diff.)
    build(marker, users=200_000, count=200_000).run(cfg, checkpoint_dir=root)
    kinds = set()
    for m in root.glob("chk-*/manifest.json"):
        for f in json.loads(m.read_text())["files"]:
            if f["role"] == "state" and f.get("vertex", "").startswith("aggregate"):
                kinds.add(f["kind"])
    assert kinds == {"full", "diff"}


def test_bad_recovery_arguments_are_config_errors(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    with pytest.raises(ConfigError, match="checkpoint_dir"):
        build(marker).run(CFG, resume=True)
    with pytest.raises(ConfigError, match="'region', 'full'"):
        Checkpointing(failover="regional")
    with pytest.raises(ConfigError, match="protocol"):
        build(marker).run(Checkpointing(protocol="none"), checkpoint_dir=tmp_path / "c")
    with pytest.raises(ConfigError, match="restart_attempts"):
        Checkpointing(restart_attempts=-1)
    with pytest.raises(ConfigError, match="full_every"):
        Checkpointing(full_every=0)
    with pytest.raises(ConfigError, match="fsync must be True, False or one of 'syncfs'"):
        build(marker).run(CFG, checkpoint_dir=tmp_path / "c", fsync="no")
    with pytest.raises(ConfigError, match="fsync=False applies to checkpoint_dir"):
        build(marker).run(CFG, fsync=False)
    with pytest.raises(ConfigError, match="direct_io must be a bool, got 'yes'"):
        build(marker).run(CFG, checkpoint_dir=tmp_path / "c", direct_io="yes")  # type: ignore[arg-type]
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize(
    ("fsync", "direct_io"), [(False, True), ("per-file", True), (True, False), (True, True)]
)
def test_every_fsync_mode_resumes(fsync: bool | str, direct_io: bool, tmp_path: Path) -> None:
    marker, root = tmp_path / "marker", tmp_path / "chk"
    with pytest.raises(TaskError, match="injected UDF failure"):
        build(marker).run(CFG, checkpoint_dir=root, fsync=fsync, direct_io=direct_io)
    assert list(root.glob("chk-*/manifest.json"))
    # A root written one way resumes the other: the files are the same format.
    report = build(marker).run(
        CFG, checkpoint_dir=root, resume=True, fsync=fsync, direct_io=not direct_io
    )
    assert report.restored_from is not None
    assert got(report.results["r"]) == expected()


def test_unwritable_checkpoint_dir_is_a_clear_error(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    marker.write_text("never fail")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(Exception, match="file"):
        build(marker).run(CFG, checkpoint_dir=blocker / "chk")


def test_savepoint_survives_retention(tmp_path: Path) -> None:
    marker, root = tmp_path / "marker", tmp_path / "chk"
    marker.write_text("never fail")
    control = JobControl()
    taken: list[bool] = []

    def take() -> None:
        time.sleep(0.02)
        control.trigger_savepoint()
        taken.append(True)

    t = once_started(control, take)
    cfg = Checkpointing(interval=0.005, retained=1)
    report = build(marker).run(cfg, checkpoint_dir=root, control=control)
    t.join()
    assert taken
    savepoints = [c.id for c in report.completed_checkpoints if c.savepoint]
    assert len(savepoints) == 1
    kept = {
        json.loads(m.read_text())["checkpoint_id"]: json.loads(m.read_text())["savepoint"]
        for m in root.glob("chk-*/manifest.json")
    }
    assert kept.get(savepoints[0]) is True, kept
    assert got(report.results["r"]) == expected()


def test_triggered_checkpoints_without_an_interval(tmp_path: Path) -> None:
    """`Checkpointing(interval=None)` takes no periodic checkpoints; each
    `trigger_checkpoint` takes one (windowed.py's way to switch them on and off)."""
    marker = tmp_path / "marker"
    marker.write_text("never fail")
    control = JobControl()
    triggered: list[float] = []

    def trigger() -> None:
        for _ in range(3):
            time.sleep(0.01)
            control.trigger_checkpoint()
            triggered.append(time.perf_counter())

    t = once_started(control, trigger)
    report = build(marker).run(
        Checkpointing(protocol="aligned", interval=None),
        checkpoint_dir=tmp_path / "chk",
        control=control,
    )
    t.join()
    assert len(triggered) == 3
    periodic = [c for c in report.completed_checkpoints if not c.is_final]
    assert len(periodic) == 3 and not any(c.savepoint for c in periodic)
    # The job's own counts, after the run: the three and the final one, all durable.
    counts = control.checkpoints()
    assert counts == (len(report.completed_checkpoints), len(report.completed_checkpoints), 0)
    assert counts.in_flight == 0
    assert got(report.results["r"]) == expected()
    none = JobControl()

    def trigger_disabled() -> None:
        with pytest.raises(ConfigError, match="checkpoints are disabled"):
            none.trigger_checkpoint()
        triggered.append(0.0)

    t = once_started(none, trigger_disabled)
    build(marker).run(Checkpointing(protocol="none"), control=none)
    t.join()
    assert len(triggered) == 4


def test_job_control_before_start_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="not started"):
        JobControl().trigger_savepoint()
    with pytest.raises(ConfigError, match="not started"):
        JobControl().checkpoints()


def test_a_durable_run_reports_its_files_runs_and_compaction(tmp_path: Path) -> None:
    """Every completed checkpoint of a durable run says what its commit
    wrote, how many sorted runs its states are made of and what the
    (budgeted) compactor has done; checkpoints kept in memory say nothing."""

    def slowly(batch: pa.RecordBatch) -> pa.RecordBatch:
        time.sleep(0.01)  # ~1 s a task: dozens of checkpoints
        return batch

    def flow() -> Dataflow:
        # Two batches a channel: a barrier waits behind ~20 ms of sleeps, not 640.
        f = Dataflow(parallelism=2, channel_capacity=2)
        ev = f.generate_dwell_events(users=USERS, count=COUNT, seed=SEED, batch_size=200)
        ev.map(slowly).key_by("user").aggregate(n="count", total=("sum", "dwell_ms")).collect("r")
        return f

    cfg = Checkpointing(interval=0.02, full_every=2, retained=3, compaction_cpu_share=0.5)
    report = flow().run(cfg, checkpoint_dir=tmp_path / "chk")
    assert got(report.results["r"]) == expected()
    stores = [c.store for c in report.completed_checkpoints]
    assert len(stores) >= 3, report.checkpoints
    seen = [s for s in stores if s is not None]
    assert len(seen) == len(stores)
    for s in seen:
        assert s.bytes_written > 0 and 1 <= s.runs_max <= s.runs_total, s
        # Half a core: a job rests as long as it worked, after its output is out.
        assert s.compaction.rested_s <= s.compaction.busy_s + 1e-6, s
    # Diffs stack on the fulls between compactions.
    assert any(s.runs_max >= 2 and s.debt_bytes > 0 for s in seen), seen
    for a, b in itertools.pairwise(seen):
        assert b.compaction.bytes_written >= a.compaction.bytes_written, (a, b)
        assert b.compaction.adopted >= a.compaction.adopted, (a, b)
    in_memory = flow().run(cfg)
    assert in_memory.completed_checkpoints
    assert all(c.store is None for c in in_memory.checkpoints)
