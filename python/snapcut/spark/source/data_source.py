"""``spark.read.format("snapcut")`` and ``spark.readStream.format("snapcut")``:
Spark's Python data source over snapcut roots.

Spark calls :meth:`SnapcutDataSource.schema` at analysis and
:meth:`~SnapcutDataSource.reader` / ``partitions`` at planning, each in a
Python worker of its own: both read only the root's meta file and manifests
(every option is checked there, so a bad one fails the ``load``, never as an
empty DataFrame). Executors run ``read`` for one state partition or one
output file each. The root kind decides what is read: a state root
(``keyed_state``'s) gives a version or the change feed, a sink root
(``ArrowSnapshotSink``'s) its committed output, and as a streaming source its
committed batches, once each.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from snapcut._core import ConfigError, SnapshotError
from snapcut.spark.sink.root import SINK_META_FILE, SinkRoot
from snapcut.spark.source.options import FORMAT, ReadOptions, parse
from snapcut.spark.source.output_plan import OutputPlan, plan_output
from snapcut.spark.source.state_plan import StatePlan, plan_state
from snapcut.spark.state.root import StateRoot
from snapcut.spark.state.spec import ROOT_META_FILE

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.datasource import DataSourceStreamReader
    from pyspark.sql.types import StructType

__all__ = ["FORMAT", "SnapcutDataSource", "plan", "read_planned", "spark_schema"]


Plan = StatePlan | OutputPlan


def open_root(opts: ReadOptions) -> StateRoot | SinkRoot:
    """The root `opts` names, by the meta file it holds."""
    sink = SinkRoot(opts.path)
    if sink.dir.exists(SINK_META_FILE):
        return sink
    if sink.dir.exists(ROOT_META_FILE):
        return StateRoot.existing(opts.path)
    raise SnapshotError(
        f"{sink.name} is neither a snapcut state root ({ROOT_META_FILE}) nor a sink root "
        f"({SINK_META_FILE}): load the root a keyed_state or an ArrowSnapshotSink wrote"
    )


def plan(opts: ReadOptions, root: StateRoot | SinkRoot | None = None) -> Plan:
    """The read `opts` asks for, planned on `root` (default: the root `opts`
    names, opened on its URI)."""
    root = open_root(opts) if root is None else root
    if isinstance(root, SinkRoot):
        return plan_output(root, opts)
    return plan_state(root, opts)


def arrow_schema(p: Plan) -> pa.Schema:
    return p.schema if isinstance(p, OutputPlan) else p.schema()


def spark_schema(schema: pa.Schema) -> StructType:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema, prefer_timestamp_ntz=False)


class _Partition(InputPartition):
    """One state partition or one output file."""


class SnapcutReader(DataSourceReader):
    """A batch read: the plan is made once, here, and pickled to the executors."""

    def __init__(self, p: Plan) -> None:
        self.plan = p

    def partitions(self) -> Sequence[InputPartition]:
        ids = self.plan.partitions
        return [_Partition(i) for i in ids]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from self.plan.read(int(partition.value))


class SnapcutDataSource(DataSource):
    """Spark's name for it: ``format("snapcut")``; see the module."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def _options(self) -> ReadOptions:
        return parse(dict(self.options))

    def schema(self) -> StructType:
        opts = self._options()
        root = open_root(opts)
        if isinstance(root, SinkRoot):
            # No committed batch needed: a streaming reader may start first.
            opts.refuse_state_options(root.name)
            return spark_schema(root.output_meta()["arrow_schema"])
        return spark_schema(plan_state(root, opts).schema())

    def reader(self, schema: StructType) -> DataSourceReader:
        return SnapcutReader(plan(self._options()))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from snapcut.spark.source.stream import SinkStreamReader

        opts = self._options()
        root = open_root(opts)
        if not isinstance(root, SinkRoot):
            raise ConfigError(
                f"readStream.format('snapcut') reads a sink root's committed batches, and "
                f"{opts.path} is a state root: load an ArrowSnapshotSink root, or read the "
                "state with spark.read (readChangeFeed for its changes)"
            )
        return SinkStreamReader(root, opts)


def read_planned(spark: Any, p: Plan) -> DataFrame:
    """The read of plan `p` without the data source API, for a root on a
    filesystem object (which string options cannot carry): the same plan,
    its partitions read by executors through ``mapInArrow``."""
    ids = list(p.partitions)

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            for i in b.column(0).to_pylist():
                yield from p.read(i)

    frame = spark.createDataFrame([(i,) for i in ids], "i int")
    df: DataFrame = frame.repartition(max(1, len(ids))).mapInArrow(
        read, spark_schema(arrow_schema(p))
    )
    return df
