"""Incremental checkpoints of the Python keyed process (`key_by(k).process(fn)`):
diffs of the changed keys with `__deleted` tombstones, a full capture every
`full_every`, restore from a full + diffs chain, durable files readable with
plain pyarrow, and clear errors for bad state."""

from __future__ import annotations

import json
import pickle
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.ipc as ipc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.runtime_support import fold

from snapcut import (
    Checkpointing,
    ConfigError,
    Dataflow,
    SnapshotError,
    TaskError,
    _core,
    snapshots,
)
from snapcut.dataflow import dwell_events

Steps = list[list[pa.RecordBatch]]


def running(key: int, rows: pa.RecordBatch, state: int | None) -> tuple[Any, int | None]:
    """Running sum of `v` per key; a negative `v` drops the key."""
    vs = rows["v"].to_pylist()
    if any(v < 0 for v in vs):
        return None, None
    total = (state or 0) + sum(vs)
    return pa.RecordBatch.from_pydict({"k": [key], "total": [total]}), total


def batch(keys: list[Any], v: int = 1) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"k": keys, "v": [v] * len(keys)})


def state_of(table: pa.Table | pa.RecordBatch, key: str = "k") -> dict[Any, Any]:
    d = table.to_pydict()
    return {k: pickle.loads(s) for k, s in zip(d[key], d["state"], strict=True)}


# --- the operator driven directly: deterministic checkpoint boundaries ---


def test_diffs_hold_only_the_changed_keys_and_a_full_comes_every_full_every() -> None:
    steps: Steps = [[batch(list(range(1_000)))]] + [[batch([1, 2, 3])] for _ in range(6)]
    caps = _core._keyed_checkpoints("k", running, steps, full_every=3)
    assert [(kind, base) for kind, base, _ in caps] == [
        ("full", None),
        ("diff", 1),
        ("diff", 2),
        ("full", None),
        ("diff", 4),
        ("diff", 5),
        ("full", None),
    ]
    for i, (kind, _, b) in enumerate(caps):
        step = i + 1
        if kind == "full":
            assert b.schema.names == ["k", "state"]
            assert b.num_rows == 1_000
        else:
            assert b.schema.names == ["k", "state", "__deleted"]
            assert b["k"].to_pylist() == [1, 2, 3], "only the touched keys"
            assert not any(b["__deleted"].to_pylist())
            assert state_of(b) == {1: step, 2: step, 3: step}
        # The key is named in the schema: a reader can rebuild without snapcut's help.
        assert b.schema.metadata[b"snapcut.key"] == b"k"


def test_dropped_keys_become_tombstones() -> None:
    steps: Steps = [
        [batch(list(range(10)))],
        [batch([5], v=-1), batch([6], v=4)],
        [batch([11]), batch([11], v=-1)],  # born and dropped between checkpoints
        [batch([5], v=7)],  # back again
    ]
    caps = _core._keyed_checkpoints("k", running, steps, full_every=10)
    _, _, second = caps[1]
    rows = sorted(zip(*second.select(["k", "__deleted"]).to_pydict().values(), strict=True))
    assert rows == [(5, True), (6, False)]
    tomb = second.filter(second["__deleted"])
    assert tomb["state"].null_count == 1, "a tombstone carries only the key"
    assert caps[2][2].num_rows == 0, "a key added and dropped in between leaves no trace"
    assert caps[3][2].to_pydict()["k"] == [5]
    assert state_of(caps[3][2]) == {5: 7}


def test_an_aborted_checkpoint_makes_the_next_one_full() -> None:
    steps: Steps = [[batch([1, 2])], [batch([1])], [batch([2])], [batch([2])]]
    caps = _core._keyed_checkpoints("k", running, steps, full_every=10, aborted=[2])
    assert [(kind, base) for kind, base, _ in caps] == [
        ("full", None),
        ("diff", 1),
        ("full", None),
        ("diff", 3),
    ]
    # The aborted diff's change is in the full capture that replaces it.
    assert state_of(caps[2][2]) == {1: 2, 2: 2}


@pytest.mark.parametrize("string_keys", [False, True])
def test_restore_from_a_chain_continues_like_an_uninterrupted_run(string_keys: bool) -> None:
    def key(i: int) -> Any:
        return f"u{i}" if string_keys else i

    steps: Steps = [
        [batch([key(i) for i in range(50)])],
        [batch([key(1), key(2)]), batch([key(3)], v=-1)],
        [batch([key(2), key(60)], v=5)],
        [batch([key(4)], v=-1), batch([key(1)], v=2)],
    ]
    after = [batch([key(1), key(2), key(3), key(60)], v=10)]
    caps = _core._keyed_checkpoints("k", running, steps, full_every=100)
    assert [kind for kind, _, _ in caps] == ["full", "diff", "diff", "diff"]
    outputs, end = _core._keyed_restore("k", running, caps, after)

    rows = [(k, v) for step in [*steps, after] for b in step for k, v in _rows(b)]
    assert state_of(end) == fold(rows)
    got = {o["k"][0].as_py(): o["total"][0].as_py() for o in outputs}
    assert got == {k: fold(rows)[k] for k in (key(1), key(2), key(3), key(60))}
    # The first capture after a restore is full (its base is not known to be stored).
    assert end.schema.names == ["k", "state"]


def _rows(b: pa.RecordBatch) -> list[tuple[Any, int]]:
    return list(zip(b["k"].to_pylist(), b["v"].to_pylist(), strict=True))


def test_a_broken_chain_is_refused() -> None:
    steps: Steps = [[batch([1, 2])], [batch([1])], [batch([2])]]
    caps = _core._keyed_checkpoints("k", running, steps, full_every=10)
    with pytest.raises(SnapshotError, match="must start with a full capture"):
        _core._keyed_restore("k", running, caps[1:], [])
    with pytest.raises(SnapshotError, match="increasing bases"):
        _core._keyed_restore("k", running, [caps[0], caps[2], caps[1]], [])


def test_unpicklable_state_is_a_task_error_naming_the_key() -> None:
    def keep_a_lambda(key: int, rows: pa.RecordBatch, state: Any) -> tuple[None, Any]:
        return None, (lambda: 0) if key == 2 else 1

    with pytest.raises(TaskError, match=r"cannot pickle the state of key 2 .*keep picklable"):
        _core._keyed_checkpoints("k", keep_a_lambda, [[batch([1, 2, 3])]], full_every=3)


def test_state_that_does_not_unpickle_is_a_snapshot_error() -> None:
    bad = pa.RecordBatch.from_pydict(
        {"k": pa.array([1], pa.int64()), "state": pa.array([b"not a pickle"], pa.binary())}
    )
    with pytest.raises(SnapshotError, match="cannot unpickle the state of key 1"):
        _core._keyed_restore("k", running, [("full", None, bad)], [])


def test_null_keys_and_changing_key_types_are_task_errors() -> None:
    with pytest.raises(TaskError, match=r"holds 1 null\(s\).*filter the nulls"):
        _core._keyed_checkpoints("k", running, [[batch([1, None])]], full_every=3)
    with pytest.raises(TaskError, match="changed from integer to string keys"):
        _core._keyed_checkpoints("k", running, [[batch([1]), batch(["a"])]], full_every=3)


@pytest.mark.parametrize("name", ["state", "__deleted"])
def test_a_key_named_like_a_state_column_is_a_config_error(name: str) -> None:
    flow = Dataflow()
    src = flow.from_batches(pa.table({name: [1, 2], "v": [1, 2]}))
    src.key_by(name).process(lambda k, b, s: (b, s)).collect("out")
    with pytest.raises(ConfigError, match="rename the column"):
        flow.run(Checkpointing())


@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(
        st.lists(st.tuples(st.integers(0, 12), st.integers(-1, 5)), max_size=8),
        min_size=1,
        max_size=9,
    ),
    full_every=st.integers(1, 5),
    aborted=st.sets(st.integers(1, 9)),
)
def test_every_checkpoint_restores_to_the_model(
    steps: list[list[tuple[int, int]]], full_every: int, aborted: set[int]
) -> None:
    """Random updates and drops, checkpoints and aborts: restoring any
    completed checkpoint from its chain (last full + diffs) gives the state
    of a plain dict fed the same rows; diffs hold only keys touched since."""
    batches: Steps = [[batch([k], v) for k, v in step] for step in steps]
    caps = _core._keyed_checkpoints(
        "k", running, batches, full_every=full_every, aborted=sorted(aborted)
    )
    rows: list[tuple[int, int]] = []
    start = 0  # index of the newest full capture
    for i, (kind, base, b) in enumerate(caps):
        cid = i + 1
        rows += steps[i]
        if kind == "full":
            start = i
        else:
            assert base == cid - 1 and (cid - 1) not in aborted
            touched = {k for k, _ in steps[i]}
            assert set(b["k"].to_pylist()) <= touched
        if cid in aborted:
            continue  # never stored: nothing restores from it
        _, end = _core._keyed_restore("k", running, caps[start : i + 1], [])
        assert state_of(end) == fold(rows), f"checkpoint {cid}"


# --- whole jobs writing durable checkpoints ---

POPULATION = 1_000
HOT = [0, 1, 2]  # the only keys touched after the first batch
DROPPED = list(range(500, 520))


def slow_items(n: int = 160, delay: float = 0.003) -> Callable[[], Iterator[pa.RecordBatch]]:
    """Every key once, then slowly (so that checkpoints fall in between)
    only the hot keys, with some cold keys dropped along the way."""

    def items() -> Iterator[pa.RecordBatch]:
        yield batch(list(range(POPULATION)))
        for i in range(n):
            time.sleep(delay)
            if i % 8 == 4:
                yield batch([DROPPED[i // 8]], v=-1)
            else:
                yield batch([HOT[i % 3]], v=i)

    return items


def all_rows() -> list[tuple[int, int]]:
    return [r for b in slow_items(delay=0)() for r in _rows(b)]


def keyed_flow(items: Callable[[], Iterator[pa.RecordBatch]], before: Any = None) -> Dataflow:
    flow = Dataflow(parallelism=1)
    src = flow.from_iterable(items)
    if before is not None:
        src = src.map(before)
    src.key_by("k").process(running, name="keyed").collect("out")
    return flow


def state_files(root: Path) -> list[tuple[int, dict[str, Any]]]:
    """(checkpoint id, manifest entry) of the keyed task's state file, oldest first."""
    out = []
    for cid in snapshots.open(root).list():
        manifest = json.loads((root / f"chk-{cid:08d}" / "manifest.json").read_text())
        (entry,) = [
            f for f in manifest["files"] if f["role"] == "state" and f.get("vertex") == "keyed"
        ]
        out.append((cid, entry))
    return out


# Bound (seconds) on how long `until_merged` keeps the job going for the
# store's first merged run: far above a merge of POPULATION keys on a
# loaded machine, so running out of it means a stuck compactor.
MERGE_WAIT = 60.0


def merged_listed(root: Path) -> bool:
    """Whether a committed manifest under `root` lists a merged run."""
    for path in root.glob("chk-*/manifest.json"):
        try:
            manifest = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being replaced or removed: the next look sees it
        for f in manifest["files"]:
            if f["role"] == "state" and any(len(r["merges"]) > 1 for r in f.get("runs", [])):
                return True
    return False


def until_merged(
    root: Path, items: Callable[[], Iterator[pa.RecordBatch]], delay: float = 0.003
) -> Callable[[], Iterator[pa.RecordBatch]]:
    """`items`, then hot-key updates (checkpoints go on) until a manifest
    under `root` lists a merged run, at most MERGE_WAIT seconds: the store
    merges in the background and a later commit adopts the output, so how
    many checkpoints that takes depends on the machine's load."""

    def more() -> Iterator[pa.RecordBatch]:
        yield from items()
        deadline = time.monotonic() + MERGE_WAIT
        i = 0
        while time.monotonic() < deadline and (i % 10 or not merged_listed(root)):
            time.sleep(delay)
            yield batch([HOT[i % 3]], v=i)
            i += 1

    return more


def test_durable_diffs_hold_only_changed_keys(tmp_path: Path) -> None:
    root, full_every = tmp_path / "chk", 4
    cfg = Checkpointing(interval=0.01, full_every=full_every, retained=10_000)
    report = keyed_flow(until_merged(root, slow_items())).run(cfg, checkpoint_dir=root)
    files = state_files(root)
    kinds = [e["kind"] for _, e in files]
    assert kinds[0] == "full"
    assert "diff" in kinds, f"expected diffs among {kinds}"

    tombstones = set()
    for (cid, entry), prev in zip(files, [None, *files], strict=False):
        # Readable without snapcut: an Arrow IPC file of key + pickles.
        table = ipc.open_file(root / f"chk-{cid:08d}" / entry["path"]).read_all()
        if entry["kind"] == "full":
            assert table.column_names == ["k", "state"]
            assert table.num_rows >= POPULATION - len(DROPPED)
            continue
        assert table.column_names == ["k", "state", "__deleted"]
        assert prev is not None and entry["base"] == prev[0], "a diff is based on the last one"
        deleted = table.filter(table["__deleted"])["k"].to_pylist()
        upserted = table.filter(pc.invert(table["__deleted"]))["k"].to_pylist()
        assert set(upserted) <= set(HOT), f"checkpoint {cid} wrote untouched keys"
        assert set(deleted) <= set(DROPPED)
        tombstones.update(deleted)
    assert tombstones, "some key was dropped between two diffs"

    # The tasks capture only diffs after the first full (an aborted
    # checkpoint makes the next one full); the store merges them in the
    # background once full_every diffs sit on a full: some checkpoint lists
    # a merged run (the source went on until one did, at most MERGE_WAIT
    # seconds), and every state's runs end with a full.
    aborted = [c for c in report.checkpoints if not c.completed]
    if not aborted:
        assert kinds[1:] == ["diff"] * (len(kinds) - 1), kinds
    assert all(e["runs"][-1]["kind"] == "full" for _, e in files)
    merged = [cid for cid, e in files if any(len(r["merges"]) > 1 for r in e["runs"])]
    assert merged, f"no merged run among {len(files)} checkpoints"


@pytest.mark.parametrize("backend", ["rust", "pyarrow-fs"])
def test_snapshots_open_rebuilds_each_checkpoint_from_its_chain(
    tmp_path: Path, backend: str
) -> None:
    root = tmp_path / "chk"
    cfg = Checkpointing(interval=0.01, full_every=5, retained=10_000)
    keyed_flow(slow_items(n=100)).run(cfg, checkpoint_dir=root)
    fs = pafs.LocalFileSystem() if backend == "pyarrow-fs" else None
    snaps = snapshots.open(root, filesystem=fs)
    rows = all_rows()
    chains = 0
    for chk in snaps:
        # One source subtask feeding the keyed task directly, aligned: the
        # state holds exactly the rows before the source's offset.
        (offset,) = chk.source_offsets().values()
        state = chk.state("keyed", 0)
        assert state is not None
        assert state.column_names == ["k", "state"]
        assert state_of(state) == fold(rows[:offset]), f"checkpoint {chk.id}"
        entry = next(f for f in chk.files if f["role"] == "state" and f.get("vertex") == "keyed")
        chains += len(entry.get("chain", [])) > 1
    assert chains, "some checkpoint needed a chain of full + diffs"


def failing_once(marker: Path, root: Path, after: int) -> Callable[[pa.RecordBatch], Any]:
    """A pass-through map that raises once, when `after` checkpoints exist."""

    def fn(b: pa.RecordBatch) -> pa.RecordBatch:
        if not marker.exists() and len(list(root.glob("chk-*/manifest.json"))) >= after:
            marker.write_text("failed once")
            raise RuntimeError("injected failure")
        return b

    return fn


def final_state(root: Path) -> dict[Any, Any]:
    snaps = snapshots.open(root)
    state = snaps.latest().state("keyed", 0)
    assert state is not None
    return state_of(state)


def test_resume_from_a_diff_checkpoint_matches_a_failure_free_run(tmp_path: Path) -> None:
    # full_every high: every checkpoint after the first is a diff.
    cfg = Checkpointing(interval=0.01, full_every=1_000, retained=10_000)
    clean_root = tmp_path / "clean"
    clean = keyed_flow(slow_items()).run(cfg, checkpoint_dir=clean_root)

    root, marker = tmp_path / "chk", tmp_path / "marker"
    with pytest.raises(TaskError, match="injected failure"):
        keyed_flow(slow_items(), failing_once(marker, root, after=3)).run(cfg, checkpoint_dir=root)
    resumed = keyed_flow(slow_items(), failing_once(marker, root, after=3)).run(
        cfg, checkpoint_dir=root, resume=True
    )
    assert resumed.restored_from is not None
    entry = dict(state_files(root))[resumed.restored_from]
    assert entry["kind"] == "diff", "the restore read a chain of full + diffs"
    assert len(entry["chain"]) >= 2

    want = fold(all_rows())
    assert final_state(clean_root) == want
    assert final_state(root) == want

    def last_totals(t: pa.Table) -> dict[int, int]:
        d = t.to_pydict()
        return {k: v for k, v in zip(d["k"], d["total"], strict=True) if k in HOT}

    assert last_totals(resumed.results["out"]) == last_totals(clean.results["out"])


def test_regional_failover_restores_keyed_state_from_diffs(tmp_path: Path) -> None:
    """A failed pipeline with a keyed process restarts from a checkpoint
    whose keyed state is full + diffs; counts come out exactly once."""
    # Small batches, each user seen 4 times on average: once most are in,
    # a checkpoint interval (~2,500 records here) touches under half of a
    # task's 5,000 users, so its capture is a diff (while the table fills,
    # half of it or more changes: a full). The failure comes after 60 % of
    # the 2,000 batches.
    users, count, batch_size = 10_000, 40_000, 20
    calls = {"n": 0}

    def fail_once(b: pa.RecordBatch) -> pa.RecordBatch:
        calls["n"] += 1
        if calls["n"] == 1_200:
            raise RuntimeError("injected failure")
        # Slow enough that many 5 ms intervals pass on either side of the
        # failure even when a loaded machine stretches each checkpoint (at
        # 1 ms a batch, a busy CI run once took only full checkpoints).
        time.sleep(0.004)
        return b

    def counting(user: int, rows: pa.RecordBatch, n: int | None) -> tuple[Any, int]:
        n = (n or 0) + rows.num_rows
        return pa.RecordBatch.from_pydict({"user": [user], "n": [n]}), n

    flow = Dataflow(parallelism=2)
    ev = flow.generate_dwell_events(users=users, count=count, seed=3, batch_size=batch_size)
    ev.map(fail_once).key_by("user").process(counting, name="keyed").collect("out")
    cfg = Checkpointing(
        interval=0.005, full_every=3, retained=10_000, restart_attempts=1, restart_delay=0
    )
    root = tmp_path / "chk"
    report = flow.run(cfg, checkpoint_dir=root)
    assert len(report.restarts) == 1, report.restarts
    kinds = {e["kind"] for _, e in _all_state_files(root)}
    assert "diff" in kinds, kinds
    got = report.results["out"].group_by("user").aggregate([("n", "max")]).to_pydict()
    events = dwell_events(users, count, 3).group_by("user").aggregate([("user", "count")])
    want = dict(zip(events["user"].to_pylist(), events["user_count"].to_pylist(), strict=True))
    assert dict(zip(got["user"], got["n_max"], strict=True)) == want


def _all_state_files(root: Path) -> list[tuple[int, dict[str, Any]]]:
    out = []
    for cid in snapshots.open(root).list():
        manifest = json.loads((root / f"chk-{cid:08d}" / "manifest.json").read_text())
        out += [(cid, f) for f in manifest["files"] if f.get("vertex") == "keyed"]
    return out
