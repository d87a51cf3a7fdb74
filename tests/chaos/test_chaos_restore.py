"""Crash points on the restore path: a job killed while restoring (after
the checkpoint was read, or with its sink half way through publishing the
files the checkpoint staged) still ends with exactly-once output."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

import snapcut.snapshots
from snapcut.chaos import local as chaos

USERS, RECORDS, SEED = 50, 6_000, 3


@pytest.fixture(scope="module")
def ref() -> chaos.Reference:
    return chaos.reference(USERS, RECORDS, SEED)


def job(run_dir: Path, resume: bool, failpoint: str | None) -> subprocess.CompletedProcess[str]:
    opts = chaos.Options(records=RECORDS, users=USERS, seed=SEED)
    cmd = chaos._child_cmd(opts, run_dir, interval=0.01, resume=resume)
    env = dict(os.environ)
    env.pop("SNAPCUT_FAILPOINTS", None)
    if failpoint is not None:
        env["SNAPCUT_FAILPOINTS"] = failpoint
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


def committed_events(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "events").glob("*.arrow") if not p.name.startswith("."))


def test_kills_on_the_restore_path_lose_and_duplicate_nothing(
    tmp_path: Path, ref: chaos.Reference
) -> None:
    # Killed after checkpoint 2's manifest, before the sinks published its files.
    first = job(tmp_path, False, "store.after_manifest=2")
    assert first.returncode == -signal.SIGKILL, first.stderr
    store = tmp_path / "checkpoints"
    intact = snapcut.snapshots.open(str(store)).list()
    assert intact[-1] == 2, intact
    events_before = committed_events(tmp_path / "out")

    # Killed once the checkpoint is read, before any task started: nothing changed.
    second = job(tmp_path, True, "restore.after_load=1")
    assert second.returncode == -signal.SIGKILL, second.stderr
    assert "failpoint restore.after_load hit 1" in second.stderr
    assert snapcut.snapshots.open(str(store)).list() == intact
    assert committed_events(tmp_path / "out") == events_before

    # Killed after the restoring sink published one of checkpoint 2's files.
    third = job(tmp_path, True, "sink.during_restore=1")
    assert third.returncode == -signal.SIGKILL, third.stderr
    assert "failpoint sink.during_restore hit 1" in third.stderr
    # Whatever it published stays; the next restore publishes the rest once.
    assert set(events_before) <= set(committed_events(tmp_path / "out"))

    done = job(tmp_path, True, None)
    assert done.returncode == 0, done.stderr
    finished = json.loads(done.stdout.strip().splitlines()[-1])
    assert finished["restored_from"] == 2
    check = chaos.check_output(tmp_path / "out", ref)
    assert (check.lost, check.duplicated, check.mismatched) == (0, 0, 0), check.problems


def test_restore_points_are_in_the_harness_and_need_a_resumed_attempt() -> None:
    assert set(chaos.RESTORE_FAILPOINTS) <= set(chaos.FAILPOINTS)
    assert set(chaos.RESTORE_MAX_HIT) == set(chaos.RESTORE_FAILPOINTS)


def test_chaos_with_restore_crash_points_reports_nothing_lost(tmp_path: Path) -> None:
    # The first kill of a run leaves a checkpoint (after a manifest), so the
    # resumed attempts that follow have a restore to crash in.
    opts = chaos.Options(
        protocol="aligned",
        runs=3,
        seed=2,
        records=RECORDS,
        users=USERS,
        workdir=str(tmp_path),
        max_kills=3,
        kill_mode="failpoint",
        failpoints=("store.after_manifest", *chaos.RESTORE_FAILPOINTS),
    )
    s = chaos.run_chaos(opts)
    assert s.errors == 0, s
    assert (s.lost, s.duplicated, s.mismatched) == (0, 0, 0), s
    assert s.failpoints.get("restore.after_load", 0) >= 1, s
    assert s.recoveries >= s.kills >= 3, s
