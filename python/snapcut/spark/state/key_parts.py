"""A task's input as parts that each hold whole keys: every row of a key in
one part, in the order the rows came, so a processor can apply the batch
and emit its output a part at a time instead of holding the partition's
whole batch, its state lookups and its output at once (issue 37: a backfill
batch of 10M rows a partition under a worker's ``state_memory``).

Spark gives a ``mapInArrow`` task its rows in no key order (and a streaming
query cannot sort them), so the parts come from hashing: up to
`held_bytes` of input is held, and a batch that fits is one part, as
before. Past it, every row goes to one of :data:`BUCKETS` local Arrow IPC
stream files by its key's hash (``key_buckets``, the runs' filter hash),
and once the input ends each file is one part: read, handed out and
deleted before the next. A key's rows keep their order (a stable split),
which ``first`` and ``last`` need."""

from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from snapcut._core import key_buckets
from snapcut.spark.keys import KEY_COLUMN, state_key, with_state_key
from snapcut.spark.state.worker_memory import release_unused_arrow_memory

__all__ = [
    "BUCKETS",
    "KEYS_PER_STEP",
    "hold",
    "key_parts",
]

BUCKETS = 64
"""Files a spilled input is split into: a 10M-row partition becomes parts of
~160k rows."""

KEYS_PER_STEP = 1 << 14
"""Grouping keys a step of per-key calls (transformWithState, level 3) holds
in Python at once (their state values, input frames and output): ~16k keys,
~10 MB whatever the batch's size."""

SPLIT_ROWS = 1 << 18
"""Rows gathered before a split, so a bucket file gets few, larger batches."""


def hold(
    batches: Iterable[pa.RecordBatch], held_bytes: int
) -> tuple[list[pa.RecordBatch], Iterator[pa.RecordBatch] | None]:
    """The first of `batches`, while they total at most `held_bytes`, and
    None if that was all of them; else the held ones (one past the limit)
    and the iterator of the rest, for :func:`key_parts`."""
    it = iter(batches)
    held: list[pa.RecordBatch] = []
    size = 0
    for b in it:
        held.append(b)
        size += b.nbytes
        if size > held_bytes:
            return held, it
    return held, None


def key_parts(
    held: list[pa.RecordBatch],
    rest: Iterator[pa.RecordBatch],
    schema: pa.Schema,
    key: Sequence[str],
    batch_id: int,
    directory: str | None = None,
    buckets: int = BUCKETS,
) -> Iterator[pa.Table]:
    """The rows of `held` and then `rest` (of `schema`) as tables holding
    whole keys of `key`, one a bucket (empty ones skipped). The bucket files
    go to a temporary directory in `directory` (default: the system's, as
    the state table's local runs), removed when the parts end or the caller
    stops early, and by the next spilling table made there if the process
    dies first. Every row is spilled before the first part: a null key is
    the ConfigError ``with_state_key`` names, raised before any part. The
    caller should drop its own reference to `held`."""
    # Named as a state table's spill directories (spill-<pid>-...): a worker
    # killed mid-batch leaves one that the next spilling table's start removes
    # (LocalRuns' sweep of dead processes' directories).
    prefix = f"spill-{os.getpid()}-input-"
    with tempfile.TemporaryDirectory(prefix=prefix, dir=directory) as d:
        spill = _Buckets(d, schema, key, batch_id, buckets)
        try:
            # The held batches too go a split at a time, each let go once
            # split: splitting all of them at once held a second copy of
            # them, and their sort order, beside them.
            pending: list[pa.RecordBatch] = []
            rows = 0
            for b in itertools.chain(_drained(held), rest):
                pending.append(b)
                rows += b.num_rows
                if rows >= SPLIT_ROWS:
                    spill.add(pa.Table.from_batches(pending, schema))
                    pending, rows = [], 0
            if pending:
                spill.add(pa.Table.from_batches(pending, schema))
            del pending
        finally:
            spill.close()
        release_unused_arrow_memory()
        yield from spill.parts()


def _drained(batches: list[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The batches of the list in order, each removed from it as it goes."""
    batches.reverse()
    while batches:
        yield batches.pop()


class _Buckets:
    """The bucket files of one task's spilled input."""

    def __init__(
        self, directory: str, schema: pa.Schema, key: Sequence[str], batch_id: int, n: int
    ) -> None:
        self.directory = directory
        self.schema = schema
        self.key = key
        self.batch_id = batch_id
        self.n = n
        self.encoded = state_key(schema, key) == KEY_COLUMN
        self._writers: dict[int, Any] = {}
        self._sinks: dict[int, Any] = {}

    def _path(self, bucket: int) -> str:
        return os.path.join(self.directory, f"bucket-{bucket:05d}.arrow")

    def add(self, rows: pa.Table) -> None:
        keyed = with_state_key(rows, self.key, self.batch_id)
        ids = key_buckets(keyed[state_key(rows.schema, self.key)], self.n)
        # A stable sort by bucket keeps each key's rows in their order.
        order = pc.sort_indices(ids)
        counts = np.bincount(ids.to_numpy(), minlength=self.n)
        grouped = rows.take(order)
        start = 0
        for bucket, count in enumerate(counts.tolist()):
            if count:
                self._writer(bucket).write_table(grouped.slice(start, count))
                start += count

    def _writer(self, bucket: int) -> Any:
        w = self._writers.get(bucket)
        if w is None:
            sink = pa.OSFile(self._path(bucket), "wb")
            w = pa.ipc.new_stream(sink, self.schema)
            self._sinks[bucket], self._writers[bucket] = sink, w
        return w

    def close(self) -> None:
        for w in self._writers.values():
            w.close()
        for s in self._sinks.values():
            s.close()

    def parts(self) -> Iterator[pa.Table]:
        for bucket in sorted(self._writers):
            path = self._path(bucket)
            with pa.OSFile(path, "rb") as f:
                part = pa.ipc.open_stream(f).read_all()
            os.remove(path)
            yield part
