"""``ArrowSnapshotSink(output=IcebergOutput(...))``: append, update and
complete round trips read back with pyiceberg scans, equal to what
``read_output_arrow`` returns for the same stream into an Arrow IPC root;
exactly one Iceberg snapshot per batch whose summary carries
``snapcut.app_id`` and ``snapcut.batch``; crashes before the table commit and
between the catalog commit and snapcut's manifest, then a restart, commit
nothing twice; with ``state=`` the manifest names the snapshot of the batch
whose state it names; bad inputs (a table of another query, an incompatible
schema, an identifier that is a namespace, a catalog that cannot be reached,
a root written with another output, no pyiceberg, missing or refused S3
credentials) fail typed and commit nothing; one append round trip with the
warehouse on S3 (moto)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from table_sink import (  # the fixtures: pytest finds them here
    FILES,
    armed,
    as_totals,
    dwell,
    event_rows,
    fail_driver_at,
    frames,
    manifest,
    points,
    run,
    small_rows,
    spark,
    totals,
    user_totals,
)
from tests.s3_support import ACCESS_KEY, REGION, SECRET_KEY, AuthS3Server, S3Server
from tests.spark_support import stream

from snapcut import ConfigError, ObjectStoreError, SnapshotError, StorageError, snapshots
from snapcut.spark import (
    ArrowSnapshotSink,
    DeltaOutput,
    IcebergOutput,
    keyed_state,
    read_output,
    read_output_arrow,
    read_state_arrow,
)
from snapcut.spark.sink import iceberg as iceberg_module
from snapcut.spark.sink.root import read_sink_meta

__all__ = ["armed", "dwell", "points", "spark"]  # fixtures, imported for pytest

pytest.importorskip("pyiceberg")
from pyiceberg.catalog import load_catalog
from pyiceberg.table.snapshots import ancestors_of

TABLE = "ns.events"


def catalog_properties(where: Path) -> dict[str, str]:
    """A local SqlCatalog on SQLite, its warehouse beside it."""
    (where / "warehouse").mkdir(parents=True, exist_ok=True)
    return {
        "type": "sql",
        "uri": f"sqlite:///{where}/catalog.db",
        "warehouse": f"file://{where}/warehouse",
    }


def output(where: Path, identifier: str = TABLE) -> IcebergOutput:
    return IcebergOutput(catalog_properties(where), identifier)


def load(props: dict[str, str] | Path, identifier: str = TABLE) -> Any:
    if isinstance(props, Path):
        props = catalog_properties(props)
    return load_catalog("snapcut", **props).load_table(identifier)


def scan(table: Any, snapshot_id: int | None = None) -> pa.Table:
    return table.scan(snapshot_id=snapshot_id).to_arrow()


def summaries(table: Any) -> list[dict[str, Any]]:
    """The current snapshot's ancestry, oldest first: summary properties
    plus ``snapshot_id``."""
    chain = list(ancestors_of(table.current_snapshot(), table.metadata))
    return [
        {**s.summary.additional_properties, "snapshot_id": s.snapshot_id} for s in reversed(chain)
    ]


def one_snapshot_per_batch(table: Any, batches: int) -> list[int]:
    """Asserts one snapshot per batch, each carrying the batch and the one
    app id; returns the snapshot ids, batch order."""
    history = summaries(table)
    assert len(table.snapshots()) == batches
    assert [h["snapcut.batch"] for h in history] == [str(b) for b in range(batches)]
    assert len({h["snapcut.app_id"] for h in history}) == 1
    assert table.properties["snapcut.app_id"] == history[0]["snapcut.app_id"]
    return [int(h["snapshot_id"]) for h in history]


def arrow_output(spark: Any, df: Any, where: Path, mode: str, key: str | None = None) -> pa.Table:
    """The same stream through the Arrow IPC output: ``read_output_arrow``."""
    sink = ArrowSnapshotSink(str(where / "arrow"), output_mode=mode, key=key)
    run(df, sink, where / "arrow-chk", mode)
    return read_output_arrow(str(where / "arrow"))


# --- round trips ------------------------------------------------------------


def test_append_round_trip_one_snapshot_per_batch(
    spark: Any, dwell: tuple[Path, pd.DataFrame], tmp_path: Path
) -> None:
    directory, events = dwell
    root = tmp_path / "out"
    sink = ArrowSnapshotSink(str(root), output=output(tmp_path))
    run(stream(spark, directory).repartition(3), sink, tmp_path / "chk")
    table = load(tmp_path)
    assert event_rows(scan(table)) == event_rows(events)
    expected = arrow_output(spark, stream(spark, directory).repartition(3), tmp_path, "append")
    assert event_rows(scan(table)) == event_rows(expected)
    ids = one_snapshot_per_batch(table, FILES)
    assert [h.table_version for h in sink.history()] == ids
    assert [r.table_version for r in sink.reports] == ids
    # Snapshot b is the rows of batches 0..b: the manifest of b names it.
    for b in range(FILES):
        m = manifest(root, b)
        assert m["output"]["iceberg"]["snapshot_id"] == ids[b]
        assert m["output"]["iceberg"]["table"] == TABLE
        assert m["output"]["iceberg"]["replayed"] is False
        assert m["output"]["rows"] == len(frames()[b])
        assert not [f for f in m["files"] if f["role"] == "output"]
        assert event_rows(scan(table, ids[b])) == event_rows(pd.concat(frames()[: b + 1]))
    # Only the committed files are in the batch directories.
    referenced = {t.file.file_path.removeprefix("file://") for t in table.scan().plan_files()}
    on_disk = {str(p) for p in (tmp_path / "warehouse").rglob("snapcut-b*/*.parquet")}
    assert referenced == on_disk
    assert len(on_disk) >= FILES
    with pytest.raises(SnapshotError, match=r"writes its rows to the iceberg table ns\.events"):
        read_output_arrow(str(root))
    with pytest.raises(Exception, match="writes its rows to the iceberg table"):
        read_output(spark, str(root)).collect()


@pytest.mark.parametrize("mode", ["update", "complete"])
def test_aggregates_update_and_complete(
    spark: Any, dwell: tuple[Path, pd.DataFrame], mode: str, tmp_path: Path
) -> None:
    """update merges on the key (copy-on-write, one overwrite snapshot),
    complete replaces the table; both equal the Arrow output's reading."""
    directory, events = dwell
    root = tmp_path / "out"
    key = "user" if mode == "update" else None
    sink = ArrowSnapshotSink(str(root), output_mode=mode, key=key, output=output(tmp_path))
    run(user_totals(stream(spark, directory)), sink, tmp_path / "chk", mode)
    table = load(tmp_path)
    assert as_totals(scan(table)) == totals(events)
    expected = arrow_output(spark, user_totals(stream(spark, directory)), tmp_path, mode, key)
    assert as_totals(scan(table)) == as_totals(expected)
    ids = one_snapshot_per_batch(table, FILES)
    operations = [table.snapshot_by_id(i).summary.operation.value for i in ids]
    assert operations == ["append"] + ["overwrite"] * (FILES - 1)
    for b in range(FILES):
        assert as_totals(scan(table, ids[b])) == totals(pd.concat(frames()[: b + 1]))
        assert manifest(root, b)["output"]["iceberg"]["snapshot_id"] == ids[b]
    # Complete mode removes every older file from the current snapshot;
    # update mode keeps one row per key across its files.
    if mode == "complete":
        assert {t.file.file_path.split("/")[-2] for t in table.scan().plan_files()} == {
            f"snapcut-b{FILES - 1:08d}-{manifest(root, 0)['spark']['query_id'][:8]}"
        }


@pytest.mark.parametrize("mode", ["append", "update", "complete"])
def test_an_empty_batch_is_one_snapshot_too(spark: Any, mode: str, tmp_path: Path) -> None:
    key = "user" if mode == "update" else None
    sink = ArrowSnapshotSink(
        str(tmp_path / "out"), output_mode=mode, key=key, output=output(tmp_path)
    )
    rows, want, empty = small_rows(mode)
    df = spark.createDataFrame(rows[0])
    sink(df, 0)
    sink(df.limit(0), 1)
    sink(spark.createDataFrame(rows[1]), 2)
    table = load(tmp_path)
    ids = one_snapshot_per_batch(table, 3)
    got = sorted(scan(table).to_pylist(), key=lambda r: (r["user"], r["n"]))
    assert [(r["user"], r["n"]) for r in got] == want
    assert sorted((r["user"], r["n"]) for r in scan(table, ids[1]).to_pylist()) == empty


def test_an_update_of_many_keys_prunes_files_by_the_keys_range(spark: Any, tmp_path: Path) -> None:
    """Beyond IN_LITERALS distinct keys a batch's file filter is their range,
    not an In of every key: a file outside the range is not rewritten, every
    file inside it is merged (the newest row per key wins)."""
    many = iceberg_module.IN_LITERALS + 500
    sink = ArrowSnapshotSink(
        str(tmp_path / "out"), output_mode="update", key="user", output=output(tmp_path)
    )
    batches = [
        pd.DataFrame({"user": range(0, many), "n": 0}),  # one file of keys [0, many)
        pd.DataFrame({"user": range(10 * many, 10 * many + 5), "n": 1}),  # In: a second file
        pd.DataFrame({"user": range(many // 2, many // 2 + many), "n": 2}),  # range: the first
    ]
    want: dict[int, int] = {}
    for b, frame in enumerate(batches):
        sink(spark.createDataFrame(frame), b)
        want.update(zip(frame["user"], frame["n"], strict=True))
    table = load(tmp_path)
    one_snapshot_per_batch(table, len(batches))
    assert {r["user"]: r["n"] for r in scan(table).to_pylist()} == want
    assert len(scan(table)) == len(want)
    # Batch 2's snapshot replaced the first file only; batch 1's file stays.
    files = [t.file.file_path for t in table.scan().plan_files()]
    assert len(files) == 2 and sum("snapcut-b00000001" in f for f in files) == 1
    source = pa.table({"user": pa.array(range(many), pa.int64())})
    assert "GreaterThanOrEqual" in repr(iceberg_module._key_filter(source, ["user"]))
    assert repr(iceberg_module._key_filter(source.slice(0, 10), ["user"])).startswith("In(")


# --- exactly once -----------------------------------------------------------


def test_crashes_around_the_table_commit_then_restarts_commit_nothing_twice(
    spark: Any,
    dwell: tuple[Path, pd.DataFrame],
    armed: Callable[[str], None],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    directory, events = dwell
    root, chk = tmp_path / "out", tmp_path / "chk"
    data = tmp_path / "warehouse" / "ns" / "events" / "data"
    df = stream(spark, directory).repartition(3)
    # Run 1: batch 0's partition 0 fails once after staging (its file loses);
    # the driver fails after staging batch 1, before the table commit.
    armed("sink.after_stage:0:0:raise:0")
    fail_driver_at(monkeypatch, "sink.before_commit", 1)
    with pytest.raises(Exception, match=r"injected driver failure at sink\.before_commit"):
        run(df, ArrowSnapshotSink(str(root), output=output(tmp_path)), chk)
    armed("")
    assert len(load(tmp_path).snapshots()) == 1
    assert list(data.glob("snapcut-b00000001-*/*.parquet"))  # staged, not committed
    assert len(list(data.glob("snapcut-b00000000-*/*.parquet"))) == 3  # losers removed
    # Run 2: batch 1 re-runs; the driver fails after batch 2's catalog
    # commit, before snapcut's manifest.
    monkeypatch.undo()
    fail_driver_at(monkeypatch, "sink.after_table_commit", 2)
    with pytest.raises(Exception, match=r"injected driver failure at sink\.after_table_commit"):
        run(df, ArrowSnapshotSink(str(root), output=output(tmp_path)), chk)
    assert len(load(tmp_path).snapshots()) == 3
    assert snapshots.open(str(root)).list() == [0, 1]
    # Run 3: Spark re-runs batch 2; the sink finds its snapshot in the
    # ancestry and only writes the manifest.
    monkeypatch.undo()
    sink = ArrowSnapshotSink(str(root), output=output(tmp_path))
    run(df, sink, chk)
    table = load(tmp_path)
    ids = one_snapshot_per_batch(table, FILES)
    assert [(r.batch_id, r.committed, r.table_version) for r in sink.reports] == [(2, True, ids[2])]
    assert sink.reports[0].rows == len(frames()[2])
    assert event_rows(scan(table)) == event_rows(events)
    record = manifest(root, 2)["output"]["iceberg"]
    assert record["snapshot_id"] == ids[2]
    assert record["replayed"] is True
    assert record["app_id"] == manifest(root, 0)["output"]["iceberg"]["app_id"]
    assert snapshots.open(str(root)).list() == list(range(FILES))
    # A re-delivered batch is skipped by the manifest: still one each.
    run(df, ArrowSnapshotSink(str(root), output=output(tmp_path)), chk)
    one_snapshot_per_batch(load(tmp_path), FILES)


def test_state_and_the_table_snapshot_are_one_cut(
    spark: Any, dwell: tuple[Path, pd.DataFrame], tmp_path: Path
) -> None:
    directory, events = dwell
    root, state_root = tmp_path / "out", tmp_path / "state"
    ks = keyed_state(stream(spark, directory), "user", str(state_root), 3, full_every=2)
    averages = ks.aggregate(count="count", total=("sum", "dwell_ms"))
    sink = ArrowSnapshotSink(
        str(root), output_mode="update", key="user", state=ks, output=output(tmp_path)
    )
    run(averages, sink, tmp_path / "chk", "update")
    table = load(tmp_path)
    assert as_totals(scan(table), "count") == totals(events)
    one_snapshot_per_batch(table, FILES)
    for b in range(FILES):
        m = manifest(root, b)
        assert m["state"]["batch"] == b
        at = scan(table, m["output"]["iceberg"]["snapshot_id"])
        # The snapshot the manifest names and the state of the same batch
        # hold the same counts per key.
        state = read_state_arrow(str(state_root), batch=b).to_pylist()
        counts = {u: n for u, (n, _) in as_totals(at, "count").items()}
        assert counts == {r["user"]: r["count"] for r in state}
        assert counts == {u: n for u, (n, _) in totals(pd.concat(frames()[: b + 1])).items()}


# --- bad input --------------------------------------------------------------


def test_a_table_of_another_query_is_refused(
    spark: Any, dwell: tuple[Path, pd.DataFrame], tmp_path: Path
) -> None:
    directory, _ = dwell
    run(
        stream(spark, directory),
        ArrowSnapshotSink(str(tmp_path / "a"), output=output(tmp_path)),
        tmp_path / "chk-a",
    )
    before = summaries(load(tmp_path))
    with pytest.raises(Exception, match="written by another streaming query's sink"):
        run(
            stream(spark, directory),
            ArrowSnapshotSink(str(tmp_path / "b"), output=output(tmp_path)),
            tmp_path / "chk-b",
        )
    plain = spark.createDataFrame(frames()[0])
    with pytest.raises(ConfigError, match=r"another streaming query's sink .*new table"):
        ArrowSnapshotSink(str(tmp_path / "c"), output=output(tmp_path))(plain, 0)
    assert summaries(load(tmp_path)) == before
    assert not list((tmp_path / "b").glob("chk-*"))


def test_an_incompatible_schema_is_refused(spark: Any, tmp_path: Path) -> None:
    catalog = load_catalog("snapcut", **catalog_properties(tmp_path))
    catalog.create_namespace("ns")
    made = catalog.create_table(TABLE, pa.schema([("user", pa.int64()), ("n", pa.string())]))
    made.append(pa.table({"user": pa.array([1], pa.int64()), "n": ["x"]}))
    sink = ArrowSnapshotSink(str(tmp_path / "out"), output=output(tmp_path))
    df = spark.createDataFrame(pd.DataFrame({"user": [1, 2], "n": [3, 4]}))
    with pytest.raises(ConfigError, match=r"does not have the output's schema: changed n"):
        sink(df, 0)
    assert len(load(tmp_path).snapshots()) == 1
    assert not list((tmp_path / "out").glob("chk-*"))
    # The table's own schema is taken: the batch commits.
    ok = spark.createDataFrame(pd.DataFrame({"user": [2], "n": ["y"]}))
    ArrowSnapshotSink(str(tmp_path / "out2"), output=output(tmp_path))(ok, 0)
    assert sorted(scan(load(tmp_path)).to_pylist(), key=lambda r: r["user"]) == [
        {"user": 1, "n": "x"},
        {"user": 2, "n": "y"},
    ]


@pytest.mark.parametrize("mode", ["append", "update"])
def test_a_new_column_is_added_only_with_schema_mode_merge(
    spark: Any, mode: str, tmp_path: Path
) -> None:
    """A restarted query's batch with a new column: refused naming it and
    schema_mode='merge'; with the opt-in, added (optional) in the batch's
    one snapshot, older rows null (update: the merged old files too);
    anything but added columns stays refused."""
    root = tmp_path / "out"
    key = "user" if mode == "update" else None
    first = pd.DataFrame({"user": [1, 2], "n": [3, 4]})
    second = pd.DataFrame({"user": [1, 3], "n": [5, 6], "note": ["a", "b"]})
    want = {
        "append": {(1, 3, None), (2, 4, None), (1, 5, "a"), (3, 6, "b")},
        "update": {(1, 5, "a"), (2, 4, None), (3, 6, "b")},
    }[mode]

    def sink(**kw: Any) -> ArrowSnapshotSink:
        out = IcebergOutput(catalog_properties(tmp_path), TABLE, **kw)
        return ArrowSnapshotSink(str(root), output_mode=mode, key=key, output=out)

    sink()(spark.createDataFrame(first), 0)
    df = spark.createDataFrame(second)
    with pytest.raises(
        ConfigError, match=r"added \['note'\]\. .*IcebergOutput\(\.\.\., schema_mode"
    ):
        sink()(df, 1)
    assert len(load(tmp_path).snapshots()) == 1
    merging = sink(schema_mode="merge")
    merging(df, 1)
    table = load(tmp_path)
    got = {(r["user"], r["n"], r["note"]) for r in scan(table).to_pylist()}
    assert got == want
    ids = one_snapshot_per_batch(table, 2)
    assert table.schema().find_field("note").optional
    assert [s.schema_id for s in table.snapshots()] == [0, 1]
    assert manifest(root, 1)["output"]["iceberg"]["snapshot_id"] == ids[1]
    meta = read_sink_meta(str(root))
    assert meta["columns_added"] == [{"batch": 1, "columns": ["note"]}]
    merging(spark.createDataFrame(second.assign(n=[7, 8])), 2)
    one_snapshot_per_batch(load(tmp_path), 3)
    for bad, change in (
        (second.assign(n=["x", "y"]), r"changed n int64 -> string"),
        (second.drop(columns="note"), r"removed \['note'\]"),
    ):
        with pytest.raises(ConfigError, match=change):
            merging(spark.createDataFrame(bad), 3)
    assert len(load(tmp_path).snapshots()) == 3


def test_a_table_without_the_output_s_column_names_the_option(spark: Any, tmp_path: Path) -> None:
    catalog = load_catalog("snapcut", **catalog_properties(tmp_path))
    catalog.create_namespace("ns")
    made = catalog.create_table(TABLE, pa.schema([("user", pa.int64()), ("n", pa.int64())]))
    made.append(pa.table({"user": pa.array([1], pa.int64()), "n": pa.array([2], pa.int64())}))
    df = spark.createDataFrame(pd.DataFrame({"user": [3], "n": [4], "note": ["c"]}))
    sink = ArrowSnapshotSink(str(tmp_path / "out"), output=output(tmp_path))
    with pytest.raises(
        ConfigError,
        match=r"output's column\(s\) \['note'\]: pass IcebergOutput\(\.\.\., schema_mode",
    ):
        sink(df, 0)
    assert len(load(tmp_path).snapshots()) == 1
    with pytest.raises(ConfigError, match=r"schema_mode=\) must be None"):
        IcebergOutput(catalog_properties(tmp_path), TABLE, schema_mode="union")
    merging = IcebergOutput(catalog_properties(tmp_path), TABLE, schema_mode="merge")
    ArrowSnapshotSink(str(tmp_path / "out2"), output=merging)(df, 0)
    got = {(r["user"], r["n"], r["note"]) for r in scan(load(tmp_path)).to_pylist()}
    assert got == {(1, 2, None), (3, 4, "c")}


def test_not_a_table_and_an_unreachable_catalog_are_refused(spark: Any, tmp_path: Path) -> None:
    df = spark.createDataFrame(pd.DataFrame({"user": [1, 2], "n": [3, 4]}))
    catalog = load_catalog("snapcut", **catalog_properties(tmp_path))
    catalog.create_namespace(("ns", "sub"))
    sink = ArrowSnapshotSink(str(tmp_path / "out"), output=output(tmp_path, "ns.sub"))
    with pytest.raises(ConfigError, match=r"ns\.sub is not an Iceberg table: .* a namespace"):
        sink(df, 0)
    assert catalog.list_tables("ns") == []
    with pytest.raises(ConfigError, match=r"identifier must be 'namespace\.table'"):
        IcebergOutput(catalog_properties(tmp_path), "events")
    with pytest.raises(ConfigError, match="needs catalog_properties"):
        IcebergOutput({}, TABLE)
    gone = {"type": "sql", "uri": f"sqlite:///{tmp_path}/no/such/dir/catalog.db"}
    sink = ArrowSnapshotSink(str(tmp_path / "out2"), output=IcebergOutput(gone, TABLE))
    with pytest.raises(StorageError, match=r"catalog .* cannot be reached"):
        sink(df, 0)
    unknown = IcebergOutput({"type": "no-such-catalog"}, TABLE)
    with pytest.raises(ConfigError, match="catalog cannot be loaded"):
        ArrowSnapshotSink(str(tmp_path / "out3"), output=unknown)(df, 0)
    for out in ("out", "out2", "out3"):
        assert not list((tmp_path / out).glob("chk-*"))


def test_no_pyiceberg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "pyiceberg.catalog", None)
    with pytest.raises(ConfigError, match=r"pip install 'snapcut\[iceberg\]'"):
        IcebergOutput(catalog_properties(tmp_path), TABLE)
    assert iceberg_module.INSTALL == "pip install 'snapcut[iceberg]'"


def test_a_root_written_with_a_table_refuses_another_output(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "out"
    df = spark.createDataFrame(pd.DataFrame({"user": [1, 2], "n": [3, 4]}))
    ArrowSnapshotSink(str(root), output=output(tmp_path))(df, 0)
    with pytest.raises(ConfigError, match="was created with output="):
        ArrowSnapshotSink(str(root))(df, 1)
    with pytest.raises(ConfigError, match="was created with output="):
        ArrowSnapshotSink(str(root), output=output(tmp_path, "ns.other"))(df, 1)
    with pytest.raises(ConfigError, match="was created with output="):
        ArrowSnapshotSink(str(root), output=DeltaOutput(str(tmp_path / "delta")))(df, 1)
    assert snapshots.open(str(root)).list() == [0]
    assert not (tmp_path / "delta").exists()
    plain_root = tmp_path / "plain"
    ArrowSnapshotSink(str(plain_root))(df, 0)
    with pytest.raises(ConfigError, match="was created with output=None"):
        ArrowSnapshotSink(str(plain_root), output=output(tmp_path, "ns.third"))(df, 1)
    catalog = load_catalog("snapcut", **catalog_properties(tmp_path))
    assert [t[-1] for t in catalog.list_tables("ns")] == ["events"]


# --- S3 ---------------------------------------------------------------------


def test_append_on_s3(
    spark: Any, dwell: tuple[Path, pd.DataFrame], s3: S3Server, tmp_path: Path
) -> None:
    directory, events = dwell
    bucket = s3.bucket()
    props = {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path}/catalog.db",
        "warehouse": f"s3://{bucket}/warehouse",
        "s3.endpoint": f"http://{s3.endpoint}",
        "s3.access-key-id": ACCESS_KEY,
        "s3.secret-access-key": SECRET_KEY,
        "s3.region": REGION,
    }
    root = tmp_path / "out"
    sink = ArrowSnapshotSink(str(root), output=IcebergOutput(props, TABLE))
    run(stream(spark, directory), sink, tmp_path / "chk")
    table = load(props)
    assert table.location().startswith(f"s3://{bucket}/warehouse/")
    assert event_rows(scan(table)) == event_rows(events)
    ids = one_snapshot_per_batch(table, FILES)
    assert [manifest(root, b)["output"]["iceberg"]["snapshot_id"] for b in range(FILES)] == ids
    data = s3.filesystem().get_file_info(pafs.FileSelector(f"{bucket}/warehouse", recursive=True))
    assert any("/data/snapcut-b00000000-" in i.path for i in data)


def test_missing_and_refused_credentials_are_refused_before_anything_is_written(
    spark: Any, s3_auth: AuthS3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """On a store that checks credentials: no credentials, a key the store
    does not know in the catalog properties or in the executors'
    filesystem, each an ObjectStoreError naming the table, the client, the
    key and the property to set, raised before the batch's Spark job and
    the catalog commit; then the right key commits (so the refusals were
    the credentials')."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    props = {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path}/catalog.db",
        "warehouse": f"s3://{s3_auth.bucket}/warehouse",
        "s3.endpoint": f"http://{s3_auth.endpoint}",
        "s3.region": REGION,
    }
    right = {"s3.access-key-id": s3_auth.access_key, "s3.secret-access-key": s3_auth.secret_key}
    wrong = {"s3.access-key-id": "AKIASNAPCUTWRONGKEY", "s3.secret-access-key": "nope"}
    cases = [
        ({}, None, r"FileIO \(catalog properties\) has no S3 credentials .*'s3.access-key-id'"),
        (wrong, None, r"refused the credentials AKIASNAPCUTWRONGKEY of pyiceberg's FileIO"),
        (
            right,
            s3_auth.filesystem("AKIASNAPCUTWRONGFS", "nope"),
            r"refused the credentials AKIASNAPCUTWRONGFS of the executors' .*filesystem=",
        ),
    ]
    df = spark.createDataFrame(pd.DataFrame({"user": [1, 2], "n": [3, 4]}))
    root = tmp_path / "out"
    for keys, fs, message in cases:
        output = IcebergOutput({**props, **keys}, TABLE, filesystem=fs)
        with pytest.raises(ObjectStoreError, match=message) as refused:
            ArrowSnapshotSink(str(root), output=output)(df, 0)
        assert f"output table {TABLE}" in str(refused.value)
        assert "nope" not in str(refused.value)  # a secret is never shown
        assert s3_auth.keys("warehouse") == []
        assert load_catalog("snapcut", **props).list_tables("ns") == []
        assert not list(root.glob("chk-*"))
    sink = ArrowSnapshotSink(str(root), output=IcebergOutput({**props, **right}, TABLE))
    sink(df, 0)
    got = scan(load({**props, **right})).to_pylist()
    assert sorted((r["user"], r["n"]) for r in got) == [(1, 3), (2, 4)]
