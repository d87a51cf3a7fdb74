"""A checkpoint directory that runs out of room, for real: a child job runs
under RLIMIT_FSIZE (its file writes fail with EFBIG, "File too large",
exactly like a full quota; works as root, needs no mount or sudo). The job
must fail with a clear error naming the checkpoint path, and the checkpoints
written before must stay intact and unchanged."""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import snapcut.snapshots

USERS, COUNT, SEED = 30, 20_000, 5

JOB = textwrap.dedent(
    """
    import sys, time
    from snapcut import Checkpointing, Dataflow, SnapcutError

    def slow(batch):
        time.sleep(0.002)
        return batch

    flow = Dataflow(parallelism=2)
    ev = flow.generate_dwell_events(users={users}, count={count}, seed={seed}, batch_size=200)
    ev.map(slow).key_by("user").aggregate(n="count", total=("sum", "dwell_ms")).collect("r")
    try:
        flow.run(Checkpointing(interval=0.005, retained=5), checkpoint_dir=sys.argv[1], resume=True)
    except SnapcutError as e:
        print(type(e).__name__)
        print(e)
        sys.exit(3)
    print("finished")
    """
).format(users=USERS, count=COUNT, seed=SEED)


def limit_file_size(limit: int) -> None:
    """In the child before exec: writes past `limit` bytes fail with EFBIG
    (SIGXFSZ ignored, else it would kill the process instead)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def run_limited(root: Path, limit: int | None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", JOB, str(root)],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=None if limit is None else (lambda: limit_file_size(limit)),
    )


def test_full_checkpoint_disk_fails_clearly_and_keeps_older_checkpoints(tmp_path: Path) -> None:
    root = tmp_path / "chk"
    res = run_limited(root, None)
    assert res.returncode == 0 and "finished" in res.stdout, (res.stdout, res.stderr)
    snaps = snapcut.snapshots.open(root)
    before = snaps.list()
    assert before, "the first run completed checkpoints"
    manifests = {
        c: (root / snapcut.snapshots.checkpoint_dir_name(c) / "manifest.json").read_bytes()
        for c in before
    }

    # 512 bytes: no Arrow state file or manifest fits.
    res = run_limited(root, 512)
    assert res.returncode == 3, (res.stdout, res.stderr)
    kind, message = res.stdout.splitlines()[:2]
    assert kind == "SnapshotError", res.stdout
    assert "could not be written" in message, message
    assert "File too large" in message, message
    assert str(root / "chk-") in message, message

    snaps = snapcut.snapshots.open(root)
    assert snaps.list() == before, "no checkpoint added or removed"
    assert all(why is None for c, why in snaps.verify().items() if c in before)
    for c, data in manifests.items():
        path = root / snapcut.snapshots.checkpoint_dir_name(c) / "manifest.json"
        assert path.read_bytes() == data, f"manifest of checkpoint {c} unchanged"

    # Without the limit the same job resumes from those checkpoints and finishes.
    res = run_limited(root, None)
    assert res.returncode == 0 and "finished" in res.stdout, (res.stdout, res.stderr)


def test_the_limit_is_what_fails_the_job(tmp_path: Path) -> None:
    # The control: the same child with room to write finishes.
    res = run_limited(tmp_path / "chk", 64 * 1024 * 1024)
    assert res.returncode == 0 and "finished" in res.stdout, (res.stdout, res.stderr)
