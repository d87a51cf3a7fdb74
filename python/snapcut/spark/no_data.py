"""Spark's no-data micro-batches for snapcut's stateful step.

When the watermark advances (event-time timeouts) or on every trigger
(processing-time timeouts), Spark runs a micro-batch with no input so that
``applyInPandasWithState`` can fire timeouts
(``spark.sql.streaming.noDataMicroBatches.enabled``, default true). Spark runs
one only when a state operator of the plan asks for it
(``StateStoreWriter.shouldRunAnotherBatch``), and in it every source becomes
an empty relation, which the optimizer folds through projections and
repartitions, so a ``mapInArrow`` step over it runs no task.

Two public-API pieces make the step take part, with Spark's rules:

- the step's input goes through ``DataFrame.observe`` (a ``CollectMetrics``
  node, which the optimizer does not fold) before the repartition: over an
  empty input the repartition still yields its P partitions, so every state
  partition's task runs and fires its timeouts;
- a companion branch unioned to the step's output holds a Spark state
  operator that asks for the batch exactly when Spark's own would, and never
  sees a row (a filter that is always false and cannot be folded):
  event-time timeouts — a windowed count over the watermarked input (asks
  when the watermark advanced); processing-time timeouts —
  ``applyInPandasWithState`` with ``ProcessingTimeTimeout`` (asks on every
  trigger).

The companion costs what an empty Spark state operator costs per
micro-batch: ``spark.sql.shuffle.partitions`` small tasks and state-store
commits, and a second read of the input's event-time column.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from snapcut.spark.group_state import GroupStateTimeout

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["companion", "enabled", "keep_tasks_in_empty_batches"]

CONF = "spark.sql.streaming.noDataMicroBatches.enabled"


def enabled(df: DataFrame, timeout: str) -> bool:
    """Whether Spark would run no-data batches for a step with `timeout`."""
    if timeout == GroupStateTimeout.NoTimeout or not df.isStreaming:
        return False
    value = df.sparkSession.conf.get(CONF, "true")
    return str(value).strip().lower() != "false"


def keep_tasks_in_empty_batches(df: DataFrame, vertex: str) -> DataFrame:
    """`df` behind a ``CollectMetrics`` node (input rows, observed as
    ``snapcut_<vertex>_input``) that stops the optimizer folding an empty
    micro-batch through the step's repartition."""
    from pyspark.sql import functions as F

    return df.observe(f"snapcut_{vertex}_input", F.count(F.lit(1)).alias("rows"))


def companion(
    source: DataFrame,
    key: tuple[str, ...],
    event_time: str | None,
    delay_ms: int | None,
    timeout: str,
    output_mode: str,
    output_type: Any,
) -> DataFrame:
    """A branch with no rows whose state operator makes Spark schedule the
    no-data batches `timeout` needs; its columns are `output_type`'s."""
    from pyspark.sql import functions as F

    ticks = source
    if event_time is not None:
        ticks = ticks.withWatermark(event_time, f"{delay_ms} milliseconds")
    # Always false, and not foldable (spark_partition_id is not deterministic):
    # a folded filter would take the watermark node with it.
    ticks = ticks.where(F.spark_partition_id() < 0)
    nulls = [F.lit(None).cast(f.dataType).alias(f.name) for f in output_type.fields]
    if timeout == GroupStateTimeout.EventTimeTimeout:
        assert event_time is not None
        counted = ticks.groupBy(F.window(event_time, "36500 days")).count()
        return counted.where(F.col("count") < 0).select(*nulls)

    def never_called(_key: Any, _rows: Any, _state: Any) -> Any:
        return iter(())

    return ticks.groupBy(*key).applyInPandasWithState(
        never_called, output_type, "unused int", output_mode, timeout
    )
