"""Reading a Spark state root through the data source: a version's state
(one Spark partition per state partition) or the change feed of a range of
batches (the same), planned from the manifests alone.

Columns are Spark's state data source's: ``key`` and ``value`` structs and
``partition_id``, or for the change feed ``batch_id``, ``change_type``,
``key``, ``value``, ``partition_id``. ``key`` holds the columns that key a
row (a transformWithState list's position or map's user key included),
``value`` the others, snapcut's internal ``__`` columns left out, so a
version read and a change feed compare row by row. ``columns=flat`` gives a
version's rows as :func:`~snapcut.spark.read_state` always has (key and state
columns side by side, internal ones kept).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from snapcut._core import ConfigError, SnapshotError
from snapcut.snapshots.change_feed import baseline, changes
from snapcut.spark.keys import KEY_COLUMN
from snapcut.spark.source.options import ReadOptions
from snapcut.spark.state.partition import schema_of
from snapcut.spark.state.read import read_partition, table_of
from snapcut.spark.state.root import StateRoot
from snapcut.spark.state.spec import GROUP_COLUMN
from snapcut.spark.tws.variables import TIMER_COLUMN as EXPIRY
from snapcut.spark.tws.variables import TIMERS

__all__ = ["StatePlan", "plan_state"]

INTERNAL = (KEY_COLUMN, GROUP_COLUMN)
TIMER_COLUMN = "expiration_timestamp_ms"
"""Spark's name for it in ``readRegisteredTimers``."""


@dataclass(frozen=True)
class StatePlan:
    """What executors need to read one version, or one change-feed range,
    of a state root. Picklable."""

    state: StateRoot
    variable: str | None
    partitions: tuple[int, ...]
    key: tuple[str, ...]
    """The columns of the ``key`` struct."""
    flat: pa.Schema
    """A version's rows as :func:`read_partition` gives them."""
    manifest: dict[str, Any] | None = None
    """The version read (None: the change feed)."""
    flat_columns: bool = False
    change_range: tuple[int, int] | None = None

    @property
    def values(self) -> list[str]:
        return [c for c in self.flat.names if c not in self.key and not c.startswith("__")]

    @property
    def timers(self) -> bool:
        """A version of the timers: Spark's columns, ``key`` (the grouping
        key) and ``expiration_timestamp_ms``."""
        return self.variable == TIMERS and self.change_range is None and not self.flat_columns

    def schema(self) -> pa.Schema:
        """The columns this read yields."""
        if self.flat_columns:
            return self.flat
        if self.timers:
            key = pa.struct([self.flat.field(c) for c in self.key if c != EXPIRY])
            return pa.schema(
                [("key", key), (TIMER_COLUMN, pa.int64()), ("partition_id", pa.int32())]
            )
        key = pa.struct([self.flat.field(c) for c in self.key])
        value = pa.struct([self.flat.field(c) for c in self.values])
        head = [("batch_id", pa.int64()), ("change_type", pa.string())]
        tail = [("key", key), ("value", value), ("partition_id", pa.int32())]
        return pa.schema(tail if self.change_range is None else head + tail)

    def read(self, partition: int) -> Iterator[pa.RecordBatch]:
        if self.change_range is not None:
            start, end = self.change_range
            root = self.state
            feed = changes(root.path, start, end, self.variable, root.fs, partition=partition)
            if feed.num_rows:
                yield from feed.cast(self.schema()).to_batches()
            return
        assert self.manifest is not None
        rows = read_partition(self.state, self.manifest, partition, self.variable)
        if self.flat_columns:
            yield from rows.select(self.flat.names).to_batches()
            return
        if not rows.num_rows:
            return
        schema = self.schema()
        key = _struct(rows, [f.name for f in schema.field("key").type], schema.field("key").type)
        middle = (
            rows[EXPIRY].cast(pa.int64())
            if self.timers
            else _struct(rows, self.values, schema.field("value").type)
        )
        partition_id = pa.array([partition] * rows.num_rows, pa.int32())
        out = pa.Table.from_arrays([key, middle, partition_id], schema=schema)
        yield from out.to_batches()


def _struct(rows: pa.Table, columns: Sequence[str], kind: pa.DataType) -> pa.Array:
    if not columns:
        return pa.array([{}] * rows.num_rows, kind)
    arrays = [rows[c].combine_chunks() for c in columns]
    return pa.StructArray.from_arrays(arrays, fields=list(kind))


def _key_columns(state: StateRoot, variable: str | None) -> tuple[str, ...]:
    """The columns that key a row: the change feed's (``snapshots.changes``)."""
    spec = state.spec
    if variable is None:
        return spec.key
    return tuple(c for c in spec.table(variable).key_columns if c not in INTERNAL)


def _variable(state: StateRoot, opts: ReadOptions) -> str | None:
    if not opts.timers:
        return opts.variable
    if not any(t.name == TIMERS for t in state.spec.tables):
        raise ConfigError(
            f"option 'readRegisteredTimers': state root {state.name} has no timers (only a "
            "transformWithState root whose timeMode is not 'None' has): leave the option out"
        )
    return TIMERS


def _partitions(state: StateRoot, opts: ReadOptions) -> tuple[int, ...]:
    n = state.spec.partitions
    if opts.partition_id is None:
        return tuple(range(n))
    if opts.partition_id >= n:
        raise ConfigError(
            f"option 'partitionId' is {opts.partition_id}, but state root {state.name} has "
            f"{n} partitions: pass 0..{n - 1}"
        )
    return (opts.partition_id,)


def _committed(state: StateRoot) -> list[int]:
    committed = state.backend.complete()
    if not committed:
        raise SnapshotError(f"state root {state.name} has no committed batch yet")
    return committed


def plan_state(state: StateRoot, opts: ReadOptions) -> StatePlan:
    """The plan of `opts` on `state`, every option checked against the root."""
    opts.refuse_stream_options(state.name)
    variable = _variable(state, opts)
    layout = table_of(state.spec, variable, option="option 'variable'")
    flat = schema_of(layout)
    for internal in INTERNAL:
        if internal in flat.names:
            flat = flat.remove(flat.get_field_index(internal))
    common = {
        "state": state,
        "variable": variable,
        "partitions": _partitions(state, opts),
        "key": _key_columns(state, variable),
        "flat": flat,
    }
    committed = _committed(state)
    if not opts.change_feed:
        if opts.batch_id is not None and opts.batch_id not in committed:
            raise ConfigError(
                f"option 'batchId' is {opts.batch_id}, which state root {state.name} has not "
                f"committed or no longer retains (committed: {_span(committed)}): pass one of "
                "those, or keep more versions (retain=)"
            )
        manifest = state.manifest_at(opts.batch_id)
        return StatePlan(**common, manifest=manifest, flat_columns=opts.columns == "flat")
    assert opts.change_start is not None
    start = opts.change_start
    end = committed[-1] if opts.change_end is None else opts.change_end
    if end not in committed:
        raise ConfigError(
            f"option 'changeEndBatchId' is {end}, which state root {state.name} has not "
            f"committed (committed: {_span(committed)}): pass a batch in that range"
        )
    if start > end:
        raise ConfigError(
            f"option 'changeStartBatchId' ({start}) is after the newest committed batch {end} "
            f"of state root {state.name}: the start must be at most the end"
        )
    try:
        baseline(state.backend, committed, start)
    except SnapshotError as e:
        raise ConfigError(f"option 'changeStartBatchId': {e}") from None
    return StatePlan(**common, change_range=(start, end))


def _span(batches: list[int]) -> str:
    return f"{batches[0]}..{batches[-1]}" if len(batches) > 1 else str(batches[0])
