"""Reading a Spark state root as pyarrow, with no Spark: a partition's or
the whole state at a committed batch (the data source, :mod:`snapcut.spark.source`,
reads it into Spark with :func:`read_partition`)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from snapcut._core import ConfigError, StateTable
from snapcut.spark.keys import KEY_COLUMN
from snapcut.spark.state.partition import schema_of
from snapcut.spark.state.root import StateRoot
from snapcut.spark.state.spec import GROUP_COLUMN, RootSpec, TableLayout, table_vertex

__all__ = ["committed_batches", "read_partition", "read_state_arrow", "table_of"]


def _open(root: str | StateRoot, filesystem: Any) -> StateRoot:
    """The root a reader was given: a StateRoot as it is, a path/URI opened once."""
    if isinstance(root, StateRoot):
        return root
    return StateRoot.existing(str(root), filesystem)


def committed_batches(root: str | StateRoot, filesystem: Any = None) -> list[int]:
    """Batch ids whose state is committed (a manifest), oldest first."""
    return _open(root, filesystem).backend.complete()


def table_of(spec: RootSpec, variable: str | None, option: str = "variable=") -> TableLayout:
    """The table to read: the root's only one, or a transformWithState
    variable (`variable` names it; ``"$timers"`` the timers). `option` is how
    the caller's users name it, for the messages."""
    if not spec.tables:
        if variable is not None:
            raise ConfigError(
                f"state root {spec.uri} holds one state table, not state variables: "
                f"leave out {option}"
            )
        return spec.layout()
    if variable is None:
        names = ", ".join(t.name for t in spec.tables)
        raise ConfigError(
            f"state root {spec.uri} holds transformWithState state variables ({names}): "
            f"name one with {option}"
        )
    spec.table(variable)
    return spec.layout(table_vertex(spec.vertex, variable))


def read_partition(
    state: StateRoot, manifest: dict[str, Any], partition: int, variable: str | None = None
) -> pa.Table:
    """One partition's full state at a committed batch (key columns first)."""
    spec = state.spec
    layout = table_of(spec, variable)
    table = StateTable(schema_of(layout), layout.state_key, full_every=spec.full_every)
    chain = state.read_chain(manifest, partition, layout.vertex)
    if chain:
        table.restore(chain)
    rows = table.to_arrow()
    internal = [c for c in (KEY_COLUMN, GROUP_COLUMN) if c in rows.column_names]
    if internal:
        rows = rows.drop_columns(internal)
    order = [*spec.key, *(c for c in ("__seq", "__expiry_ms") if c in rows.column_names)]
    return rows.sort_by([(k, "ascending") for k in order])


def read_state_arrow(
    root: str | StateRoot,
    batch: int | None = None,
    filesystem: Any = None,
    variable: str | None = None,
) -> pa.Table:
    """The whole state at `batch` (default: the newest committed) as pyarrow;
    a transformWithState root: the state variable `variable`."""
    state = _open(root, filesystem)
    table_of(state.spec, variable)
    manifest = state.manifest_at(batch)
    parts = [read_partition(state, manifest, p, variable) for p in range(state.spec.partitions)]
    return pa.concat_tables(parts)
