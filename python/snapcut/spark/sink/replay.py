"""A re-delivered micro-batch the sink already committed: its DataFrame is
still run to its end, writing nothing.

Spark (4.1 and later) checks after each micro-batch of a stateful query
with a ``foreachBatch`` sink that every partition of every Spark state
store committed (``spark.sql.streaming.stateStore.commitValidation.enabled``,
on by default), and fails the query if not: a ``foreachBatch`` function that
returns without running its DataFrame commits none of them. A query with an
event-time or processing-time timeout has such a store (the companion that
makes Spark run no-data micro-batches, :mod:`snapcut.spark.no_data`), as
has any query with a Spark stateful operator of its own; restarted after
the sink committed batch N and before Spark did, it failed on the replay.

Running the DataFrame runs the batch's ``keyed_state`` step again from
version N-1: it writes the same version N (its files are deterministic), as
it does when a restart comes before the sink's commit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["COMMIT_VALIDATION", "run_replayed_batch"]

COMMIT_VALIDATION = "spark.sql.streaming.stateStore.commitValidation.enabled"


def run_replayed_batch(batch_df: DataFrame) -> bool:
    """Runs `batch_df` to its end into Spark's ``noop`` sink unless Spark's
    commit validation is off; whether it ran."""
    value = batch_df.sparkSession.conf.get(COMMIT_VALIDATION, "true")
    if str(value).strip().lower() == "false":
        return False
    batch_df.write.format("noop").mode("overwrite").save()
    return True
