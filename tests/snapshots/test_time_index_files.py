"""A full of a state table with a time index stores the index beside its
file (format 5), from Python's writer to a local root and to an object
store alike: the manifest names it, ``FsBackend.chain_files`` reads it
checked, a restore takes it and finds the same keys due, and a damaged one
is named by ``verify`` and refused."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from snapcut import SnapshotError, StateTable, snapshots
from snapcut._core import crc32c
from snapcut.snapshots.backend import FsBackend
from snapcut.snapshots.layout import TIME_METADATA
from spark_support import NoRenameHandler

SCHEMA = pa.schema([("k", pa.int64()), ("expires", pa.int64())])
KEYS = 20_000
TASK = ("agg", 0)


def expiry(k: int, add: int = 0) -> int | None:
    """Key `k`'s expiry: none for every 8th key."""
    return None if k % 8 == 0 else (k * 37 + add) % 10_000


def rows(keys: range, add: int = 0) -> pa.Table:
    return pa.table({"k": list(keys), "expires": [expiry(k, add) for k in keys]}, schema=SCHEMA)


def model_due(model: dict[int, int], threshold: int) -> list[int]:
    return [k for at, k in sorted((at, k) for k, at in model.items() if at <= threshold)]


def write_root(filesystem: pafs.FileSystem | None, root: str) -> dict[int, int]:
    """Checkpoint 1, a full of every key; checkpoint 2, a diff rewriting a
    third: written as a Spark partition writes its versions. Returns the
    model of key -> expiry."""
    table = StateTable(SCHEMA, "k", time_column="expires", full_every=4)
    writer = snapshots.SnapshotWriter(root, filesystem=filesystem)
    table.update(rows(range(KEYS)))
    _, kind, full = table.checkpoint_streamed(1)
    assert kind == "full" and TIME_METADATA.encode() in full.schema.metadata
    e1 = writer.write_state(1, *TASK, full, key="k", sort=True, base_chain=[])
    writer.commit(1, [e1], tasks=[TASK])
    table.checkpoint_committed(1)
    table.update(rows(range(0, KEYS, 3), add=5))
    _, kind, diff = table.checkpoint_streamed(2)
    assert kind == "diff"
    e2 = writer.write_state(2, *TASK, diff, key="k", kind="diff", sort=True, base_chain=[1])
    writer.commit(2, [e2], tasks=[TASK])
    assert "times" not in e2
    times = e1["times"]
    assert (times["path"], times["column"]) == ("agg-0.state.times.arrow", "expires")
    assert times["rows"] == KEYS - KEYS // 8
    model = {k: expiry(k, 5 if k % 3 == 0 else 0) for k in range(KEYS)}
    return {k: at for k, at in model.items() if at is not None}


@pytest.fixture(params=["local", "object-store"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[pafs.FileSystem, str]:
    if request.param == "local":
        return pafs.LocalFileSystem(), str(tmp_path / "root")
    return pafs.PyFileSystem(NoRenameHandler()), str(tmp_path / "root")


def test_a_timed_full_stores_its_index_and_a_restore_takes_it(
    root: tuple[pafs.FileSystem, str],
) -> None:
    fs, path = root
    model = write_root(fs, path)
    backend = FsBackend(fs, path)
    for mapped in (False, True):
        files = backend.chain_files(2, TASK, mapped=mapped)
        assert files is not None and [f.kind for f in files] == ["full", "diff"]
        index = files[0].times
        assert index is not None and files[1].times is None
        assert index.num_rows == KEYS - KEYS // 8
        assert index.schema.metadata[TIME_METADATA.encode()] == b"expires"
        for state_memory in (None, "2MB"):
            table = StateTable(SCHEMA, "k", time_column="expires", state_memory=state_memory)
            chain = [(f.checkpoint, f.kind, f.table) for f in files]
            table.restore(chain, times=index)
            for threshold in (-1, 0, 3000, 9999):
                due = table.due(threshold).to_pylist()
                assert due == model_due(model, threshold), (mapped, state_memory, threshold)
    # A rebuild reads no index.
    no_sidecars = backend.chain_files(2, TASK, sidecars=False)
    assert no_sidecars is not None and no_sidecars[0].times is None
    assert snapshots.verify_checkpoints(path, filesystem=fs)[-1].ok


def test_a_restore_refuses_an_index_that_is_not_its_fulls(tmp_path: Path) -> None:
    write_root(None, str(tmp_path))
    files = FsBackend(pafs.LocalFileSystem(), str(tmp_path)).chain_files(2, TASK)
    assert files is not None and files[0].times is not None
    chain = [(f.checkpoint, f.kind, f.table) for f in files]
    table = StateTable(SCHEMA, "k", time_column="expires")
    with pytest.raises(SnapshotError, match="holds 17499 entries, but the full has 17500 rows"):
        table.restore(chain, times=files[0].times.slice(1))


def damage(root: Path, how: str) -> str:
    """Damages checkpoint 1's stored index; returns a fragment of the reason."""
    index = root / "chk-00000001" / "agg-0.state.times.arrow"
    if how == "checksum":
        data = bytearray(index.read_bytes())
        data[len(data) // 2] ^= 0xFF
        index.write_bytes(bytes(data))
        return "checksum"
    if how == "missing":
        index.unlink()
        return "missing"
    # Intact by its entry (size and checksum match), yet not a time index
    # ("shape"), or one out of order ("order").
    sink = pa.BufferOutputStream()
    if how == "order":
        stored = pa.ipc.open_file(str(index)).read_all()
        backwards = stored.take(pa.array(range(stored.num_rows - 1, -1, -1)))
        with pa.ipc.new_file(sink, stored.schema) as w:
            w.write_table(backwards)
    else:
        with pa.ipc.new_file(sink, pa.schema([("x", pa.int64())])) as w:
            w.write_table(pa.table({"x": list(range(17_500))}))
    odd = sink.getvalue().to_pybytes()
    index.write_bytes(odd)
    for cid in (1, 2):
        path = root / f"chk-0000000{cid}" / "manifest.json"
        m = json.loads(path.read_text())
        for entry in m["files"]:
            for holder in [entry, *entry.get("runs", [])]:
                if "times" in holder:
                    holder["times"].update(bytes=len(odd), crc32c=crc32c(odd))
        path.write_text(json.dumps(m))
    return "out of order" if how == "order" else "is not a time index"


@pytest.mark.parametrize("how", ["checksum", "missing", "shape", "order"])
def test_a_damaged_index_is_named_by_verify_and_refused(tmp_path: Path, how: str) -> None:
    write_root(None, str(tmp_path))
    why = damage(tmp_path, how)
    checks = {c.id: c for c in snapshots.verify_checkpoints(str(tmp_path))}
    assert not checks[1].ok and not checks[2].ok
    reasons = checks[2].reasons()
    assert any("agg-0.state.times.arrow" in r and why in r for r in reasons), reasons
    backend = FsBackend(pafs.LocalFileSystem(), str(tmp_path))
    for mapped in (False, True):
        if how in ("shape", "order"):
            # Read as its entry says; the restore refuses it.
            files = backend.chain_files(2, TASK, mapped=mapped)
            assert files is not None and files[0].times is not None
            chain = [(f.checkpoint, f.kind, f.table) for f in files]
            table = StateTable(SCHEMA, "k", time_column="expires")
            with pytest.raises(SnapshotError, match=why):
                table.restore(chain, times=files[0].times)
        else:
            with pytest.raises(SnapshotError, match=r"agg-0\.state\.times\.arrow"):
                backend.chain_files(2, TASK, mapped=mapped)
