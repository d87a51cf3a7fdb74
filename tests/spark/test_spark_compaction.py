"""A Spark state root's runs merged off the tasks' path, driven without
Spark: commits write diffs only and adopt what a worker's compactor
published (the same worker's or another's), a retry adopts the same merge,
a commit writes a full itself only past the cap, one worker merges a
partition at a time, and a worker killed mid-merge costs nothing but time.
Every state is compared with a root whose commits write fulls themselves."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from test_spark_partition import make_spec, processor, rows

from snapcut._core import ConfigError, SnapshotError
from snapcut._core import format as fmt
from snapcut.snapshots import SnapshotWriter
from snapcut.spark import failpoints
from snapcut.spark.failpoints import InjectedFailure
from snapcut.spark.state import compaction
from snapcut.spark.state.compaction import WorkerCompactor
from snapcut.spark.state.partition import PartitionTask
from snapcut.spark.state.read import read_state_arrow
from snapcut.spark.state.root import StateRoot
from snapcut.spark.state.spec import RootSpec
from snapcut.spark.state.warm import StateCache

FULL_EVERY = 3
FLUSH_S = 60.0


def users_of(batch: int) -> list[int]:
    """A batch's keys: a few new ones and some of the earlier ones again."""
    return [batch * 10 + i for i in range(6)] + [i * 7 % (batch * 10 + 1) for i in range(8)]


def commit(
    spec: RootSpec,
    batch: int,
    compactor: WorkerCompactor | bool | None,
    cache: StateCache | None = None,
    flush: bool = True,
) -> PartitionTask:
    """Runs partition 0 of `batch` and (`flush`) waits for what its commit
    handed over to be merged and published."""
    task = PartitionTask(
        StateRoot(spec), batch, 0, "q1", None, cache=cache or StateCache(0), compactor=compactor
    )
    task.run(rows(users_of(batch)), processor(spec), None)
    if flush and isinstance(compactor, WorkerCompactor):
        assert compactor.flush(FLUSH_S)
    return task


def entry(root: Path, batch: int) -> dict[str, Any]:
    manifest = json.loads((root / f"chk-{batch:08d}" / "manifest.json").read_text())
    (found,) = [f for f in manifest["files"] if f["role"] == "state"]
    return dict(found)


def state(root: Path, batch: int) -> list[dict[str, Any]]:
    return sorted(read_state_arrow(str(root), batch).to_pylist(), key=lambda r: r["user"])


@pytest.fixture
def roots(tmp_path: Path) -> tuple[RootSpec, RootSpec]:
    """A root whose workers merge its runs, and one whose commits write fulls."""
    merged = make_spec(tmp_path / "merged", partitions=1, full_every=FULL_EVERY)
    plain = make_spec(tmp_path / "plain", partitions=1, full_every=FULL_EVERY, compaction=False)
    for spec in (merged, plain):
        StateRoot(spec).init("aggregate")
    return merged, plain


@pytest.fixture
def worker(roots: tuple[RootSpec, RootSpec]) -> Any:
    wc = WorkerCompactor(roots[0].uri)
    yield wc
    wc.close()


def test_commits_write_diffs_and_adopt_merges_made_off_their_path(
    roots: tuple[RootSpec, RootSpec], worker: WorkerCompactor
) -> None:
    merged, plain = roots
    warm = StateCache()
    adopted = merges = merge_ms = 0
    kinds = []
    for b in range(16):
        # Warm and cold tasks alternate: a cold one reads the runs back.
        task = commit(merged, b, worker, warm if b % 2 else None)
        commit(plain, b, False)
        figures = task.figures()
        adopted += figures["state_compactions_adopted"]
        assert figures["state_fulls_written"] == int(b == 0), b
        assert state(Path(merged.uri), b) == state(Path(plain.uri), b), b
        written = entry(Path(merged.uri), b)
        kinds.append(written["kind"])
        # The runs a cold task reads, and the diffs compaction folds.
        assert figures["state_stored_runs_max"] == len(written["runs"]), b
        debt = sum(r["bytes"] for r in written["runs"] if r["kind"] == "diff")
        assert figures["state_compaction_debt_bytes"] == debt, b
        merges += figures["state_compactions_merged"]
        merge_ms += figures["state_compaction_ms"]
        # Submitted once FULL_EVERY diffs sit on the full, adopted by the next commit.
        assert len(written["runs"]) <= FULL_EVERY + 1, (b, written["runs"])
    assert adopted >= 3
    assert kinds == ["full"] + ["diff"] * 15
    last = entry(Path(merged.uri), 15)
    assert any("run-" in r["path"] for r in last["runs"]), last["runs"]
    # A merged run names its span, not every checkpoint of the history.
    assert all(len(r["merges"]) <= 2 for r in last["runs"]), last["runs"]
    assert last["runs"][-1]["merges"][0] == 0
    # Every file the newest version names is in place and checks out.
    from snapcut import snapshots

    checks = snapshots.open(merged.uri).verify()
    assert 15 in checks and all(why is None for why in checks.values()), checks
    stats = worker.stats()
    assert stats["merged"] == stats["published"] >= adopted
    assert stats["failed"] == 0
    # Each merge reported once, by the task after it (this test's flush
    # makes it finish before the next task's commit; the last one's is
    # left for a next task), its time likewise, rounded to milliseconds at
    # each report.
    rest = worker.report()
    assert merges >= 3 and merges + rest["merged"] == stats["merged"]
    assert abs(merge_ms + rest["busy_ms"] - stats["busy_s"] * 1000) <= 17
    assert worker.report() == {"merged": 0, "busy_ms": 0}


def test_a_merge_one_worker_published_is_adopted_by_anothers_commit(
    roots: tuple[RootSpec, RootSpec], worker: WorkerCompactor
) -> None:
    merged, plain = roots
    other = WorkerCompactor(merged.uri)
    try:
        b = 0
        while worker.stats()["published"] == 0:
            commit(merged, b, worker, StateCache(0))
            commit(plain, b, False)
            b += 1
            assert b < 3 * FULL_EVERY
        # The next batch runs in another worker: no warm state, its own compactor.
        adopter = b
        task = commit(merged, b, other)
        commit(plain, b, False)
        assert task.figures()["state_compactions_adopted"] == 1
        adopted = [r for r in entry(Path(merged.uri), b)["runs"] if r["checkpoint"] == b][-1]
        assert "run-" in adopted["path"]
        placed = Path(merged.uri) / f"chk-{b:08d}" / adopted["path"]
        published = Path(compaction.partition_dir(merged.uri, "state", 0)) / adopted["path"]
        # A hard link: the commit copied nothing.
        assert placed.stat().st_ino == published.stat().st_ino
        assert state(Path(merged.uri), b) == state(Path(plain.uri), b)
        # The next commit finds it adopted: its published copy goes (it
        # would keep the file's space once retention removed chk-N's link).
        for b in range(adopter + 1, adopter + 1 + 2 * FULL_EVERY):
            commit(merged, b, other)
            commit(plain, b, False)
            assert not published.exists()
        assert state(Path(merged.uri), b) == state(Path(plain.uri), b)
    finally:
        other.close()


def test_without_hard_links_a_commit_adopts_a_copy(
    roots: tuple[RootSpec, RootSpec], worker: WorkerCompactor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filesystem with no hard links (``os.link`` refused): the adopting
    commit places a copy of the merged run, fsynced, and the state is the same."""
    merged, plain = roots

    def no_links(src: str, dst: str) -> None:
        raise PermissionError(1, "Operation not permitted", dst)

    monkeypatch.setattr(os, "link", no_links)
    adopted = 0
    for b in range(2 * FULL_EVERY):
        task = commit(merged, b, worker)
        commit(plain, b, False)
        adopted += task.figures()["state_compactions_adopted"]
        assert state(Path(merged.uri), b) == state(Path(plain.uri), b)
    assert adopted >= 1
    placed = list(Path(merged.uri).glob("chk-*/state-0.run-*.state.arrow"))
    assert placed and all(p.stat().st_nlink == 1 for p in placed), placed


def test_a_retry_of_an_adopting_batch_writes_the_same_entry(
    roots: tuple[RootSpec, RootSpec], worker: WorkerCompactor
) -> None:
    merged, _ = roots
    b = 0
    while True:
        task = commit(merged, b, worker)
        if task.figures()["state_compactions_adopted"]:
            break
        b += 1
        assert b < 3 * FULL_EVERY
    first = entry(Path(merged.uri), b)
    retry = commit(merged, b, worker)  # a task retry: no warm state
    assert retry.figures()["state_compactions_adopted"] == 1
    assert entry(Path(merged.uri), b) == first


def test_a_commit_writes_a_full_itself_once_runs_reach_twice_full_every(
    roots: tuple[RootSpec, RootSpec], worker: WorkerCompactor
) -> None:
    merged, plain = roots
    hold = worker.hold()  # the compactor falls behind: nothing merges
    fulls = []
    for b in range(2 * FULL_EVERY + 2):
        task = commit(merged, b, worker, flush=False)
        commit(plain, b, False)
        if task.figures()["state_fulls_written"]:
            fulls.append(b)
    assert fulls == [0, 2 * FULL_EVERY]
    # The merge it held is of runs a full superseded: a later look drops it.
    hold.release()
    assert worker.flush(FLUSH_S)
    d = Path(compaction.partition_dir(merged.uri, "state", 0))
    assert [p.name for p in d.glob("*.json") if p.name != "claim.json"]
    first = 2 * FULL_EVERY + 2
    for b in range(first, first + FULL_EVERY + 2):
        commit(merged, b, worker)
        commit(plain, b, False)
        assert state(Path(merged.uri), b) == state(Path(plain.uri), b)
    stale = [r for r in compaction.published(merged.uri, "state", 0) if r.output["merges"][0] == 0]
    assert stale == []


def test_one_worker_at_a_time_merges_a_partition(
    roots: tuple[RootSpec, RootSpec], worker: WorkerCompactor, monkeypatch: pytest.MonkeyPatch
) -> None:
    merged, _ = roots
    other = WorkerCompactor(merged.uri)
    try:
        hold = worker.hold()
        for b in range(FULL_EVERY + 1):
            commit(merged, b, worker, flush=False)
        d = compaction.partition_dir(merged.uri, "state", 0)
        claim = json.loads((Path(d) / compaction.CLAIM_FILE).read_text())
        assert (claim["host"], claim["pid"]) == (socket.gethostname(), os.getpid())
        latest = entry(Path(merged.uri), FULL_EVERY)["runs"]
        assert not other.submit("state", 0, "user", latest, FULL_EVERY, 0)
        # A claim older than the timeout is taken over (its worker died elsewhere).
        monkeypatch.setattr(compaction, "CLAIM_TIMEOUT_S", 0.0)
        assert other.submit("state", 0, "user", latest, FULL_EVERY, 0)
        hold.release()
        assert other.flush(FLUSH_S) and worker.flush(FLUSH_S)
    finally:
        other.close()


def test_a_merge_whose_input_went_away_gives_its_partition_back(
    roots: tuple[RootSpec, RootSpec], worker: WorkerCompactor
) -> None:
    """A merge whose input is gone when it starts (retention removes runs a
    full superseded; mapped inputs survive it, unmapped ones do not) fails
    with no output: its claim is given up, and a later commit's merge runs."""
    merged, plain = roots
    hold = worker.hold()
    for b in range(FULL_EVERY + 1):
        commit(merged, b, worker, flush=False)
        commit(plain, b, False)
    newest = Path(merged.uri) / f"chk-{FULL_EVERY:08d}" / "state-0.state.arrow"
    saved = newest.read_bytes()
    newest.unlink()
    hold.release()
    assert worker.flush(FLUSH_S)
    assert worker.stats()["failed"] == 1 and worker.stats()["published"] == 0
    claim = Path(compaction.partition_dir(merged.uri, "state", 0)) / compaction.CLAIM_FILE
    deadline = time.monotonic() + 10
    while claim.exists():
        assert time.monotonic() < deadline, "the failed merge's claim was given up"
        time.sleep(0.05)
    newest.write_bytes(saved)
    adopted = 0
    for b in range(FULL_EVERY + 1, 2 * FULL_EVERY + 1):
        task = commit(merged, b, worker)
        commit(plain, b, False)
        adopted += task.figures()["state_compactions_adopted"]
        assert state(Path(merged.uri), b) == state(Path(plain.uri), b)
    assert adopted >= 1


def _die_mid_merge(spec: RootSpec, batches: int, point: str) -> None:
    """A worker: runs `batches` batches with its compactor and is SIGKILLed
    at `point` by its first merge: the Rust crash point before the merge's
    output is whole, or the Spark one once it is staged, not yet published
    (armed for the last batch, whose commit hands the merge over)."""
    from snapcut._core import arm_failpoint

    if point == "compaction.before_rename":
        arm_failpoint(point)
    else:
        os.environ[failpoints.ENV] = f"{point}:{batches - 1}:0:kill:0"
    wc = WorkerCompactor(spec.uri)
    for b in range(batches):
        task = PartitionTask(StateRoot(spec), b, 0, "q1", None, cache=StateCache(0), compactor=wc)
        task.run(rows(users_of(b)), processor(spec), None)
    wc.flush(FLUSH_S)  # the merge hits the crash point: the process dies here
    os._exit(3)


@pytest.mark.parametrize("point", ["compaction.before_rename", "compaction.before_publish"])
def test_a_worker_killed_mid_merge_costs_nothing_but_time(
    roots: tuple[RootSpec, RootSpec], point: str
) -> None:
    merged, plain = roots
    ctx = multiprocessing.get_context("spawn")
    p = ctx.Process(target=_die_mid_merge, args=(merged, FULL_EVERY + 1, point))
    p.start()
    p.join(120)
    assert p.exitcode == -signal.SIGKILL
    base = Path(merged.uri) / compaction.COMPACTING_DIR
    dead = [d for d in base.iterdir() if d.name.startswith(compaction.WORKER_PREFIX)]
    assert len(dead) == 1 and list(dead[0].iterdir()), "its partial output is left"
    for b in range(FULL_EVERY + 1):
        commit(plain, b, False)
    # The next worker clears the dead one's staging and takes over its claim.
    wc = WorkerCompactor(merged.uri)
    try:
        assert not dead[0].exists()
        adopted = 0
        for b in range(FULL_EVERY + 1, 3 * FULL_EVERY + 2):
            task = commit(merged, b, wc)
            commit(plain, b, False)
            adopted += task.figures()["state_compactions_adopted"]
            assert task.figures()["state_fulls_written"] == 0
            assert state(Path(merged.uri), b) == state(Path(plain.uri), b)
        assert adopted >= 1
    finally:
        wc.close()


def test_the_compactors_crash_point_cannot_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reached on the compactor's thread, outside any task: kill or sleep."""
    monkeypatch.setenv(failpoints.ENV, "compaction.before_publish:1:0:raise")
    with pytest.raises(ConfigError, match="outside any task, where there is nothing to raise"):
        failpoints.hit_off_task("compaction.before_publish", 1, 0, None)
    # Another batch's, partition's or attempt's hand-over passes it by.
    monkeypatch.setenv(failpoints.ENV, "compaction.before_publish:1:0:kill:0")
    failpoints.hit_off_task("compaction.before_publish", 2, 0, None)
    failpoints.hit_off_task("compaction.before_publish", 1, 1, None)
    failpoints.hit_off_task("compaction.before_publish", 1, 0, 1)


def test_a_crash_before_adoption_leaves_the_merge_for_the_retry(
    roots: tuple[RootSpec, RootSpec], worker: WorkerCompactor, monkeypatch: pytest.MonkeyPatch
) -> None:
    merged, plain = roots
    for b in range(FULL_EVERY + 1):
        commit(merged, b, worker)
        commit(plain, b, False)
    b = FULL_EVERY + 1
    assert compaction.published(merged.uri, "state", 0)
    monkeypatch.setenv("SNAPCUT_SPARK_FAILPOINTS", f"state.before_adopt:{b}:0:raise")
    with pytest.raises(InjectedFailure):
        commit(merged, b, worker)
    monkeypatch.delenv("SNAPCUT_SPARK_FAILPOINTS")
    task = commit(merged, b, worker)
    commit(plain, b, False)
    assert task.figures()["state_compactions_adopted"] == 1
    assert state(Path(merged.uri), b) == state(Path(plain.uri), b)


def test_bad_compactor_settings_and_lineages_are_refused(tmp_path: Path) -> None:
    for kwargs, words in [
        ({"cpu_share": 0.0}, "compaction_cpu_share must be in [0.01, 1]"),
        ({"bytes_per_s": 0}, "compaction_bytes_per_s must be positive"),
        ({"pause_s": -1.0}, "pause_s must be a number of seconds >= 0"),
    ]:
        with pytest.raises(ConfigError, match=words.replace("[", r"\[").replace("]", r"\]")):
            fmt.RunCompactor(str(tmp_path), str(tmp_path / "staging"), **kwargs)
    table = pa.table({"user": pa.array([1], pa.int64()), "n": pa.array([1], pa.int64())})
    writer = SnapshotWriter(str(tmp_path / "root"))
    with pytest.raises(ConfigError, match=r"chain_at .* or runs_at .*, not both"):
        writer.write_state(0, "v", 0, table, "user", base_chain=[], base_runs=[])
    with pytest.raises(SnapshotError, match="a diff needs a base id"):
        diff = table.append_column("__deleted", pa.array([False]))
        writer.write_state(1, "v", 0, diff, "user", kind="diff", base_runs=[])
    with pytest.raises(SnapshotError, match="base runs"):
        writer.write_state(1, "v", 0, table, "user", base_runs=[{"checkpoint": 0}])


def test_a_closed_compactor_gives_up_its_claims_and_leaves_no_directory(
    roots: tuple[RootSpec, RootSpec],
) -> None:
    """Closing a worker's compactor (its process exiting normally) abandons
    the merge in hand, gives its partition's claim back and removes its own
    staging directory; another worker merges the partition at once."""
    merged, plain = roots
    wc = WorkerCompactor(merged.uri)
    hold = wc.hold()
    for b in range(FULL_EVERY + 1):
        commit(merged, b, wc, flush=False)
        commit(plain, b, False)
    claim = Path(compaction.partition_dir(merged.uri, "state", 0)) / compaction.CLAIM_FILE
    assert claim.exists() and Path(wc.staging).exists()
    wc.close()
    hold.release()
    assert not claim.exists() and not Path(wc.staging).exists()
    other = WorkerCompactor(merged.uri)
    try:
        task = commit(merged, FULL_EVERY + 1, other)
        commit(plain, FULL_EVERY + 1, False)
        assert other.stats()["published"] == 1
        task = commit(merged, FULL_EVERY + 2, other)
        commit(plain, FULL_EVERY + 2, False)
        assert task.figures()["state_compactions_adopted"] == 1
        assert state(Path(merged.uri), FULL_EVERY + 2) == state(Path(plain.uri), FULL_EVERY + 2)
    finally:
        other.close()
