"""``read_state(spark, root)`` and ``read_output(spark, root)``: the function
forms of the data source, for code that has a root and a session. Each is
``spark.read.format("snapcut")`` with the matching options. The same plan is
read through ``mapInArrow`` instead where the data source cannot be: a root
on a ``filesystem=`` object (string options cannot carry it), and a classic
session whose Python data source planner cannot start (Spark plans a Python
data source in a driver-side worker run with the executors' Python, which
with ``spark.archives`` in client mode is ``./environment/bin/python``, a
path that exists only in the executors' working directories), and a second
session of a driver, where Spark refuses the name (see ``register``)."""

from __future__ import annotations

import os
import shutil
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


def planner_runs(spark: Any) -> bool:
    """Whether ``format("snapcut")`` resolves in `spark` and Spark can start
    the driver-side Python worker that plans a Python data source (see the
    module)."""
    if not register(spark):
        return False
    try:
        python = str(spark.sparkContext.pythonExec)
    except Exception:  # Spark Connect: no SparkContext here; the server plans
        return True
    return os.path.isabs(python) or shutil.which(python) is not None or os.path.exists(python)


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
    direct = planner_runs(spark)
    if isinstance(root, StateRoot):
        state = root
    elif filesystem is None and direct:
        return load(spark, os.fspath(root), options)
    else:
        state = StateRoot.existing(os.fspath(root), filesystem)
    if state.spec.filesystem is None and direct:
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
    if filesystem is None and planner_runs(spark):
        return load(spark, os.fspath(root), options)
    sink = SinkRoot(root, filesystem)
    return read_planned(spark, plan_output(sink, parse({"path": sink.uri, **options})))
