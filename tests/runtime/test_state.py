"""snapcut.StateTable: keyed upserts/deletes, diffs, checkpoints, restore, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.s3_support import S3Server

import snapcut
from snapcut import ConfigError, SnapshotError, StateTable
from snapcut._core import encode_keys

SCHEMA = pa.schema(
    [
        pa.field("user", pa.string(), nullable=False),
        pa.field("count", pa.int64()),
        pa.field("total", pa.float64()),
    ]
)


def batch(rows: list[tuple[str, int | None, float | None]]) -> pa.RecordBatch:
    users, counts, totals = zip(*rows, strict=True) if rows else ([], [], [])
    return pa.record_batch(
        [pa.array(users, pa.string()), pa.array(counts, pa.int64()), pa.array(totals)],
        schema=SCHEMA,
    )


def as_dict(table: pa.Table) -> dict[str, tuple[int | None, float | None]]:
    d = table.to_pydict()
    return {u: (c, t) for u, c, t in zip(d["user"], d["count"], d["total"], strict=True)}


def test_upsert_get_delete() -> None:
    t = StateTable(SCHEMA, "user")
    t.update(batch([("ann", 1, 1.5), ("bob", 2, None), ("ann", 3, 4.0)]))
    assert len(t) == 2
    got = t.get(["bob", "nobody", "ann"])
    assert isinstance(got, pa.Table)
    assert got.to_pydict() == {"user": ["bob", "ann"], "count": [2, 3], "total": [None, 4.0]}
    assert t.delete(pa.array(["ann", "zed"])) == 1
    assert as_dict(t.to_arrow()) == {"bob": (2, None)}
    assert t.schema.metadata[b"snapcut.key"] == b"user"
    assert t.key == "user"


def test_update_accepts_tables_with_many_chunks() -> None:
    t = StateTable(SCHEMA, "user")
    table = pa.Table.from_batches([batch([("a", 1, 1.0)]), batch([("b", 2, 2.0), ("a", 9, 9.0)])])
    t.update(table)
    assert as_dict(t.to_arrow()) == {"a": (9, 9.0), "b": (2, 2.0)}


def test_diff_and_checkpoints() -> None:
    t = StateTable(SCHEMA, "user", full_every=3)
    t.update(batch([("a", 1, 1.0), ("b", 2, 2.0)]))
    cid, kind, full = t.checkpoint()
    assert (cid, kind, full.num_rows) == (1, "full", 2)
    t.update(batch([("c", 3, 3.0)]))
    t.delete(["a"])
    diff = t.diff()
    assert isinstance(diff, pa.RecordBatch)
    rows = sorted(zip(diff["user"].to_pylist(), diff["__deleted"].to_pylist(), strict=True))
    assert rows == [("a", True), ("c", False)]
    assert t.changed == 2
    assert t.checkpoint()[:2] == (2, "diff")
    assert t.changed == 0
    assert t.checkpoint()[:2] == (3, "diff")
    assert t.checkpoint()[:2] == (4, "full")
    assert t.last_checkpoint == 4


def test_restore_from_any_checkpoint() -> None:
    t = StateTable(SCHEMA, "user", full_every=4)
    taken = []
    expected = []
    for i in range(10):
        t.update(batch([(f"u{i}", i, float(i)), (f"u{i // 2}", -i, None)]))
        if i % 3 == 0:
            t.delete([f"u{i // 3}"])
        taken.append(t.checkpoint())
        expected.append(as_dict(t.to_arrow()))
    for i in range(len(taken)):
        start = max(j for j in range(i + 1) if taken[j][1] == "full")
        r = StateTable(SCHEMA, "user", full_every=4)
        r.restore(taken[start : i + 1])
        assert as_dict(r.to_arrow()) == expected[i]
        assert r.last_checkpoint == taken[i][0]


def test_errors_name_the_problem() -> None:
    with pytest.raises(ConfigError, match="key column 'nope' is not in the state schema"):
        StateTable(SCHEMA, "nope")
    with pytest.raises(ConfigError, match="a state key must be"):
        StateTable(pa.schema([("f", pa.float64())]), "f")
    with pytest.raises(ConfigError, match="unsupported type"):
        StateTable(pa.schema([("k", pa.int64()), ("l", pa.list_(pa.int64()))]), "k")
    t = StateTable(SCHEMA, "user")
    with pytest.raises(ConfigError, match="batch has no column 'total'"):
        t.update(pa.record_batch({"user": ["a"], "count": [1]}))
    with pytest.raises(ConfigError, match="column 'count' has type Utf8"):
        t.update(pa.record_batch({"user": ["a"], "count": ["x"], "total": [1.0]}))
    with pytest.raises(ConfigError, match="non-null"):
        t.delete(pa.array([None], pa.string()))
    with pytest.raises(ConfigError, match="key type is Utf8"):
        t.delete(pa.array([1, 2]))
    with pytest.raises(ConfigError, match="must be 'full' or 'diff'"):
        t.restore([(1, "partial", batch([]))])
    t.update(batch([("a", 1, 1.0)]))
    t.checkpoint(5)
    with pytest.raises(ConfigError, match="must increase"):
        t.checkpoint(5)
    cid, _, diff = t.checkpoint(6)
    with pytest.raises(SnapshotError, match="must start with a full capture"):
        t.restore([(cid, "diff", diff)])
    assert issubclass(ConfigError, snapcut.SnapcutError)


I64 = st.integers(-(2**63), 2**63 - 1)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("up"), st.lists(st.tuples(st.integers(0, 15), I64), max_size=5)),
        st.tuples(st.just("del"), st.lists(st.integers(0, 15), max_size=4)),
        st.tuples(st.just("chk"), st.just([])),
        st.tuples(st.just("flush"), st.just([])),
    ),
    max_size=30,
)


@pytest.mark.parametrize(
    "data_type",
    [
        pa.int64(),
        pa.bool_(),
        pa.float32(),
        pa.date32(),
        pa.timestamp("us", "UTC"),
        pa.string(),
        pa.binary(),
        pa.decimal128(10, 2),
        pa.list_(pa.int64()),
        pa.struct([("a", pa.int64())]),
        pa.map_(pa.string(), pa.int64()),
    ],
)
def test_storable_type_says_what_a_state_table_takes(data_type: pa.DataType) -> None:
    schema = pa.schema([("k", pa.int64()), ("v", data_type)])
    try:
        StateTable(schema, "k")
        built = True
    except ConfigError as e:
        assert "unsupported type" in str(e)
        built = False
    assert snapcut._core.storable_type(data_type) is built


@settings(max_examples=60, deadline=None)
@given(OPS, st.integers(1, 4), st.sampled_from([None, "1MB"]))
def test_random_ops_match_a_dict(
    ops: list[tuple[str, list]], full_every: int, state_memory: str | None
) -> None:
    """With a memory budget, "flush" moves the rows into a run on disk
    (without one it is skipped): reads, diffs and restores agree all the same."""
    schema = pa.schema([pa.field("k", pa.int64(), nullable=False), ("v", pa.int64())])
    t = StateTable(schema, "k", full_every=full_every, state_memory=state_memory)
    model: dict[int, int] = {}
    chain: list[tuple[int, str, pa.RecordBatch]] = []
    for op, arg in ops:
        if op == "up":
            t.update(pa.record_batch([[k for k, _ in arg], [v for _, v in arg]], schema=schema))
            model.update(dict(arg))
        elif op == "del":
            t.delete(pa.array(arg, pa.int64()))
            for k in arg:
                model.pop(k, None)
        elif op == "flush":
            if state_memory is not None:
                t.flush()
        else:
            taken = t.checkpoint()
            chain = [taken] if taken[1] == "full" else [*chain, taken]
            r = StateTable(schema, "k", full_every=full_every)
            r.restore(chain)
            d = r.to_arrow().to_pydict()
            assert dict(zip(d["k"], d["v"], strict=True)) == model
        d = t.to_arrow().to_pydict()
        assert dict(zip(d["k"], d["v"], strict=True)) == model


def test_a_memory_budget_spills_to_files_and_reads_them_back(tmp_path: Path) -> None:
    schema = pa.schema([pa.field("k", pa.int64(), nullable=False), ("v", pa.int64())])
    t = StateTable(schema, "k", state_memory="1MB", spill_dir=tmp_path, full_every=1000)
    assert t.state_memory == 1 << 20
    n = 200_000
    for start in range(0, n, 20_000):
        keys = pa.array(range(start, start + 20_000), pa.int64())
        t.update(pa.record_batch([keys, keys], schema=schema))
    stats = t.spill_stats()
    assert stats is not None and stats["flushes"] >= 2, stats
    assert stats["memtable_bytes"] <= 1 << 20, stats
    assert [p.name[:6] for p in tmp_path.iterdir()] == ["spill-"]
    assert len(t) == n
    got = t.get(pa.array([5, 150_000, n + 1], pa.int64())).to_pydict()
    assert got == {"k": [5, 150_000], "v": [5, 150_000]}
    del t
    assert not list(tmp_path.iterdir()), "the runs go with the table"


def test_bad_memory_budgets_are_refused_with_the_fix(tmp_path: Path) -> None:
    schema = pa.schema([pa.field("k", pa.int64(), nullable=False), ("v", pa.int64())])
    with pytest.raises(ConfigError, match="below the minimum of 1048576 bytes"):
        StateTable(schema, "k", state_memory=4096)
    with pytest.raises(ConfigError, match="256MB"):
        StateTable(schema, "k", state_memory="lots")
    with pytest.raises(ValueError, match="state_memory must be bytes"):
        StateTable(schema, "k", state_memory=1.5)
    with pytest.raises(ValueError, match="needs state_memory"):
        StateTable(schema, "k", spill_dir=tmp_path)
    assert StateTable(schema, "k").spill_stats() is None
    with pytest.raises(ConfigError, match="memory budget"):
        StateTable(schema, "k").flush()


def test_a_time_index_finds_due_keys_of_a_spilled_table_without_reading_it(
    tmp_path: Path,
) -> None:
    """``time_column=`` indexes the keys by an int64 time: ``due(t)`` gives
    those at or before t, by time then key, whether their rows sit in memory
    or in spilled runs, and follows deletes and a restore."""
    schema = pa.schema(
        [pa.field("k", pa.int64(), nullable=False), ("at", pa.int64()), ("v", pa.int64())]
    )
    t = StateTable(schema, "k", state_memory="1MB", spill_dir=tmp_path, time_column="at")
    assert t.time_column == "at"
    n = 200_000
    for start in range(0, n, 20_000):
        keys = pa.array(range(start, start + 20_000), pa.int64())
        at = pa.array([None if k % 7 == 0 else k % 1000 for k in range(start, start + 20_000)])
        t.update(pa.record_batch([keys, at, keys], schema=schema))
    stats = t.spill_stats() or {}
    assert stats["flushes"] >= 2
    # The index's own entries went into runs too (an eighth of the budget
    # holds ~1,400 of the 171k keys with a time), merged past 8 runs.
    assert stats["time_flushes"] >= 9 and stats["time_merges"] >= 1, stats
    assert 1 <= stats["time_runs"] <= 8, stats
    # Keys whose time moves leave stale entries in the runs: due skips them.
    moved = pa.array(range(0, 20_000, 2), pa.int64())
    t.update(pa.record_batch([moved, pa.array([5000] * len(moved)), moved], schema=schema))
    want = sorted((k % 1000, k) for k in range(n) if k % 7 and k % 1000 <= 2)
    want = [(at, k) for at, k in want if not (k < 20_000 and k % 2 == 0)]
    assert t.due(2).to_pylist() == [k for _, k in want]
    assert t.due(2).to_pylist() == [k for _, k in want], "asked again, the same keys"
    assert t.earliest_time() == 0
    t.delete(pa.array([1, 1001], pa.int64()))
    assert t.due(1).to_pylist() == [k for at, k in want if at <= 1 and k not in (1, 1001)]
    _, _, full = t.checkpoint(1)
    back = StateTable(schema, "k", time_column="at")
    back.restore([(1, "full", full)])
    assert back.due(2).to_pylist() == t.due(2).to_pylist()
    with pytest.raises(ConfigError, match="must be an Int64 value column"):
        StateTable(schema, "k", time_column="k")
    with pytest.raises(ConfigError, match="no time index"):
        StateTable(schema, "k").due(0)


def test_groups_of_a_spilled_table_are_read_and_deleted_from_its_runs(tmp_path: Path) -> None:
    """A table with a group column spills too when its keys begin with their
    group (``group_prefix``): a group's rows are found in memory and in the
    runs (one key range each), newer rows hide older ones, and a group
    delete reaches the runs. transformWithState's list and map state."""
    schema = pa.schema(
        [
            pa.field("k", pa.binary(), nullable=False),
            pa.field("g", pa.int64(), nullable=False),
            ("s", pa.int64()),
            ("v", pa.int64()),
        ]
    )

    def batch(gs: list[int], ss: list[int], vs: list[int]) -> pa.RecordBatch:
        g, s = pa.array(gs, pa.int64()), pa.array(ss, pa.int64())
        return pa.record_batch([encode_keys([g, s]), g, s, pa.array(vs, pa.int64())], schema=schema)

    t = StateTable(
        schema, "k", group="g", group_prefix="encoding", state_memory="1MB", spill_dir=tmp_path
    )
    assert t.state_memory == 1 << 20
    groups = 20_000
    for s in range(8):  # 8 rows a group, each pass a new row of every group
        t.update(batch(list(range(groups)), [s] * groups, [s] * groups))
    assert (t.spill_stats() or {})["flushes"] >= 2
    t.update(batch([5, 5], [0, 8], [100, 108]))  # one changed, one new: in memory
    rows, which = t.lookup_groups(pa.array([5, 7, -1], pa.int64()))
    columns = (which.to_pylist(), rows.column("s").to_pylist(), rows.column("v").to_pylist())
    got = sorted(zip(*columns, strict=True))
    assert got == sorted(
        [(0, 0, 100), *((0, s, s) for s in range(1, 8)), (0, 8, 108)]
        + [(1, s, s) for s in range(8)]
    )
    assert t.delete_groups(pa.array([5, 6], pa.int64())) == 9 + 8
    assert t.lookup_groups(pa.array([5, 6], pa.int64()))[0].num_rows == 0
    assert len(t) == groups * 8 + 1 - 17
    with pytest.raises(ConfigError, match="group_prefix"):
        StateTable(schema, "k", group="g", state_memory="1MB", spill_dir=tmp_path)
    with pytest.raises(ConfigError, match="neither 'value'"):
        StateTable(schema, "k", group="g", group_prefix="bytes")
    with pytest.raises(ConfigError, match="needs a binary group column"):
        StateTable(schema, "k", group="g", group_prefix="value")
    plain = StateTable(schema, "k", group="g", group_prefix="encoding")
    with pytest.raises(ConfigError, match="does not begin with the encoding of its group 2"):
        plain.update(
            pa.record_batch(
                [encode_keys([pa.array([1], pa.int64())]), pa.array([2]), [0], [0]], schema=schema
            )
        )


def test_a_mapped_restore_reads_through_its_files_pages_and_refuses_pages_that_do_not_fit(
    tmp_path: Path,
) -> None:
    """``restore(pages=)``: per file of a mapped chain the ``MappedFile`` it
    was read from (or None). A table with a budget reads through them as it
    would through pyarrow's own mapping, its large lookups in chunks that
    release the pages between them, and reads the same after its pages (or
    the file's) are released. Pages need mapped=True and one entry a file;
    a missing file is the OS's FileNotFoundError naming it."""
    from snapcut.snapshots import DELETED_COLUMN
    from snapcut.snapshots.layout import read_ipc
    from snapcut.snapshots.mapped import map_file

    schema = pa.schema([("k", pa.int64()), ("v", pa.int64())])
    n = 200_000
    full = pa.table({"k": pa.array(range(0, 2 * n, 2)), "v": pa.array(range(n))}, schema=schema)
    diff = pa.table(
        {"k": [1, 4, 6], "v": [11, 44, None], DELETED_COLUMN: [False, False, True]},
        schema=schema.append(pa.field(DELETED_COLUMN, pa.bool_())),
    )
    paths = []
    for name, table in (("full", full), ("diff", diff)):
        path = tmp_path / f"{name}.arrow"
        with pa.ipc.new_file(path, table.schema) as w:
            w.write_table(table)
        paths.append(path)
    reads = [map_file(str(p)) for p in paths]
    assert reads[0].buffer.to_pybytes() == paths[0].read_bytes()
    chain = [(1, "full", read_ipc(reads[0].buffer)), (2, "diff", read_ipc(reads[1].buffer))]
    pages = [r.pages for r in reads]

    with pytest.raises(ConfigError, match="pages without mapped=True"):
        StateTable(schema, "k").restore(chain, pages=pages)
    with pytest.raises(ConfigError, match="restore got 1 pages for a chain of 2 files"):
        StateTable(schema, "k").restore(chain, mapped=True, pages=pages[:1])
    with pytest.raises(FileNotFoundError, match=r"no-such\.arrow"):
        map_file(str(tmp_path / "no-such.arrow"))

    want = StateTable(schema, "k")
    want.restore(chain)
    # 1 MiB of mapped pages: a lookup of 100k probes over the ~3 MB file goes
    # in chunks, releasing between them.
    with pytest.raises(ConfigError, match="needs a memory budget"):
        StateTable(schema, "k", mapped_memory="1MB")
    t = StateTable(
        schema, "k", state_memory="1MB", spill_dir=tmp_path / "spill", mapped_memory="1MB"
    )
    t.restore(chain, mapped=True, pages=[pages[0], None])
    probes = pa.array([(i * 7_919) % (2 * n + 5) for i in range(100_000)] + [1, 4, 6], pa.int64())
    expected = want.lookup(probes)
    assert t.lookup(probes) == expected
    assert expected[1].to_pylist()[-3:] == [True, True, False]
    t.release_pages()
    for r in reads:
        assert r.pages is not None
        r.pages.release()
    assert t.lookup(probes) == expected
    assert len(t) == len(want) == n  # 1 added, 6 deleted


def test_a_restore_refuses_filters_that_do_not_fit_its_chain() -> None:
    """``restore(filters=)``: one per file or a ConfigError; bytes that are no
    bloom filter, or a filter lacking a key of its diff (another run's), are
    SnapshotErrors naming the chain entry; the right ones are taken."""
    from snapcut import snapshots
    from snapcut._core import format as fmt

    schema = pa.schema([("k", pa.int64()), ("v", pa.int64())])
    full = pa.record_batch([pa.array([1, 2, 3]), pa.array([10, 20, 30])], schema=schema)
    diff = pa.record_batch(
        [pa.array([2, 7]), pa.array([21, 70]), pa.array([False, False])],
        names=["k", "v", snapshots.DELETED_COLUMN],
    )
    other = pa.record_batch(
        [pa.array([100]), pa.array([1]), pa.array([False])],
        names=["k", "v", snapshots.DELETED_COLUMN],
    )
    chain = [(1, "full", full), (2, "diff", diff)]
    bloom = fmt.encode_state("t", 0, diff, "k", "diff", 1)[2]
    foreign = fmt.encode_state("t", 0, other, "k", "diff", 1)[2]
    assert bloom is not None and foreign is not None
    with pytest.raises(ConfigError, match="restore got 1 filters for a chain of 2 files"):
        StateTable(schema, "k").restore(chain, mapped=True, filters=[None])
    with pytest.raises(SnapshotError, match=r"state chain entry 2's filter.*33 bytes is corrupt"):
        StateTable(schema, "k").restore(chain, mapped=True, filters=[None, b"\0" * 33])
    with pytest.raises(SnapshotError, match=r"lacks key .* the filter is corrupt or another run's"):
        StateTable(schema, "k").restore(chain, mapped=True, filters=[None, foreign])
    t = StateTable(schema, "k")
    t.restore(chain, mapped=True, filters=[None, bloom])
    assert (t.spill_stats() or {})["filters_stored"] == 1
    assert as_rows(t) == {1: 10, 2: 21, 3: 30, 7: 70}


def as_rows(t: StateTable) -> dict[int, int]:
    table = t.to_arrow()
    return dict(zip(table["k"].to_pylist(), table["v"].to_pylist(), strict=True))


def test_a_streamed_checkpoint_writes_the_files_of_the_checkpoint_in_memory(
    tmp_path: Path,
) -> None:
    """``checkpoint_streamed``: a table over its budget leaves its capture as
    ``StateRuns``, which ``write_state_file`` merges as it writes: the file and
    filter are those of ``checkpoint()``'s batch, for fulls and diffs alike;
    runs written as the other kind, or given to ``encode_state``, are refused."""
    from snapcut._core import StateRuns
    from snapcut._core import format as fmt

    schema = pa.schema([("k", pa.int64()), ("v", pa.int64()), ("s", pa.string())])

    def table(name: str) -> StateTable:
        return StateTable(schema, "k", state_memory="1MB", spill_dir=tmp_path / name, full_every=3)

    memory, streamed = table("memory"), table("streamed")
    kinds = []
    for cid in range(1, 6):
        # 60k keys, then 25k new ones a checkpoint: each diff holds under half
        # the table's keys (at half, a capture is full whatever its place).
        n = 60_000 if cid == 1 else 25_000
        keys = np.arange(n, dtype=np.int64) * 7 % 150_000 + cid * 150_000
        batch = pa.record_batch(
            [pa.array(keys), pa.array(keys + cid), pa.array([f"s{k % 97}" for k in keys])],
            schema=schema,
        )
        for t in (memory, streamed):
            t.update(batch)
            t.delete(pa.array(np.arange(40, dtype=np.int64) * 11 + cid))
        _, kind, want = memory.checkpoint(cid)
        _, got_kind, got = streamed.checkpoint_streamed(cid)
        assert got_kind == kind
        assert isinstance(got, StateRuns), f"checkpoint {cid}: {got!r}"
        assert got.rows_in >= want.num_rows
        kinds.append(kind)
        base = None if kind == "full" else cid - 1
        expected, entry, bloom = fmt.encode_state("t", 0, want, "k", kind, base, True)
        assert (bloom is None) == (kind == "full")
        d = tmp_path / f"chk-{cid}"
        d.mkdir()
        local = fmt.write_state_file(str(d), ".tmp", "t", 0, got, "k", kind, base, True)
        assert local == entry, f"checkpoint {cid}"
        assert (d / f"{entry['path']}.tmp").read_bytes() == expected.to_pybytes()
        if bloom is not None:
            assert (d / f"{entry['filter']['path']}.tmp").read_bytes() == bloom
        # No spool file is left beside them.
        assert len(list(d.iterdir())) == (1 if bloom is None else 2)
        other = "diff" if kind == "full" else "full"
        with pytest.raises(SnapshotError, match=f"a {kind} capture's runs cannot be written"):
            fmt.write_state_file(str(d), ".x", "t", 0, got, "k", other, 1, True)
        with pytest.raises(ConfigError, match="encode_state takes a table, not StateRuns"):
            fmt.encode_state("t", 0, got, "k", kind, base, True)
    assert kinds == ["full", "diff", "diff", "full", "diff"]
    assert as_rows(streamed) == as_rows(memory)


def test_a_streamed_capture_is_uploaded_to_a_remote_root_as_written_locally(
    tmp_path: Path, s3: S3Server
) -> None:
    """``SnapshotWriter.write_state`` of ``StateRuns``: on a local root the merge
    goes straight into the checkpoint's directory, on S3 through a local
    temporary file uploaded a part at a time; both give the bytes (and the
    diff's filter) of the in-memory capture, and no temporary file is left."""
    from snapcut.snapshots import SnapshotWriter, checkpoint_dir_name

    schema = pa.schema([("k", pa.int64()), ("v", pa.int64())])
    tables = [
        StateTable(schema, "k", state_memory="1MB", spill_dir=tmp_path / n, full_every=5)
        for n in ("memory", "streamed")
    ]
    local = SnapshotWriter(tmp_path / "local")
    remote = SnapshotWriter(f"{s3.bucket()}/root", s3.filesystem())
    for cid in (1, 2):
        keys = np.arange(80_000, dtype=np.int64) * (cid + 2)
        for t in tables:
            t.update(pa.record_batch([pa.array(keys), pa.array(keys * cid)], schema=schema))
        _, kind, batch = tables[0].checkpoint(cid)
        _, _, runs = tables[1].checkpoint_streamed(cid)
        base = None if kind == "full" else cid - 1
        want = local.write_state(cid, "t", 0, batch, "k", kind, base, sort=True)
        got = remote.write_state(cid, "t", 1, runs, "k", kind, base, sort=True)
        mine = local.write_state(cid, "t", 1, runs, "k", kind, base, sort=True)
        assert (
            (got["bytes"], got["crc32c"])
            == (want["bytes"], want["crc32c"])
            == (
                mine["bytes"],
                mine["crc32c"],
            )
        )
        names = [got["path"]] + ([got["filter"]["path"]] if kind == "diff" else [])
        for name in names:
            d = checkpoint_dir_name(cid)
            uploaded = remote.fs.open_input_file(f"{remote.root}/{d}/{name}").read()
            assert uploaded == (tmp_path / "local" / d / name).read_bytes()
    left = [p.name for p in (tmp_path / "local").rglob("*") if p.name.endswith(".tmp")]
    assert left == []
