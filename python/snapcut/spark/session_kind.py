"""Which kind of Spark session a DataFrame belongs to: classic (py4j, a
SparkContext on this side) or Spark Connect (a client of a server)."""

from __future__ import annotations

from typing import Any

__all__ = ["is_connect", "is_connect_batch"]


def is_connect(session: Any) -> bool:
    """Whether `session` is a Spark Connect session (no SparkContext, no py4j)."""
    return type(session).__module__.startswith("pyspark.sql.connect")


def is_connect_batch(df: Any) -> bool:
    """Whether `df` derives from a micro-batch Spark Connect handed to
    ``foreachBatch``: its plan reads a DataFrame the server cached for the
    worker (``CachedRemoteRelation``), possibly below the user's own
    transformations. A plain Connect DataFrame is not a micro-batch."""
    if not is_connect(df.sparkSession):
        return False
    from pyspark.sql.connect.plan import CachedRemoteRelation, LogicalPlan

    stack, seen = [df._plan], set()
    while stack:
        plan = stack.pop()
        if id(plan) in seen:
            continue
        seen.add(id(plan))
        if isinstance(plan, CachedRemoteRelation):
            return True
        for value in vars(plan).values():
            children = value if isinstance(value, list | tuple) else [value]
            stack.extend(c for c in children if isinstance(c, LogicalPlan))
    return False
