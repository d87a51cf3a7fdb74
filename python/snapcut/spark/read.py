"""Reading a Spark state root: as pyarrow with no Spark, or as a Spark DataFrame."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from snapcut._core import SnapshotError, StateTable
from snapcut.spark.keys import KEY_COLUMN
from snapcut.spark.root import RootSpec, StateRoot, spec_of

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


def read_partition(spec: RootSpec, manifest: dict[str, Any], partition: int) -> pa.Table:
    """One partition's full state at a committed batch (key columns first)."""
    return _read_partition(StateRoot(spec), manifest, partition)


def _read_partition(state: StateRoot, manifest: dict[str, Any], partition: int) -> pa.Table:
    spec = state.spec
    table = StateTable(spec.schema, spec.state_key, full_every=spec.full_every)
    table.restore(state.read_chain(manifest, partition))
    rows = table.to_arrow()
    if KEY_COLUMN in rows.column_names:
        rows = rows.drop_columns([KEY_COLUMN])
    return rows.sort_by([(k, "ascending") for k in spec.key])


def read_state_arrow(root: str, batch: int | None = None, filesystem: Any = None) -> pa.Table:
    """The whole state at `batch` (default: the newest committed) as pyarrow."""
    spec = spec_of(root, filesystem)
    state = StateRoot(spec)
    manifest = _resolve_batch(state, batch)
    parts = [_read_partition(state, manifest, p) for p in range(spec.partitions)]
    return pa.concat_tables(parts)


def read_state(
    spark: Any, root: str, batch: int | None = None, filesystem: Any = None
) -> DataFrame:
    """The state at `batch` (default: the newest committed) as a Spark
    DataFrame, each partition read by an executor in parallel."""
    from pyspark.sql.pandas.types import from_arrow_schema

    spec = spec_of(root, filesystem)
    manifest = _resolve_batch(StateRoot(spec), batch)
    schema = spec.schema
    if KEY_COLUMN in schema.names:
        schema = schema.remove(schema.get_field_index(KEY_COLUMN))

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            for p in b.column(0).to_pylist():
                yield from read_partition(spec, manifest, p).to_batches()

    ids = spark.createDataFrame([(p,) for p in range(spec.partitions)], "p int")
    out_type = from_arrow_schema(schema, prefer_timestamp_ntz=False)
    out: DataFrame = ids.repartition(spec.partitions).mapInArrow(read, out_type)
    return out
