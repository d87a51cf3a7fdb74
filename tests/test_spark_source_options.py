"""The options of ``format("snapcut")`` parsed without Spark: Spark's names
case-insensitively, typed values, and every bad combination refused with a
ConfigError naming the option (the Spark tests check the same errors reach
the user from ``load``)."""

from __future__ import annotations

import pytest

from snapcut import ConfigError
from snapcut.spark.source.options import parse


def test_spark_names_in_any_case_become_typed_values() -> None:
    opts = parse(
        {
            "PATH": "/r",
            "readchangefeed": "TRUE",
            "changeStartBatchId": "3",
            "CHANGEENDBATCHID": " 7 ",
            "stateVarName": "pages",
            "partitionid": "1",
        }
    )
    assert (opts.path, opts.change_feed, opts.change_start, opts.change_end) == ("/r", True, 3, 7)
    assert (opts.variable, opts.partition_id, opts.batch_id, opts.columns) == (
        "pages",
        1,
        None,
        "spark",
    )
    assert set(opts.given) == {
        "path",
        "readChangeFeed",
        "changeStartBatchId",
        "changeEndBatchId",
        "stateVarName",
        "partitionId",
    }
    assert parse({"path": "/r", "readRegisteredTimers": "false"}).timers is False
    assert parse({"path": "/r", "columns": "FLAT"}).columns == "flat"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "needs the root to read"),
        ({"path": "/r", "bogus": "1"}, "unknown option 'bogus'"),
        ({"path": "/r", "batchId": "x"}, "option 'batchId' must be an integer"),
        ({"path": "/r", "batchId": "-1"}, "option 'batchId' must be at least 0"),
        ({"path": "/r", "readChangeFeed": "1"}, "must be true or false"),
        ({"path": "/r", "readChangeFeed": "true"}, "needs 'changeStartBatchId'"),
        (
            {"path": "/r", "readChangeFeed": "true", "changeStartBatchId": "4", "batchId": "4"},
            "use 'changeStartBatchId'",
        ),
        (
            {
                "path": "/r",
                "readChangeFeed": "true",
                "changeStartBatchId": "5",
                "changeEndBatchId": "4",
            },
            "is after 'changeEndBatchId'",
        ),
        ({"path": "/r", "changeEndBatchId": "4"}, "applies to the change feed"),
        ({"path": "/r", "variable": "a", "stateVarName": "b"}, "name different state variables"),
        ({"path": "/r", "variable": "a", "readRegisteredTimers": "true"}, "give one of"),
        ({"path": "/r", "columns": "wide"}, "option 'columns' must be one of"),
        (
            {"path": "/r", "readChangeFeed": "true", "changeStartBatchId": "1", "columns": "flat"},
            "does not apply to the change feed",
        ),
    ],
)
def test_bad_options_are_refused_naming_the_option(options: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse(options)


def test_a_sink_root_refuses_state_options() -> None:
    parse({"path": "/r", "batchId": "2"}).refuse_state_options("/r")
    for name, value in (("variable", "v"), ("partitionId", "0"), ("columns", "flat")):
        with pytest.raises(ConfigError, match=f"option '{name}' reads a state root"):
            parse({"path": "/r", name: value}).refuse_state_options("/r")


def test_batch_reads_refuse_stream_options_and_streams_refuse_batch_ones() -> None:
    with pytest.raises(
        ConfigError, match=r"option .maxBatchesPerTrigger. applies to spark\.readStream"
    ):
        parse({"path": "/r", "maxBatchesPerTrigger": "2"}).refuse_stream_options("/r")
    with pytest.raises(ConfigError, match=r"option .batchId. does not apply to spark\.readStream"):
        parse({"path": "/r", "batchId": "2"}).refuse_batch_options("/r")
    stream = parse({"path": "/r", "maxBatchesPerTrigger": "2", "startingBatchId": "5"})
    stream.refuse_batch_options("/r")
    assert (stream.max_batches, stream.starting_batch) == (2, 5)
