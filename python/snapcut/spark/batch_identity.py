"""How a micro-batch's identity (query id, batch id) reaches the Spark tasks
that write a state root's version N.

On a classic session Spark sets the local properties ``sql.streaming.queryId``
and ``streaming.sql.batchId`` on every task of a micro-batch. Under Spark
Connect the DataFrame handed to ``foreachBatch`` is executed by the server's
Connect thread, and its tasks carry neither. What both session kinds carry is
the session's SQL conf: every ``spark.*`` entry set on the session before an
action becomes a local property of that action's tasks
(``SQLExecution.withSQLConfPropagated``). So whoever runs the batch's actions
inside ``foreachBatch`` — the sink, or :func:`foreach_batch` around a
function of the user's — announces (batch id, query id) in one conf entry for
the duration of the call and removes it afterwards; a task reads that entry
first and Spark's streaming properties second. One code path for both
session kinds, and no value is ever guessed.

The query id (stable across restarts) comes from the local property a
classic session sets on the ``foreachBatch`` thread, else from
``<checkpointLocation>/metadata``, where Spark keeps it: under Connect
``foreachBatch`` is told neither, so there the checkpointLocation must be
passed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from snapcut import _fs
from snapcut._core import ConfigError, TaskError
from snapcut.spark.query_checkpoint import checkpoint_fs, read_query_id
from snapcut.spark.roots import BATCH_OWNER
from snapcut.spark.session_kind import is_connect, is_connect_batch

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "ForeachBatch",
    "announced",
    "foreach_batch",
    "query_id",
    "task_batch",
]

CONF_KEY = "spark.snapcut.microBatch"
SPARK_BATCH_PROP = "streaming.sql.batchId"
SPARK_QUERY_PROP = "sql.streaming.queryId"


# -- the task side -------------------------------------------------------------


def task_batch(ctx: Any, streaming: bool) -> tuple[int, str]:
    """(batch id, query id) of the running task. A batch DataFrame is batch 0
    of the batch owner. In a streaming query: the announced batch if there
    is one, else Spark's streaming local properties; neither is an error,
    never batch 0 (state written under a wrong id breaks exactly-once).
    Where both exist they must agree."""
    if not streaming:
        return 0, BATCH_OWNER
    announcement = ctx.getLocalProperty(CONF_KEY)
    raw_batch = ctx.getLocalProperty(SPARK_BATCH_PROP)
    query = ctx.getLocalProperty(SPARK_QUERY_PROP)
    spark_has = raw_batch is not None and query is not None
    if announcement is not None:
        batch_id, owner = _decode(str(announcement))
        if spark_has and (int(raw_batch), str(query)) != (batch_id, owner):
            raise TaskError(
                f"this task runs for batch {raw_batch} of query {query}, but batch {batch_id} "
                f"of query {owner} was announced for it ({CONF_KEY}): the entry is left over "
                "from another query; set spark.snapcut.* only through snapcut"
            )
        return batch_id, owner
    if spark_has:
        return int(raw_batch), str(query)
    props = {SPARK_BATCH_PROP: raw_batch, SPARK_QUERY_PROP: query}
    missing = [name for name, value in props.items() if value is None]
    raise TaskError(
        f"the keyed_state step runs in a streaming query but its task has no batch id: it lacks "
        f"the local propert(ies) {missing} that a classic Spark session sets (Spark Connect "
        "does not), and no batch was announced. Under Spark Connect write the query with "
        "foreachBatch(ArrowSnapshotSink(..., checkpoint_location=...)) or wrap your own "
        "function: foreachBatch(snapcut.spark.foreach_batch(func, checkpoint_location=...)); "
        "and do not run the step's plan from a thread of your own"
    )


def _encode(query: str, batch_id: int) -> str:
    return f"{int(batch_id)}/{query}"


def _decode(value: str) -> tuple[int, str]:
    batch, sep, query = value.partition("/")
    if not sep or not query or not batch.isdigit():
        raise TaskError(
            f"{CONF_KEY}={value!r} is not '<batch id>/<query id>': it is set by snapcut "
            "(the sink, foreach_batch) only; unset it"
        )
    return int(batch), query


# -- the foreachBatch side -----------------------------------------------------


@contextlib.contextmanager
def announced(session: Any, query: str, batch_id: int) -> Iterator[None]:
    """Announces (batch id, query id) to the tasks of every action `session`
    runs in the block. Removed afterwards, so an action run later on the
    session never writes state under this batch's id."""
    session.conf.set(CONF_KEY, _encode(query, batch_id))
    try:
        yield
    finally:
        with contextlib.suppress(Exception):  # a session already stopped
            session.conf.unset(CONF_KEY)


def query_id(batch_df: DataFrame, batch_id: int, checkpoint_location: str | None, what: str) -> str:
    """The id of the streaming query `batch_df` (its batch `batch_id`) is a
    micro-batch of, or the batch owner for a plain DataFrame. `what` names
    the caller in errors."""
    spark_id = _local_query_id(batch_df)
    in_query = spark_id is not None or is_connect_batch(batch_df)
    if in_query and checkpoint_location is not None:
        meta_id = read_query_id(checkpoint_location)
        if spark_id is not None and spark_id != meta_id:
            raise ConfigError(
                f"{what}: checkpoint_location={_fs.redact(checkpoint_location)} belongs to "
                f"query {meta_id}, but this batch is of query {spark_id}: pass the "
                "checkpointLocation of the query that runs it"
            )
        if spark_id is None:
            _check_running_batch(checkpoint_location, batch_id, what)
        return meta_id
    if spark_id is not None:
        return spark_id
    if in_query:
        raise ConfigError(
            f"{what}: cannot determine the streaming query's id: under Spark Connect, "
            "foreachBatch is told neither the query id nor its checkpointLocation. Pass the "
            "writeStream's checkpointLocation as checkpoint_location="
        )
    return BATCH_OWNER


def _check_running_batch(checkpoint_location: str, batch_id: int, what: str) -> None:
    """Where nothing names the running query (Spark Connect), a checkpoint
    location of another query is caught by its logs: while batch N runs,
    its query has written ``offsets/N`` and not yet ``commits/N`` (a batch
    re-run after a restart is one whose commit is missing)."""
    fs, path = checkpoint_fs(checkpoint_location)
    where = _fs.redact(checkpoint_location)
    if not _fs.exists(fs, f"{path}/offsets/{batch_id}"):
        raise ConfigError(
            f"{what}: checkpoint_location={where} has no offsets/{batch_id}, so batch "
            f"{batch_id} is not running there: pass the checkpointLocation of the query "
            "that runs this foreachBatch"
        )
    if _fs.exists(fs, f"{path}/commits/{batch_id}"):
        raise ConfigError(
            f"{what}: checkpoint_location={where} has already committed batch {batch_id}, so "
            "it is not the query running it: pass the checkpointLocation of the query that "
            "runs this foreachBatch"
        )


def _local_query_id(batch_df: DataFrame) -> str | None:
    if is_connect(batch_df.sparkSession):
        return None  # no SparkContext on this side
    qid = batch_df.sparkSession.sparkContext.getLocalProperty(SPARK_QUERY_PROP)
    return str(qid) if qid else None


class ForeachBatch:
    """A ``foreachBatch`` function that runs `func` with its batch announced
    (see the module's docstring); picklable, as Spark Connect ships it to the
    server's worker."""

    def __init__(
        self, func: Callable[[DataFrame, int], Any], checkpoint_location: str | None
    ) -> None:
        if not callable(func):
            raise ConfigError(f"foreach_batch takes a function (batch_df, batch_id), got {func!r}")
        self.func = func
        self.checkpoint_location = checkpoint_location

    def __call__(self, batch_df: DataFrame, batch_id: int) -> Any:
        owner = query_id(batch_df, batch_id, self.checkpoint_location, "foreach_batch")
        with announced(batch_df.sparkSession, owner, int(batch_id)):
            return self.func(batch_df, batch_id)


def foreach_batch(
    func: Callable[[DataFrame, int], Any], *, checkpoint_location: str | None = None
) -> ForeachBatch:
    """Wraps your own ``foreachBatch`` function so the ``keyed_state`` steps
    its actions run write state under the micro-batch's id on Spark Connect
    too: ``q = out.writeStream.foreachBatch(foreach_batch(func,
    checkpoint_location=chk)).option("checkpointLocation", chk).start()``.
    ``checkpoint_location``: the query's, needed under Connect (it holds the
    query id); on a classic session it is checked against the running query.
    :class:`ArrowSnapshotSink` does this itself."""
    return ForeachBatch(func, checkpoint_location)
