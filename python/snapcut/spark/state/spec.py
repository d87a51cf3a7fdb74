"""What a Spark state root holds, as every task needs to know it: the
root's spec (partitions, key, the state schema, the tables of a
transformWithState operator) and where each table lives (its layout).
Pickled into the tasks with the :class:`~snapcut.spark.state.root.StateRoot`."""

from __future__ import annotations

import base64
import functools
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from snapcut import _fs
from snapcut._core import ConfigError, SnapshotError
from snapcut.snapshots.run_cache import RunCacheSpec
from snapcut.spark.roots import schema_bytes, schema_from_bytes, schema_to_json

__all__ = [
    "EXPIRES_COLUMN",
    "GROUP_COLUMN",
    "ROOT_META_FILE",
    "TIMEOUT_COLUMN",
    "TIMER_COLUMN",
    "TIME_COLUMNS",
    "RootSpec",
    "TableLayout",
    "TableSpec",
    "schema_bytes",
    "schema_from_bytes",
    "table_vertex",
]

ROOT_META_FILE = "_snapcut_state.json"
ROOT_FORMAT = "snapcut-spark-state"
ROOT_FORMAT_VERSION = 1
GROUP_COLUMN = "__group"
"""The internal column of a composite-key table (list and map state) that
holds the grouping key's encoding: its rows are read and deleted together."""
TIMEOUT_COLUMN = "__timeout_ms"
"""A ``GroupState`` timeout (applyInPandasWithState, level 2): ms, or null."""
EXPIRES_COLUMN = "__expires_ms"
"""A transformWithState TTL: when the row (a value, a list element, a map
entry) expires, ms."""
TIMER_COLUMN = "__expiry_ms"
"""A transformWithState timer's time, ms (a row per timer)."""
TIME_COLUMNS = (TIMEOUT_COLUMN, EXPIRES_COLUMN, TIMER_COLUMN)
"""The internal columns that say when a row is due. A table with one keeps
its keys indexed by it (``StateTable(time_column=)``), so expiry finds the
due keys without reading the table."""


@dataclass(frozen=True)
class TableSpec:
    """One of several state tables of a root: a transformWithState operator
    keeps each state variable (and its timers) in a table of its own, written
    per partition as vertex ``<name>.<table>`` of the same checkpoints."""

    name: str
    kind: str
    """"value", "list", "map" or "timers"."""
    state_key: str
    schema: bytes
    group: str | None = None
    """The column whose rows are read and deleted together (the grouping key
    of a composite key); None for a table keyed by the grouping key itself."""
    ttl_ms: int | None = None
    key_columns: tuple[str, ...] = ()
    """The columns that key a row (they may not change on restart)."""

    @property
    def arrow_schema(self) -> pa.Schema:
        return schema_from_bytes(self.schema)

    @property
    def time_column(self) -> str | None:
        """The column its rows are due by (:data:`TIME_COLUMNS`), if any."""
        return time_column(self.schema)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "state_key": self.state_key,
            "group": self.group,
            "ttl_ms": self.ttl_ms,
            "key_columns": list(self.key_columns),
            "schema": schema_to_json(self.arrow_schema),
            "schema_ipc": base64.b64encode(self.schema).decode(),
        }

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> TableSpec:
        return cls(
            name=meta["name"],
            kind=meta["kind"],
            state_key=meta["state_key"],
            schema=base64.b64decode(meta["schema_ipc"]),
            group=meta.get("group"),
            ttl_ms=meta.get("ttl_ms"),
            key_columns=tuple(meta.get("key_columns", ())),
        )


@dataclass(frozen=True)
class TableLayout:
    """Where one state table of a root lives: its vertex in the checkpoints."""

    vertex: str
    state_key: str
    schema: bytes
    group: str | None = None
    time: str | None = None
    """The table's time column (one of :data:`TIME_COLUMNS`), if it has one."""

    @property
    def group_prefix(self) -> str | None:
        """What the keys of a table with a group column begin with (a
        spilling table finds a group's rows in its runs by it): the
        ``__group`` column's bytes (it holds the grouping key's encoding),
        else the encoding of the grouping key column itself (the composite
        key is ``encode_keys([grouping key..., sub-key...])``)."""
        if self.group is None:
            return None
        return "value" if self.group == GROUP_COLUMN else "encoding"


@dataclass(frozen=True)
class RootSpec:
    """What every task needs to know about a root; pickled into the UDF."""

    uri: str
    vertex: str
    partitions: int
    key: tuple[str, ...]
    state_key: str
    state_schema: bytes
    full_every: int
    retain: int
    filesystem: Any = field(default=None, compare=False)
    tables: tuple[TableSpec, ...] = ()
    """Several state tables (transformWithState's variables); empty for the
    one table of `state_schema` keyed by `state_key`."""
    run_cache: RunCacheSpec = field(default=RunCacheSpec(), compare=False)
    """Where a worker caches a remote root's state files (a local root's are
    mapped where they are): ``keyed_state(run_cache_size=, run_cache_dir=)``."""
    compaction: bool = field(default=True, compare=False)
    """Whether the workers merge a local root's runs off the tasks' path
    (:mod:`snapcut.spark.state.compaction`); else a commit writes a full
    every `full_every` batches."""
    compaction_cpu_share: float = field(default=1.0, compare=False)
    """Of one core, what a worker's compactor may take (0.01 to 1)."""
    compaction_bytes_per_s: int | None = field(default=None, compare=False)
    """Bytes a worker's compactor may write per second (None: no limit)."""

    @property
    def schema(self) -> pa.Schema:
        return schema_from_bytes(self.state_schema)

    @functools.cached_property
    def _layouts(self) -> tuple[TableLayout, ...]:
        if not self.tables:
            return (
                TableLayout(
                    self.vertex,
                    self.state_key,
                    self.state_schema,
                    time=time_column(self.state_schema),
                ),
            )
        return tuple(
            TableLayout(
                table_vertex(self.vertex, t.name),
                t.state_key,
                t.schema,
                t.group,
                t.time_column,
            )
            for t in self.tables
        )

    def layouts(self) -> tuple[TableLayout, ...]:
        """The root's state tables (built once per spec): vertex ``<vertex>``
        alone, or ``<vertex>.<table>`` for each of `tables`."""
        return self._layouts

    def layout(self, vertex: str | None = None) -> TableLayout:
        """The layout of table `vertex` (default: the first, the only one of
        a one-table root)."""
        layouts = self._layouts
        if vertex is None:
            return layouts[0]
        for x in layouts:
            if x.vertex == vertex:
                return x
        raise SnapshotError(f"state root {_fs.redact(self.uri)} has no state table {vertex!r}")

    def table(self, name: str) -> TableSpec:
        for t in self.tables:
            if t.name == name:
                return t
        known = [t.name for t in self.tables] or ["(none: the root holds one table)"]
        raise ConfigError(
            f"state root {_fs.redact(self.uri)} has no state variable {name!r}; it has "
            f"{', '.join(known)}"
        )

    def describe(self, operator: str) -> dict[str, Any]:
        return {
            "format": ROOT_FORMAT,
            "format_version": ROOT_FORMAT_VERSION,
            "operator": operator,
            "vertex": self.vertex,
            "partitions": self.partitions,
            "key": list(self.key),
            "state_key": self.state_key,
            "state_schema": schema_to_json(self.schema),
            "state_schema_ipc": base64.b64encode(self.state_schema).decode(),
            "full_every": self.full_every,
            **({"tables": [t.describe() for t in self.tables]} if self.tables else {}),
        }


def table_vertex(vertex: str, table: str) -> str:
    """The vertex of one of an operator's several state tables."""
    return f"{vertex}.{table}"


def time_column(schema: bytes) -> str | None:
    """The time column of a table of `schema` (IPC bytes), if it has one."""
    names = set(schema_from_bytes(schema).names)
    found = [c for c in TIME_COLUMNS if c in names]
    if len(found) > 1:
        raise SnapshotError(f"a state table has several time columns {found}; at most one")
    return found[0] if found else None
