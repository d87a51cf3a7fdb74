"""Reading a Spark state root: as pyarrow with no Spark, or as a Spark DataFrame."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from snapcut._core import ConfigError, StateTable
from snapcut.spark.keys import KEY_COLUMN
from snapcut.spark.state.partition import schema_of
from snapcut.spark.state.root import StateRoot
from snapcut.spark.state.spec import GROUP_COLUMN, RootSpec, TableLayout, table_vertex

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["committed_batches", "read_partition", "read_state", "read_state_arrow"]


def _open(root: str | StateRoot, filesystem: Any) -> StateRoot:
    """The root a reader was given: a StateRoot as it is, a path/URI opened once."""
    if isinstance(root, StateRoot):
        return root
    return StateRoot.existing(str(root), filesystem)


def committed_batches(root: str | StateRoot, filesystem: Any = None) -> list[int]:
    """Batch ids whose state is committed (a manifest), oldest first."""
    return _open(root, filesystem).backend.complete()


def _table(spec: RootSpec, variable: str | None) -> TableLayout:
    """The table to read: the root's only one, or a transformWithState
    variable (``variable=`` names it; ``"$timers"`` the timers)."""
    if not spec.tables:
        if variable is not None:
            raise ConfigError(
                f"state root {spec.uri} holds one state table, not state variables: "
                "leave out variable="
            )
        return spec.layout()
    if variable is None:
        names = ", ".join(t.name for t in spec.tables)
        raise ConfigError(
            f"state root {spec.uri} holds transformWithState state variables ({names}): "
            "name one with variable="
        )
    spec.table(variable)
    return spec.layout(table_vertex(spec.vertex, variable))


def read_partition(
    state: StateRoot, manifest: dict[str, Any], partition: int, variable: str | None = None
) -> pa.Table:
    """One partition's full state at a committed batch (key columns first)."""
    spec = state.spec
    layout = _table(spec, variable)
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
    _table(state.spec, variable)
    manifest = state.manifest_at(batch)
    parts = [read_partition(state, manifest, p, variable) for p in range(state.spec.partitions)]
    return pa.concat_tables(parts)


def read_state(
    spark: Any,
    root: str | StateRoot,
    batch: int | None = None,
    filesystem: Any = None,
    variable: str | None = None,
) -> DataFrame:
    """The state at `batch` (default: the newest committed) as a Spark
    DataFrame, each partition read by an executor in parallel; a
    transformWithState root: the state variable `variable`."""
    from pyspark.sql.pandas.types import from_arrow_schema

    state = _open(root, filesystem)
    spec = state.spec
    manifest = state.manifest_at(batch)
    schema = schema_of(_table(spec, variable))
    for internal in (KEY_COLUMN, GROUP_COLUMN):
        if internal in schema.names:
            schema = schema.remove(schema.get_field_index(internal))

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            for p in b.column(0).to_pylist():
                yield from read_partition(state, manifest, p, variable).to_batches()

    ids = spark.createDataFrame([(p,) for p in range(spec.partitions)], "p int")
    out_type = from_arrow_schema(schema, prefer_timestamp_ntz=False)
    out: DataFrame = ids.repartition(spec.partitions).mapInArrow(read, out_type)
    return out
