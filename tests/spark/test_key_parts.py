"""A task's input larger than a worker holds, applied in parts of whole keys
(``snapcut.spark.state.key_parts``, ``PartitionTask.apply_parts``), driven
without Spark: the parts hold every row once, each key in one part with its
rows in order, their files go when the parts end; and a batch applied in
parts leaves the same state and the same rows a key as applied whole."""

from __future__ import annotations

import gc
import os
import weakref
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_spark_partition import make_spec, processor, rows

from snapcut import ConfigError
from snapcut._core import key_buckets
from snapcut.spark.state.key_parts import SPLIT_ROWS, hold, key_parts
from snapcut.spark.state.partition import PartitionTask
from snapcut.spark.state.read import read_state_arrow
from snapcut.spark.state.root import StateRoot
from snapcut.spark.state.spec import RootSpec
from snapcut.spark.state.warm import StateCache
from snapcut.spark.state.worker_memory import input_held_bytes


def batches_of(table: pa.Table, size: int) -> Iterator[pa.RecordBatch]:
    return iter(table.to_batches(max_chunksize=size))


@settings(max_examples=30, deadline=None)
@given(
    keys=st.lists(st.tuples(st.integers(0, 40), st.sampled_from(["a", "b", "é"])), max_size=400),
    chunk=st.integers(1, 50),
    held=st.integers(0, 3000),
    buckets=st.integers(1, 9),
)
def test_parts_hold_every_row_once_and_each_key_whole_in_order(
    tmp_path_factory: pytest.TempPathFactory,
    keys: list[tuple[int, str]],
    chunk: int,
    held: int,
    buckets: int,
) -> None:
    table = pa.table(
        {
            "k1": pa.array([k for k, _ in keys], pa.int64()),
            "k2": pa.array([s for _, s in keys], pa.string()),
            "seq": pa.array(range(len(keys)), pa.int64()),
        }
    )
    directory = tmp_path_factory.mktemp("parts")
    first, rest = hold(batches_of(table, chunk), held)
    if rest is None:
        # It all fitted: the held batches are the input, as it came.
        assert sum(b.nbytes for b in first) <= held
        got = pa.Table.from_batches(first, table.schema) if first else table.slice(0, 0)
        assert got.equals(table)
        return
    parts = list(
        key_parts(first, rest, table.schema, ("k1", "k2"), 3, str(directory), buckets=buckets)
    )
    assert 1 <= len(parts) <= buckets
    seen: dict[tuple[int, str], int] = {}
    for i, part in enumerate(parts):
        assert part.num_rows > 0
        pairs = list(zip(part["k1"].to_pylist(), part["k2"].to_pylist(), strict=True))
        for key in pairs:
            assert seen.setdefault(key, i) == i, "a key's rows in two parts"
        # Each key's rows keep the order they came in.
        for key in set(pairs):
            mask = pc.and_(pc.equal(part["k1"], key[0]), pc.equal(part["k2"], key[1]))
            order = part.filter(mask)["seq"].to_pylist()
            assert order == sorted(order)
    together = pa.concat_tables(parts).sort_by("seq")
    assert together.equals(table)
    assert os.listdir(directory) == [], "the bucket files outlived their parts"


def test_held_batches_are_let_go_as_they_are_split(tmp_path: Path) -> None:
    # Three held batches of a split's rows each: by the time the rest of the
    # input is read, the first two are split into their bucket files and
    # freed (not all held, and sorted, at once beside a copy).
    n = SPLIT_ROWS
    table = pa.table({"k": pa.array(np.arange(3 * n) % 1000), "v": pa.array(np.arange(3 * n))})
    held = table.to_batches(max_chunksize=n)
    del table
    assert len(held) == 3
    refs = [weakref.ref(b) for b in held]
    alive_when_read: list[list[bool]] = []

    def rest() -> Iterator[pa.RecordBatch]:
        gc.collect()
        alive_when_read.append([r() is not None for r in refs])
        yield pa.record_batch({"k": pa.array([1]), "v": pa.array([-1])})

    parts = list(key_parts(held, rest(), held[0].schema, ["k"], 0, str(tmp_path)))
    assert alive_when_read == [[False, False, True]]
    assert sum(p.num_rows for p in parts) == 3 * n + 1


def test_a_part_set_left_early_removes_its_files_and_a_null_key_is_refused(
    tmp_path: Path,
) -> None:
    table = pa.table({"user": pa.array(range(50_000), pa.int64())})
    first, rest = hold(batches_of(table, 1000), 10_000)
    assert rest is not None and len(first) == 2
    parts = key_parts(first, rest, table.schema, ("user",), 0, str(tmp_path), buckets=8)
    one = next(parts)
    assert one.num_rows > 0 and len(os.listdir(tmp_path)) == 1
    assert next(tmp_path.iterdir()).name.startswith(f"spill-{os.getpid()}-input-")
    assert len(os.listdir(next(tmp_path.iterdir()))) == 7  # the first part's file is gone
    parts.close()
    assert os.listdir(tmp_path) == []
    nulls = pa.table({"user": pa.array([1, None] * 5000, pa.int64())})
    first, rest = hold(batches_of(nulls, 1000), 0)
    assert rest is not None
    with pytest.raises(ConfigError, match=r"'user' holds .* null"):
        next(key_parts(first, rest, nulls.schema, ("user",), 4, str(tmp_path)))
    assert os.listdir(tmp_path) == []


def test_a_killed_workers_input_files_go_when_the_next_spilling_table_starts(
    tmp_path: Path,
) -> None:
    """A worker SIGKILLed mid-batch leaves its bucket directory; it is named as
    a state table's spill directory, so a later spilling table made in the
    same place (a retried task's) removes it, and a live process's stays."""
    import subprocess
    import sys

    from snapcut._core import StateTable

    script = (
        "import os, signal, sys, pyarrow as pa\n"
        "from snapcut.spark.state.key_parts import hold, key_parts\n"
        "t = pa.table({'user': pa.array(range(40_000), pa.int64())})\n"
        "first, rest = hold(iter(t.to_batches(max_chunksize=1000)), 1000)\n"
        "parts = key_parts(first, rest, t.schema, ('user',), 0, sys.argv[1], buckets=4)\n"
        "next(parts)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    res = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True)
    assert res.returncode == -9, res.stderr
    [left] = os.listdir(tmp_path)
    assert left.startswith("spill-") and "-input-" in left
    mine = tmp_path / f"spill-{os.getpid()}-input-live"
    mine.mkdir()
    schema = pa.schema([("user", pa.int64()), ("n", pa.int64())])
    StateTable(schema, "user", state_memory=2 << 20, spill_dir=str(tmp_path))
    names = sorted(os.listdir(tmp_path))
    assert left not in names and mine.name in names, names


def test_key_buckets_agree_across_key_types_and_refuse_bad_input() -> None:
    ints = pa.array(np.arange(10_000, dtype=np.int64))
    got = key_buckets(ints, 16)
    assert got.type == pa.uint32() and len(got) == 10_000
    assert key_buckets(pa.chunked_array([ints[:5000], ints[5000:]]), 16).equals(got)
    assert key_buckets(pa.array(np.arange(10_000, dtype=np.int32)), 16).equals(got)
    counts = np.bincount(got.to_numpy(), minlength=16)
    assert counts.min() > 500, counts
    assert key_buckets(pa.array(["x", "y"]), 5).equals(key_buckets(pa.array([b"x", b"y"]), 5))
    with pytest.raises(ConfigError, match="null"):
        key_buckets(pa.array([1, None], pa.int64()), 4)
    with pytest.raises(ConfigError, match="at least 1 bucket"):
        key_buckets(ints, 0)
    assert input_held_bytes(256 << 20) == 64 << 20


def task_of(spec: RootSpec, batch: int, partition: int, budget: int | None) -> PartitionTask:
    return PartitionTask(
        StateRoot(spec), batch, partition, "q1", None, cache=StateCache(4), state_memory=budget
    )


@pytest.mark.parametrize("budget", [None, 4 << 20])
def test_a_batch_applied_in_parts_leaves_the_state_and_rows_of_one_applied_whole(
    tmp_path: Path, budget: int | None
) -> None:
    """Three batches (the first creates 120k keys, the next repeat keys many
    times), each applied in parts in one root and whole in another: every
    key's output row and the state files' rows are equal."""
    rng = np.random.default_rng(5)
    batches = [
        rng.permutation(120_000).tolist(),
        rng.integers(0, 150_000, 90_000).tolist(),
        rng.integers(0, 2_000, 30_000).tolist(),
    ]
    parted, whole = make_spec(tmp_path / "parts", 2), make_spec(tmp_path / "whole", 2)
    for spec in (parted, whole):
        StateRoot(spec).init("aggregate")
    for batch, users in enumerate(batches):
        data = rows(users, v=batch + 3)
        for partition in (0, 1):
            mine = data.filter(pc.equal(pc.bit_wise_and(data["user"], 1), partition))

            a = task_of(parted, batch, partition, budget)
            first, rest = hold(batches_of(mine, 4096), 50_000)
            assert rest is not None
            parts = key_parts(first, rest, mine.schema, ("user",), batch, str(tmp_path), 16)
            outs = list(a.apply_parts(parts, processor(parted), None))
            a.commit()
            assert len(outs) > 1
            b = task_of(whole, batch, partition, budget)
            want = b.run(mine, processor(whole), None)
            got = pa.concat_tables(outs)
            assert got.num_rows == want.num_rows == len(set(mine["user"].to_pylist()))
            assert got.sort_by("user").equals(want.sort_by("user"))
            figures = a.figures()
            assert figures["input_rows_spilled"] == figures["rows_in"] == mine.num_rows
            assert b.figures()["input_rows_spilled"] == 0
    got = read_state_arrow(str(tmp_path / "parts")).sort_by("user")
    want = read_state_arrow(str(tmp_path / "whole")).sort_by("user")
    assert got.equals(want) and got.num_rows > 120_000
