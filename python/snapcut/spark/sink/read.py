"""The committed output of a sink root as a Spark DataFrame: executors
read the files (one task per file); ``update`` keeps the newest row per key."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from snapcut._core import SnapshotError
from snapcut.spark.sink.root import ORDER_COLUMN, SinkRoot, output_files, read_output_file

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["read_output"]


@dataclass(frozen=True)
class _ReadSpec:
    root: SinkRoot
    order: bool
    files: list[tuple[int, int, dict[str, Any]]] = field(default_factory=list)


def read_output(
    spark: Any, root: str | os.PathLike[str], batch: int | None = None, filesystem: Any = None
) -> DataFrame:
    """The committed output (as :func:`read_output_arrow`) as a Spark
    DataFrame; executors read the files, one task per file."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    sink = SinkRoot(root, filesystem)
    meta = sink.meta()
    manifests = sink.output_manifests(meta, batch)
    if not manifests:
        raise SnapshotError(f"sink root {sink.name} has no committed batch yet")
    schema: pa.Schema = meta["arrow_schema"]
    update = meta["output_mode"] == "update"
    files = [(i, b, f) for i, (b, f) in enumerate(output_files(manifests))]
    spec = _ReadSpec(sink, update, files)
    out_schema = schema.append(pa.field(ORDER_COLUMN, pa.int64())) if update else schema

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        backend = spec.root.backend()
        for b in batches:
            for i in b.column(0).to_pylist():
                index, batch_id, entry = spec.files[i]
                table = read_output_file(backend, batch_id, entry)
                if spec.order:
                    base = index << 32
                    order = pa.array(range(base, base + table.num_rows), pa.int64())
                    table = table.append_column(ORDER_COLUMN, order)
                yield from table.to_batches()

    spark_schema = from_arrow_schema(out_schema, prefer_timestamp_ntz=False)
    n = max(1, len(files))
    ids = spark.createDataFrame([(i,) for i in range(len(files))], "i int")
    df: DataFrame = ids.repartition(n).mapInArrow(read, spark_schema)
    if update:
        cols = [F.col(c) for c in schema.names]
        newest = F.max_by(F.struct(*cols), F.col(ORDER_COLUMN)).alias("__row")
        df = df.groupBy(*meta["key"]).agg(newest).select("__row.*")
    return df
