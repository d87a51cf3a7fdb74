"""How a micro-batch's identity (query id, batch id) reaches the Spark tasks
that write a state root's version N.

On a classic session Spark sets the local properties ``sql.streaming.queryId``
and ``streaming.sql.batchId`` on every task of a micro-batch. Under Spark
Connect the batch DataFrame handed to ``foreachBatch`` is executed by the
server's Connect thread, and its tasks carry neither. What both session kinds
do carry is the session's SQL conf: every ``spark.*`` entry set on the
session before an action becomes a local property of that action's tasks
(``SQLExecution.withSQLConfPropagated``). So the sink, which knows the batch
id (the ``foreachBatch`` argument) and the query id, announces them in one
conf entry per state root just before its action and removes it afterwards;
a task reads its root's entry first and Spark's streaming properties second.
One code path for both session kinds, and no value is ever guessed.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from typing import Any

from snapcut import _fs
from snapcut._core import TaskError
from snapcut.spark.root import BATCH_OWNER

__all__ = ["announced", "conf_key", "is_connect", "is_connect_batch", "task_batch"]

CONF_PREFIX = "spark.snapcut.batch."
SPARK_BATCH_PROP = "streaming.sql.batchId"
SPARK_QUERY_PROP = "sql.streaming.queryId"


def conf_key(uri: str, filesystem: Any = None) -> str:
    """The conf entry that names the batch writing the state root `uri`: one
    per root, so two roots in one plan never read each other's; the resolved
    path, so ``/x/state`` and ``/x/state/`` are one root."""
    fs, path = _fs.resolve(uri, filesystem)
    digest = hashlib.sha256(f"{fs.type_name}:{path}".encode()).hexdigest()[:20]
    return CONF_PREFIX + digest


def encode(query_id: str, batch_id: int) -> str:
    return f"{int(batch_id)}/{query_id}"


def decode(value: str, key: str) -> tuple[int, str]:
    batch, sep, query = value.partition("/")
    if not sep or not query or not batch.isdigit():
        raise TaskError(
            f"conf entry {key}={value!r} is not '<batch id>/<query id>': it is set by "
            "snapcut's ArrowSnapshotSink only; do not set spark.snapcut.batch.* yourself"
        )
    return int(batch), query


@contextlib.contextmanager
def announced(session: Any, keys: list[str], query_id: str, batch_id: int) -> Iterator[None]:
    """Sets each of `keys` to (query id, batch id) on `session` for the
    duration of the block, the sink's one action. Removed afterwards, so a
    later action of the same session (the next batch's own ``count()``, say)
    never writes state under this batch's id."""
    value = encode(query_id, batch_id)
    for key in keys:
        session.conf.set(key, value)
    try:
        yield
    finally:
        for key in keys:
            with contextlib.suppress(Exception):  # a session already stopped
                session.conf.unset(key)


def task_batch(ctx: Any, streaming: bool, key: str | None = None) -> tuple[int, str]:
    """(batch id, query id) of the running task. A batch DataFrame is batch 0
    of the batch owner. In a streaming query: the sink's announcement for this
    root (`key`) if there is one, else Spark's streaming local properties;
    neither is an error, never batch 0 (state written under a wrong id breaks
    exactly-once). Where both exist they must agree."""
    if not streaming:
        return 0, BATCH_OWNER
    announced_value = None if key is None else ctx.getLocalProperty(key)
    raw_batch = ctx.getLocalProperty(SPARK_BATCH_PROP)
    query = ctx.getLocalProperty(SPARK_QUERY_PROP)
    spark_has = raw_batch is not None and query is not None
    if announced_value is not None:
        assert key is not None
        batch_id, owner = decode(str(announced_value), key)
        if spark_has and (int(raw_batch), str(query)) != (batch_id, owner):
            raise TaskError(
                f"the sink announced batch {batch_id} of query {owner} for this state root, "
                f"but Spark runs this task for batch {raw_batch} of query {query}: the state "
                "root is written by another query's plan than the sink's; give each query "
                "its own state root and pass that query's KeyedState to its sink's state="
            )
        return batch_id, owner
    if spark_has:
        return int(raw_batch), str(query)
    props = {SPARK_BATCH_PROP: raw_batch, SPARK_QUERY_PROP: query}
    missing = [name for name, value in props.items() if value is None]
    raise TaskError(
        f"the keyed_state step runs in a streaming query but its task has no batch id: no "
        f"ArrowSnapshotSink announced one for this state root, and the task lacks the local "
        f"propert(ies) {missing} that a classic Spark session sets (Spark Connect does not). "
        "Write the query with foreachBatch(ArrowSnapshotSink(..., state=<this KeyedState>)), "
        "and do not run the step's plan from a thread of your own"
    )


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
        stack.extend(v for v in vars(plan).values() if isinstance(v, LogicalPlan))
        for v in vars(plan).values():
            if isinstance(v, list | tuple):
                stack.extend(x for x in v if isinstance(x, LogicalPlan))
    return False
