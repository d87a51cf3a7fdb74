"""Operating snapshot roots: the Python API (snapcut.snapshots.list_checkpoints,
show_checkpoint, verify_checkpoints, diff_checkpoints, export_checkpoint,
prune) and `snapcut snapshots ...` over it, on roots of the Rust store, of a
real job and in the Spark helper's layout; local paths, file:// URIs,
pyarrow SubTreeFileSystems, and s3:// URIs on a real S3 server (moto)."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.ipc as ipc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.s3_support import S3Server

from conftest import Root, runtime_expected
from snapcut import SnapshotError, snapshots
from snapcut._core import SnapshotStore, crc32c
from snapcut.cli import main
from snapcut.snapshots.tables import EXPORT_MANIFEST, FORMATS, TaskDiff

KINDS = ["local", "uri", "subtree"]
CLI_KINDS = ["local", "uri"]


@pytest.fixture(autouse=True)
def _plain_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain text unless a test asks for a terminal (rich honours these)."""
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["snapshots", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def as_model(table: pa.Table, key: str) -> dict[Any, tuple[Any, ...]]:
    rows = table.to_pylist()
    return {r.pop(key): tuple(r.values()) for r in rows}


def chk(root: Path, cid: int) -> Path:
    return root / snapshots.checkpoint_dir_name(cid)


# --- list ---


@pytest.mark.parametrize("kind", KINDS)
def test_list_describes_every_checkpoint_from_its_files(local_root: Root, kind: str) -> None:
    rows = snapshots.list_checkpoints(**local_root.open(kind))
    assert [r.id for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r.kind for r in rows] == ["full", "diff", "diff", "full", "diff", "diff"]
    assert [r.chain for r in rows] == [[1], [1, 2], [1, 2, 3], [4], [4, 5], [4, 5, 6]]
    for r in rows:
        m = json.loads((chk(local_root.path, r.id) / "manifest.json").read_text())
        files = [f for f in m["files"]]
        assert (r.status, r.engine, r.protocol) == ("complete", "local", "aligned")
        assert r.files == len(files) == 4  # agg-0, agg-1, one channel log, sources
        assert r.bytes == sum(
            (chk(local_root.path, r.id) / f["path"]).stat().st_size for f in files
        )
        read = [ipc.open_file(chk(local_root.path, r.id) / f["path"]).read_all() for f in files]
        records = [t.num_rows for t, f in zip(read, files, strict=True) if f["role"] != "sources"]
        assert r.records == sum(records)
        assert r.committed_ms == m["committed_ms"] and not r.savepoint and r.error is None


@pytest.mark.parametrize("kind", KINDS)
def test_list_shows_partial_and_unreadable_checkpoints(local_root: Root, kind: str) -> None:
    (chk(local_root.path, 6) / "manifest.json").write_text("{ not json")
    partial = chk(local_root.path, 7)
    partial.mkdir()
    (partial / "agg-0.state.arrow").write_bytes(b"12345")
    rows = {r.id: r for r in snapshots.list_checkpoints(**local_root.open(kind))}
    assert sorted(rows) == [1, 2, 3, 4, 5, 6, 7]
    assert rows[6].status == "unreadable" and "not valid JSON" in (rows[6].error or "")
    assert (rows[7].status, rows[7].files, rows[7].bytes) == ("partial", 1, 5)
    assert rows[7].kind is None and rows[7].records is None


@pytest.mark.parametrize("kind", KINDS)
def test_a_spark_root_lists_its_batches_from_zero(spark_root: Root, kind: str) -> None:
    rows = snapshots.list_checkpoints(**spark_root.open(kind))
    assert [r.id for r in rows] == [0, 1, 2, 3]
    assert {(r.engine, r.protocol) for r in rows} == {("spark", "spark-microbatch")}
    assert [r.kind for r in rows] == ["full", "diff", "full", "diff"]
    assert [r.chain for r in rows] == [[0], [0, 1], [2], [2, 3]]
    first = snapshots.show_checkpoint(checkpoint_id=0, **spark_root.open(kind))
    assert first.summary.id == 0 and first.manifest["spark"]["batch_id"] == 0
    latest = snapshots.show_checkpoint(**spark_root.open(kind))
    assert latest.summary.id == 3
    assert [(f["path"], f["role"]) for f in latest.files] == [
        ("sources.arrow", "sources"),
        ("output-0.arrow", "output"),
        ("output-1.arrow", "output"),
    ]
    assert [t.label for t in latest.tasks] == ["counts-0", "counts-1", "kafka-0"]


# --- show ---


@pytest.mark.parametrize("kind", KINDS)
def test_show_groups_the_manifest_by_task(local_root: Root, kind: str) -> None:
    info = snapshots.show_checkpoint(checkpoint_id=5, **local_root.open(kind))
    manifest = json.loads((chk(local_root.path, 5) / "manifest.json").read_text())
    assert info.manifest == manifest
    agg0, agg1, src = info.tasks
    assert (agg0.label, agg1.label, src.label) == ("agg-0", "agg-1", "src-0")
    assert agg0.state is not None and agg0.state["kind"] == "diff"
    assert agg0.state["chain"] == [4, 5]
    [chan] = agg0.channels
    assert (chan["edge"], chan["from_subtask"], chan["rows"]) == ("agg<-loop", 0, 2)
    assert agg1.channels == [] and src.state is None
    assert src.source_offset == 50 and agg0.source_offset is None
    assert (agg0.alignment_ms, agg1.alignment_ms) == (1.5, 3.0)
    assert [f["role"] for f in info.files] == ["sources"]
    as_json = json.loads(json.dumps(info.to_dict()))
    assert as_json["id"] == 5 and as_json["tasks"][2]["source_offset"] == 50


# --- verify ---


@pytest.mark.parametrize("kind", KINDS)
def test_verify_reads_every_file_once_and_agrees_with_the_reader(
    local_root: Root, kind: str
) -> None:
    calls: list[tuple[int, int]] = []
    checks = snapshots.verify_checkpoints(
        **local_root.open(kind), which="all", progress=lambda n, t: calls.append((n, t))
    )
    assert [(c.id, c.ok, c.reasons()) for c in checks] == [(i, True, []) for i in range(1, 7)]
    # Every data file and every diff's stored filter (format 3).
    every_file = [p for p in local_root.path.glob("chk-*/*") if p.suffix in (".arrow", ".bloom")]
    assert any(p.suffix == ".bloom" for p in every_file)
    total = sum(p.stat().st_size for p in every_file)
    assert calls[0] == (0, total)
    assert sum(n for n, _ in calls[1:]) == total and len(calls) == len(every_file) + 1
    # Checkpoint 6 is read from its own files and its chain's state files.
    assert {f.checkpoint for f in checks[-1].files} == {4, 5, 6}
    assert [
        c.id for c in snapshots.verify_checkpoints(**local_root.open(kind), which="latest")
    ] == [6]
    assert [c.id for c in snapshots.verify_checkpoints(**local_root.open(kind), which=2)] == [2]
    with pytest.raises(SnapshotError, match="checkpoint 9 does not exist"):
        snapshots.verify_checkpoints(**local_root.open(kind), which=9)


DAMAGES = [
    "checksum",
    "truncated",
    "missing",
    "partial",
    "manifest",
    "base",
    "rows",
    "filter",
    "filter-shape",
]


def damage(root: Path, how: str) -> tuple[set[int], str, str]:
    """Damages the root; returns the broken checkpoints, the file to be named
    (relative to the root) and a fragment of the reason."""
    state = chk(root, 5) / "agg-1.state.arrow"
    if how == "checksum":
        data = bytearray(state.read_bytes())
        data[len(data) // 2] ^= 0xFF
        state.write_bytes(bytes(data))
        return {5, 6}, "chk-00000005/agg-1.state.arrow", "checksum"
    if how == "truncated":
        state.write_bytes(state.read_bytes()[:-7])
        return {5, 6}, "chk-00000005/agg-1.state.arrow", "truncated"
    if how == "missing":
        (chk(root, 5) / "sources.arrow").unlink()
        return {5}, "chk-00000005/sources.arrow", "missing"
    if how == "partial":
        (chk(root, 5) / "manifest.json").unlink()
        # 6 reads 5's runs through its own entries (format 4): still intact.
        return {5}, "chk-00000005/manifest.json", "partial"
    if how == "manifest":
        (chk(root, 5) / "manifest.json").write_text('{"format_version": 1')
        return {5}, "chk-00000005/manifest.json", "not valid JSON"
    if how == "base":
        (chk(root, 4) / "agg-0.state.arrow").write_bytes(b"garbage")
        return {4, 5, 6}, "chk-00000004/agg-0.state.arrow", "needs base checkpoint 4"
    bloom = chk(root, 5) / "agg-1.state.bloom"
    if how == "filter":
        data = bytearray(bloom.read_bytes())
        data[0] ^= 0xFF
        bloom.write_bytes(bytes(data))
        return {5, 6}, "chk-00000005/agg-1.state.bloom", "checksum"
    if how == "filter-shape":
        # Intact by its entry (size and checksum match), yet no filter.
        odd = b"\0" * 33
        bloom.write_bytes(odd)
        path = chk(root, 5) / "manifest.json"
        m = json.loads(path.read_text())
        entry = next(f for f in m["files"] if f["path"] == "agg-1.state.arrow")
        entry["filter"].update(bytes=len(odd), crc32c=crc32c(odd))
        for run in entry.get("runs", []):
            if run["path"] == entry["path"]:
                run["filter"] = entry["filter"]
        path.write_text(json.dumps(m))
        return {5, 6}, "chk-00000005/agg-1.state.bloom", "does not read as a bloom filter"
    # A manifest that disagrees with an intact file: only a structural check sees it.
    path = chk(root, 5) / "manifest.json"
    m = json.loads(path.read_text())
    entry = next(f for f in m["files"] if f["path"] == "agg-1.state.arrow")
    entry["rows"] += 1
    path.write_text(json.dumps(m))
    # 6 checks the file against its own run entry, which is right.
    return {5}, "chk-00000005/agg-1.state.arrow", f"says {entry['rows']}"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("how", DAMAGES)
def test_verify_names_each_broken_file_and_why(local_root: Root, kind: str, how: str) -> None:
    broken, file, why = damage(local_root.path, how)
    checks = {c.id: c for c in snapshots.verify_checkpoints(**local_root.open(kind))}
    assert {c for c, check in checks.items() if not check.ok} == broken
    reasons = checks[5].reasons()
    assert any(file.split("/")[-1] in r and why in r for r in reasons), reasons
    if how != "partial" and how != "manifest":
        named = [f for f in checks[5].files if not f.ok]
        assert any(f.path == file for f in named), named
    if how not in ("rows", "filter-shape"):  # the readers check sizes and checksums
        for reader in (snapshots.open(local_root.path), snapshots.open(local_root.path.as_uri())):
            assert {c for c, r in reader.verify().items() if r is not None} == broken


def test_verify_checks_that_each_file_opens(local_root: Root) -> None:
    """A file whose size and checksum match its manifest but is no Arrow file."""
    path = chk(local_root.path, 3) / "manifest.json"
    m = json.loads(path.read_text())
    entry = next(f for f in m["files"] if f["path"] == "agg-0.state.arrow")
    junk = b"not an arrow file"
    (chk(local_root.path, 3) / "agg-0.state.arrow").write_bytes(junk)
    entry.update(bytes=len(junk), crc32c=crc32c(junk))
    path.write_text(json.dumps(m))
    [check] = snapshots.verify_checkpoints(local_root.path, which=3)
    assert not check.ok
    assert any("agg-0.state.arrow does not open as arrow" in r for r in check.reasons())


def test_verify_checks_the_chain_of_each_state(local_root: Root) -> None:
    """A chain naming a checkpoint that holds no state for the task (an
    entry without runs, as format 1 writes it); runs that do not end with a
    full (format 2)."""
    path = chk(local_root.path, 5) / "manifest.json"
    m = json.loads(path.read_text())
    entry = next(f for f in m["files"] if f["path"] == "agg-1.state.arrow")
    runs = entry.pop("runs")
    entry["chain"] = [3, 5]
    path.write_text(json.dumps(m))
    [check] = snapshots.verify_checkpoints(local_root.path, which=5)
    assert any("needs a full state at checkpoint 3" in r for r in check.reasons())
    entry["runs"] = [dict(runs[0], kind="diff")]
    entry["chain"] = [5]
    path.write_text(json.dumps(m))
    [check] = snapshots.verify_checkpoints(local_root.path, which=5)
    assert any("a diff, not a full" in r for r in check.reasons()), check.reasons()


# --- diff ---


def check_diff(d: TaskDiff, before: dict[Any, Any], after: dict[Any, Any]) -> None:
    """`d` against a plain-dict model of the two states."""
    key = d.key[0]
    assert as_model(d.added, key) == {k: after[k] for k in after.keys() - before.keys()}
    assert as_model(d.removed, key) == {k: before[k] for k in before.keys() - after.keys()}
    both = before.keys() & after.keys()
    changed = {k for k in both if before[k] != after[k]}
    rows = d.changed.to_pylist()
    assert {r[key] for r in rows} == changed
    for r in rows:
        assert tuple(v for c, v in r.items() if c.startswith("before_")) == before[r[key]]
        assert tuple(v for c, v in r.items() if c.startswith("after_")) == after[r[key]]
    assert d.unchanged == len(both) - len(changed)
    assert (d.rows_a, d.rows_b) == (len(before), len(after))
    arrow = d.to_arrow()
    counts = {c: arrow["change"].to_pylist().count(c) for c in ("added", "removed", "changed")}
    assert counts == {
        "added": d.added.num_rows,
        "removed": d.removed.num_rows,
        "changed": len(rows),
    }
    assert arrow.column_names[:2] == ["change", key]


@pytest.mark.parametrize("kind", KINDS)
def test_diff_matches_a_dict_model_for_every_pair(local_root: Root, kind: str) -> None:
    for a, b in itertools.permutations(local_root.model, 2):
        diffs = snapshots.diff_checkpoints(**local_root.open(kind), a=a, b=b)
        assert [d.label for d in diffs] == ["agg-0", "agg-1"]
        for d in diffs:
            task = (d.vertex, d.subtask)
            check_diff(d, local_root.model[a][task], local_root.model[b][task])
    [d] = snapshots.diff_checkpoints(**local_root.open(kind), a=2, b=5, task="agg-1")
    assert d.label == "agg-1"
    assert len(snapshots.diff_checkpoints(**local_root.open(kind), a=2, b=5, task="agg")) == 2
    with pytest.raises(SnapshotError, match="tasks with state: agg-0, agg-1"):
        snapshots.diff_checkpoints(**local_root.open(kind), a=2, b=5, task="src")


@pytest.mark.parametrize("kind", KINDS)
def test_diff_of_spark_batches_with_list_values(spark_root: Root, kind: str) -> None:
    for a, b in itertools.permutations(spark_root.model, 2):
        for d in snapshots.diff_checkpoints(**spark_root.open(kind), a=a, b=b):
            task = (d.vertex, d.subtask)
            check_diff(d, spark_root.model[a][task], spark_root.model[b][task])


def test_diff_without_a_key_compares_whole_rows_and_new_tasks(tmp_path: Path) -> None:
    w = snapshots.SnapshotWriter(tmp_path)
    w.commit(1, [w.write_state(1, "sum", 0, pa.table({"s": [3, 4, 4], "k": [0, 0, 0]}), key="k")])
    files = [
        w.write_state(2, "sum", 0, pa.table({"s": [4, 5], "k": [0, 0]}), key="k"),
        w.write_state(2, "new", 0, pa.table({"id": [1, 2], "x": [9, 9]}), key="id"),
    ]
    w.commit(2, files)
    # Drop the key of "sum" (as operator state without a key is written).
    for cid in (1, 2):
        path = chk(tmp_path, cid) / "manifest.json"
        m = json.loads(path.read_text())
        for f in m["files"]:
            if f.get("vertex") == "sum":
                f.pop("key")
                table = ipc.open_file(chk(tmp_path, cid) / f["path"]).read_all()
                table = table.replace_schema_metadata(None)
                sink = pa.BufferOutputStream()
                with ipc.new_file(sink, table.schema) as out:
                    out.write_table(table)
                data = sink.getvalue().to_pybytes()
                (chk(tmp_path, cid) / f["path"]).write_bytes(data)
                f.update(bytes=len(data), crc32c=crc32c(data))
        path.write_text(json.dumps(m))
    new, summed = snapshots.diff_checkpoints(tmp_path, 1, 2)
    assert summed.key == [] and summed.changed.num_rows == 0
    assert summed.added.to_pylist() == [{"s": 5, "k": 0}]
    assert sorted(r["s"] for r in summed.removed.to_pylist()) == [3, 4]  # one of the two 4s
    assert summed.unchanged == 1
    assert new.key == ["id"] and new.added.num_rows == 2 and new.rows_a == 0
    assert summed.to_arrow().column_names == [
        "change",
        "before_s",
        "after_s",
        "before_k",
        "after_k",
    ]


# --- export ---


def export_model(root: Root, cid: int, vertex: str) -> dict[Any, Any]:
    return {k: v for (vx, _), d in root.model[cid].items() if vx == vertex for k, v in d.items()}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_export_is_read_back_by_duckdb_and_polars(
    local_root: Root, tmp_path: Path, kind: str, fmt: str
) -> None:
    out = tmp_path / "out"
    calls: list[tuple[int, int]] = []
    result = snapshots.export_checkpoint(
        **local_root.open(kind),
        out=out.as_uri() if kind == "uri" else out,
        checkpoint_id=5,
        format=fmt,
        progress=lambda n, t: calls.append((n, t)),
    )
    assert calls == [(0, 2), (1, 2), (1, 2)]
    [table] = result.tables
    assert (table.name, table.role, table.key) == ("agg", "state", "k")
    assert table.parts == [f"agg/part-00000.{fmt}", f"agg/part-00001.{fmt}"]
    expected = export_model(local_root, 5, "agg")
    assert table.rows == len(expected)
    glob = f"{out}/agg/*.{fmt}"
    if fmt == "parquet":
        got = duckdb.sql(f"SELECT k, v, blob FROM read_parquet('{glob}')").fetchall()
        frame = pl.read_parquet(glob)
    elif fmt == "csv":
        got = duckdb.sql(f"SELECT k, v, from_base64(blob) FROM read_csv('{glob}')").fetchall()
        frame = pl.read_csv(glob).with_columns(pl.col("blob").str.decode("base64"))
    else:
        arrow = ds.dataset(str(out / "agg"), format="arrow")  # noqa: F841 - scanned by DuckDB
        got = duckdb.sql("SELECT k, v, blob FROM arrow").fetchall()
        frame = pl.read_ipc(glob)
    assert {k: (v, bytes(b)) for k, v, b in got} == expected
    assert {r["k"]: (r["v"], r["blob"]) for r in frame.to_dicts()} == expected
    # One part per subtask: part-00001 holds subtask 1's keys only.
    reader = {"parquet": pl.read_parquet, "csv": pl.read_csv, "arrow": pl.read_ipc}[fmt]
    part = reader(str(out / f"agg/part-00001.{fmt}"))
    assert set(part["k"].to_list()) == set(local_root.model[5][("agg", 1)])
    meta = json.loads((out / EXPORT_MANIFEST).read_text())
    assert (meta["checkpoint"], meta["format"], meta["complete"]) == (5, fmt, True)


@pytest.mark.parametrize("fmt", FORMATS)
def test_export_of_a_spark_batch_writes_state_and_output_tables(
    spark_root: Root, tmp_path: Path, fmt: str
) -> None:
    out = tmp_path / "out"
    result = snapshots.export_checkpoint(spark_root.path.as_uri(), out, 3, format=fmt)
    assert [(t.name, t.role, len(t.parts)) for t in result.tables] == [
        ("counts", "state", 2),
        ("output", "output", 2),
    ]
    outputs = sorted((r["key"], r["n"]) for rows in spark_root.outputs[3].values() for r in rows)
    expected = export_model(spark_root, 3, "counts")
    reader = {"parquet": pl.read_parquet, "csv": pl.read_csv, "arrow": pl.read_ipc}[fmt]
    state = reader(f"{out}/counts/*.{fmt}")
    if fmt == "csv":  # lists are written as JSON text
        state = state.with_columns(pl.col("recent").str.json_decode(pl.List(pl.Int64)))
    assert {r["key"]: (r["n"], r["recent"]) for r in state.to_dicts()} == expected
    output = reader(f"{out}/output/*.{fmt}")
    if fmt == "csv":  # one part file holds no rows: CSV keeps no types
        output = output.with_columns(pl.col("n").cast(pl.Int64))
    assert sorted(output.iter_rows()) == outputs
    if fmt == "parquet":
        got = duckdb.sql(f"SELECT key, n FROM read_parquet('{out}/output/*.parquet')").fetchall()
        assert sorted(got) == outputs


def test_export_reads_through_checksums_and_guards_its_target(
    local_root: Root, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(SnapshotError, match="is not empty"):
        snapshots.export_checkpoint(local_root.path, out)
    with pytest.raises(SnapshotError, match="not an earlier export, so it is left alone"):
        snapshots.export_checkpoint(local_root.path, out, overwrite=True)
    assert (out / "notes.txt").read_text() == "mine"
    fresh = tmp_path / "fresh"
    assert snapshots.export_checkpoint(local_root.path, fresh).checkpoint == 6
    with pytest.raises(SnapshotError, match="is not empty"):
        snapshots.export_checkpoint(local_root.path, fresh, 2)
    snapshots.export_checkpoint(local_root.path, fresh, 2, format="csv", overwrite=True)
    assert json.loads((fresh / EXPORT_MANIFEST).read_text())["checkpoint"] == 2
    assert sorted(p.name for p in (fresh / "agg").iterdir()) == ["part-00000.csv", "part-00001.csv"]
    damage(local_root.path, "checksum")
    with pytest.raises(SnapshotError, match=r"agg-1\.state\.arrow fails its checksum"):
        snapshots.export_checkpoint(local_root.path, tmp_path / "bad", 5)
    assert json.loads((tmp_path / "bad" / EXPORT_MANIFEST).read_text())["complete"] is False
    # A failed export can be overwritten.
    snapshots.export_checkpoint(local_root.path, tmp_path / "bad", 4, overwrite=True)
    with pytest.raises(SnapshotError, match="format must be one of parquet, arrow, csv"):
        snapshots.export_checkpoint(local_root.path, tmp_path / "bad", 5, format="orc")


@pytest.mark.spark
def test_export_read_back_by_spark(local_root: Root, tmp_path: Path) -> None:
    pyspark = pytest.importorskip("pyspark.sql")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java")
    snapshots.export_checkpoint(local_root.path, tmp_path / "out", 5)
    spark = pyspark.SparkSession.builder.master("local[1]").getOrCreate()
    try:
        rows = spark.read.parquet(str(tmp_path / "out" / "agg")).collect()
    finally:
        spark.stop()
    got = {r["k"]: (r["v"], bytes(r["blob"])) for r in rows}
    assert got == export_model(local_root, 5, "agg")


# --- prune ---


@pytest.mark.parametrize("kind", KINDS)
def test_prune_keeps_the_bases_of_kept_checkpoints(local_root: Root, kind: str) -> None:
    partial = chk(local_root.path, 7)
    partial.mkdir()
    dry = snapshots.prune(**local_root.open(kind), keep=2, dry_run=True)
    # 5 and 6 read the full at 4: its directory is held, 1..3 go.
    assert (dry.removed, dry.kept, dry.partial, dry.dry_run) == ([1, 2, 3, 4], [5, 6], [7], True)
    assert (dry.base_only, dry.held) == ([], [4])
    assert [r.id for r in snapshots.list_checkpoints(local_root.path)] == [1, 2, 3, 4, 5, 6, 7]
    done = snapshots.prune(**local_root.open(kind), keep=2)
    assert (done.removed, done.kept, done.held) == ([1, 2, 3, 4], [5, 6], [4])
    assert sorted(p.name for p in local_root.path.iterdir()) == [
        "chk-00000004",
        "chk-00000005",
        "chk-00000006",
        "chk-00000007",
    ]
    statuses = [r.status for r in snapshots.list_checkpoints(local_root.path)]
    assert statuses == ["held", "complete", "complete", "partial"]
    for cid in (5, 6):
        for s in (0, 1):
            state = snapshots.open(local_root.path)[cid].state("agg", s)
            assert state is not None
            assert as_model(state, "k") == local_root.model[cid][("agg", s)]
    again = snapshots.prune(**local_root.open(kind), keep=1)
    assert (again.removed, again.held) == ([5], [4, 5])  # 6 reads 4 and 5


@settings(max_examples=60, deadline=None)
@given(
    plan=st.lists(st.tuples(st.booleans(), st.booleans(), st.booleans()), min_size=1, max_size=9),
    keep=st.integers(1, 4),
    first=st.sampled_from([0, 1]),
)
def test_prune_never_breaks_a_kept_checkpoints_chain(
    plan: list[tuple[bool, bool, bool]], keep: int, first: int
) -> None:
    """Random fulls and diffs per task, savepoints and `keep`: prune keeps
    exactly the newest `keep`, the savepoints and the checkpoints their chains
    read, to a fixpoint (issue 29: the Rust store's rule; the one-pass rule
    before it cut the chains of checkpoints kept as bases); each of those
    newest and savepoints still verifies and rebuilds its model state; a
    checkpoint kept only as a base is reported as such exactly when its own
    chain was cut (never, under the fixpoint)."""
    with tempfile.TemporaryDirectory() as tmp:
        w = snapshots.SnapshotWriter(tmp)
        model: dict[int, dict[int, dict[int, int]]] = {}
        chains: dict[int, set[int]] = {}
        last_full: dict[int, int] = {}
        state: dict[int, dict[int, int]] = {0: {}, 1: {}}
        savepoints = set()
        for i, (full0, full1, savepoint) in enumerate(plan):
            cid = first + i
            files = []
            chains[cid] = {cid}
            for task, full in ((0, full0), (1, full1)):
                full = full or task not in last_full
                state[task][cid] = cid * 10 + task
                if full:
                    last_full[task] = cid
                    table = pa.table({"k": list(state[task]), "v": list(state[task].values())})
                    files.append(w.write_state(cid, "op", task, table, key="k"))
                else:
                    diff = pa.table({"k": [cid], "v": [cid * 10 + task], "__deleted": [False]})
                    files.append(
                        w.write_state(cid, "op", task, diff, key="k", kind="diff", base=cid - 1)
                    )
                chains[cid] |= set(range(last_full[task], cid + 1))
            w.commit(cid, files, savepoint=savepoint)
            model[cid] = {t: dict(s) for t, s in state.items()}
            if savepoint:
                savepoints.add(cid)
        regular = [c for c in model if c not in savepoints]
        chosen = set(regular[-keep:]) | savepoints
        # The Rust store's rule: a checkpoint kept as a base is kept whole,
        # so the checkpoints its own chains read are kept too (a fixpoint).
        expected = set(chosen)
        while more := set().union(*(chains[c] for c in expected)) - expected:
            expected |= more

        dry = snapshots.prune(tmp, keep, dry_run=True)
        assert len(snapshots.list_checkpoints(tmp)) == len(model), "a dry run removes nothing"
        result = snapshots.prune(tmp, keep)
        assert (result.kept, result.removed) == (dry.kept, dry.removed)
        assert result.kept == sorted(expected)
        assert result.removed == sorted(model.keys() - expected)
        assert result.base_only == sorted(c for c in expected if not chains[c] <= expected)
        checks = {c.id: c for c in snapshots.verify_checkpoints(tmp)}
        assert sorted(checks) == sorted(expected)
        assert {c for c, check in checks.items() if not check.ok} == set(result.base_only)
        reader = snapshots.open(tmp)
        for cid in chosen:
            assert checks[cid].ok
            for task in (0, 1):
                table = reader[cid].state("op", task)
                assert table is not None and as_model(table, "k") == {
                    k: (v,) for k, v in model[cid][task].items()
                }


# --- the command line ---


@pytest.mark.parametrize("kind", CLI_KINDS)
def test_cli_list_as_text_and_json(
    local_root: Root, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    root = local_root.name(kind)
    code, out, err = cli(capsys, "list", root)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == [
        "id", "committed", "(UTC)", "engine", "protocol", "status", "kind", "files", "size",
        "records", "chain",
    ]  # fmt: skip
    assert set(lines[1]) == {"-", " "}
    assert "aligned" in lines[6] and "4→5→6" in lines[7]
    assert lines[8] == f"6 checkpoints under {root}: 6 complete"
    code, out, _ = cli(capsys, "list", root, "--json")
    rows = json.loads(out)
    assert code == 0 and [r["id"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert rows[4]["chain"] == [4, 5] and rows[4]["kind"] == "diff"


@pytest.mark.parametrize("kind", CLI_KINDS)
def test_cli_show_as_text_and_json(
    spark_root: Root, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    root = spark_root.name(kind)
    code, out, _ = cli(capsys, "show", root, "0")
    assert code == 0
    assert out.startswith(f"checkpoint 0 under {root}\n")
    assert "engine              spark, protocol spark-microbatch" in out
    assert "spark query_id      q-1" in out
    assert "output-1.arrow  output   partition 1" in out
    code, out, _ = cli(capsys, "show", root, "chk-00000001", "--json")
    shown = json.loads(out)
    assert code == 0 and shown["id"] == 1 and shown["spark"]["batch_id"] == 1
    assert [t["state"]["kind"] for t in shown["tasks"][:2]] == ["diff", "diff"]


@pytest.mark.parametrize("kind", CLI_KINDS)
@pytest.mark.parametrize("how", DAMAGES)
def test_cli_verify_exits_1_naming_the_broken_file(
    local_root: Root, kind: str, how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    root = local_root.name(kind)
    code, out, _ = cli(capsys, "verify", root, "1")
    assert code == 0 and out.endswith(f"1 checkpoint intact under {root}\n")
    broken, file, why = damage(local_root.path, how)
    code, out, err = cli(capsys, "verify", root, "--all")
    assert code == 1 and err == ""
    assert f"{len(broken)} of 6 checkpoints broken" in out
    assert any(file.split("/")[-1] in line and why in line for line in out.splitlines()), out
    assert out.count("BROKEN") == len(broken)
    code, _, _ = cli(capsys, "verify", root)  # the newest checkpoint
    assert code == (1 if 6 in broken else 0)


@pytest.mark.parametrize("kind", CLI_KINDS)
def test_cli_diff_as_text_json_and_arrow(
    local_root: Root, kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = local_root.name(kind)
    code, out, _ = cli(capsys, "diff", root, "2", "6", "--json", "--sample", "2")
    assert code == 0
    shown = json.loads(out)
    for t in shown["tasks"]:
        before = local_root.model[2][(t["vertex"], t["subtask"])]
        after = local_root.model[6][(t["vertex"], t["subtask"])]
        assert t["added"] == len(after.keys() - before.keys())
        assert t["removed"] == len(before.keys() - after.keys())
        assert len(t["sample"]["added"]) == min(2, t["added"])
        blob = t["sample"]["added"][0]["blob"]
        assert blob.startswith("base64:")
    code, out, _ = cli(capsys, "diff", root, "2", "6", "--task", "agg-0")
    lines = out.splitlines()
    assert code == 0 and lines[0] == "checkpoint 2 → 6"
    assert lines[3].split()[:2] == ["agg-0", "k"] and len(lines[2:]) > 2
    assert any(line.startswith("  + k=") for line in lines)
    assert any(line.startswith("  - k=") for line in lines)
    code, out, _ = cli(capsys, "diff", root, "2", "6", "--arrow", str(tmp_path / "d"))
    assert code == 0 and "wrote 2 Arrow files" in out
    code, out, _ = cli(
        capsys, "diff", root, "2", "6", "--json", "--arrow", str(tmp_path / "d"), "--overwrite"
    )
    assert code == 0 and json.loads(out)["b"] == 6  # stdout holds the JSON only
    table = ipc.open_file(tmp_path / "d" / "agg" / "part-00001.arrow").read_all()
    before, after = local_root.model[2][("agg", 1)], local_root.model[6][("agg", 1)]
    assert table["change"].to_pylist().count("added") == len(after.keys() - before.keys())


@pytest.mark.parametrize("kind", CLI_KINDS)
def test_cli_export_and_prune(
    local_root: Root, kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = local_root.name(kind)
    out_dir = tmp_path / "out"
    code, out, err = cli(capsys, "export", root, "--to", str(out_dir), "--format", "parquet")
    assert (code, err) == (0, "")
    assert "exported 1 tables in 2 files" in out and "agg/*.parquet" in out
    total = duckdb.sql(f"SELECT count(*) FROM read_parquet('{out_dir}/agg/*.parquet')").fetchall()
    assert total == [(len(export_model(local_root, 6, "agg")),)]
    code, out, _ = cli(capsys, "prune", root, "--keep", "2", "--dry-run")
    assert code == 0 and out.startswith("would remove 4 checkpoints: 1, 2, 3, 4\n")
    assert "held 1 directories for the runs kept checkpoints read" in out
    assert len(snapshots.list_checkpoints(local_root.path)) == 6
    code, out, _ = cli(capsys, "prune", root, "--keep", "2")
    assert code == 0 and out.startswith("removed 4 checkpoints: 1, 2, 3, 4\n")
    assert [r.id for r in snapshots.list_checkpoints(local_root.path)] == [4, 5, 6]


def test_cli_errors_are_one_line_with_a_nonzero_exit(
    local_root: Root, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope"
    for args in (
        ("list", str(missing)),
        ("show", str(local_root.path), "42"),
        ("diff", str(local_root.path), "1", "2", "--task", "nope"),
        ("export", str(local_root.path), "--to", str(local_root.path)),
        ("verify", missing.as_uri()),
        ("list", "nosuchscheme://x/y"),
    ):
        code, out, err = cli(capsys, *args)
        assert code == 2, args
        assert out == "" and err.count("\n") == 1, err
        assert err.startswith(f"snapcut snapshots {args[0]}: error: "), err
    _, _, err = cli(capsys, "show", str(local_root.path), "42")
    assert "checkpoint 42 does not exist" in err
    with pytest.raises(SystemExit):
        main(["snapshots", "prune", str(local_root.path), "--keep", "0"])
    with pytest.raises(SystemExit):
        main(["snapshots", "verify", str(local_root.path), "3", "--all"])


def test_cli_draws_rich_tables_on_a_terminal(
    local_root: Root, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    monkeypatch.setenv("COLUMNS", "140")
    code, out, _ = cli(capsys, "list", str(local_root.path))
    assert code == 0 and "┃" in out and "4→5→6" in out
    code, out, _ = cli(capsys, "verify", str(local_root.path), "--all")
    assert code == 0 and "┃" in out


@pytest.mark.parametrize("kind", CLI_KINDS)
def test_every_command_on_a_runtime_root(
    runtime_root: Path, kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A root the local runtime wrote: the final checkpoint holds every user."""
    root = str(runtime_root) if kind == "local" else runtime_root.as_uri()
    code, out, _ = cli(capsys, "list", root, "--json")
    rows = json.loads(out)
    assert code == 0 and rows and {r["engine"] for r in rows} == {"local"}
    first, last = rows[0]["id"], rows[-1]["id"]
    assert cli(capsys, "show", root)[0] == 0
    assert cli(capsys, "verify", root, "--all")[0] == 0
    code, out, _ = cli(capsys, "diff", root, str(first), str(last), "--json")
    assert code == 0
    reader = snapshots.open(runtime_root)  # the Rust reader, for an independent view
    for t in json.loads(out)["tasks"]:
        a = reader[first].state(t["vertex"], t["subtask"])
        b = reader[last].state(t["vertex"], t["subtask"])
        if not t["key"]:
            continue
        before = as_model(a, "user") if a is not None else {}
        after = as_model(b, "user") if b is not None else {}
        assert t["added"] == len(after.keys() - before.keys())
        assert t["changed"] == sum(before[k] != after[k] for k in before.keys() & after.keys())
    out_dir = tmp_path / "out"
    assert cli(capsys, "export", root, "--to", str(out_dir))[0] == 0
    got = duckdb.sql(
        f"SELECT user, count, total FROM read_parquet('{out_dir}/aggregate/*.parquet')"
    ).fetchall()
    assert {u: (c, t) for u, c, t in got} == runtime_expected()
    code, out, _ = cli(capsys, "prune", root, "--keep", "1", "--dry-run")
    assert code == 0 and out.startswith("would remove")


def test_the_snapcut_entry_point(local_root: Root) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "snapcut", "snapshots", "list", str(local_root.path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1] == f"6 checkpoints under {local_root.path}: 6 complete"


def test_the_store_and_the_operations_share_one_format(local_root: Root) -> None:
    """Rows the operations report agree with what the Rust store lists."""
    store = SnapshotStore(local_root.path, retain=1_000, cleanup_partial_on_open=False)
    rows = snapshots.list_checkpoints(local_root.path)
    assert [r.id for r in rows] == store.completed()


# --- on S3 (the S3 server of the Spark tests: moto on 127.0.0.1) ---


def on_s3(s3: S3Server, root: Root) -> tuple[str, str]:
    """Uploads a root's files to a new bucket: (its s3:// URI, bucket/path)."""
    path = s3.upload(root.path)
    return s3.uri(path), path


@pytest.mark.parametrize("which", ["local_root", "spark_root"])
def test_cli_on_an_s3_root_says_what_it_says_locally(
    s3: S3Server,
    which: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    root: Root = request.getfixturevalue(which)
    uri, path = on_s3(s3, root)
    first, last = min(root.model), max(root.model)

    def same(*args: str) -> str:
        """Runs a command on the local root and on S3; their outputs (root
        names aside) must be equal."""
        code, here, err = cli(capsys, args[0], str(root.path), *args[1:])
        assert (code, err) == (0, "")
        code, there, err = cli(capsys, args[0], uri, *args[1:])
        assert (code, err) == (0, ""), err
        assert there.replace(uri, "ROOT").replace(path, "ROOT") == here.replace(
            str(root.path), "ROOT"
        )
        return there

    rows = json.loads(same("list", "--json"))
    assert [r["id"] for r in rows] == sorted(root.model)
    same("show", str(last), "--json")
    same("diff", str(first), str(last), "--json")
    assert "intact under ROOT" in same("verify", "--all").replace(uri, "ROOT")
    # export reads the S3 root, writes a local directory (and an S3 one).
    code, _, err = cli(capsys, "export", uri, "--to", str(tmp_path / "x"), "--format", "arrow")
    assert (code, err) == (0, "")
    code, _, err = cli(capsys, "export", str(root.path), "--to", str(tmp_path / "y"))
    assert (code, err) == (0, "")
    tables = sorted(p.name for p in (tmp_path / "y").iterdir() if p.is_dir())
    assert tables == sorted(p.name for p in (tmp_path / "x").iterdir() if p.is_dir())
    assert tables
    for table in tables:
        got = ds.dataset(tmp_path / "x" / table, format="ipc").to_table().to_pylist()
        want = ds.dataset(tmp_path / "y" / table, format="parquet").to_table().to_pylist()
        assert sorted(map(repr, got)) == sorted(map(repr, want))
    code, _, err = cli(capsys, "export", uri, "--to", s3.uri(f"{path}-export"))
    assert (code, err) == (0, "")
    assert any(k.endswith(".parquet") for k in s3.keys(f"{path}-export"))
    # A corrupt object is named; prune removes objects on S3 as it removes files.
    victim = f"{path}/{snapshots.checkpoint_dir_name(last)}/sources.arrow"
    fs = s3.filesystem()
    with fs.open_output_stream(victim) as f:
        f.write(b"not arrow")
    code, out, _ = cli(capsys, "verify", uri, str(last))
    assert code == 1 and "sources.arrow" in out
    code, out, err = cli(capsys, "prune", uri, "--keep", "1")
    assert (code, err) == (0, "") and out.startswith("removed ")
    kept, held = snapshots.open(uri).list(), snapshots.open(uri).held()
    assert kept and kept[-1] == last and len(kept) < len(root.model)
    gone = set(root.model) - set(kept) - set(held)
    assert gone
    keys = s3.keys(path)
    gone_dirs = tuple(snapshots.checkpoint_dir_name(c) for c in gone)
    assert not any(k.startswith(gone_dirs) for k in keys)
    # A held directory keeps its record and the files it names, no more.
    for c in held:
        d = snapshots.checkpoint_dir_name(c)
        record = json.loads(fs.open_input_stream(f"{path}/{d}/held.json").read())
        names = {k.split(f"{d}/", 1)[1] for k in keys if f"/{d}/" in f"/{k}"}
        assert names == {"held.json", *record["files"]}, (c, names)
