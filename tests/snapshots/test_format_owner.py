"""Issue 29: one implementation of the snapshot format (Rust).

- The Rust store's retention and ``snapcut snapshots prune`` keep exactly the
  same checkpoints of the same root (a chain whose base is shared, a
  checkpoint in progress).
- Roots written before the format moved to Rust (tests/snapshots/fixtures/)
  read as they did, through the Rust reader (local paths) and the pyarrow.fs
  backend (URIs) alike, and verify; writing the same inputs again gives the
  same files.
- The format's bindings are one submodule, ``snapcut._core.format``; the
  entries it gives are the dicts ``json.loads`` gives of the manifest written
  (same keys, same order, same values).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from tests.snapshots.fixtures import make_fixtures

from snapcut import snapshots
from snapcut._core import SnapshotError, SnapshotStore
from snapcut.cli import main

FIXTURES = Path(__file__).resolve().parent / "fixtures"

SCHEMA = pa.schema(
    [pa.field("k", pa.int64(), nullable=False), ("v", pa.int64())],
    metadata={"snapcut.key": "k"},
)
DIFF = pa.schema([*SCHEMA, pa.field("__deleted", pa.bool_())], metadata=SCHEMA.metadata)

# --- retention: one rule ---

PLAN: list[tuple[int, dict[int, int | None]]] = [
    # (checkpoint, {task: base of its diff, or None for a full})
    (1, {0: None, 1: None}),
    (2, {0: 1, 1: None}),
    (3, {0: None, 1: 2}),
    (4, {0: 3, 1: 3}),  # needs 2 and 3; 2 needs 1 (task 0): kept to a fixpoint
    (5, {0: 4, 1: 4}),  # staged, never committed: in progress, based on 4
    (6, {0: None, 1: None}),  # committed while 5 is in flight
]


def state(cid: int, base: int | None) -> tuple[str, int | None, pa.RecordBatch]:
    if base is None:
        return "full", None, pa.record_batch([[cid], [cid]], schema=SCHEMA)
    return "diff", base, pa.record_batch([[cid], [cid], [False]], schema=DIFF)


def write(root: Path, retain: int) -> SnapshotStore:
    """Runs PLAN through a store; returns it with checkpoint 5 still staged."""
    store = SnapshotStore(root, retain=retain, fsync="off")
    for cid, tasks in PLAN:
        for task, base in tasks.items():
            store.task_snapshot(cid, "op", task, state=state(cid, base))
        if cid != 5:
            store.commit(cid)
    return store


def test_store_retention_and_prune_keep_the_same_checkpoints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kept_by_store = write(tmp_path / "store", retain=1)
    written = write(tmp_path / "prune", retain=1_000)
    assert snapshots.open(tmp_path / "prune").partial() == [5]
    assert main(["snapshots", "prune", str(tmp_path / "prune"), "--keep", "1"]) == 0
    capsys.readouterr()
    on_disk = snapshots.open(tmp_path / "store").list()
    # 6 (retain 1) and 4 (5's base) stay whole; 4's runs hold 3 (both
    # tasks' files) and 2 (task 1's full); 1 goes.
    assert on_disk == kept_by_store.completed() == [4, 6]
    assert snapshots.open(tmp_path / "prune").list() == on_disk
    assert snapshots.open(tmp_path / "store").held() == [2, 3]
    assert held_files(tmp_path / "prune") == held_files(tmp_path / "store")
    assert held_files(tmp_path / "store")[2] == ["held.json", "op-1.state.arrow"]
    for kind in ("local", "uri"):
        root = tmp_path / "prune"
        snaps = snapshots.open(root if kind == "local" else root.as_uri())
        assert snaps.held() == [2, 3]
        assert all(why is None for cid, why in snaps.verify().items() if cid != 5)
        state = snaps[4].state("op", 1)
        assert state is not None and sorted(state.column("k").to_pylist()) == [2, 3, 4]
    # Once 5 commits, both drop everything but the newest: the same again.
    for store in (kept_by_store, written):
        store.commit(5)
    assert main(["snapshots", "prune", str(tmp_path / "prune"), "--keep", "1"]) == 0
    assert snapshots.open(tmp_path / "prune").list() == snapshots.open(tmp_path / "store").list()


def held_files(root: Path) -> dict[int, list[str]]:
    """The files of each held directory under `root`, by checkpoint."""
    return {
        int(d.name.removeprefix("chk-")): sorted(f.name for f in d.iterdir())
        for d in sorted(root.glob("chk-*"))
        if (d / "held.json").is_file() and not (d / "manifest.json").is_file()
    }


def test_retention_rule_is_the_stores_on_a_uri_root(tmp_path: Path) -> None:
    """SnapshotWriter.apply_retention (any pyarrow filesystem) is the same rule."""
    write(tmp_path / "store", retain=1)
    write(tmp_path / "w", retain=1_000)
    removed = snapshots.SnapshotWriter((tmp_path / "w").as_uri()).apply_retention(1)
    assert removed == [1, 2, 3]  # 1 deleted, 2 and 3 held
    assert snapshots.open(tmp_path / "w").list() == snapshots.open(tmp_path / "store").list()
    assert held_files(tmp_path / "w") == held_files(tmp_path / "store")


# --- fixture roots written before the change ---


def normalized(rows: Any) -> Any:
    """Rows as a sorted list (the row order of a rebuilt state is not part of
    the format; the two readers before issue 29 disagreed on it)."""
    if not isinstance(rows, dict) or "rows" not in rows:
        return rows
    return {**rows, "rows": sorted(rows["rows"], key=lambda r: json.dumps(r, sort_keys=True))}


def states(read: dict[str, Any]) -> dict[tuple[str, str], Any]:
    return {
        (c, t): normalized(task["state"])
        for c, chk in read["checkpoints"].items()
        for t, task in chk["tasks"].items()
    }


@pytest.mark.parametrize("name", make_fixtures.ROOTS)
def test_a_root_written_before_reads_as_it_did(name: str, tmp_path: Path) -> None:
    root = tmp_path / name
    shutil.copytree(FIXTURES / name, root)
    expected = json.loads((FIXTURES / f"{name}.json").read_text())
    got = json.loads(json.dumps(make_fixtures.expected(root, name)))
    # Through pyarrow.fs: exactly as before.
    assert got["uri"] == expected["uri"]
    if "spark_state" in expected:
        assert got["spark_state"] == expected["spark_state"]
    # Through the Rust reader: the same rows (it failed on list columns in a
    # diff chain before; now one rebuild serves both, in the same order).
    want = states(expected["uri"])
    assert states(got["local"]) == want
    assert got["local"] == got["uri"]
    for kind in ("local", "uri"):
        checks = snapshots.verify_checkpoints(root if kind == "local" else root.as_uri())
        assert [(c.id, c.ok) for c in checks] == [(int(i), True) for i in expected["uri"]["list"]]


@pytest.mark.parametrize("name", make_fixtures.ROOTS)
def test_the_same_inputs_write_the_same_files(name: str, tmp_path: Path) -> None:
    """Every data file written again from the same inputs has the same
    content (rows, schema, metadata) and every manifest the same fields;
    files of the Rust store (the local runtime) the same bytes. Files that
    pyarrow encoded before are now encoded by the Rust encoder (one
    implementation): same content, other bytes, still deterministic."""
    make_fixtures.WRITERS[name](tmp_path / name)
    old, new = FIXTURES / name, tmp_path / name
    files = sorted(p.relative_to(old) for p in old.rglob("*") if p.is_file())
    written = sorted(p.relative_to(new) for p in new.rglob("*") if p.is_file())
    # Format 3 stores each non-empty diff's bloom filter beside it, named by
    # its entry; the fixtures (format 1) have none.
    blooms = [rel for rel in written if rel.suffix == ".bloom"]
    assert files == [rel for rel in written if rel.suffix != ".bloom"]
    named = [
        rel.parent / e["filter"]["path"]
        for rel in written
        if rel.name == "manifest.json"
        for e in json.loads((new / rel).read_text())["files"]
        if "filter" in e
    ]
    assert sorted(named) == blooms

    # A table's diffs now name its live keys (`snapcut.live_keys`, which the
    # fixtures predate): the number of rows of the task's state at that
    # checkpoint. Without it the content is the fixture's; the files (and so
    # the manifests' sizes and checksums) differ by it.
    want = states(json.loads((FIXTURES / f"{name}.json").read_text())["uri"])
    live_key = snapshots.LIVE_KEYS_METADATA.encode()
    named_live = []
    for rel in files:
        if rel.suffix == ".arrow":
            a, b = (make_fixtures.read_ipc_file(d / rel) for d in (old, new))
            live = (b.schema.metadata or {}).get(live_key)
            if live is not None:
                cid = str(int(rel.parent.name.removeprefix(snapshots.CHECKPOINT_DIR_PREFIX)))
                task = rel.name.removesuffix(".state.arrow")
                assert int(live) == len(want[(cid, task)]["rows"]), rel
                assert b.column_names[-1] == snapshots.DELETED_COLUMN, rel
                meta = {k: v for k, v in (b.schema.metadata or {}).items() if k != live_key}
                b = b.replace_schema_metadata(meta)
                named_live.append(rel)
            assert a.equals(b, check_metadata=True), rel
            if name == make_fixtures.RUNTIME and live is None:
                assert (old / rel).read_bytes() == (new / rel).read_bytes(), rel
    # The roots written from tables (the runtime's aggregate, the Spark
    # helper's partitions) have diffs; the Python writer's takes no counts.
    assert bool(named_live) == (name != make_fixtures.SPARK_WRITER), named_live
    for rel in files:
        if rel.name == "manifest.json":
            same_bytes = name == make_fixtures.RUNTIME and not named_live
            a, b = (make_fixtures.manifest_content(d / rel, same_bytes) for d in (old, new))
            assert a == as_format_1(b), rel


def as_format_1(manifest: dict[str, Any]) -> dict[str, Any]:
    """A format 2 manifest written from the fixtures' inputs as the format 1
    fixture has it: the version, and each state entry's `runs`, which with
    no compaction are its chain's files, newest first, each merging its own
    checkpoint (checked here, then dropped)."""
    assert manifest["format_version"] == snapshots.FORMAT_VERSION == 5
    out = {**manifest, "format_version": 1, "files": []}
    for entry in manifest["files"]:
        if "filter" in entry:
            assert entry["kind"] == "diff" and entry["rows"] > 0, entry
            assert entry["filter"]["path"] == entry["path"].removesuffix(".arrow") + ".bloom"
            entry = {k: v for k, v in entry.items() if k != "filter"}
        runs = entry.get("runs")
        if runs is not None:
            assert [r["checkpoint"] for r in runs] == entry["chain"][::-1], entry
            assert all(r["merges"] == [r["checkpoint"]] for r in runs), entry
            assert runs[0]["path"] == entry["path"] and runs[0]["rows"] == entry["rows"]
            assert runs[-1]["kind"] == "full"
            entry = {k: v for k, v in entry.items() if k != "runs"}
        out["files"].append(entry)
    return out


# --- the bindings: one submodule, entries as the manifest's dicts ---


def test_the_format_bindings_are_one_submodule() -> None:
    import snapcut._core
    import snapcut._core.format
    from snapcut._core import format as fmt

    assert snapcut._core.format is fmt
    assert fmt.__name__ == "snapcut._core.format"
    assert fmt.scan.__module__ == "snapcut._core.format"
    assert [n for n in dir(snapcut._core) if n.startswith("format_")] == []


def test_entries_are_the_dicts_of_the_manifest_written(tmp_path: Path) -> None:
    from snapcut._core import format as fmt

    writer = snapshots.SnapshotWriter(tmp_path)
    table = pa.table({"k": [2, 1], "v": [20, 10]})
    state = writer.write_state(1, "op", 0, table, "k", base_chain=())
    fields = {"partition": 3, "z": {"b": [1, 2.5, None, True], "a": "x"}}
    output = snapshots.file_entry("part-00003.arrow", "output", 1, 8, 7, fields)
    manifest = writer.commit(1, [state, output])
    assert manifest["files"][:2] == [state, output]
    assert [list(e) for e in manifest["files"][:2]] == [list(state), list(output)]
    assert fmt.state_files(json.dumps(manifest).encode(), 1) == [("op", 0, state)]
    with pytest.raises(TypeError, match="not JSON serializable"):
        snapshots.file_entry("p.arrow", "output", 0, 0, 0, {"at": object()})
    with pytest.raises(SnapshotError, match="malformed manifest file entry"):
        fmt.check_file(b"", {"path": 1}, 1, "p")
    # A mapped file's bytes are checked in place, as unsigned bytes in one piece.
    data = b"abcdef"
    with pytest.raises(ValueError, match="not one contiguous buffer"):
        fmt.check_file(memoryview(data)[::2], state, 1, "p")
    with pytest.raises(BufferError, match="not compatible with u8"):
        fmt.check_file(memoryview(data).cast("b"), state, 1, "p")
    with pytest.raises(SnapshotError):
        fmt.check_file(memoryview(data), state, 1, "p")


def test_held_directories_list_as_held_and_an_interrupted_hold_is_finished(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Retention leaves a held directory with its record and the runs read;
    what an interrupted demotion leaves (a record beside the manifest, files
    beside the held ones) is finished by the next retention."""
    root = tmp_path / "r"
    write(root, retain=1_000)
    assert main(["snapshots", "prune", str(root), "--keep", "1"]) == 0
    assert "held 2 directories" in capsys.readouterr().out
    rows = {r.id: r.status for r in snapshots.list_checkpoints(root)}
    assert rows == {2: "held", 3: "held", 4: "complete", 5: "partial", 6: "complete"}
    # A demotion cut short after its record: the manifest wins.
    shutil.copy(root / "chk-00000002" / "held.json", root / "chk-00000006" / "held.json")
    assert snapshots.open(root).list() == [4, 6]
    # One cut short after its manifest went: files beside the held ones.
    (root / "chk-00000002" / "op-0.state.arrow").write_bytes(b"left over")
    prune = snapshots.prune(root, 1)
    assert (prune.removed, prune.held) == ([], [2, 3])
    assert held_files(root)[2] == ["held.json", "op-1.state.arrow"]
    # Asked for, a held checkpoint says what it is, in both readers.
    for opened in (snapshots.open(root), snapshots.open(root.as_uri())):
        with pytest.raises(SnapshotError, match="checkpoint 2 was removed by retention"):
            opened[2]
    # A store opening the root removes the partial 5, never a held directory.
    SnapshotStore(root, retain=1_000, fsync="off")
    assert (snapshots.open(root).partial(), snapshots.open(root).held()) == ([], [2, 3])
