"""Reading a Spark state root: as pyarrow with no Spark, or as a Spark DataFrame."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from snapcut._core import ConfigError, SnapshotError, StateTable
from snapcut.spark.keys import KEY_COLUMN
from snapcut.spark.partition import schema_of
from snapcut.spark.root import RootSpec, StateRoot, TableLayout, spec_of, table_vertex
from snapcut.spark.tws.variables import GROUP_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["committed_batches", "read_partition", "read_state", "read_state_arrow"]


def committed_batches(root: str, filesystem: Any = None) -> list[int]:
    """Batch ids whose state is committed (a manifest), oldest first."""
    return StateRoot(spec_of(root, filesystem)).backend.complete()


def _resolve_batch(state: StateRoot, batch: int | None) -> dict[str, Any]:
    batches = state.backend.complete()
    if not batches:
        raise SnapshotError(f"state root {state.name} has no committed batch yet")
    wanted = batches[-1] if batch is None else batch
    manifest = state.manifest(wanted)
    if manifest is None:
        raise SnapshotError(
            f"batch {wanted} is not committed (or not retained) in state root "
            f"{state.name}; committed batches: {batches}"
        )
    return manifest


def read_partition(
    spec: RootSpec, manifest: dict[str, Any], partition: int, variable: str | None = None
) -> pa.Table:
    """One partition's full state at a committed batch (key columns first)."""
    return _read_partition(StateRoot(spec), manifest, partition, variable)


def _table(spec: RootSpec, variable: str | None) -> TableLayout:
    """The table to read: the root's only one, or a transformWithState
    variable (``variable=`` names it; ``"$timers"`` the timers)."""
    if not spec.tables:
        if variable is not None:
            raise ConfigError(
                f"state root {spec.uri} holds one state table, not state variables: "
                "leave out variable="
            )
        return spec.layouts()[0]
    if variable is None:
        names = ", ".join(t.name for t in spec.tables)
        raise ConfigError(
            f"state root {spec.uri} holds transformWithState state variables ({names}): "
            "name one with variable="
        )
    spec.table(variable)
    return next(x for x in spec.layouts() if x.vertex == table_vertex(spec.vertex, variable))


def _read_partition(
    state: StateRoot, manifest: dict[str, Any], partition: int, variable: str | None = None
) -> pa.Table:
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
    root: str, batch: int | None = None, filesystem: Any = None, variable: str | None = None
) -> pa.Table:
    """The whole state at `batch` (default: the newest committed) as pyarrow;
    a transformWithState root: the state variable `variable`."""
    spec = spec_of(root, filesystem)
    state = StateRoot(spec)
    _table(spec, variable)
    manifest = _resolve_batch(state, batch)
    parts = [_read_partition(state, manifest, p, variable) for p in range(spec.partitions)]
    return pa.concat_tables(parts)


def read_state(
    spark: Any,
    root: str,
    batch: int | None = None,
    filesystem: Any = None,
    variable: str | None = None,
) -> DataFrame:
    """The state at `batch` (default: the newest committed) as a Spark
    DataFrame, each partition read by an executor in parallel; a
    transformWithState root: the state variable `variable`."""
    from pyspark.sql.pandas.types import from_arrow_schema

    spec = spec_of(root, filesystem)
    manifest = _resolve_batch(StateRoot(spec), batch)
    schema = schema_of(_table(spec, variable))
    for internal in (KEY_COLUMN, GROUP_COLUMN):
        if internal in schema.names:
            schema = schema.remove(schema.get_field_index(internal))

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            for p in b.column(0).to_pylist():
                yield from read_partition(spec, manifest, p, variable).to_batches()

    ids = spark.createDataFrame([(p,) for p in range(spec.partitions)], "p int")
    out_type = from_arrow_schema(schema, prefer_timestamp_ntz=False)
    out: DataFrame = ids.repartition(spec.partitions).mapInArrow(read, out_type)
    return out
