"""snapcut.snapshots: the same format read through Rust (local paths) and
through pyarrow.fs (URIs, sub-tree filesystems), written by Rust or Python."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pytest

import snapcut
from snapcut import ConfigError, SnapshotError, StateTable, StorageError, snapshots
from snapcut._core import SnapshotStore, StateRuns
from snapcut._core import format as fmt

SCHEMA = pa.schema([pa.field("k", pa.int64(), nullable=False), ("v", pa.int64())])


def rows(keys: list[int], add: int) -> pa.RecordBatch:
    return pa.record_batch([keys, [k + add for k in keys]], schema=SCHEMA)


def as_dict(table: pa.Table) -> dict[int, int]:
    d = table.to_pydict()
    return dict(zip(d["k"], d["v"], strict=True))


def build(root: Path, n: int = 5, full_every: int = 3, retain: int = 10) -> list[dict[int, int]]:
    """Checkpoints 1..n through the Rust store; returns the state at each."""
    store = SnapshotStore(root, retain=retain)
    table = StateTable(SCHEMA, "k", full_every=full_every)
    states = []
    for cid in range(1, n + 1):
        table.update(rows(list(range(cid * 3, cid * 3 + 6)), cid * 100))
        if cid % 2 == 0:
            table.delete([cid * 3])
        _, kind, batch = table.checkpoint(cid)
        base = None if kind == "full" else cid - 1
        chan = pa.table({"x": [cid, cid + 1]})
        store.task_snapshot(
            cid, "agg", 0, state=(kind, base, batch), channels=[(1, "agg<-loop", 0, chan)]
        )
        store.task_snapshot(cid, "src", 0, source_offset=cid * 10)
        store.commit(cid, protocol="aligned", graph_fingerprint="g1", started_ms=cid)
        states.append(as_dict(table.to_arrow()))
    return states


def open_as(kind: str, root: Path) -> snapshots.Snapshots:
    if kind == "local":
        return snapshots.open(root)
    if kind == "uri":
        return snapshots.open(root.as_uri())
    sub = pafs.SubTreeFileSystem(str(root.parent), pafs.LocalFileSystem())
    return snapshots.open(root.name, filesystem=sub)


KINDS = ["local", "uri", "subtree"]


@pytest.mark.parametrize("kind", KINDS)
def test_read_back_every_checkpoint(tmp_path: Path, kind: str) -> None:
    states = build(tmp_path)
    snaps = open_as(kind, tmp_path)
    assert snaps.list() == [1, 2, 3, 4, 5]
    for cid, expected in enumerate(states, start=1):
        chk = snaps[cid]
        state = chk.state("agg", 0)
        assert state is not None
        assert as_dict(state) == expected
        assert chk.state("src", 0) is None
        assert chk.source_offsets() == {("src", 0): cid * 10}
        [chan] = chk.channels("agg", 0)
        assert (chan.input, chan.edge, chan.from_subtask) == (1, "agg<-loop", 0)
        assert chan.records.column("x").to_pylist() == [cid, cid + 1]
        assert chk.meta["protocol"] == "aligned"
        assert chk.meta["graph_fingerprint"] == "g1"
        assert chk.meta["format_version"] == snapshots.FORMAT_VERSION
        assert sorted(chk.tasks) == [("agg", 0), ("src", 0)]
    assert snaps.latest().id == 5
    assert snaps.verify() == {c: None for c in range(1, 6)}
    kinds = [f["kind"] for c in snaps for f in c.files if f["role"] == "state"]
    assert kinds == ["full", "diff", "diff", "full", "diff"]


def corrupt(root: Path, how: str) -> str:
    """Damages checkpoint 5; returns the message fragment expected."""
    d = root / "chk-00000005"
    state = d / "agg-0.state.arrow"
    if how == "manifest":
        (d / "manifest.json").unlink()
        return "partial"
    if how == "missing":
        (d / "sources.arrow").unlink()
        return "missing"
    if how == "checksum":
        data = bytearray(state.read_bytes())
        data[len(data) // 2] ^= 0xFF
        state.write_bytes(bytes(data))
        return "checksum"
    if how == "truncated":
        state.write_bytes(state.read_bytes()[:-5])
        return "truncated"
    m = json.loads((d / "manifest.json").read_text())
    m["format_version"] = 7
    (d / "manifest.json").write_text(json.dumps(m))
    return "format_version 7"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("how", ["manifest", "missing", "checksum", "truncated", "version"])
def test_corruption_is_detected_and_skipped(tmp_path: Path, kind: str, how: str) -> None:
    states = build(tmp_path)
    fragment = corrupt(tmp_path, how)
    snaps = open_as(kind, tmp_path)
    report = snaps.verify()
    assert report[4] is None
    assert report[5] is not None and fragment in report[5]
    chk, skipped = snaps.latest_intact()
    assert chk.id == 4
    assert [s[0] for s in skipped] == [5]
    assert fragment in skipped[0][1]
    state = chk.state("agg", 0)
    assert state is not None and as_dict(state) == states[3]
    if how in ("checksum", "truncated"):
        with pytest.raises(SnapshotError, match=fragment):
            snaps[5].state("agg", 0)
    if how in ("manifest", "version"):
        with pytest.raises(SnapshotError, match=fragment):
            snaps[5]


@pytest.mark.parametrize("kind", KINDS)
def test_broken_base_spoils_the_chain(tmp_path: Path, kind: str) -> None:
    build(tmp_path, n=3, full_every=10)
    (tmp_path / "chk-00000001" / "agg-0.state.arrow").write_bytes(b"garbage")
    snaps = open_as(kind, tmp_path)
    with pytest.raises(SnapshotError, match="needs base checkpoint 1"):
        snaps[3].verify()
    with pytest.raises(SnapshotError, match="no intact checkpoint"):
        snaps.latest_intact()


@pytest.mark.parametrize("kind", KINDS)
def test_files_without_manifest_are_not_complete(tmp_path: Path, kind: str) -> None:
    build(tmp_path, n=2)
    partial = tmp_path / "chk-00000003"
    partial.mkdir()
    (partial / "agg-0.state.arrow").write_bytes(
        (tmp_path / "chk-00000002/agg-0.state.arrow").read_bytes()
    )
    snaps = open_as(kind, tmp_path)
    assert snaps.list() == [1, 2]
    assert snaps.partial() == [3]
    assert snaps.latest().id == 2
    assert snaps.latest_intact()[0].id == 2
    # Reopening the store cleans the abandoned directory.
    SnapshotStore(tmp_path)
    assert not partial.exists()


def test_retention_keeps_the_chain(tmp_path: Path) -> None:
    build(tmp_path, n=8, full_every=3, retain=2)
    snaps = snapshots.open(tmp_path)
    # Fulls at 1, 4, 7: keep 7, 8 (retain 2), whose chain starts at 7.
    assert snaps.list() == [7, 8]
    states = build(tmp_path / "b", n=6, full_every=4, retain=1)
    # Fulls at 1, 5: keep 6; 5 is held for the full 6 reads.
    b = snapshots.open(tmp_path / "b")
    assert (b.list(), b.held()) == ([6], [5])
    state = b[6].state("agg", 0)
    assert state is not None and as_dict(state) == states[5]


def test_python_writer_is_read_by_rust_and_python(tmp_path: Path) -> None:
    root = tmp_path / "py"
    w = snapshots.SnapshotWriter(root.as_uri())
    table = StateTable(SCHEMA, "k", full_every=10)
    table.update(rows([1, 2, 3], 0))
    files = [w.write_state(1, "agg", 0, table.checkpoint(1)[2], key="k")]
    w.commit(1, files, source_offsets={("src", 0): 7}, graph_fingerprint="spark")
    table.update(rows([3, 4], 10))
    table.delete([1])
    diff = table.checkpoint(2)[2]
    files = [
        w.write_state(2, "agg", 0, diff, key="k", kind="diff", base=1),
        w.write_channel(2, "agg", 0, "agg<-x", 1, pa.table({"y": [1]})),
    ]
    w.commit(2, files, source_offsets={("src", 0): 9})
    expected = as_dict(table.to_arrow())
    for kind in KINDS:
        snaps = open_as(kind, root)
        assert snaps.verify() == {1: None, 2: None}
        state = snaps[2].state("agg", 0)
        assert state is not None and as_dict(state) == expected
        assert snaps[2].source_offsets() == {("src", 0): 9}
        assert snaps[2].channels("agg", 0)[0].records.num_rows == 1
        assert snaps[2].files[0]["chain"] == [1, 2]
    with pytest.raises(SnapshotError, match="already committed"):
        w.commit(2, files)


def test_python_writer_on_subtree_filesystem(tmp_path: Path) -> None:
    sub = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    w = snapshots.SnapshotWriter("snaps", filesystem=sub)
    w.commit(1, [w.write_state(1, "v", 2, rows([5], 1), key="k")])
    assert not (tmp_path / "snaps/chk-00000001/manifest.json.tmp").exists()
    state = snapshots.open(tmp_path / "snaps")[1].state("v", 2)
    assert state is not None and as_dict(state) == {5: 6}
    with pytest.raises(SnapshotError, match="no key column"):
        w.write_state(2, "v", 2, rows([5], 1), key="nope")


def test_a_local_state_file_is_encoded_into_its_file_as_the_bytes_a_remote_one_gets(
    tmp_path: Path,
) -> None:
    """A local root's state file is written by the Rust encoder straight into
    its temp file, then renamed: the same bytes and entry as the encoded
    buffer a remote root gets, and no temp file left, even when it fails."""
    w = snapshots.SnapshotWriter(tmp_path / "root")
    table = rows(list(range(1000, 0, -1)), 3)
    entry = w.write_state(4, "agg", 1, table, key="k", sort=True, base_chain=[])
    data, want, bloom = fmt.encode_state("agg", 1, table, "k", "full", None, True, (4, []))
    assert bloom is None  # a full stores no filter
    assert entry == want
    path = tmp_path / "root" / "chk-00000004" / entry["path"]
    assert path.read_bytes() == data.to_pybytes()
    with pytest.raises(SnapshotError, match="no key column"):
        w.write_state(4, "agg", 2, table, key="nope")
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


def test_a_state_file_written_with_direct_io_has_the_same_bytes(tmp_path: Path) -> None:
    """`direct_io=True` (O_DIRECT where the filesystem takes it) changes how
    the bytes reach the disk, not which: a full from a table and a diff from
    a capture's runs (with its filter) past a 4 MiB chunk and an
    unaligned tail read back identical to the buffered writer's files."""
    schema = pa.schema([("k", pa.int64()), ("v", pa.int64())])
    n = 400_001
    table = StateTable(schema, "k", state_memory="8MB", spill_dir=str(tmp_path / "spill"))
    table.update(pa.table({"k": list(range(n)), "v": list(range(n))}, schema=schema))
    full = table.checkpoint(1)[2]
    table.checkpoint_committed(1)
    table.update(pa.table({"k": list(range(0, n, 3)), "v": [7] * len(range(0, n, 3))}))
    table.delete(pa.array([1, 2, 4]))
    _, kind, runs = table.checkpoint_streamed(2)
    assert kind == "diff" and isinstance(runs, StateRuns)
    written = {}
    for direct in (False, True):
        root = tmp_path / f"direct-{direct}"
        w = snapshots.SnapshotWriter(root, direct_io=direct)
        e1 = w.write_state(1, "agg", 0, full, key="k", sort=True, base_chain=[])
        e2 = w.write_state(2, "agg", 0, runs, key="k", kind="diff", base_chain=[1])
        w.commit(1, [e1])
        w.commit(2, [e2])
        assert "filter" in e2
        files = [
            root / "chk-00000001" / e1["path"],
            root / "chk-00000002" / e2["path"],
            root / "chk-00000002" / e2["filter"]["path"],
        ]
        written[direct] = (e1, e2, [f.read_bytes() for f in files])
    assert written[True] == written[False]
    assert len(written[True][2][0]) > 4 << 20  # past a direct write's 4 MiB chunk
    snaps = snapshots.open(tmp_path / "direct-True")
    assert snaps.verify() == {1: None, 2: None}
    state = snaps[2].state("agg", 0)
    assert state is not None and state.num_rows == n - 3
    with pytest.raises(ConfigError, match="direct_io must be a bool"):
        snapshots.SnapshotWriter(tmp_path / "x", direct_io="yes")  # type: ignore[arg-type]


def test_duckdb_reads_a_state_file_directly(tmp_path: Path) -> None:
    states = build(tmp_path, n=1)
    path = tmp_path / "chk-00000001" / "agg-0.state.arrow"
    dataset = ds.dataset(str(path), format="arrow")  # noqa: F841 - scanned by DuckDB by name
    total = duckdb.sql("SELECT sum(v) AS s, count(*) AS n FROM dataset").fetchall()[0]
    assert total == (sum(states[0].values()), len(states[0]))


def test_missing_root_and_unwritable_root(tmp_path: Path) -> None:
    with pytest.raises(SnapshotError, match="does not exist"):
        snapshots.open(tmp_path / "nope")
    with pytest.raises(SnapshotError, match="does not exist"):
        snapshots.open((tmp_path / "nope").as_uri())
    blocker = tmp_path / "file"
    blocker.write_bytes(b"x")
    with pytest.raises(StorageError, match=str(blocker)):
        SnapshotStore(blocker / "root")
    with pytest.raises(snapcut.ConfigError, match="'per-file', 'syncfs', 'off'"):
        SnapshotStore(tmp_path / "never", fsync="sometimes")
    assert not (tmp_path / "never").exists()
    w = snapshots.SnapshotWriter(blocker / "root")
    with pytest.raises(StorageError, match="root"):
        w.write_state(1, "a", 0, rows([1], 0), key="k")


def test_rust_checksum_matches_python_view(tmp_path: Path) -> None:
    build(tmp_path, n=1)
    m: dict[str, Any] = json.loads((tmp_path / "chk-00000001" / "manifest.json").read_text())
    for f in m["files"]:
        data = (tmp_path / "chk-00000001" / f["path"]).read_bytes()
        assert snapcut._core.crc32c(data) == f["crc32c"]
        assert len(data) == f["bytes"]
    assert os.path.basename(m["files"][0]["path"]).endswith(".arrow")


def test_a_table_restored_from_a_snapshot_continues_with_diffs(tmp_path: Path) -> None:
    states = build(tmp_path, n=4, full_every=10)
    snaps = snapshots.open(tmp_path)
    state = snaps[4].state("agg", 0)
    assert state is not None
    table = StateTable(SCHEMA, "k", full_every=10)
    table.restore([(4, "full", state)])  # a pyarrow Table is accepted too
    assert as_dict(table.to_arrow()) == states[3]
    table.update(rows([1000], 0))
    cid, kind, diff = table.checkpoint()
    assert (cid, kind, diff.num_rows) == (5, "diff", 1)


@pytest.mark.parametrize("kind", KINDS)
def test_operator_state_without_key_metadata(tmp_path: Path, kind: str) -> None:
    store = SnapshotStore(tmp_path)
    plain = pa.record_batch({"sum": [3, 4]})
    store.task_snapshot(1, "agg", 0, state=("full", None, plain))
    store.commit(1)
    state = open_as(kind, tmp_path)[1].state("agg", 0)
    assert state is not None and state.column("sum").to_pylist() == [3, 4]


def test_python_writer_retention_and_cleanup(tmp_path: Path) -> None:
    sub = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    w = snapshots.SnapshotWriter("r", filesystem=sub)
    for cid in range(1, 7):
        kind, base = ("full", None) if cid in (1, 4) else ("diff", cid - 1)
        data = rows([cid], 0)
        if kind == "diff":
            data = pa.Table.from_batches([data]).append_column(
                "__deleted", pa.array([False], pa.bool_())
            )
        files = [w.write_state(cid, "a", 0, data, key="k", kind=kind, base=base)]
        w.commit(cid, files, savepoint=cid == 2)
    (tmp_path / "r" / "chk-00000007").mkdir()
    assert w.apply_retention(1) == [3]  # keep 6 and its chain 4, 5; savepoint 2 and base 1
    snaps = snapshots.open(tmp_path / "r")
    assert snaps.list() == [1, 2, 4, 5, 6]
    state = snaps[6].state("a", 0)
    assert state is not None and as_dict(state) == {4: 4, 5: 5, 6: 6}
    assert w.cleanup_partial(below=100) == [7]
    assert snaps.partial() == []
    with pytest.raises(SnapshotError, match="at least 1"):
        w.apply_retention(0)


@pytest.mark.parametrize("kind", KINDS)
def test_empty_channel_log_reads_as_an_empty_table(tmp_path: Path, kind: str) -> None:
    store = SnapshotStore(tmp_path)
    empty = pa.Table.from_batches([], schema=pa.schema([]))
    store.task_snapshot(1, "join", 2, channels=[(0, "join<-left", 1, empty)])
    store.commit(1, protocol="chandy-lamport")
    chk = open_as(kind, tmp_path)[1]
    [chan] = chk.channels("join", 2)
    assert (chan.edge, chan.from_subtask, chan.records.num_rows) == ("join<-left", 1, 0)
    assert chk.protocol == "chandy-lamport"
    assert chk.verify() is None


def commit_diffs(store: SnapshotStore, checkpoints: int) -> None:
    """Checkpoints 1..`checkpoints` of task agg-0, each adding key `cid`:
    a full, then diffs; each commit adopts the merges finished before it."""
    table = StateTable(SCHEMA, "k", full_every=1_000_000)
    for cid in range(1, checkpoints + 1):
        table.update(rows([cid], cid))
        _, kind, batch = table.checkpoint(cid)
        store.task_snapshot(cid, "agg", 0, state=(kind, None if kind == "full" else cid - 1, batch))
        # The store merges in the background and the next commit adopts
        # the output: waiting (bounded: 60 s is a stuck compactor, a merge
        # of 5 rows takes milliseconds) makes that independent of the load.
        assert store.wait_for_compactions(60.0)
        store.commit(cid)


def test_store_side_materialization_bounds_chains(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, retain=1, materialize_every=2)
    commit_diffs(store, 5)
    snaps = snapshots.open(tmp_path.as_uri())
    chains = {c.id: c.files[0]["chain"] for c in snaps}
    assert all(len(chain) <= 2 for chain in chains.values()), chains
    state = snaps.latest().state("agg", 0)
    assert state is not None and as_dict(state) == {k: 2 * k for k in range(1, 6)}


def test_a_compaction_budget_rests_the_compactor_and_bad_budgets_are_refused(
    tmp_path: Path,
) -> None:
    store = SnapshotStore(tmp_path / "ok", retain=1, materialize_every=2, compaction_cpu_share=0.5)
    commit_diffs(store, 6)
    stats = store.compaction_stats()
    assert stats["adopted"] >= 1 and stats["failed"] == 0, stats
    assert stats["bytes_read"] > 0 and stats["bytes_written"] > 0, stats
    # Half a core: each job rests as long as it worked.
    assert stats["busy_s"] > 0 and stats["rested_s"] == pytest.approx(stats["busy_s"], abs=1e-6)
    state = snapshots.open((tmp_path / "ok").as_uri()).latest().state("agg", 0)
    assert state is not None and as_dict(state) == {k: 2 * k for k in range(1, 7)}
    with pytest.raises(ConfigError, match=r"compaction_cpu_share must be in \[0.01, 1\]"):
        SnapshotStore(tmp_path / "bad", materialize_every=2, compaction_cpu_share=0.0)
    with pytest.raises(ConfigError, match="compaction_bytes_per_s must be positive"):
        SnapshotStore(tmp_path / "bad", materialize_every=2, compaction_bytes_per_s=0)
