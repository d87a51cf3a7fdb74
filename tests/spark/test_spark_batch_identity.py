"""The micro-batch identity's failure paths, without a Spark session: an
announcement that is malformed or disagrees with Spark's own properties, and
a checkpoint location that cannot name the running query (no ``metadata``,
no ``offsets/N``, or ``commits/N`` already written)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from snapcut._core import ConfigError, TaskError
from snapcut.spark.batch_identity import (
    CONF_KEY,
    SPARK_BATCH_PROP,
    SPARK_QUERY_PROP,
    _check_running_batch,
    task_batch,
)
from snapcut.spark.query_checkpoint import read_query_id


class Context:
    """A TaskContext's local properties."""

    def __init__(self, **props: str) -> None:
        self.props = props

    def getLocalProperty(self, name: str) -> str | None:
        return self.props.get(name)


def test_an_announced_batch_is_read_and_checked_against_sparks_properties() -> None:
    assert task_batch(Context(**{CONF_KEY: "4/q-1"}), streaming=True) == (4, "q-1")
    agreeing = {CONF_KEY: "4/q-1", SPARK_BATCH_PROP: "4", SPARK_QUERY_PROP: "q-1"}
    assert task_batch(Context(**agreeing), streaming=True) == (4, "q-1")
    other = {CONF_KEY: "4/q-1", SPARK_BATCH_PROP: "5", SPARK_QUERY_PROP: "q-1"}
    with pytest.raises(TaskError, match=r"runs for batch 5 of query q-1, but batch 4"):
        task_batch(Context(**other), streaming=True)
    for bad in ("4", "x/q-1", "4/"):
        with pytest.raises(TaskError, match="is not '<batch id>/<query id>'"):
            task_batch(Context(**{CONF_KEY: bad}), streaming=True)


def test_a_checkpoint_location_that_cannot_name_the_running_query_is_refused(
    tmp_path: Path,
) -> None:
    chk = tmp_path / "chk"
    with pytest.raises(ConfigError, match=r"cannot read the query id from .*/metadata"):
        read_query_id(str(chk))
    chk.mkdir()
    (chk / "metadata").write_text("{}")
    with pytest.raises(ConfigError, match="names no query id"):
        read_query_id(str(chk))
    (chk / "metadata").write_text(json.dumps({"id": "q-7"}))
    assert read_query_id(str(chk)) == read_query_id(chk.as_uri()) == "q-7"
    with pytest.raises(ConfigError, match=r"has no offsets/2, so batch 2 is not running"):
        _check_running_batch(str(chk), 2, "sink")
    (chk / "offsets").mkdir()
    (chk / "offsets" / "2").write_text("v1\n{}\n")
    _check_running_batch(str(chk), 2, "sink")  # planned, not committed: running
    (chk / "commits").mkdir()
    (chk / "commits" / "2").write_text("v1\n{}\n")
    with pytest.raises(ConfigError, match="has already committed batch 2"):
        _check_running_batch(str(chk), 2, "sink")
