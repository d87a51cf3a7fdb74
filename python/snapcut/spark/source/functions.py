"""``read_state(spark, root)`` and ``read_output(spark, root)``: the function
forms of the data source, for code that has a root and a session. Each is
``spark.read.format("snapcut")`` with the matching options; a root on a
``filesystem=`` object (which string options cannot carry) is read with the
same plan through ``mapInArrow``."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from snapcut.spark.sink.root import SinkRoot
from snapcut.spark.source.options import FORMAT, parse
from snapcut.spark.source.output_plan import plan_output
from snapcut.spark.source.register import register
from snapcut.spark.source.state_plan import plan_state
from snapcut.spark.state.root import StateRoot

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["read_output", "read_state"]


def load(spark: Any, root: str, options: dict[str, str]) -> DataFrame:
    """``spark.read.format("snapcut").options(...).load(root)``, registered first."""
    register(spark)
    df: DataFrame = spark.read.format(FORMAT).options(**options).load(root)
    return df


def read_state(
    spark: Any,
    root: str | os.PathLike[str] | StateRoot,
    batch: int | None = None,
    filesystem: Any = None,
    variable: str | None = None,
) -> DataFrame:
    """The state at `batch` (default: the newest committed) as a Spark
    DataFrame of key and state columns side by side, each state partition
    read by an executor; a transformWithState root: the state variable
    `variable`. The data source with ``columns=flat``."""
    from snapcut.spark.source.data_source import read_planned

    options = {"columns": "flat"}
    if batch is not None:
        options["batchId"] = str(batch)
    if variable is not None:
        options["variable"] = variable
    if isinstance(root, StateRoot):
        state = root
    elif filesystem is None:
        return load(spark, os.fspath(root), options)
    else:
        state = StateRoot.existing(os.fspath(root), filesystem)
    if state.spec.filesystem is None:
        return load(spark, state.spec.uri, options)
    return read_planned(spark, plan_state(state, parse({"path": state.spec.uri, **options})))


def read_output(
    spark: Any,
    root: str | os.PathLike[str],
    batch: int | None = None,
    filesystem: Any = None,
) -> DataFrame:
    """The committed output as of `batch` (default: the newest committed) as
    a Spark DataFrame, one task per file: append → all rows; update → the
    newest row per key; complete → the newest batch. The data source's read
    of a sink root."""
    from snapcut.spark.source.data_source import read_planned

    options = {} if batch is None else {"batchId": str(batch)}
    if filesystem is None:
        return load(spark, os.fspath(root), options)
    sink = SinkRoot(root, filesystem)
    return read_planned(spark, plan_output(sink, parse({"path": sink.uri, **options})))
