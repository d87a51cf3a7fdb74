"""Reading a streaming query's Spark checkpoint (its ``checkpointLocation``):
where it is for a running query, the query id Spark keeps in ``metadata``,
and the offset log entry of a batch (``offsets/<N>``)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from snapcut import _fs
from snapcut._core import ConfigError, SnapshotError
from snapcut.spark.session_kind import is_connect

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["checkpoint_fs", "read_offsets", "read_query_id", "running_checkpoint"]


def checkpoint_fs(location: str) -> tuple[Any, str]:
    """A Hadoop-style checkpoint URI as a pyarrow filesystem and path."""
    if location.startswith("file:"):
        rest = location[len("file:") :]
        if rest.startswith("//"):
            rest = rest[2:]
        return _fs.resolve(rest)
    for scheme in ("s3a://", "s3n://"):
        if location.startswith(scheme):
            location = "s3://" + location[len(scheme) :]
    return _fs.resolve(location)


def read_query_id(checkpoint_location: str) -> str:
    """The query id Spark keeps in ``<checkpointLocation>/metadata`` (written
    when the query first starts, the same across restarts)."""
    fs, path = checkpoint_fs(checkpoint_location)
    where = f"{_fs.redact(checkpoint_location)}/metadata"
    try:
        qid = json.loads(_fs.read_bytes(fs, f"{path}/metadata")).get("id")
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"cannot read the query id from {where} ({e}): is checkpoint_location= the "
            "checkpointLocation the query was started with?"
        ) from e
    if not isinstance(qid, str) or not qid:
        raise ConfigError(f"{where} names no query id: is it a Spark checkpointLocation?")
    return qid


def running_checkpoint(batch_df: DataFrame, qid: str) -> str | None:
    """The running query's resolved checkpointLocation (PySpark classic)."""
    from pyspark.sql import SparkSession

    if is_connect(batch_df.sparkSession):
        return None  # no py4j: checkpoint_location= is required there
    for session in (SparkSession.getActiveSession(), batch_df.sparkSession):
        if session is None:
            continue
        try:
            query = session.streams.get(qid)
            if query is not None:
                return str(query._jsq.streamingQuery().resolvedCheckpointRoot())
        except Exception:
            continue
    try:
        jvm = batch_df.sparkSession._jvm
        if jvm is None:
            return None
        default = jvm.org.apache.spark.sql.SparkSession.getDefaultSession()
        if default.isDefined():
            jquery = default.get().streams().get(qid)
            if jquery is not None:
                return str(jquery.streamingQuery().resolvedCheckpointRoot())
    except Exception:
        pass
    return None


def read_offsets(checkpoint_location: str, batch_id: int) -> dict[str, Any]:
    """Spark's offset log entry of `batch_id`: ``offsets/<N>`` of the query's
    checkpointLocation (version line, batch metadata, one line per source)."""
    fs, path = checkpoint_fs(checkpoint_location)
    log = f"{path}/offsets/{batch_id}"
    try:
        text = _fs.read_bytes(fs, log).decode()
    except (OSError, FileNotFoundError) as e:
        raise SnapshotError(
            f"Spark's offset log has no readable entry for batch {batch_id} ({log}: {e}); is "
            f"{checkpoint_location} this query's checkpointLocation?"
        ) from e
    lines = text.splitlines()
    if len(lines) < 2 or not lines[0].startswith("v"):
        raise SnapshotError(f"{log} is not a Spark offset log entry")
    meta = json.loads(lines[1])
    sources: list[Any] = []
    for line in lines[2:]:
        if line.strip() == "-":
            sources.append(None)
            continue
        try:
            sources.append(json.loads(line))
        except ValueError:
            sources.append(line)
    return {
        "log": f"offsets/{batch_id}",
        "version": lines[0],
        "batch_watermark_ms": meta.get("batchWatermarkMs"),
        "batch_timestamp_ms": meta.get("batchTimestampMs"),
        "sources": sources,
    }
