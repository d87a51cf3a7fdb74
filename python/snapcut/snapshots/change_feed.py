"""The change feed of a snapshot root, without Spark: Spark's ``readChangeFeed``.

    >>> snapcut.snapshots.changes("/data/sessions", 3, 7, variable="pages")
    pyarrow.Table
    batch_id: int64, change_type: string, key: struct<...>, value: struct<...>, partition_id: int32

One row per key whose state changed in a batch, in Spark's state data
source columns: ``change_type`` ``"update"`` (the key's new value) or
``"delete"`` (``value`` null). A batch's changes are the difference between
the state after it and the state after the committed batch before it, on
the keys its state file names: a diff's rows and tombstones, or every key of
a full file. So the feed is the same whatever the root's full/diff layout,
and a key rewritten with its old value is no change. States are rebuilt by
the existing reader (the Rust rules of :mod:`snapcut.snapshots.layout`) and
compared by :mod:`snapcut.snapshots.tables`; this module only walks the
batches.

``key`` holds the columns that key a row: a Spark state root's grouping key
(with a transformWithState list's position or map's user key), as its
``_snapcut_state.json`` names them, else the state file's key column.
``value`` holds the other columns, snapcut's internal ``__`` columns left
out. Values a transformWithState root keeps pickled (decimals, nested types)
stay binary here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from snapcut import _fs
from snapcut._core import ConfigError, SnapshotError
from snapcut._core import format as fmt
from snapcut.snapshots.backend import FsBackend
from snapcut.snapshots.layout import DELETED_COLUMN, KEY_METADATA, read_ipc, rebuild_state
from snapcut.snapshots.ops import Root, open_root
from snapcut.snapshots.tables import _diff_keyed

__all__ = ["SPARK_ROOT_META", "baseline", "changes"]

SPARK_ROOT_META = "_snapcut_state.json"
"""A Spark state root's description (``snapcut.spark.state.spec.ROOT_META_FILE``;
named again here because this layer sits below the Spark one)."""
SPARK_PROTOCOL = "spark-microbatch"
INTERNAL = ("__key", "__group")
"""Encodings of key columns a Spark root stores beside them."""

EMPTY = pa.schema(
    [
        ("batch_id", pa.int64()),
        ("change_type", pa.string()),
        ("key", pa.struct([])),
        ("value", pa.struct([])),
        ("partition_id", pa.int32()),
    ]
)
"""The feed of a range without state files."""


@dataclass(frozen=True)
class _Table:
    """The vertex read, and which of its columns key a row."""

    vertex: str
    key: tuple[str, ...]


def changes(
    root: Root,
    start: int,
    end: int | None = None,
    variable: str | None = None,
    filesystem: Any = None,
    partition: int | None = None,
) -> pa.Table:
    """The changes of batches `start`..`end` (default: the newest committed),
    one row per changed key per batch (see the module). A transformWithState
    root needs `variable` (Spark's ``stateVarName``; ``"$timers"`` the timers).
    `partition`: only that state partition's changes (default: all)."""
    backend = open_root(root, filesystem)
    committed = backend.complete()
    if not committed:
        raise SnapshotError(f"no committed batch under {backend.root}")
    last = committed[-1] if end is None else end
    if start < 0 or start > last:
        raise ConfigError(
            f"change feed from batch {start} to {last}: the start must be at least 0 and at "
            f"most the end (the newest committed batch is {committed[-1]})"
        )
    if last not in committed:
        raise SnapshotError(
            f"batch {last} is not committed under {backend.root} (committed: "
            f"{committed[0]}..{committed[-1]}): pass an end batch in that range"
        )
    before = baseline(backend, committed, start)
    batches = [b for b in committed if start <= b <= last]
    table = _table(backend, last, variable)
    return _feed(backend, table, before, batches, partition)


def baseline(backend: FsBackend, committed: Sequence[int], start: int) -> int | None:
    """The committed batch whose state `start`'s changes are measured from
    (None: `start` is the root's first batch, measured from no state)."""
    earlier = [b for b in committed if b < start]
    if earlier:
        return earlier[-1]
    oldest = committed[0]
    spark = backend.manifest(oldest).get("protocol") == SPARK_PROTOCOL
    # Spark batches count from 0, checkpoints of the local runtime from 1.
    if oldest <= (0 if spark else 1):
        return None
    raise SnapshotError(
        f"the change feed of batch {start} needs the state of batch {oldest - 1}, which "
        f"retention removed from {backend.root} (oldest retained: {oldest}): start at batch "
        f"{oldest + 1} or later, or keep more batches (retain=)"
    )


def _spark_meta(backend: FsBackend) -> dict[str, Any] | None:
    path = f"{backend.root}/{SPARK_ROOT_META}"
    if not _fs.exists(backend.fs, path):
        return None
    meta: dict[str, Any] = json.loads(_fs.read_bytes(backend.fs, path))
    return meta


def _table(backend: FsBackend, batch: int, variable: str | None) -> _Table:
    """The vertex `variable` names (or the root's only one) and its key columns."""
    raw = backend.manifest_bytes(batch)
    vertices = sorted({v for v, _, _ in fmt.state_files(raw, batch)})
    meta = _spark_meta(backend)
    tables = {t["name"]: t for t in (meta or {}).get("tables", [])}
    if meta is not None and tables:
        names = ", ".join(sorted(tables))
        if variable is None:
            raise ConfigError(
                f"state root {backend.root} holds transformWithState state variables "
                f"({names}): name one with variable="
            )
        if variable not in tables:
            raise ConfigError(
                f"state root {backend.root} has no state variable {variable!r} (it has "
                f"{names}): pass one of them as variable="
            )
        key = [c for c in tables[variable]["key_columns"] if c not in INTERNAL]
        return _Table(f"{meta['vertex']}.{variable}", tuple(key))
    if meta is not None:
        if variable is not None:
            raise ConfigError(
                f"state root {backend.root} holds one state table, not state variables: "
                "leave out variable="
            )
        return _Table(str(meta["vertex"]), tuple(meta["key"]))
    # Not a Spark state root (the local runtime's): `variable` names an operator.
    if variable is None and len(vertices) == 1:
        return _Table(vertices[0], ())
    if variable is None or variable not in vertices:
        raise ConfigError(
            f"root {backend.root} has the state of operator(s) {', '.join(vertices) or 'none'}"
            + ("" if variable is None else f", not {variable!r}")
            + ": name one with variable="
        )
    return _Table(variable, ())


def _feed(
    backend: FsBackend,
    table: _Table,
    before: int | None,
    batches: Sequence[int],
    partition: int | None = None,
) -> pa.Table:
    states: dict[int, pa.Table | None] = {}
    parts: list[pa.Table] = []
    for batch in batches:
        raw = backend.manifest_bytes(batch)
        entries = {
            s: e
            for v, s, e in fmt.state_files(raw, batch)
            if v == table.vertex and partition in (None, s)
        }
        for p in sorted(entries):
            if p not in states:
                states[p] = None if before is None else backend.state(before, (table.vertex, p))
            prev, entry = states[p], entries[p]
            own = read_ipc(backend.read_checked(batch, entry))
            key = str(entry.get("key") or (own.schema.metadata or {})[KEY_METADATA.encode()])
            if entry.get("kind", "full") == "full":
                new = own
                touched = None
            elif prev is not None and entry.get("base") == _previous(batches, before, batch):
                new = rebuild_state([("full", prev), ("diff", own)])
                touched = own[key]
            else:  # a diff on an older base (rebased): the reader rebuilds it
                new = backend.state(batch, (table.vertex, p))
                touched = own[key]
            states[p] = new
            parts.append(_changes(table, key, batch, p, prev, new, touched))
    if not parts:
        return EMPTY.empty_table()
    return pa.concat_tables(parts)


def _previous(batches: Sequence[int], before: int | None, batch: int) -> int | None:
    i = list(batches).index(batch)
    return batches[i - 1] if i > 0 else before


def _changes(
    table: _Table,
    key: str,
    batch: int,
    partition: int,
    prev: pa.Table | None,
    new: pa.Table,
    touched: pa.ChunkedArray | None,
) -> pa.Table:
    """One partition's changes in one batch, in the feed's columns."""
    new = new.drop_columns([c for c in (DELETED_COLUMN,) if c in new.column_names])
    prev = new.schema.empty_table() if prev is None else prev
    if touched is not None:
        keys = touched.combine_chunks()
        prev = prev.filter(pc.is_in(prev[key], value_set=keys))
        new = new.filter(pc.is_in(new[key], value_set=keys))
    added, removed, changed = _diff_keyed(prev, new, key)
    moved = pa.concat_arrays([added[key].combine_chunks(), changed[key].combine_chunks()])
    updates = new.filter(pc.is_in(new[key], value_set=moved))
    key_cols = list(table.key) or [key]
    values = [c for c in new.column_names if c not in key_cols and not c.startswith("__")]
    n_up, n_del = updates.num_rows, removed.num_rows
    return pa.table(
        {
            "batch_id": pa.array([batch] * (n_up + n_del), pa.int64()),
            "change_type": pa.array(["update"] * n_up + ["delete"] * n_del, pa.string()),
            "key": pa.concat_arrays(
                [_struct(updates, key_cols), _struct(removed.select(new.column_names), key_cols)]
            ),
            "value": pa.concat_arrays(
                [_struct(updates, values), _struct(new.schema.empty_table(), values, n_del)]
            ),
            "partition_id": pa.array([partition] * (n_up + n_del), pa.int32()),
        }
    )


def _struct(t: pa.Table, columns: Sequence[str], nulls: int = 0) -> pa.Array:
    """`t`'s `columns` as one struct column; or `nulls` null structs of that type."""
    fields = [t.schema.field(c) for c in columns]
    if nulls:
        return pa.nulls(nulls, pa.struct(fields))
    if not fields:
        return pa.array([{}] * t.num_rows, pa.struct([]))
    return pa.StructArray.from_arrays([t[c].combine_chunks() for c in columns], fields=fields)
