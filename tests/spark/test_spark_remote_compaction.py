"""A remote root's (S3's) runs merged off the tasks' path, driven without
Spark: a worker's compactor fetches a merge's inputs through the run cache,
stores the merged run in the directory of the newest checkpoint it merged,
and a later commit names it there; a merge whose checkpoint retention may
no longer keep whole is not adopted; a merge whose input is gone gives its
partition back; a worker killed mid-merge costs nothing but time. Every
state is compared with a local root whose commits write fulls themselves."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_spark_compaction import FLUSH_S, commit, users_of
from test_spark_partition import make_spec, processor, rows
from tests.s3_support import S3Server

from snapcut import snapshots
from snapcut.snapshots import checkpoint_dir_name
from snapcut.snapshots.run_cache import RunCacheSpec, shared
from snapcut.spark.state import compaction
from snapcut.spark.state.compactors import compactor_for
from snapcut.spark.state.partition import PartitionTask
from snapcut.spark.state.read import read_state_arrow
from snapcut.spark.state.remote_compaction import MIN_RETAIN, RemoteCompactor
from snapcut.spark.state.root import StateRoot
from snapcut.spark.state.spec import RootSpec
from snapcut.spark.state.warm import StateCache

FULL_EVERY = 3


@dataclasses.dataclass
class Remote:
    spec: RootSpec
    plain: RootSpec
    worker: RemoteCompactor

    @property
    def root(self) -> StateRoot:
        return StateRoot(self.spec)

    def entry(self, batch: int) -> dict[str, Any]:
        manifest = self.root.manifest(batch)
        assert manifest is not None, batch
        (found,) = [f for f in manifest["files"] if f["role"] == "state"]
        return dict(found)

    def state(self, batch: int) -> list[dict[str, Any]]:
        got = read_state_arrow(self.spec.uri, batch, filesystem=self.spec.filesystem)
        return sorted(got.to_pylist(), key=lambda r: r["user"])

    def want(self, batch: int) -> list[dict[str, Any]]:
        got = read_state_arrow(self.plain.uri, batch)
        return sorted(got.to_pylist(), key=lambda r: r["user"])

    def exists(self, batch: int, name: str) -> bool:
        root = self.root
        info = root.fs.get_file_info(f"{root.path}/{checkpoint_dir_name(batch)}/{name}")
        return bool(info.is_file)

    def step(self, batch: int, cache: StateCache | None = None, flush: bool = True) -> Any:
        task = commit(self.spec, batch, self.worker, cache, flush=flush)
        commit(self.plain, batch, False)
        return task


def remote_spec(s3: S3Server, tmp_path: Path, full_every: int, retain: int) -> RootSpec:
    return dataclasses.replace(
        make_spec(tmp_path / "unused", partitions=1, full_every=full_every, retain=retain),
        uri=f"{s3.bucket()}/state",
        filesystem=s3.filesystem(),
        run_cache=RunCacheSpec(str(tmp_path / "cache"), 1 << 30),
    )


def make_remote(s3: S3Server, tmp_path: Path, full_every: int, retain: int = 10) -> Remote:
    spec = remote_spec(s3, tmp_path, full_every, retain)
    plain = make_spec(tmp_path / "plain", partitions=1, full_every=full_every, compaction=False)
    for s in (spec, plain):
        StateRoot(s).init("aggregate")
    root = StateRoot(spec)
    cache = shared(spec.run_cache)
    assert cache is not None
    return Remote(spec, plain, RemoteCompactor(root.fs, root.path, cache))


@pytest.fixture
def remote(s3: S3Server, tmp_path: Path) -> Any:
    r = make_remote(s3, tmp_path, FULL_EVERY)
    yield r
    r.worker.close()


def test_commits_on_s3_write_diffs_and_name_merges_where_they_are_stored(
    remote: Remote, tmp_path: Path
) -> None:
    warm = StateCache()
    adopted = merges = 0
    last = 11
    for b in range(last + 1):
        # Warm and cold tasks alternate: a cold one reads the runs back.
        task = remote.step(b, warm if b % 2 else None)
        figures = task.figures()
        adopted += figures["state_compactions_adopted"]
        merges += figures["state_compactions_merged"]
        assert figures["state_fulls_written"] == int(b == 0), b
        if b <= last - remote.spec.retain:  # the later ones are compared below
            assert remote.state(b) == remote.want(b), b
        written = remote.entry(b)
        assert written["kind"] == ("full" if b == 0 else "diff")
        assert len(written["runs"]) <= FULL_EVERY + 1, (b, written["runs"])
        for run in written["runs"]:
            # A merged run is named in the checkpoint that stores it (the
            # newest it merged), never copied into the adopter's.
            if "run-" in run["path"]:
                assert run["checkpoint"] == run["merges"][-1] < b
                assert remote.exists(run["checkpoint"], run["path"]), run
    assert adopted >= 2
    # Every retained checkpoint checks out and reads back equal.
    checks = snapshots.open(remote.spec.uri, filesystem=remote.spec.filesystem).verify()
    assert sorted(checks) == list(range(last + 1 - remote.spec.retain, last + 1)), checks
    assert all(why is None for why in checks.values()), checks
    for b in checks:
        assert remote.state(b) == remote.want(b), b
    stats = remote.worker.stats()
    assert stats["merged"] == stats["published"] >= adopted
    assert stats["failed"] == stats["fetch_failures"] == stats["publish_failures"] == 0
    # The tasks reported each merge once (the last one's left for a next task).
    assert merges + remote.worker.report()["merged"] == stats["merged"]
    # The merged runs went into this host's run cache as they were stored:
    # a cold load finds the newest there (named by its size and checksum).
    merged = [r for r in remote.entry(last)["runs"] if "run-" in r["path"]]
    assert merged
    for run in merged:
        assert list((tmp_path / "cache").glob(f"*-{run['bytes']}-{run['crc32c']}.arrow")), run
    # Nothing of the merges' inputs stays in the worker's own directory.
    assert not [p for p in Path(remote.worker.inputs_root).rglob("*") if p.is_file()]


def test_a_merge_stored_in_a_checkpoint_retention_may_drop_is_not_adopted(
    s3: S3Server, tmp_path: Path
) -> None:
    """With `retain` below `full_every`, a merge held back until its
    checkpoint is `retain` batches old is not named (retention could have
    dropped its directory): its record is removed, the commit writes a diff
    on the runs as they are, and later merges are adopted."""
    every, retain = 4, MIN_RETAIN
    r = make_remote(s3, tmp_path, every, retain)
    try:
        hold = r.worker.hold()
        for b in range(every + retain):
            r.step(b, flush=False)
        at = every  # the merge handed over after batch `every`'s commit
        hold.release()
        assert r.worker.flush(FLUSH_S)
        (stored,) = r.worker.stored("state", 0)
        assert stored.at == at and r.exists(at, stored.name)
        b = every + retain
        assert b - at >= retain
        task = r.step(b, flush=False)
        assert task.figures()["state_compactions_adopted"] == 0
        assert task.figures()["state_fulls_written"] == 0
        assert r.worker.stored("state", 0) == []
        assert r.state(b) == r.want(b)
        assert all(run["path"] != stored.name for run in r.entry(b)["runs"])
        assert r.worker.flush(FLUSH_S)
        adopted = 0
        for b in range(every + retain + 1, every + retain + 2 + every):
            task = r.step(b)
            adopted += task.figures()["state_compactions_adopted"]
        assert adopted >= 1
        assert r.state(b) == r.want(b)
        # The merge no commit named went with its checkpoint's directory.
        assert not r.exists(at, stored.name)
        checks = snapshots.open(r.spec.uri, filesystem=r.spec.filesystem).verify()
        assert all(why is None for why in checks.values()), checks
    finally:
        r.worker.close()


def test_a_merge_whose_input_is_gone_gives_its_partition_back(remote: Remote) -> None:
    """An input gone before it is fetched (retention removed runs a full
    superseded): the merge is given up before it starts, and its claim too."""
    last = FULL_EVERY - 1
    for b in range(FULL_EVERY):  # runs short of a merge: none handed over
        remote.step(b)
    runs = remote.entry(last)["runs"]
    root = remote.root
    newest = f"{root.path}/{checkpoint_dir_name(last)}/{runs[0]['path']}"
    saved = root.fs.open_input_file(newest).read()
    root.fs.delete_file(newest)
    for cached in Path(remote.worker.cache.directory).glob("*.arrow"):
        cached.unlink()  # as the run cache of a worker on another machine
    assert remote.worker.submit("state", 0, "user", runs, last, 0)
    assert remote.worker.flush(FLUSH_S)
    stats = remote.worker.stats()
    assert stats["fetch_failures"] == 1 and stats["published"] == 0
    # Its claim was given up: the same worker (or another) may merge it now.
    with root.fs.open_output_stream(newest) as out:
        out.write(saved)
    assert remote.worker.submit("state", 0, "user", runs, last, 0)
    assert remote.worker.flush(FLUSH_S)
    assert remote.worker.stats()["published"] == 1


def test_one_worker_merges_a_partition_at_a_time(remote: Remote, tmp_path: Path) -> None:
    root = remote.root
    other = RemoteCompactor(root.fs, root.path, remote.worker.cache)
    try:
        assert remote.worker._claim("state", 0)
        assert not other._claim("state", 0)
        # A claim whose process is gone (on this host) is taken over.
        p = subprocess.Popen(["true"])
        p.wait(60)
        claim = f"{remote.worker._dir('state', 0)}/{compaction.CLAIM_FILE}"
        held = {"host": remote.worker.host, "pid": p.pid, "at_ms": 0}
        with root.fs.open_output_stream(claim) as out:
            out.write(json.dumps(held).encode())
        assert other._claim("state", 0)
    finally:
        other.close()


def test_which_roots_get_a_remote_compactor(s3: S3Server, tmp_path: Path) -> None:
    spec = remote_spec(s3, tmp_path, FULL_EVERY, 10)
    found = compactor_for(spec, StateRoot(spec).fs, StateRoot(spec).path)
    assert isinstance(found, RemoteCompactor)
    assert compactor_for(spec, StateRoot(spec).fs, StateRoot(spec).path) is found
    # Commits write fulls themselves: no run cache to read inputs through,
    # a `retain` too small to keep a merge's checkpoint, compaction off.
    for changed in (
        {"run_cache": RunCacheSpec(None, 0)},
        {"retain": MIN_RETAIN - 1},
        {"compaction": False},
    ):
        other = dataclasses.replace(spec, **changed)
        assert compactor_for(other, StateRoot(other).fs, StateRoot(other).path) is None


def _die_mid_merge(spec: RootSpec, batches: int) -> None:
    """A worker: runs `batches` batches with its compactor and is SIGKILLed
    by the Rust crash point before its first merge's output is whole."""
    from snapcut._core import arm_failpoint

    arm_failpoint("compaction.before_rename")
    root = StateRoot(spec)
    cache = shared(spec.run_cache)
    assert cache is not None
    wc = RemoteCompactor(root.fs, root.path, cache)
    for b in range(batches):
        task = PartitionTask(StateRoot(spec), b, 0, "q1", None, cache=StateCache(0), compactor=wc)
        task.run(rows(users_of(b)), processor(spec), None)
    wc.flush(FLUSH_S)  # the merge hits the crash point: the process dies here
    os._exit(3)


def test_a_worker_killed_mid_merge_costs_nothing_but_time(s3: S3Server, tmp_path: Path) -> None:
    spec = remote_spec(s3, tmp_path, FULL_EVERY, 10)
    plain = make_spec(tmp_path / "plain", partitions=1, full_every=FULL_EVERY, compaction=False)
    for s in (spec, plain):
        StateRoot(s).init("aggregate")
    p = multiprocessing.get_context("spawn").Process(
        target=_die_mid_merge, args=(spec, FULL_EVERY + 1)
    )
    p.start()
    p.join(120)
    assert p.exitcode == -signal.SIGKILL
    base = tmp_path / "cache" / compaction.COMPACTING_DIR
    dead = [d for d in base.iterdir() if d.name.startswith(compaction.WORKER_PREFIX)]
    assert len(dead) == 1 and [f for f in dead[0].rglob("*") if f.is_file()]
    for b in range(FULL_EVERY + 1):
        commit(plain, b, False)
    root = StateRoot(spec)
    cache = shared(spec.run_cache)
    assert cache is not None
    # The next worker on the host clears the dead one's directory and takes
    # over its claim.
    r = Remote(spec, plain, RemoteCompactor(root.fs, root.path, cache))
    try:
        assert not dead[0].exists()
        adopted = 0
        for b in range(FULL_EVERY + 1, 2 * FULL_EVERY + 2):
            task = r.step(b)
            adopted += task.figures()["state_compactions_adopted"]
            assert task.figures()["state_fulls_written"] == 0
            assert r.state(b) == r.want(b)
        assert adopted >= 1
    finally:
        r.worker.close()


def test_a_merge_upload_waits_while_a_commit_of_its_process_runs(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A remote root's merged run is uploaded a part at a time; between parts
    it waits while a task of the same process commits (bounded), so the
    commit has the store's bandwidth to itself."""
    import threading
    import time

    from snapcut import _fs
    from snapcut.spark.state.compaction import committing, yield_to_commits

    monkeypatch.setattr(_fs, "UPLOAD_PART", 1024)
    source = tmp_path / "merged.arrow"
    source.write_bytes(os.urandom(8 * 1024))
    fs, key = s3.filesystem(), f"{s3.bucket()}/merged.arrow"
    parts: list[float] = []

    def between() -> None:
        assert yield_to_commits(FLUSH_S)
        parts.append(time.monotonic())

    with committing():
        upload = threading.Thread(target=_fs.upload, args=(fs, str(source), key, between))
        upload.start()
        time.sleep(0.3)
        assert parts == [], "no part after the first while the commit runs"
        assert not yield_to_commits(0.05)
        ended = time.monotonic()
    upload.join(FLUSH_S)
    assert len(parts) == 7 and parts[0] >= ended
    assert fs.open_input_file(key).read() == source.read_bytes()


def test_a_closed_remote_compactor_gives_up_its_claims_and_leaves_no_directory(
    remote: Remote,
) -> None:
    hold = remote.worker.hold()
    for b in range(FULL_EVERY + 1):
        remote.step(b, flush=False)
    root = remote.root
    claim = f"{remote.worker._dir('state', 0)}/{compaction.CLAIM_FILE}"
    assert root.fs.get_file_info(claim).is_file
    assert Path(remote.worker.inputs_root).exists()
    remote.worker.close()
    hold.release()
    assert not root.fs.get_file_info(claim).is_file
    assert not Path(remote.worker.inputs_root).exists()


def test_a_twin_merge_does_not_overwrite_a_stored_run(
    remote: Remote, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two workers that merged the same runs (an object store's claims are
    best effort): the second finds the run file stored and uploads nothing
    (a commit may name the first already); its record is the same merge."""
    from snapcut import _fs

    b = 0
    while not remote.worker.stored("state", 0):
        remote.step(b)
        b += 1
        assert b < 3 * FULL_EVERY
    (first,) = remote.worker.stored("state", 0)
    runs = remote.entry(first.at)["runs"]
    root = remote.root
    other = RemoteCompactor(root.fs, root.path, remote.worker.cache)
    uploads: list[str] = []
    real_upload = _fs.upload

    def counted(fs: Any, source: str, path: str, *args: Any) -> None:
        uploads.append(path)
        real_upload(fs, source, path, *args)

    monkeypatch.setattr(_fs, "upload", counted)
    try:
        assert other.submit("state", 0, "user", runs, FULL_EVERY, 0)
        assert other.flush(FLUSH_S)
        assert other.stats()["published"] == 1
    finally:
        other.close()
    assert uploads == []
    assert remote.worker.stored("state", 0) == [first]


def test_a_store_that_refuses_the_upload_gives_the_partition_back(
    remote: Remote, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The merge is done but the store refuses its upload: counted as a
    publish failure, nothing recorded (no commit can name it), the
    partition's claim given back and the staged output removed."""
    from snapcut import _fs
    from snapcut._core import StorageError

    for b in range(FULL_EVERY):  # runs short of a merge: none handed over
        remote.step(b)
    runs = remote.entry(FULL_EVERY - 1)["runs"]

    def refused(*args: Any) -> None:
        raise StorageError("the store refused the upload (injected)")

    monkeypatch.setattr(_fs, "upload", refused)
    assert remote.worker.submit("state", 0, "user", runs, FULL_EVERY - 1, 0)
    assert remote.worker.flush(FLUSH_S)
    stats = remote.worker.stats()
    assert stats["merged"] == 1 and stats["publish_failures"] == 1 and stats["published"] == 0
    assert remote.worker.stored("state", 0) == []
    assert not remote.worker._claims
    assert not [p for p in Path(remote.worker.inputs_root).rglob("*") if p.is_file()]
    monkeypatch.undo()
    # Given back: the next submission merges and publishes.
    assert remote.worker.submit("state", 0, "user", runs, FULL_EVERY - 1, 0)
    assert remote.worker.flush(FLUSH_S)
    assert remote.worker.stats()["published"] == 1
