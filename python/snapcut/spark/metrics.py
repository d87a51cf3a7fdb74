"""The stateful step's figures in Spark's query progress.

snapcut's step is a ``mapInArrow`` stage, not a Spark state operator, so
``StreamingQueryProgress.stateOperators`` does not list it. Each task ends
its output with one metrics row (marked by :data:`FLAG`); the step sums them
with ``DataFrame.observe`` under the name ``snapcut_<name>`` and drops them,
so ``query.lastProgress["observedMetrics"]["snapcut_<name>"]`` holds, per
micro-batch: rows in, rows out, late rows dropped, keys timed out, state rows
(keys held after the batch), state bytes written and the slowest state write,
the tables written whole in a commit and the merged runs commits adopted
(:mod:`snapcut.spark.state.compaction`); the most runs one partition's
table is made of after its commit (what a cold task reads) and the bytes of
the diff runs on the partitions' fulls (compaction's debt), and the merges
the workers' compactors finished and the time they spent merging since the
worker's task before;
the state cache's hits (a task found its partition's tables in its worker)
and misses (it read them from the root), the bytes those misses read and
the slowest one's time to read and restore; and, for tables with a memory
budget (``keyed_state(state_memory=...)``), flushes to local runs and the
rows they took, merges of those runs, keys looked up in the runs and found
there, and the most runs a table had; and the input rows tasks spilled to
local files by key hash, to apply a batch larger than a worker's input share
in parts (:mod:`snapcut.spark.state.key_parts`); and, on a remote root, the
state files cold tasks found in the local run cache, fetched into it, and
the bytes fetched (:mod:`snapcut.snapshots.run_cache`). :func:`observed` reads one step's
figures out of a progress, on classic Spark and Spark Connect alike.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "FIELDS",
    "FLAG",
    "MAXIMA",
    "internal_schema",
    "metrics_batch",
    "observe_and_strip",
    "observed",
]

FLAG = "__snapcut_metrics"
FIELDS = (
    "rows_in",
    "rows_out",
    "late_rows_dropped",
    "keys_timed_out",
    "state_rows",
    "state_bytes_written",
    "state_fulls_written",
    "state_compactions_adopted",
    "state_write_ms_max",
    "state_cache_hits",
    "state_cache_misses",
    "state_bytes_read",
    "state_load_ms_max",
    "state_times_stored",
    "state_flushes",
    "state_rows_flushed",
    "state_merges",
    "state_run_probes",
    "state_run_hits",
    "state_runs_max",
    "state_stored_runs_max",
    "state_compaction_debt_bytes",
    "state_compactions_merged",
    "state_compaction_ms",
    "input_rows_spilled",
    "state_run_cache_hits",
    "state_run_cache_misses",
    "state_run_cache_bytes_fetched",
)
MAXIMA = frozenset(
    {"state_write_ms_max", "state_load_ms_max", "state_runs_max", "state_stored_runs_max"}
)
"""Figures the step reports as the largest task's, not the sum."""


def observation_name(vertex: str) -> str:
    return f"snapcut_{vertex}"


def internal_schema(output: pa.Schema) -> pa.Schema:
    """The stage's Arrow output: the user's columns (nullable: the metrics row
    has none of them) and :data:`FLAG`, the figures as a JSON object in the
    metrics row and null in every other. One narrow column: a null string
    costs a data row its validity bit and offset, where a column per figure
    sent 8 zero bytes a figure a row to the JVM."""
    fields = [f.with_nullable(True) for f in output]
    fields.append(pa.field(FLAG, pa.string()))
    return pa.schema(fields)


def metrics_batch(schema: pa.Schema, figures: dict[str, int]) -> pa.RecordBatch:
    """The one metrics row a task emits after its output, in `schema`
    (:func:`internal_schema`)."""
    row = {FLAG: json.dumps({name: int(figures[name]) for name in FIELDS})}
    return pa.RecordBatch.from_pylist([row], schema=schema)


def with_null_metrics(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """An output batch with :data:`FLAG` null."""
    arrays = [*batch.columns, pa.nulls(batch.num_rows, pa.string())]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def observe_and_strip(df: DataFrame, vertex: str, output: pa.Schema) -> DataFrame:
    """Sums the metrics rows into the observation ``snapcut_<vertex>`` and
    returns the user's rows and columns only."""
    from pyspark.sql import functions as F

    # One aggregate (the tasks' metrics rows, one a task) and each figure
    # folded out of it. A column and an aggregate a figure made a level-1
    # batch ~10 % slower at 21 figures, outside the Python worker
    # (bench/results/state_store/no_regression/).
    rows = F.collect_list(F.col(FLAG))

    def fold(name: str) -> Any:
        figures = F.transform(rows, lambda j: F.get_json_object(j, f"$.{name}").cast("long"))
        if name in MAXIMA:
            return F.coalesce(F.array_max(figures), F.lit(0))
        return F.aggregate(figures, F.lit(0).cast("long"), lambda acc, x: acc + x)

    sums = [fold(n).alias(n) for n in FIELDS]
    observed = df.observe(observation_name(vertex), *sums)
    return observed.where(F.col(FLAG).isNull()).select(*[F.col(n) for n in output.names])


def observed(progress: Any, vertex: str) -> dict[str, Any] | None:
    """Step `vertex`'s figures in one query progress (``query.recentProgress``
    item) as a dict; None if the progress has none (a batch with no data).
    Classic Spark gives a Row of the figures; Spark Connect's progress JSON a
    Row of its ``values`` and ``schema``."""
    row = (progress["observedMetrics"] or {}).get(observation_name(vertex))
    if row is None:
        return None
    d = row.asDict() if hasattr(row, "asDict") else dict(row)
    if set(d) == {"values", "schema"}:
        names = [f["name"] for f in d["schema"]["fields"]]
        return dict(zip(names, d["values"], strict=True))
    return d
