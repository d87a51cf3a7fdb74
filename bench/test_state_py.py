"""Keyed state through the Python API: full vs diff, N = 100k keys of which
PCT % (1 or 10) change between checkpoints (90 % of those overwritten, 10 %
deleted: tombstones). Schema: ``key int64 (non-null), count int64, total
float64``, as ``rust/core/benches/state.rs`` (which does the same at 10M keys
with no Python in the way). One group per operation and PCT; in each, the full
variant is the baseline, so a diff's ratio is the fraction of a full's cost:

- ``state-checkpoint-PCTpct``: ``StateTable.checkpoint()``, the sync phase (what
  a task waits for): a full copy of the table vs the changed rows + tombstones
  (the changes are applied in the untimed set-up of each round).
- ``state-write-PCTpct``: one task's state file made durable and committed:
  the Rust store (``SnapshotStore.task_snapshot`` + ``commit``: Arrow IPC,
  crc32c, fsync, manifest) and the Python writer over ``pyarrow.fs``
  (``snapshots.SnapshotWriter.write_state`` + ``commit``), full vs diff.
  ``extra_info["bytes"]``: the state file's size.
- ``state-read-PCTpct``: the state of checkpoint 10 as a pyarrow Table, when it
  is a full vs when it is a full + 9 diffs (the chain is rebuilt): the Rust
  reader (``SnapshotReader.state``) and the Python one (``snapshots.open`` of a
  ``file://`` URI, i.e. ``pyarrow.fs``).
- ``state-restore-PCTpct``: ``StateTable.restore`` from the chain already in
  memory, [full] vs [full, 9 diffs] (what a task does after the read).

Run: pytest bench/test_state_py.py --benchmark-only
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from snapcut import StateTable, snapshots
from snapcut._core import SnapshotReader, SnapshotStore

SCHEMA = pa.schema(
    [pa.field("key", pa.int64(), nullable=False), ("count", pa.int64()), ("total", pa.float64())]
)
PCTS = [1, 10]
CHAIN = 10  # checkpoint 10 = a full + 9 diffs
ROUNDS = 30


def keys_count(smoke: bool) -> int:
    return 10_000 if smoke else 100_000


def rows(keys: np.ndarray, seed: int) -> pa.RecordBatch:
    rng = np.random.default_rng(seed)
    return pa.record_batch(
        [
            pa.array(keys, pa.int64()),
            pa.array(rng.integers(0, 1_000, len(keys)), pa.int64()),
            pa.array(rng.random(len(keys)), pa.float64()),
        ],
        schema=SCHEMA,
    )


class Changes:
    """Seeded rounds of changes to a table of `n` keys: PCT % of the keys, 90 %
    of them overwritten (new values), 10 % deleted and re-inserted next round
    (so the table keeps its size)."""

    def __init__(self, n: int, pct: int) -> None:
        self.n, self.changed = n, max(1, n * pct // 100)
        self.rng = np.random.default_rng(pct)
        self.deleted: np.ndarray = np.array([], np.int64)

    def initial(self) -> pa.RecordBatch:
        return rows(np.arange(self.n, dtype=np.int64), 0)

    def apply(self, table: StateTable) -> None:
        picked = self.rng.choice(self.n, self.changed, replace=False).astype(np.int64)
        gone = picked[: self.changed // 10]
        upsert = np.union1d(picked[self.changed // 10 :], self.deleted)
        upsert = np.setdiff1d(upsert, gone)
        table.update(rows(upsert, int(self.rng.integers(1 << 30))))
        table.delete(pa.array(gone, pa.int64()))
        self.deleted = gone


def chain(n: int, pct: int) -> list[tuple[int, str, pa.RecordBatch]]:
    """Checkpoints 1..CHAIN of one table: 1 full, then diffs."""
    table = StateTable(SCHEMA, "key", full_every=1_000_000)
    changes = Changes(n, pct)
    table.update(changes.initial())
    out = []
    for cid in range(1, CHAIN + 1):
        if cid > 1:
            changes.apply(table)
        out.append(table.checkpoint(cid))
        table.checkpoint_committed(cid)
    return out


def remaining(n: int, pct: int) -> int:
    """Keys in the table after a round of Changes (its deletes are pending)."""
    return n - max(1, n * pct // 100) // 10


def _baseline(benchmark: Any, full: bool) -> None:
    if full:
        benchmark.extra_info["baseline"] = True


# --- sync phase ---


@pytest.mark.parametrize("kind", ["full", "diff"])
@pytest.mark.parametrize("pct", PCTS)
def test_checkpoint(benchmark: Any, kind: str, pct: int, smoke: bool) -> None:
    benchmark.group = f"state-checkpoint-{pct}pct"
    _baseline(benchmark, kind == "full")
    n = keys_count(smoke)
    table = StateTable(SCHEMA, "key", full_every=1 if kind == "full" else 1_000_000)
    changes = Changes(n, pct)
    table.update(changes.initial())
    table.checkpoint_committed(table.checkpoint(1)[0])
    ids = itertools.count(2)

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        changes.apply(table)
        return (next(ids),), {}

    def capture(cid: int) -> tuple[int, str, pa.RecordBatch]:
        out = table.checkpoint(cid)
        table.checkpoint_committed(cid)
        return out

    _, got, batch = benchmark.pedantic(capture, setup=setup, rounds=ROUNDS, warmup_rounds=1)
    assert got == kind
    benchmark.extra_info["rows"] = batch.num_rows


# --- durable write ---


@pytest.mark.parametrize("kind", ["full", "diff"])
@pytest.mark.parametrize("writer", ["rust-store", "python-writer"])
@pytest.mark.parametrize("pct", PCTS)
def test_write(
    benchmark: Any, kind: str, writer: str, pct: int, smoke: bool, tmp_path: Path
) -> None:
    benchmark.group = f"state-write-{pct}pct"
    _baseline(benchmark, kind == "full" and writer == "rust-store")
    checkpoints = chain(keys_count(smoke), pct)
    full, diff = checkpoints[0][2], checkpoints[1][2]
    ids = itertools.count(2)
    root = tmp_path / "root"

    if writer == "rust-store":
        store = SnapshotStore(root, retain=3)
        store.task_snapshot(1, "agg", 0, state=("full", None, full))
        store.commit(1)

        def write(cid: int) -> None:
            state = ("full", None, full) if kind == "full" else ("diff", cid - 1, diff)
            store.task_snapshot(cid, "agg", 0, state=state)
            store.commit(cid)

        def size(cid: int) -> int:
            entry = snapshots.open(root)[cid].files[0]
            return int(entry["bytes"])
    else:
        w = snapshots.SnapshotWriter(root.as_uri())
        w.commit(1, [w.write_state(1, "agg", 0, pa.table(full), key="key", kind="full")])
        table = pa.table(full if kind == "full" else diff)

        def write(cid: int) -> None:
            base = None if kind == "full" else cid - 1
            w.commit(cid, [w.write_state(cid, "agg", 0, table, key="key", kind=kind, base=base)])

        def size(cid: int) -> int:
            return int(snapshots.open(root.as_uri())[cid].files[0]["bytes"])

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (next(ids),), {}

    benchmark.pedantic(write, setup=setup, rounds=ROUNDS, warmup_rounds=1)
    benchmark.extra_info["bytes"] = size(next(ids) - 1)


# --- read and restore ---


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory, smoke: bool) -> dict[tuple[int, str], Path]:
    """(pct, "full" | "chain") -> a root whose checkpoint CHAIN is a full, or
    the end of a full + diffs chain (same final state)."""
    out = {}
    for pct in PCTS:
        checkpoints = chain(keys_count(smoke), pct)
        final = StateTable(SCHEMA, "key")
        final.restore(checkpoints)
        for shape in ("full", "chain"):
            root = tmp_path_factory.mktemp(f"state-{pct}-{shape}")
            store = SnapshotStore(root, retain=CHAIN)
            for cid, kind, batch in checkpoints:
                if shape == "full" and cid < CHAIN:
                    continue
                if shape == "full":
                    state = ("full", None, final.to_arrow().to_batches()[0])
                else:
                    state = (kind, None if kind == "full" else cid - 1, batch)
                store.task_snapshot(cid, "agg", 0, state=state)
                store.commit(cid)
            out[pct, shape] = root
    return out


@pytest.mark.parametrize("shape", ["full", "chain"])
@pytest.mark.parametrize("reader", ["rust-reader", "python-reader"])
@pytest.mark.parametrize("pct", PCTS)
def test_read(
    benchmark: Any,
    shape: str,
    reader: str,
    pct: int,
    smoke: bool,
    roots: dict[tuple[int, str], Path],
) -> None:
    benchmark.group = f"state-read-{pct}pct"
    _baseline(benchmark, shape == "full" and reader == "rust-reader")
    root = roots[pct, shape]

    def read() -> pa.Table:
        if reader == "rust-reader":
            return pa.table(SnapshotReader(root).state(CHAIN, "agg", 0))
        return snapshots.open(root.as_uri())[CHAIN].state("agg", 0)

    got = benchmark.pedantic(read, rounds=ROUNDS, warmup_rounds=1)
    assert got.num_rows == remaining(keys_count(smoke), pct)


@pytest.mark.parametrize("shape", ["full", "chain"])
@pytest.mark.parametrize("pct", PCTS)
def test_restore(benchmark: Any, shape: str, pct: int, smoke: bool) -> None:
    benchmark.group = f"state-restore-{pct}pct"
    _baseline(benchmark, shape == "full")
    checkpoints = chain(keys_count(smoke), pct)
    if shape == "full":
        final = StateTable(SCHEMA, "key")
        final.restore(checkpoints)
        checkpoints = [(CHAIN, "full", final.to_arrow().to_batches()[0])]

    def restore() -> StateTable:
        table = StateTable(SCHEMA, "key")
        table.restore(checkpoints)
        return table

    got = benchmark.pedantic(restore, rounds=ROUNDS, warmup_rounds=1)
    assert len(got) == remaining(keys_count(smoke), pct)
