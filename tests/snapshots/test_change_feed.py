"""snapcut.snapshots.changes and `snapcut snapshots changes`: Spark's change
feed columns from a root's diffs and tombstones, without Spark.

The expected feed is always the row-by-row difference of consecutive
committed states (the roots' models), so a test fails if the feed follows
the files' layout instead of the state."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import Root, build_local_root, build_spark_root
from snapcut import ConfigError, SnapshotError, snapshots
from snapcut.cli import main
from snapcut.snapshots.change_feed import SPARK_ROOT_META

COLUMNS = ["batch_id", "change_type", "key", "value", "partition_id"]
Row = tuple[int, str, Any, Any, int]


def feed_rows(table: pa.Table) -> list[Row]:
    return sorted(
        (
            r["batch_id"],
            r["change_type"],
            tuple(r["key"].values()),
            None if r["value"] is None else tuple(r["value"].values()),
            r["partition_id"],
        )
        for r in table.to_pylist()
    )


def model_changes(root: Root, start: int, end: int, vertex: str) -> list[Row]:
    """Row by row: what differs between each batch's state and the previous one's."""
    out: list[Row] = []
    ids = sorted(root.model)
    for b in (i for i in ids if start <= i <= end):
        prev = root.model.get(ids[ids.index(b) - 1], {}) if ids.index(b) else {}
        for (v, p), now in root.model[b].items():
            if v != vertex:
                continue
            was = prev.get((v, p), {})
            for k, value in now.items():
                if was.get(k) != value:
                    out.append((b, "update", (k,), _plain(value), p))
            out += [(b, "delete", (k,), None, p) for k in was if k not in now]
    return sorted(out)


def _plain(value: Any) -> tuple[Any, ...]:
    return tuple(list(v) if isinstance(v, tuple | list) else v for v in value)


def test_the_feed_of_a_spark_layout_root_is_the_difference_of_its_states(tmp_path: Path) -> None:
    root = build_spark_root(tmp_path / "spark", batches=6, full_every=2)
    feed = snapshots.changes(root.path, 2, 5)
    assert feed.column_names == COLUMNS
    assert feed.schema.field("partition_id").type == pa.int32()
    assert feed_rows(feed) == model_changes(root, 2, 5, "counts")
    assert {r[1] for r in feed_rows(feed)} == {"update", "delete"}
    # The end defaults to the newest committed batch; batch 0 starts from no state.
    assert feed_rows(snapshots.changes(root.path, 0)) == model_changes(root, 0, 5, "counts")


def test_the_feed_is_the_same_whatever_the_full_diff_layout(tmp_path: Path) -> None:
    feeds = [
        feed_rows(snapshots.changes(build_spark_root(tmp_path / f"f{n}", 6, full_every=n).path, 1))
        for n in (1, 2, 3)
    ]
    assert feeds[0] == feeds[1] == feeds[2]


def test_a_runtime_root_starts_at_checkpoint_1(tmp_path: Path) -> None:
    root = build_local_root(tmp_path / "local", n=6, full_every=3)
    assert feed_rows(snapshots.changes(root.path, 1)) == model_changes(root, 1, 6, "agg")
    assert feed_rows(snapshots.changes(root.path, 2, 4, variable="agg")) == model_changes(
        root, 2, 4, "agg"
    )


def test_a_spark_state_root_keys_rows_by_its_grouping_key() -> None:
    """The Spark helper's own root (tests/snapshots/fixtures/spark_state):
    the feed equals the difference of its states read by the Spark reader."""
    from snapcut.spark.state.read import read_state_arrow

    root = Path(__file__).parent / "fixtures" / "spark_state"
    want: list[Row] = []
    prev: dict[Any, Any] = {}
    for b in range(4):
        now = {r.pop("user"): tuple(r.values()) for r in read_state_arrow(str(root), b).to_pylist()}
        want += [(b, "update", (k,), v, -1) for k, v in now.items() if prev.get(k) != v]
        want += [(b, "delete", (k,), None, -1) for k in prev if k not in now]
        prev = now
    got = [(*r[:4], -1) for r in feed_rows(snapshots.changes(root, 0))]
    assert sorted(got) == sorted(want)
    with pytest.raises(ConfigError, match="leave out variable="):
        snapshots.changes(root, 0, variable="count")


def test_bad_ranges_and_removed_batches_are_typed_errors(tmp_path: Path) -> None:
    root = build_spark_root(tmp_path / "spark", batches=6, full_every=2)
    with pytest.raises(ConfigError, match="at most the end"):
        snapshots.changes(root.path, 4, 2)
    with pytest.raises(SnapshotError, match="batch 9 is not committed"):
        snapshots.changes(root.path, 1, 9)
    with pytest.raises(ConfigError, match=r"operator\(s\) counts, not 'count'"):
        snapshots.changes(root.path, 1, variable="count")
    snapshots.prune(root.path, keep=2)
    oldest = snapshots.list_checkpoints(root.path)[0].id
    with pytest.raises(SnapshotError, match=f"start at batch {oldest + 1}"):
        snapshots.changes(root.path, oldest)
    assert feed_rows(snapshots.changes(root.path, oldest + 1)) == model_changes(
        root, oldest + 1, 5, "counts"
    )


def tws_root(path: Path) -> Path:
    """Two batches of a transformWithState-like root: a list variable
    ("recent", keyed by id and position) and the timers, with the
    description a Spark state root keeps."""
    schema = pa.schema(
        [
            pa.field("__key", pa.binary(), nullable=False),
            pa.field("id", pa.string(), nullable=False),
            pa.field("__seq", pa.int64(), nullable=False),
            pa.field("v", pa.int64()),
        ]
    )
    timers = pa.schema(
        [
            pa.field("__key", pa.binary(), nullable=False),
            pa.field("id", pa.string(), nullable=False),
            pa.field("__expiry_ms", pa.int64(), nullable=False),
        ]
    )
    w = snapshots.SnapshotWriter(path.as_uri())
    recent = [[("a", 0, 1), ("a", 1, 2)], [("a", 0, 1), ("b", 0, 5)]]
    for b, rows in enumerate(recent):
        table = pa.table(
            {
                "__key": [f"{i}/{s}".encode() for i, s, _ in rows],
                "id": [i for i, _, _ in rows],
                "__seq": [s for _, s, _ in rows],
                "v": [v for _, _, v in rows],
            },
            schema=schema,
        )
        files = [
            w.write_state(b, "tws.recent", 0, table, key="__key"),
            w.write_state(b, "tws.$timers", 0, timers.empty_table(), key="__key"),
        ]
        w.commit(b, files, protocol="spark-microbatch")
    meta = {
        "vertex": "tws",
        "key": ["id"],
        "tables": [
            {"name": "recent", "key_columns": ["__key", "id", "__seq"]},
            {"name": "$timers", "key_columns": ["__key", "id", "__expiry_ms"]},
        ],
    }
    (path / SPARK_ROOT_META).write_text(json.dumps(meta))
    return path


def test_a_transform_with_state_variable_is_named_by_variable(tmp_path: Path) -> None:
    root = tws_root(tmp_path / "tws")
    feed = snapshots.changes(root, 1, variable="recent")
    assert feed.schema.field("key").type.names == ["id", "__seq"]
    assert feed.schema.field("value").type.names == ["v"]
    assert feed_rows(feed) == [
        (1, "delete", ("a", 1), None, 0),
        (1, "update", ("b", 0), (5,), 0),
    ]
    assert snapshots.changes(root, 0, variable="$timers").num_rows == 0
    with pytest.raises(ConfigError, match=r"\$timers, recent\): name one with variable="):
        snapshots.changes(root, 0)
    with pytest.raises(ConfigError, match="no state variable 'count'"):
        snapshots.changes(root, 0, variable="count")


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["snapshots", "changes", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_changes_as_table_json_and_parquet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = build_spark_root(tmp_path / "spark", batches=4, full_every=2)
    want = feed_rows(snapshots.changes(root.path, 1, 3))

    code, out, _ = cli(capsys, str(root.path), "1", "3")
    assert code == 0
    assert out.splitlines()[0].split() == ["batch", "change", "partition", "key", "value"]
    assert f"{len(want)} changes under" in out

    code, out, _ = cli(capsys, str(root.path), "1", "chk-00000003", "--format", "json")
    assert code == 0
    rows = json.loads(out)
    assert list(rows[0]) == COLUMNS
    assert len(rows) == len(want)

    target = tmp_path / "feed.parquet"
    code, out, _ = cli(capsys, str(root.path), "1", "--format", "parquet", "--to", str(target))
    assert code == 0
    assert feed_rows(pq.read_table(target)) == want

    code, _, err = cli(capsys, str(root.path), "3", "1")
    assert code == 2
    assert "at most the end" in err
    code, _, err = cli(capsys, str(root.path), "1", "--format", "parquet")
    assert code == 2
    assert "--to FILE" in err
