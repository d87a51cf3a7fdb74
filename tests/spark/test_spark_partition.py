"""The per-partition state machinery of the Spark helper, driven without Spark:
versions and chains, deterministic files, the manifest written by the last
partition (or finalized by the next batch), duplicates writing concurrently,
ownership, corrupt files and retention."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.s3_support import S3Server

from snapcut import ConfigError, SnapshotError, _fs, snapshots
from snapcut._core import StateTable
from snapcut._core import format as fmt
from snapcut.snapshots.run_cache import RunCacheSpec
from snapcut.spark.keyed_state import parse_duration_ms
from snapcut.spark.processors import AggregateProcessor
from snapcut.spark.roots import schema_bytes
from snapcut.spark.state.compactors import compactor_for
from snapcut.spark.state.partition import PartitionTask
from snapcut.spark.state.read import read_state_arrow
from snapcut.spark.state.root import ACK_SUFFIX, StateRoot
from snapcut.spark.state.spec import RootSpec
from snapcut.spark.state.warm import StateCache

INPUT = pa.schema([("user", pa.int64()), ("v", pa.int64())])
SPECS = [("count", None, "n"), ("sum", "v", "total")]


def make_spec(
    root: Path,
    partitions: int = 2,
    full_every: int = 3,
    retain: int = 10,
    state: tuple[str, pa.Schema] | None = None,
    compaction: bool = True,
) -> RootSpec:
    """The root of the aggregates' state (`SPECS` by user), or of `state`: a
    key column and the state schema; `compaction`: the workers merge its
    runs (else a commit writes a full every `full_every` batches)."""
    from snapcut._core import KeyedAggregates

    if state is None:
        state = ("user", KeyedAggregates(INPUT, "user", SPECS).state_schema)
    key, schema = state
    return RootSpec(
        uri=str(root),
        vertex="state",
        partitions=partitions,
        key=(key,),
        state_key=key,
        state_schema=schema_bytes(schema),
        full_every=full_every,
        retain=retain,
        compaction=compaction,
    )


def processor(spec: RootSpec) -> AggregateProcessor:
    from snapcut._core import KeyedAggregates

    kernel = KeyedAggregates(INPUT, "user", SPECS)
    return AggregateProcessor(
        key=("user",),
        state_key="user",
        state_schema=kernel.state_schema,
        output_schema=pa.schema([("user", pa.int64()), ("n", pa.int64()), ("total", pa.int64())]),
        specs=SPECS,
    )


def rows(users: list[int], v: int = 1) -> pa.Table:
    return pa.table(
        {"user": pa.array(users, pa.int64()), "v": pa.array([v] * len(users), pa.int64())}
    )


def run(
    spec: RootSpec,
    batch: int,
    partition: int,
    data: pa.Table,
    cache: StateCache | None = None,
    owner: str = "q1",
) -> pa.Table:
    root = StateRoot(spec)
    task = PartitionTask(root, batch, partition, owner, None, cache=cache or StateCache(0))
    return task.run(data, processor(spec), None)


def split(users: list[int], partitions: int) -> list[list[int]]:
    return [[u for u in users if u % partitions == p] for p in range(partitions)]


def test_versions_chain_diffs_between_fulls_and_manifests_once_all_acked(tmp_path: Path) -> None:
    spec = make_spec(tmp_path / "root", partitions=2, full_every=3, compaction=False)
    StateRoot(spec).init("aggregate")
    batches = [[1, 2, 3, 4], [1, 1, 5], [2], [6, 7], [1]]
    for b, users in enumerate(batches):
        p0, p1 = split(users, 2)
        run(spec, b, 0, rows(p0))
        assert StateRoot(spec).manifest(b) is None  # partition 1 has not acked
        run(spec, b, 1, rows(p1))
        assert StateRoot(spec).manifest(b) is not None
    snaps = snapshots.open(tmp_path / "root")
    assert snaps.list() == list(range(len(batches)))
    kinds = [[f["kind"] for f in c.files if f["role"] == "state"] for c in snaps]
    assert kinds == [
        ["full", "full"],
        ["diff", "diff"],
        ["diff", "diff"],
        ["full", "full"],
        ["diff", "diff"],
    ]
    chains = [f["chain"] for f in snaps[4].files if f["role"] == "state"]
    assert chains == [[3, 4], [3, 4]]
    state = read_state_arrow(str(tmp_path / "root"))
    counts: dict[int, int] = {}
    for users in batches:
        for u in users:
            counts[u] = counts.get(u, 0) + 1
    assert {r["user"]: r["n"] for r in state.to_pylist()} == counts
    assert snaps[2].manifest["spark"]["rows_in"] == 1


def test_next_batch_finalizes_a_manifest_its_last_task_never_wrote(tmp_path: Path) -> None:
    spec = make_spec(tmp_path / "root", partitions=2)
    root = StateRoot(spec)
    root.init("aggregate")
    run(spec, 0, 0, rows([2]))
    run(spec, 0, 1, rows([1]))
    manifest = tmp_path / "root" / "chk-00000000" / "manifest.json"
    manifest.unlink()  # the last task died between its ack and the manifest
    out = run(spec, 1, 0, rows([2, 2]))
    assert manifest.exists()
    assert out.to_pylist() == [{"user": 2, "n": 3, "total": 3}]


def test_a_batch_reads_each_acknowledgement_once_not_once_per_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every task lists the batch's directory; only the one that finds every
    # acknowledgement reads them (P reads per batch, not P² as when each
    # task read them all); each later batch reads the previous manifest.
    partitions = 4
    spec = make_spec(tmp_path / "root", partitions=partitions)
    StateRoot(spec).init("aggregate")
    reads: list[str] = []
    real_read = _fs.read_bytes

    def counting(fs: Any, path: str) -> bytes:
        if path.endswith(ACK_SUFFIX):
            reads.append(path)
        return real_read(fs, path)

    monkeypatch.setattr(_fs, "read_bytes", counting)
    users = list(range(24))
    for b in range(3):
        reads.clear()
        for p, part in enumerate(split(users, partitions)):
            run(spec, b, p, rows(part))
        root = StateRoot(spec)
        assert sorted(reads) == [root.ack_path(b, p) for p in range(partitions)]
        assert root.manifest(b) is not None
    state = read_state_arrow(str(tmp_path / "root"))
    assert state["n"].to_pylist() == [3] * len(users)


KEY_TYPES = [pa.int64(), pa.int32(), pa.string(), pa.large_string(), pa.binary(), pa.large_binary()]


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(KEY_TYPES),
    st.lists(st.integers(-300, 300), unique=True, max_size=40),
    st.booleans(),
)
def test_the_encoder_sorts_to_the_bytes_the_python_sort_gave(
    key_type: pa.DataType, keys: list[int], diff: bool
) -> None:
    # A task hands its capture unsorted and the Rust encoder sorts it; the
    # file must be the one written when Python sorted first (pyarrow's
    # sort_by), byte for byte, for every native key type.
    if pa.types.is_integer(key_type):
        values: list[Any] = keys
    else:
        text = [f"{k}é" if k % 2 else str(k) for k in keys]
        values = (
            text
            if pa.types.is_string(key_type) or pa.types.is_large_string(key_type)
            else [t.encode() for t in text]
        )
    columns = {"k": pa.array(values, key_type), "n": pa.array(range(len(keys)), pa.int64())}
    if diff:
        columns[snapshots.DELETED_COLUMN] = pa.array([k % 3 == 0 for k in keys])
    capture = pa.record_batch(columns)
    kind, base = ("diff", 2) if diff else ("full", None)
    python_sorted = pa.Table.from_batches([capture]).sort_by("k")
    before = fmt.encode_state("state", 1, python_sorted, "k", kind, base)
    after = fmt.encode_state("state", 1, capture, "k", kind, base, sort=True)
    assert after[0].to_pybytes() == before[0].to_pybytes() and after[1:] == before[1:]


def test_missing_previous_version_is_a_clear_error(tmp_path: Path) -> None:
    spec = make_spec(tmp_path / "root", partitions=2)
    StateRoot(spec).init("aggregate")
    run(spec, 0, 0, rows([2]))
    with pytest.raises(SnapshotError, match=r"no version 0 of partition\(s\) \[1\]"):
        run(spec, 1, 0, rows([2]))


def _duplicate(args: tuple[RootSpec, int]) -> bytes:
    spec, attempt = args
    run(spec, 1, 0, rows([0, 2, 4, 2] * 50, v=3 + 0 * attempt))
    return (Path(spec.uri) / "chk-00000001" / "state-0.state.arrow").read_bytes()


def test_concurrent_duplicates_of_a_task_write_identical_bytes(tmp_path: Path) -> None:
    spec = make_spec(tmp_path / "root", partitions=1)
    StateRoot(spec).init("aggregate")
    run(spec, 0, 0, rows([0, 2]))
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        files = pool.map(_duplicate, [(spec, 0), (spec, 1), (spec, 2), (spec, 3)])
    assert len(set(files)) == 1
    chk = snapshots.open(tmp_path / "root")[1]
    chk.verify()
    assert {r["user"]: r["n"] for r in chk.state("state", 0).to_pylist()} == {0: 51, 2: 101, 4: 50}


def test_a_warm_cache_and_a_cold_restore_write_the_same_files(tmp_path: Path) -> None:
    warm, cold = make_spec(tmp_path / "warm", 1), make_spec(tmp_path / "cold", 1)
    for spec in (warm, cold):
        StateRoot(spec).init("aggregate")
    cache = StateCache(4)
    for b, users in enumerate([[3, 1, 2], [2, 9], [1, 1, 7], [9]]):
        run(warm, b, 0, rows(users), cache=cache)
        run(cold, b, 0, rows(list(reversed(users))))
    for b in range(4):
        name = f"chk-{b:08d}/state-0.state.arrow"
        assert (tmp_path / "warm" / name).read_bytes() == (tmp_path / "cold" / name).read_bytes()


def test_a_second_query_cannot_write_a_root(tmp_path: Path) -> None:
    spec = make_spec(tmp_path / "root", partitions=1)
    StateRoot(spec).init("aggregate")
    run(spec, 0, 0, rows([1]), owner="query-a")
    with pytest.raises(ConfigError, match="belongs to query query-a"):
        run(spec, 1, 0, rows([1]), owner="query-b")
    assert snapshots.open(tmp_path / "root").list() == [0]


def test_changed_partitions_or_schema_fail_before_any_batch(tmp_path: Path) -> None:
    StateRoot(make_spec(tmp_path / "root", partitions=2)).init("aggregate")
    with pytest.raises(ConfigError, match=r"partitions=2.*partitions=3"):
        StateRoot(make_spec(tmp_path / "root", partitions=3)).init("aggregate")
    other = RootSpec(
        **{**make_spec(tmp_path / "root").__dict__, "state_schema": schema_bytes(INPUT)}
    )
    with pytest.raises(ConfigError, match="'n' looks renamed to 'v'"):
        StateRoot(other).init("aggregate")
    with pytest.raises(ConfigError, match="operator"):
        StateRoot(make_spec(tmp_path / "root")).init("map_batches")


def test_unwritable_root_is_a_storage_error(tmp_path: Path) -> None:
    from snapcut import StorageError

    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StorageError, match="cannot be created"):
        StateRoot(make_spec(blocker / "root")).init("aggregate")


def test_corrupt_committed_state_stops_with_the_path(tmp_path: Path) -> None:
    spec = make_spec(tmp_path / "root", partitions=1)
    StateRoot(spec).init("aggregate")
    run(spec, 0, 0, rows([1, 2, 3]))
    path = tmp_path / "root" / "chk-00000000" / "state-0.state.arrow"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(SnapshotError, match=r"chk-00000000/state-0.state.arrow.*checksum"):
        run(spec, 1, 0, rows([1]))
    path.write_bytes(bytes(data[:20]))
    with pytest.raises(SnapshotError, match="truncated"):
        run(spec, 1, 0, rows([1]))


def test_retention_keeps_the_newest_batches_and_their_bases(tmp_path: Path) -> None:
    spec = make_spec(tmp_path / "root", partitions=1, full_every=3, retain=2)
    StateRoot(spec).init("aggregate")
    for b in range(8):
        run(spec, b, 0, rows([b % 3]))
    kept = snapshots.open(tmp_path / "root").list()
    # 6 and 7 are kept; 7 is a diff on 6, whose chain starts at the full 6.
    assert kept == [6, 7]
    for c in kept:
        snapshots.open(tmp_path / "root")[c].verify()
    assert read_state_arrow(str(tmp_path / "root"))["n"].to_pylist() == [3, 3, 2]


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 12), max_size=15), min_size=1, max_size=7),
    st.integers(1, 4),
)
def test_state_at_every_batch_equals_a_dict_model(
    batches: list[list[int]], full_every: int
) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        spec = make_spec(Path(d) / "root", partitions=2, full_every=full_every)
        StateRoot(spec).init("aggregate")
        model: dict[int, int] = {}
        for b, users in enumerate(batches):
            for p, part in enumerate(split(users, 2)):
                run(spec, b, p, rows(part, v=2))
            for u in users:
                model[u] = model.get(u, 0) + 1
            state = read_state_arrow(str(Path(d) / "root"), batch=b)
            assert {r["user"]: (r["n"], r["total"]) for r in state.to_pylist()} == {
                u: (n, 2 * n) for u, n in model.items()
            }
        # This process's compactor of the root may still be publishing a merge
        # into the directory the example removes (fcc91: "Directory not
        # empty"): it finishes first.
        root = StateRoot(spec)
        compactor = compactor_for(spec, root.fs, root.path)
        assert compactor is None or compactor.flush(60)


def test_durations_parse_like_spark() -> None:
    assert parse_duration_ms("10 seconds", "w") == 10_000
    assert parse_duration_ms("1 minute", "w") == 60_000
    assert parse_duration_ms(250, "w") == 250
    with pytest.raises(ConfigError, match="is not a duration"):
        parse_duration_ms("ten seconds", "watermark")


def test_manifest_spark_record_is_readable_json(tmp_path: Path) -> None:
    spec = make_spec(tmp_path / "root", partitions=1)
    StateRoot(spec).init("aggregate")
    run(spec, 0, 0, rows([1, 1]))
    m = json.loads((tmp_path / "root" / "chk-00000000" / "manifest.json").read_text())
    assert m["protocol"] == "spark-microbatch"
    assert m["spark"]["rows_in"] == 2 and m["spark"]["state_keys"] == 1
    assert pc.sum(read_state_arrow(str(tmp_path / "root"))["n"]).as_py() == 2


def test_a_pickled_state_root_keeps_its_filesystem_and_spec_and_drops_read_manifests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a task receives: the driver's StateRoot, unpickled without
    resolving its URI again, its layouts built once per spec, and none of the
    manifests the driver had read (a task reads current ones)."""
    import pickle

    spec = make_spec(tmp_path / "root", partitions=1)
    root = StateRoot(spec)
    root.init("aggregate")
    run(spec, 0, 0, rows([1, 2]))
    assert root.manifest(0) is not None and root.backend._raw
    layouts = root.spec.layouts()
    assert root.spec.layouts() is layouts and root.spec.layout() is layouts[0]

    real_resolve = _fs.resolve

    def no_resolve(root: Any, filesystem: Any = None) -> Any:
        # Given the filesystem, resolve() only joins the path: that is allowed.
        assert filesystem is not None, f"{root}: the URI was resolved again"
        return real_resolve(root, filesystem)

    monkeypatch.setattr(_fs, "resolve", no_resolve)
    task_side = pickle.loads(pickle.dumps(root))
    assert task_side.spec == spec and task_side.path == root.path
    assert task_side.name == root.name
    assert not task_side.backend._raw
    task = PartitionTask(task_side, 1, 0, "q1", None, cache=StateCache(0))
    task.run(rows([2, 3]), processor(spec), None)
    state = read_state_arrow(task_side).to_pylist()
    assert {r["user"]: r["n"] for r in state} == {1: 1, 2: 2, 3: 1}


def test_a_worker_budget_bounds_its_warm_partitions_and_refuses_too_little(
    tmp_path: Path,
) -> None:
    """``state_memory`` is a Python worker's: the partition a task works on
    gets half (shared by its spilling tables), and putting tables back in the
    cache flushes the largest warm ones until they hold at most the other
    half. The state is the same as without a budget."""
    from snapcut.spark.state.worker_memory import table_memory, warm_memory

    spec = make_spec(tmp_path / "budget", partitions=3, full_every=100)
    plain = make_spec(tmp_path / "plain", partitions=3, full_every=100)
    StateRoot(spec).init("aggregate")
    StateRoot(plain).init("aggregate")
    budget = 4 << 20
    assert table_memory(budget, spec.layouts()) == 2 << 20
    cache, plain_cache = StateCache(8), StateCache(8)
    for batch in range(2):
        for p in range(3):
            # 150k rows a task: the 2 MiB table flushes within one upsert.
            data = rows(list(range(p * 200_000 + batch * 20_000, p * 200_000 + 150_000 + batch)))
            root = StateRoot(spec)
            task = PartitionTask(root, batch, p, "q1", None, cache=cache, state_memory=budget)
            got = task.run(data, processor(spec), None)
            assert got.equals(run(plain, batch, p, data, plain_cache))
            assert cache.memtable_bytes() <= warm_memory(budget)
    flushed = sum(
        s["rows_flushed"]
        for _, _, tables in cache._tables.values()
        for t in tables.values()
        if (s := t.spill_stats()) is not None
    )
    assert flushed > 0
    got = read_state_arrow(str(tmp_path / "budget")).sort_by("user")
    want = read_state_arrow(str(tmp_path / "plain")).sort_by("user")
    assert got.num_rows == want.num_rows > 450_000
    assert got.select(["user", "n", "total"]).equals(want.select(["user", "n", "total"]))
    with pytest.raises(ConfigError, match="below the minimum of 2097152 bytes"):
        table_memory((2 << 20) - 1, spec.layouts())


def test_a_budget_leaves_the_warm_tables_of_a_query_without_one_alone(tmp_path: Path) -> None:
    """A Python worker runs the tasks of every query of its session: its cache
    may hold the tables of a query without a budget, opened lazily over
    their files (they report runs and in-memory rows too) when a query with
    a budget puts its tables back. Only the budgeted tables are flushed; the
    others cannot be, and are kept as they are."""
    plain = make_spec(tmp_path / "plain", partitions=1, full_every=100)
    spec = make_spec(tmp_path / "budget", partitions=1, full_every=100)
    for s in (plain, spec):
        StateRoot(s).init("aggregate")
    cache = StateCache(8)
    run(plain, 0, 0, rows(list(range(100_000))), StateCache(0))
    # Not warm: the task opens the root's files lazily, then writes 50k keys.
    run(plain, 1, 0, rows(list(range(0, 100_000, 2)), v=2), cache)
    (lazy,) = next(iter(cache._tables.values()))[2].values()
    assert lazy.state_memory is None
    stats = lazy.spill_stats()
    assert stats is not None and stats["runs"] > 0 and stats["memtable_bytes"] > 0
    budget = 4 << 20
    task = PartitionTask(StateRoot(spec), 0, 0, "q2", None, cache=cache, state_memory=budget)
    task.run(rows(list(range(150_000))), processor(spec), None)
    (budgeted,) = cache._tables[task.cache_key][2].values()
    assert (budgeted.spill_stats() or {})["rows_flushed"] > 0
    assert lazy.spill_stats() == stats
    assert read_state_arrow(str(tmp_path / "budget")).num_rows == 150_000


@pytest.mark.parametrize("budget", [4 << 20, None], ids=["budget", "no-budget"])
def test_a_cold_task_maps_the_roots_full_as_its_base_run(
    tmp_path: Path, budget: int | None
) -> None:
    """A task that does not hold its partition reads the chain from the root:
    a local root's files are mapped, and its table takes the full (sorted, as
    every state file is) as its base run as it is, with no copy into a local
    run, and the diffs after it as runs too; without a memory budget as well
    (opened lazily: nothing rebuilt in memory). The output and the state equal
    a root whose tables stay warm in memory, and the task's figures count the
    bytes it read."""
    spec = make_spec(tmp_path / "budget", partitions=1, full_every=100)
    plain = make_spec(tmp_path / "plain", partitions=1, full_every=100)
    StateRoot(spec).init("aggregate")
    StateRoot(plain).init("aggregate")
    warm = StateCache()
    batches = [list(range(150_000, 0, -1)), list(range(0, 300_000, 7)), [5, 5, 149_999]]
    for batch, users in enumerate(batches):
        data = rows(users, v=batch + 1)
        # No cache: every batch after the first reads its partition from the root.
        task = PartitionTask(
            StateRoot(spec), batch, 0, "q1", None, cache=StateCache(0), state_memory=budget
        )
        got = task.run(data, processor(spec), None)
        assert got.equals(run(plain, batch, 0, data, cache=warm))
        stats = task._loaded.tables["state"].spill_stats()
        figures = task.figures()
        assert figures["state_cache_misses"] == 1
        if batch == 0:
            assert figures["state_bytes_read"] == 0
            continue
        # The diffs since the full (sorted too) are runs as they are, each
        # with the filter stored beside its file (format 3), not rebuilt.
        assert stats is not None and stats["bases_mapped"] == 1, stats
        assert stats["diffs_mapped"] == stats["filters_stored"] == batch - 1, stats
        assert (task._loaded.tables["state"].state_memory is None) == (budget is None)
        files = sorted((tmp_path / "budget").glob("chk-*/state-0.state.arrow"))[:batch]
        assert figures["state_bytes_read"] >= 0.9 * sum(f.stat().st_size for f in files) > 0
        assert figures["state_load_ms_max"] >= 0
    got = read_state_arrow(str(tmp_path / "budget")).sort_by("user")
    want = read_state_arrow(str(tmp_path / "plain")).sort_by("user")
    assert got.equals(want) and got.num_rows > 150_000


@pytest.mark.parametrize("size", [1 << 30, 0], ids=["run-cache", "no-run-cache"])
def test_a_cold_task_on_a_remote_root_maps_its_files_from_the_run_cache(
    s3: S3Server, tmp_path: Path, size: int
) -> None:
    """On S3 a cold task maps each state file of its chain from the run
    cache, so its budgeted table takes the full as its base run as it is, as
    on a local root: the files this machine wrote are there already (kept as
    they were written); a worker with an empty cache fetches each once. With
    the cache off the files are read into memory and the base is copied into
    a local run. Either way the output and state equal a warm local root's,
    and the figures count what the cache did."""
    cache_dir = tmp_path / "cache"
    spec = dataclasses.replace(
        make_spec(tmp_path / "unused", partitions=1, full_every=100),
        uri=f"{s3.bucket()}/state",
        filesystem=s3.filesystem(),
        run_cache=RunCacheSpec(str(cache_dir), size),
    )
    plain = make_spec(tmp_path / "plain", partitions=1, full_every=100)
    StateRoot(spec).init("aggregate")
    StateRoot(plain).init("aggregate")
    assert StateRoot(spec).mappable == (size > 0)
    warm = StateCache()
    batches = [list(range(60_000, 0, -1)), list(range(0, 120_000, 7)), [5, 5, 59_999]]
    for batch, users in enumerate(batches):
        data = rows(users, v=batch + 1)
        task = PartitionTask(
            StateRoot(spec), batch, 0, "q1", None, cache=StateCache(0), state_memory=4 << 20
        )
        got = task.run(data, processor(spec), None)
        assert got.equals(run(plain, batch, 0, data, cache=warm))
        figures = task.figures()
        if batch == 0:
            continue
        stats = task._loaded.tables["state"].spill_stats()
        assert stats is not None
        assert stats["bases_mapped"] == (1 if size else 0), stats
        # A mapped diff's run takes its stored filter (read from S3 itself).
        assert stats["filters_stored"] == (batch - 1 if size else 0), stats
        # The chain is the full of batch 0 and the diffs since, each kept in
        # the cache by the task that wrote it.
        if size:
            assert figures["state_run_cache_misses"] == 0, figures
            assert figures["state_run_cache_hits"] == batch, figures
        else:
            assert figures["state_run_cache_misses"] == figures["state_run_cache_hits"] == 0
    got = read_state_arrow(f"{spec.uri}", filesystem=s3.filesystem()).sort_by("user")
    want = read_state_arrow(str(tmp_path / "plain")).sort_by("user")
    assert got.equals(want) and got.num_rows > 60_000
    if not size:
        assert not cache_dir.exists()
        return
    on_disk = [p for p in cache_dir.iterdir() if p.suffix == ".arrow"]
    assert len(on_disk) == len(batches)
    # A worker on another machine (an empty cache) fetches each file of
    # the chain once; its retry of the batch finds them there.
    other = tmp_path / "other"
    elsewhere = dataclasses.replace(spec, run_cache=RunCacheSpec(str(other), size))
    chain = {p.name: p.stat().st_size for p in on_disk}
    for attempt in range(2):
        task = PartitionTask(StateRoot(elsewhere), len(batches), 0, "q1", None, cache=StateCache(0))
        task.run(rows([1, 2], v=9), processor(spec), None)
        figures = task.figures()
        assert figures["state_run_cache_misses"] == (len(batches) if attempt == 0 else 0)
        assert figures["state_run_cache_hits"] == (0 if attempt == 0 else len(batches))
        if attempt == 0:
            assert figures["state_run_cache_bytes_fetched"] == sum(chain.values())
    # What it fetched, and the diff it wrote (kept as written).
    assert {p.name for p in other.iterdir() if p.suffix == ".arrow"} > set(chain)


def test_a_table_with_two_time_columns_is_refused() -> None:
    from snapcut.spark.roots import schema_bytes
    from snapcut.spark.state.spec import EXPIRES_COLUMN, TIMER_COLUMN, time_column

    one = pa.schema([("k", pa.int64()), (TIMER_COLUMN, pa.int64())])
    assert time_column(schema_bytes(one)) == TIMER_COLUMN
    two = one.append(pa.field(EXPIRES_COLUMN, pa.int64()))
    with pytest.raises(SnapshotError, match="several time columns"):
        time_column(schema_bytes(two))


def test_the_warm_tables_hold_at_most_a_quarter_of_the_worker_budget(tmp_path: Path) -> None:
    """A worker's budget: half to the working partition's tables, a quarter to
    its held input, a quarter to the warm partitions; so putting tables back
    flushes the largest warm ones until they hold at most a quarter of it
    (at half, a worker holding input and warm tables went 1.25x over)."""
    from snapcut.spark.state.worker_memory import warm_memory

    budget = 8 << 20
    schema = pa.schema([("k", pa.int64()), ("v", pa.int64())])
    cache = StateCache(8)
    for p in range(4):
        table = StateTable(schema, "k", state_memory="4MB", spill_dir=tmp_path / f"spill-{p}")
        # ~0.74 MB of memtable each (the 4MB table flushed once): together
        # ~3 MB, past a quarter of the budget (2 MiB), not past half.
        keys = pa.array(range(p * 60_000, (p + 1) * 60_000), pa.int64())
        table.update(pa.table({"k": keys, "v": keys}))
        cache.put(("root", "v", p), 0, {"v": [0]}, {"v": table}, memory=budget)
    held = cache.memtable_bytes()
    assert 0 < held <= warm_memory(budget) == budget // 4


@pytest.mark.parametrize("compaction", [False, True])
@pytest.mark.parametrize("budget", [None, 4 << 20])
def test_a_cold_timed_task_takes_the_time_index_stored_beside_its_full(
    tmp_path: Path, budget: int | None, compaction: bool
) -> None:
    """A partition whose table has a time index (applyInPandasWithState's
    timeouts) writes the index beside each full (format 5), a full its
    commit wrote or one a worker's compactor merged; a task that does not
    hold the partition takes it as its index instead of reading every
    row's timeout, and the batches' rows (timeouts included) and state equal
    those of a partition kept warm in one worker."""
    from test_group_state_parts import STATE, make
    from test_tws_parts import batch_rows

    cold, warm = (
        make_spec(
            tmp_path / name, partitions=1, full_every=2, state=("id", STATE), compaction=compaction
        )
        for name in ("cold", "warm")
    )
    StateRoot(cold).init("applyInPandasWithState")
    StateRoot(warm).init("applyInPandasWithState")
    warm_cache = StateCache()
    rng = np.random.default_rng(7)
    timed_out = fulls_seen = adopted = 0
    # Few keys: the function runs a Python call a key (this stays a small test).
    for batch in range(6):
        data = batch_rows(rng, 300, 500)
        ts = 1000 * (batch + 1)
        task = PartitionTask(
            StateRoot(cold), batch, 0, "q1", None, cache=StateCache(0), state_memory=budget
        )
        proc = make()[0]
        got = task.run(data, proc, ts)
        timed_out += proc.timed_out_keys
        kept = PartitionTask(StateRoot(warm), batch, 0, "q1", None, cache=warm_cache)
        want = kept.run(data, make()[0], ts)
        for t in (task, kept):
            if t.compactor is not None:
                assert t.compactor.flush(60)  # what the commit handed over is published
        assert sorted(got.to_pylist(), key=repr) == sorted(want.to_pylist(), key=repr)
        stats = task._loaded.tables["state"].spill_stats()
        # Every batch after the first reads runs from a full (0's, then a
        # later one) whose index is stored beside it.
        if batch:
            assert stats is not None and stats["times_stored"] == 1, stats
        # The step's metric: a miss that took a stored index (a hit takes none).
        assert task.figures()["state_times_stored"] == int(batch > 0)
        assert kept.figures()["state_times_stored"] == 0
        # The tables the commit wrote whole: what the batch's manifest lists.
        listed = json.loads((tmp_path / "cold" / f"chk-{batch:08d}" / "manifest.json").read_text())
        fulls = [f for f in listed["files"] if f.get("role") == "state" and f["kind"] == "full"]
        assert task.figures()["state_fulls_written"] == len(fulls), listed["files"]
        assert kept.figures()["state_fulls_written"] == len(fulls)
        fulls_seen += len(fulls)
        adopted += task.figures()["state_compactions_adopted"]
    assert timed_out > 0
    if compaction:
        # Only the first version is written whole by a commit; the merges
        # a compactor made are adopted, a merged full with its index.
        assert fulls_seen == 1 and adopted >= 1
        merged = list((tmp_path / "cold").glob("chk-*/state-0.run-*.state.times.arrow"))
        assert merged, sorted(p.name for p in (tmp_path / "cold").glob("chk-*/*"))
    else:
        assert 3 <= fulls_seen < 6  # batches 0, 2 and 4 (full_every=2), not every batch
        assert adopted == 0
    assert list((tmp_path / "cold").glob("chk-*/state-0.state.times.arrow"))
    got_state = read_state_arrow(str(tmp_path / "cold")).sort_by("id")
    assert got_state.equals(read_state_arrow(str(tmp_path / "warm")).sort_by("id"))
