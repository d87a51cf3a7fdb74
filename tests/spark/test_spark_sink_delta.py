"""``ArrowSnapshotSink(output=DeltaOutput(...))``: append, update and complete
round trips read back with delta-rs (and polars) against pandas; exactly one
Delta commit per batch carrying the app transaction; crashes before the
table commit and between the table commit and snapcut's manifest, then a
restart, commit nothing twice; with ``state=`` the manifest names the table
version of the batch whose state it names; bad inputs (a table of another
query, a path that is not a Delta table, an incompatible schema, no
deltalake) fail typed and commit nothing; one append round trip on S3."""

from __future__ import annotations

import json
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
from tests.s3_support import ACCESS_KEY, REGION, SECRET_KEY, AuthS3Server, S3Server, closed_port
from tests.spark_support import stream

from snapcut import ConfigError, ObjectStoreError, SnapshotError, snapshots
from snapcut.spark import (
    ArrowSnapshotSink,
    DeltaOutput,
    keyed_state,
    read_output,
    read_output_arrow,
    read_state_arrow,
)
from snapcut.spark.sink import delta as delta_module
from snapcut.spark.sink.root import read_sink_meta

__all__ = ["armed", "dwell", "points", "spark"]  # fixtures, imported for pytest

deltalake = pytest.importorskip("deltalake")


def table_at(
    path: Path | str,
    version: int | None = None,
    storage_options: dict[str, str] | None = None,
    filesystem: Any = None,
) -> pa.Table:
    return DeltaOutput(str(path), storage_options, filesystem).read(version)


def commits(path: Path | str, **kw: Any) -> list[dict[str, Any]]:
    """The table's commit infos, oldest first."""
    return list(reversed(deltalake.DeltaTable(str(path), **kw).history()))


def log_commits(fs: Any, path: str) -> list[dict[str, Any]]:
    """The commit infos read from the log's JSON files (on moto's S3, where
    DeltaTable.history()'s list request times out), oldest first."""
    infos = []
    for info in sorted(fs.get_file_info(pafs.FileSelector(f"{path}/_delta_log")), key=str):
        if info.base_name.endswith(".json"):
            with fs.open_input_stream(info.path) as f:
                lines = [json.loads(x) for x in f.read().decode().splitlines() if x.strip()]
            commit = next(a["commitInfo"] for a in lines if "commitInfo" in a)
            infos.append({**commit, "version": int(info.base_name.split(".")[0])})
    return sorted(infos, key=lambda c: c["version"])


def one_commit_per_batch(
    path: Path | str, batches: int, history: list[dict[str, Any]] | None = None, **kw: Any
) -> None:
    history = commits(path, **kw) if history is None else history
    assert [h["snapcut.batch"] for h in history] == list(range(batches))
    assert [h["version"] for h in history] == list(range(batches))
    app_ids = {h["snapcut.app_id"] for h in history}
    assert len(app_ids) == 1
    dt = deltalake.DeltaTable(str(path), **kw)
    assert dt.transaction_version(app_ids.pop()) == batches - 1


# --- round trips ------------------------------------------------------------


def test_append_round_trip_one_commit_per_batch(
    spark: Any, dwell: tuple[Path, pd.DataFrame], tmp_path: Path
) -> None:
    directory, events = dwell
    root, table = tmp_path / "out", tmp_path / "table"
    sink = ArrowSnapshotSink(str(root), output=DeltaOutput(str(table)))
    run(stream(spark, directory).repartition(3), sink, tmp_path / "chk")
    assert event_rows(table_at(table)) == event_rows(events)
    one_commit_per_batch(table, FILES)
    assert [h.table_version for h in sink.history()] == list(range(FILES))
    assert [r.table_version for r in sink.reports] == list(range(FILES))
    # Version b is the rows of batches 0..b: the manifest of b names it.
    for b in range(FILES):
        m = manifest(root, b)
        assert m["output"]["delta"]["version"] == b
        assert m["output"]["delta"]["replayed"] is False
        assert m["output"]["rows"] == len(frames()[b])
        assert not [f for f in m["files"] if f["role"] == "output"]
        want = event_rows(pd.concat(frames()[: b + 1]))
        assert event_rows(table_at(table, b)) == want
    # Only the committed files are in the batch directories.
    added = set(deltalake.DeltaTable(str(table)).file_uris())
    on_disk = {str(p) for p in table.glob("snapcut-b*/*.parquet")}
    assert {Path(u.removeprefix("file://")).as_posix() for u in added} == on_disk
    assert all("snapcut-b0000000" in p for p in on_disk)
    import polars as pl

    frame = pl.read_delta(str(table))
    assert event_rows(frame.to_arrow()) == event_rows(events)
    with pytest.raises(SnapshotError, match="writes its rows to the delta table"):
        read_output_arrow(str(root))
    with pytest.raises(Exception, match="writes its rows to the delta table"):
        read_output(spark, str(root)).collect()


def test_update_merges_on_the_key(
    spark: Any, dwell: tuple[Path, pd.DataFrame], tmp_path: Path
) -> None:
    directory, events = dwell
    root, table = tmp_path / "out", tmp_path / "table"
    agg = user_totals(stream(spark, directory))
    sink = ArrowSnapshotSink(
        str(root), output_mode="update", key="user", output=DeltaOutput(str(table))
    )
    run(agg, sink, tmp_path / "chk", "update")
    assert as_totals(table_at(table)) == totals(events)
    one_commit_per_batch(table, FILES)
    assert [h["operation"] for h in commits(table)][1:] == ["MERGE"] * (FILES - 1)
    for b in range(FILES):
        assert as_totals(table_at(table, b)) == totals(pd.concat(frames()[: b + 1]))
        assert manifest(root, b)["output"]["delta"]["version"] == b


def test_complete_replaces_the_table(
    spark: Any, dwell: tuple[Path, pd.DataFrame], tmp_path: Path
) -> None:
    directory, events = dwell
    root, table = tmp_path / "out", tmp_path / "table"
    agg = user_totals(stream(spark, directory))
    sink = ArrowSnapshotSink(str(root), output_mode="complete", output=DeltaOutput(str(table)))
    run(agg, sink, tmp_path / "chk", "complete")
    assert as_totals(table_at(table)) == totals(events)
    one_commit_per_batch(table, FILES)
    for b in range(FILES):
        assert as_totals(table_at(table, b)) == totals(pd.concat(frames()[: b + 1]))


@pytest.mark.parametrize("mode", ["append", "update", "complete"])
def test_an_empty_batch_is_one_commit_too(spark: Any, mode: str, tmp_path: Path) -> None:
    """Spark runs batches without rows (no-data batches that move a
    watermark): each is still one commit with its app transaction."""
    table = tmp_path / "table"
    key = "user" if mode == "update" else None
    sink = ArrowSnapshotSink(
        str(tmp_path / "out"), output_mode=mode, key=key, output=DeltaOutput(str(table))
    )
    rows, want, empty = small_rows(mode)
    df = spark.createDataFrame(rows[0])
    sink(df, 0)
    sink(df.limit(0), 1)
    sink(spark.createDataFrame(rows[1]), 2)
    one_commit_per_batch(table, 3)
    got = sorted(table_at(table).to_pylist(), key=lambda r: (r["user"], r["n"]))
    assert [(r["user"], r["n"]) for r in got] == want
    assert sorted((r["user"], r["n"]) for r in table_at(table, 1).to_pylist()) == empty


# --- exactly once -----------------------------------------------------------


def test_crashes_around_the_table_commit_then_restarts_commit_nothing_twice(
    spark: Any,
    dwell: tuple[Path, pd.DataFrame],
    armed: Callable[[str], None],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    directory, events = dwell
    root, table, chk = tmp_path / "out", tmp_path / "table", tmp_path / "chk"
    df = stream(spark, directory).repartition(3)
    # Run 1: batch 0's partition 0 fails once after staging (its file loses);
    # the driver fails after staging batch 1, before the table commit.
    armed("sink.after_stage:0:0:raise:0")
    fail_driver_at(monkeypatch, "sink.before_commit", 1)
    with pytest.raises(Exception, match=r"injected driver failure at sink\.before_commit"):
        run(df, ArrowSnapshotSink(str(root), output=DeltaOutput(str(table))), chk)
    armed("")
    assert len(commits(table)) == 1
    assert list(table.glob("snapcut-b00000001-*/*.parquet"))  # staged, not committed
    assert len(list(table.glob("snapcut-b00000000-*/*.parquet"))) == 3  # losers removed
    # Run 2: batch 1 re-runs; the driver fails after batch 2's table commit,
    # before snapcut's manifest.
    monkeypatch.undo()
    fail_driver_at(monkeypatch, "sink.after_table_commit", 2)
    with pytest.raises(Exception, match=r"injected driver failure at sink\.after_table_commit"):
        run(df, ArrowSnapshotSink(str(root), output=DeltaOutput(str(table))), chk)
    assert len(commits(table)) == 3
    assert snapshots.open(str(root)).list() == [0, 1]
    # Run 3: Spark re-runs batch 2; the sink finds it in the table and only
    # writes the manifest.
    monkeypatch.undo()
    sink = ArrowSnapshotSink(str(root), output=DeltaOutput(str(table)))
    run(df, sink, chk)
    assert [(r.batch_id, r.committed, r.table_version) for r in sink.reports] == [(2, True, 2)]
    assert sink.reports[0].rows == len(frames()[2])
    one_commit_per_batch(table, FILES)
    assert event_rows(table_at(table)) == event_rows(events)
    assert manifest(root, 2)["output"]["delta"] == {
        "table": str(table),
        "version": 2,
        "app_id": manifest(root, 0)["output"]["delta"]["app_id"],
        "replayed": True,
    }
    assert snapshots.open(str(root)).list() == list(range(FILES))
    # A re-delivered batch is skipped by the manifest: still one commit each.
    again = ArrowSnapshotSink(str(root), output=DeltaOutput(str(table)))
    run(df, again, chk)
    one_commit_per_batch(table, FILES)


def test_state_and_the_table_version_are_one_cut(
    spark: Any, dwell: tuple[Path, pd.DataFrame], tmp_path: Path
) -> None:
    directory, events = dwell
    root, table, state_root = tmp_path / "out", tmp_path / "table", tmp_path / "state"
    ks = keyed_state(stream(spark, directory), "user", str(state_root), 3, full_every=2)
    averages = ks.aggregate(count="count", total=("sum", "dwell_ms"))
    sink = ArrowSnapshotSink(
        str(root), output_mode="update", key="user", state=ks, output=DeltaOutput(str(table))
    )
    run(averages, sink, tmp_path / "chk", "update")
    assert as_totals(table_at(table), "count") == totals(events)
    one_commit_per_batch(table, FILES)
    for b in range(FILES):
        m = manifest(root, b)
        assert m["state"]["batch"] == b
        version = m["output"]["delta"]["version"]
        # The table version the manifest names and the state of the same
        # batch hold the same counts per key.
        state = read_state_arrow(str(state_root), batch=b).to_pylist()
        counts = {u: n for u, (n, _) in as_totals(table_at(table, version), "count").items()}
        assert counts == {r["user"]: r["count"] for r in state}
        assert counts == {u: n for u, (n, _) in totals(pd.concat(frames()[: b + 1])).items()}


# --- bad input --------------------------------------------------------------


def test_a_table_of_another_query_is_refused(
    spark: Any, dwell: tuple[Path, pd.DataFrame], tmp_path: Path
) -> None:
    directory, _ = dwell
    table = tmp_path / "table"
    run(
        stream(spark, directory),
        ArrowSnapshotSink(str(tmp_path / "a"), output=DeltaOutput(str(table))),
        tmp_path / "chk-a",
    )
    before = commits(table)
    with pytest.raises(Exception, match="written by another streaming query's sink"):
        run(
            stream(spark, directory),
            ArrowSnapshotSink(str(tmp_path / "b"), output=DeltaOutput(str(table))),
            tmp_path / "chk-b",
        )
    plain = spark.createDataFrame(frames()[0])
    with pytest.raises(ConfigError, match=r"another streaming query's sink .*new table"):
        ArrowSnapshotSink(str(tmp_path / "c"), output=DeltaOutput(str(table)))(plain, 0)
    assert commits(table) == before
    assert not list((tmp_path / "b").glob("chk-*"))


def test_a_crash_before_the_first_commit_restarts_on_its_own_files(
    spark: Any,
    dwell: tuple[Path, pd.DataFrame],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """The driver dies after batch 0's executors wrote their Parquet files into
    the table's path, before the first Delta commit (no _delta_log yet): the
    restart takes those files for its own batch's, not for a foreign path."""
    directory, events = dwell
    root, table, chk = tmp_path / "out", tmp_path / "table", tmp_path / "chk"
    df = stream(spark, directory)
    fail_driver_at(monkeypatch, "sink.before_commit", 0)
    with pytest.raises(Exception, match=r"injected driver failure at sink\.before_commit"):
        run(df, ArrowSnapshotSink(str(root), output=DeltaOutput(str(table))), chk)
    assert list(table.glob("snapcut-b00000000-*/*.parquet"))
    assert not list(table.glob("_delta_log/*.json"))
    monkeypatch.undo()
    run(df, ArrowSnapshotSink(str(root), output=DeltaOutput(str(table))), chk)
    one_commit_per_batch(table, FILES)
    assert event_rows(table_at(table)) == event_rows(events)


def test_a_path_that_is_not_a_delta_table_is_refused(spark: Any, tmp_path: Path) -> None:
    table = tmp_path / "not-delta"
    table.mkdir()
    (table / "data.csv").write_text("a,b\n1,2\n")
    sink = ArrowSnapshotSink(str(tmp_path / "out"), output=DeltaOutput(str(table)))
    with pytest.raises(ConfigError, match=r"is not a Delta table: .*data.csv.*no _delta_log"):
        sink(spark.createDataFrame(frames()[0]), 0)
    assert sorted(p.name for p in table.iterdir()) == ["data.csv"]
    assert not list((tmp_path / "out").glob("chk-*"))


def test_an_incompatible_schema_is_refused(spark: Any, tmp_path: Path) -> None:
    table = tmp_path / "table"
    deltalake.write_deltalake(str(table), pa.table({"user": [1], "n": ["x"]}))
    sink = ArrowSnapshotSink(str(tmp_path / "out"), output=DeltaOutput(str(table)))
    df = spark.createDataFrame(pd.DataFrame({"user": [1, 2], "n": [3, 4]}))
    with pytest.raises(ConfigError, match=r"does not have the output's schema: changed n"):
        sink(df, 0)
    assert len(commits(table)) == 1
    assert not list((tmp_path / "out").glob("chk-*"))
    # The table's own schema is taken: the batch commits.
    ok = spark.createDataFrame(pd.DataFrame({"user": [2], "n": ["y"]}))
    ArrowSnapshotSink(str(tmp_path / "out2"), output=DeltaOutput(str(table)))(ok, 0)
    assert sorted(table_at(table).to_pylist(), key=lambda r: r["user"]) == [
        {"user": 1, "n": "x"},
        {"user": 2, "n": "y"},
    ]


def test_bad_options_and_no_deltalake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="output= must be a DeltaOutput"):
        ArrowSnapshotSink(str(tmp_path / "a"), output=str(tmp_path / "t"))  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, "deltalake", None)
    with pytest.raises(ConfigError, match=r"pip install 'snapcut\[delta\]'"):
        DeltaOutput(str(tmp_path / "t"))
    assert delta_module.INSTALL in "pip install 'snapcut[delta]'"


def test_a_root_written_with_a_table_refuses_another_output(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "out"
    df = spark.createDataFrame(pd.DataFrame({"user": [1, 2], "n": [3, 4]}))
    ArrowSnapshotSink(str(root), output=DeltaOutput(str(tmp_path / "t")))(df, 0)
    with pytest.raises(ConfigError, match="was created with output="):
        ArrowSnapshotSink(str(root))(df, 1)
    with pytest.raises(ConfigError, match="was created with output="):
        ArrowSnapshotSink(str(root), output=DeltaOutput(str(tmp_path / "t2")))(df, 1)
    assert snapshots.open(str(root)).list() == [0]
    plain_root = tmp_path / "plain"
    ArrowSnapshotSink(str(plain_root))(df, 0)
    with pytest.raises(ConfigError, match="was created with output=None"):
        ArrowSnapshotSink(str(plain_root), output=DeltaOutput(str(tmp_path / "t3")))(df, 1)
    assert not (tmp_path / "t3").exists()


def evolving_rows(mode: str) -> tuple[pd.DataFrame, pd.DataFrame, set[tuple[Any, ...]]]:
    """Batch 0's rows, a restarted query's batch 1 with a new column
    ``note``, and the table's (user, n, note) rows after both, per mode."""
    first = pd.DataFrame({"user": [1, 2], "n": [3, 4]})
    second = pd.DataFrame({"user": [1, 3], "n": [5, 6], "note": ["a", "b"]})
    want = {
        "append": {(1, 3, None), (2, 4, None), (1, 5, "a"), (3, 6, "b")},
        "update": {(1, 5, "a"), (2, 4, None), (3, 6, "b")},
        "complete": {(1, 5, "a"), (3, 6, "b")},
    }[mode]
    return first, second, want


@pytest.mark.parametrize("mode", ["append", "update", "complete"])
def test_a_new_column_is_added_only_with_schema_mode_merge(
    spark: Any, mode: str, tmp_path: Path
) -> None:
    root, table = tmp_path / "out", tmp_path / "table"
    key = "user" if mode == "update" else None
    first, second, want = evolving_rows(mode)

    def sink(**kw: Any) -> ArrowSnapshotSink:
        return ArrowSnapshotSink(
            str(root), output_mode=mode, key=key, output=DeltaOutput(str(table), **kw)
        )

    sink()(spark.createDataFrame(first), 0)
    df = spark.createDataFrame(second)
    with pytest.raises(ConfigError, match=r"added \['note'\]\. .*schema_mode='merge'"):
        sink()(df, 1)
    assert len(commits(table)) == 1
    assert snapshots.open(str(root)).list() == [0]
    merging = sink(schema_mode="merge")
    merging(df, 1)
    got = {(r["user"], r["n"], r["note"]) for r in table_at(table).to_pylist()}
    assert got == want
    assert table_at(table, 0).column_names == ["user", "n"]
    # The batch that adds the column is one commit, the schema's change in it.
    history = commits(table)
    assert [h.get("snapcut.batch") for h in history] == [0, 1]
    assert manifest(root, 1)["output"]["delta"]["version"] == 1
    assert table_at(table, 1).column_names == ["user", "n", "note"]
    if mode == "append":
        # The executors' files of the rewritten batch are gone: the table's
        # files are those its commits name.
        named = {p for p in deltalake.DeltaTable(str(table)).file_uris()}
        on_disk = {str(p) for p in table.rglob("*.parquet")}
        assert {Path(p.removeprefix("file://")).resolve() for p in named} == {
            Path(p).resolve() for p in on_disk
        }
    meta = read_sink_meta(str(root))
    assert meta["arrow_schema"].names == ["user", "n", "note"]
    assert meta["columns_added"] == [{"batch": 1, "columns": ["note"]}]
    # The evolved schema is the root's now: the next batch is one commit.
    merging(spark.createDataFrame(second.assign(n=[7, 8])), 2)
    assert [h.get("snapcut.batch") for h in commits(table)] == [0, 1, 2]
    # Anything but added columns stays refused, opt-in or not.
    for bad, change in (
        (second.assign(n=["x", "y"]), r"changed n int64 -> string"),
        (second.drop(columns="note"), r"removed \['note'\]"),
    ):
        with pytest.raises(ConfigError, match=change):
            merging(spark.createDataFrame(bad), 3)
    assert len(commits(table)) == 3


def test_an_empty_update_batch_that_adds_a_column_is_one_commit(spark: Any, tmp_path: Path) -> None:
    """An update batch with no rows but a new column (MERGE of no rows makes
    no commit in delta-rs): one commit that widens the schema, rows kept."""
    root, table = tmp_path / "out", tmp_path / "table"
    sink = ArrowSnapshotSink(
        str(root),
        output_mode="update",
        key="user",
        output=DeltaOutput(str(table), schema_mode="merge"),
    )
    sink(spark.createDataFrame(pd.DataFrame({"user": [1, 2], "n": [3, 4]})), 0)
    empty = spark.createDataFrame([], "user long, n long, note string")
    sink(empty, 1)
    assert [h.get("snapcut.batch") for h in commits(table)] == [0, 1]
    after = table_at(table)
    assert after.column_names == ["user", "n", "note"]
    rows = {(r["user"], r["n"], r["note"]) for r in after.to_pylist()}
    assert rows == {(1, 3, None), (2, 4, None)}
    assert manifest(root, 1)["output"]["delta"]["version"] == 1
    assert read_sink_meta(str(root))["columns_added"] == [{"batch": 1, "columns": ["note"]}]


def test_a_table_without_the_output_s_column_names_the_option(spark: Any, tmp_path: Path) -> None:
    """A new root on an existing table that lacks a column of the output:
    the table's check names the column and the option; then it is added."""
    table = tmp_path / "table"
    deltalake.write_deltalake(str(table), pa.table({"user": [1], "n": [2]}))
    df = spark.createDataFrame(pd.DataFrame({"user": [3], "n": [4], "note": ["c"]}))
    sink = ArrowSnapshotSink(str(tmp_path / "out"), output=DeltaOutput(str(table)))
    with pytest.raises(
        ConfigError, match=r"does not have the output's column\(s\) \['note'\]: pass DeltaOutput"
    ):
        sink(df, 0)
    assert len(commits(table)) == 1
    with pytest.raises(ConfigError, match=r"schema_mode=\) must be None .* or 'merge'"):
        DeltaOutput(str(table), schema_mode="overwrite")
    output = DeltaOutput(str(table), schema_mode="merge")
    ArrowSnapshotSink(str(tmp_path / "out2"), output=output)(df, 0)
    got = {(r["user"], r["n"], r["note"]) for r in table_at(table).to_pylist()}
    assert got == {(1, 2, None), (3, 4, "c")}


# --- S3 ---------------------------------------------------------------------


def test_append_on_s3(
    spark: Any, dwell: tuple[Path, pd.DataFrame], s3: S3Server, tmp_path: Path
) -> None:
    directory, events = dwell
    bucket = s3.bucket()
    uri = f"s3://{bucket}/events"
    options = {
        "AWS_ENDPOINT_URL": f"http://{s3.endpoint}",
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_REGION": REGION,
        # moto has no DynamoDB lock here; one writer per table (the app id).
        "AWS_S3_ALLOW_UNSAFE_RENAME": "true",
    }
    output = DeltaOutput(uri, storage_options=options, filesystem=s3.filesystem())
    root = tmp_path / "out"
    run(stream(spark, directory), ArrowSnapshotSink(str(root), output=output), tmp_path / "chk")
    assert event_rows(
        table_at(uri, storage_options=options, filesystem=s3.filesystem())
    ) == event_rows(events)
    history = log_commits(s3.filesystem(), f"{bucket}/events")
    one_commit_per_batch(uri, FILES, history, storage_options=options)
    assert [manifest(root, b)["output"]["delta"]["version"] for b in range(FILES)] == [0, 1, 2]


def no_aws_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No credential source outside what a test passes (the ``s3`` fixture
    of another test may have set the AWS_* variables in this process)."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def test_missing_and_refused_credentials_are_refused_before_anything_is_written(
    spark: Any, s3_auth: AuthS3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """On a store that checks credentials: none at all, none for delta-rs,
    a key the store does not know for delta-rs or for the executors'
    filesystem, each an ObjectStoreError naming the table, the client, the
    key and the option to set, raised before the batch's Spark job; then
    the right keys commit (so the refusals were the credentials')."""
    no_aws_environment(monkeypatch, tmp_path)
    uri = f"s3://{s3_auth.bucket}/events"
    right = {"AWS_ACCESS_KEY_ID": s3_auth.access_key, "AWS_SECRET_ACCESS_KEY": s3_auth.secret_key}
    wrong = {"AWS_ACCESS_KEY_ID": "AKIASNAPCUTWRONGKEY", "AWS_SECRET_ACCESS_KEY": "nope"}
    # Where no credentials are given delta-rs asks the instance metadata
    # service: a closed port answers at once, anywhere.
    imds = {"AWS_METADATA_ENDPOINT": f"http://127.0.0.1:{closed_port()}"}
    base = {
        "AWS_ENDPOINT_URL": f"http://{s3_auth.endpoint}",
        "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": REGION,
        "AWS_S3_ALLOW_UNSAFE_RENAME": "true",
    }
    fs_none, fs_right = s3_auth.filesystem(None), s3_auth.filesystem()
    fs_wrong = s3_auth.filesystem("AKIASNAPCUTWRONGFS", "nope")
    cases = [
        (imds, fs_none, r"executors' pyarrow filesystem has no S3 credentials .*filesystem="),
        (
            imds,
            fs_right,
            r"delta-rs \(storage_options\) has no S3 credentials .*'AWS_ACCESS_KEY_ID'",
        ),
        (
            wrong,
            fs_right,
            r"refused the credentials AKIASNAPCUTWRONGKEY of delta-rs .*storage_options=",
        ),
        (right, fs_wrong, r"refused the credentials AKIASNAPCUTWRONGFS of the executors' pyarrow"),
    ]
    df = spark.createDataFrame(pd.DataFrame({"user": [1, 2], "n": [3, 4]}))
    root = tmp_path / "out"
    for keys, fs, message in cases:
        output = DeltaOutput(uri, storage_options={**base, **keys}, filesystem=fs)
        with pytest.raises(ObjectStoreError, match=message) as refused:
            ArrowSnapshotSink(str(root), output=output)(df, 0)
        assert f"output table {uri}" in str(refused.value)
        assert "nope" not in str(refused.value)  # a secret is never shown
        assert s3_auth.keys("events") == []
        assert not list(root.glob("chk-*"))
    output = DeltaOutput(uri, storage_options={**base, **right}, filesystem=fs_right)
    ArrowSnapshotSink(str(root), output=output)(df, 0)
    got = output.read().to_pylist()
    assert sorted((r["user"], r["n"]) for r in got) == [(1, 3), (2, 4)]
