"""``spark.read.format("snapcut")`` on classic sessions and Spark Connect:
versions and time travel of a level-1 and a transformWithState root, their
change feed (equal to the row-by-row difference of the versions), timers,
one partition, the flat columns of ``read_state``, a sink root's committed
output, and every bad option refused at planning with a typed error. The
roots are built once (tests/spark/source_roots.py) and read by both kinds of
session; local-cluster reads them in test_spark_cluster.py."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from source_roots import (
    BATCHES,
    VARIABLES,
    SourceRoots,
    assert_feed_matches_versions,
    build,
    read,
)

import snapcut.spark
from snapcut import snapshots
from snapcut.spark import read_output, read_output_arrow, read_state, read_state_arrow
from spark_support import start_session

SESSION_KINDS = True  # tests/conftest.py: both_sessions tests also run on Connect
_BUILT: dict[str, SourceRoots] = {}


@pytest.fixture(scope="module")
def spark(request: pytest.FixtureRequest) -> Iterator[Any]:
    session = start_session("local[2]", kind=request.param)
    snapcut.spark.register(session)
    yield session
    session.stop()


@pytest.fixture
def roots(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> SourceRoots:
    """Built by the first session kind, read by both (they are only files)."""
    if "roots" not in _BUILT:
        _BUILT["roots"] = build(spark, tmp_path_factory.mktemp("source"))
    return _BUILT["roots"]


def by_key(table: pa.Table) -> dict[str, Any]:
    return {str(r["key"]): (r["value"], r["partition_id"]) for r in table.to_pylist()}


@pytest.mark.both_sessions
def test_level1_versions_time_travel_and_change_feed(spark: Any, roots: SourceRoots) -> None:
    newest = read(spark, roots.level1).toArrow()
    assert newest.column_names == ["key", "value", "partition_id"]
    flat = read_state_arrow(str(roots.level1))
    values = [c for c in flat.column_names if c != "user" and not c.startswith("__")]
    assert "count" in values
    assert {r["key"]["user"]: r["value"] for r in newest.to_pylist()} == {
        r["user"]: {c: r[c] for c in values} for r in flat.to_pylist()
    }
    # Time travel: batchId N is read_state_arrow's batch N.
    for b in (0, 4):
        old = read(spark, roots.level1, batchId=b).toArrow()
        want = read_state_arrow(str(roots.level1), batch=b)
        assert sorted(r["key"]["user"] for r in old.to_pylist()) == sorted(want["user"].to_pylist())
    counts = assert_feed_matches_versions(spark, roots.level1)
    assert counts["update"] > 0
    # The default end is the newest batch.
    to_end = read(spark, roots.level1, readChangeFeed=True, changeStartBatchId=BATCHES - 1)
    assert set(to_end.toArrow()["batch_id"].to_pylist()) == {BATCHES - 1}
    # One partition alone.
    one = read(spark, roots.level1, partitionId=1).toArrow()
    assert set(one["partition_id"].to_pylist()) == {1}
    assert 0 < one.num_rows < newest.num_rows


@pytest.mark.both_sessions
@pytest.mark.parametrize("variable", VARIABLES)
def test_tws_change_feed_per_variable(spark: Any, roots: SourceRoots, variable: str) -> None:
    counts = assert_feed_matches_versions(spark, roots.tws, variable=variable)
    # Churn clears counts and lists and removes map keys: the feed has deletes.
    assert counts["update"] > 0 and counts["delete"] > 0
    # Spark's name for the option reads the same.
    assert by_key(read(spark, roots.tws, stateVarName=variable).toArrow()) == by_key(
        read(spark, roots.tws, variable=variable).toArrow()
    )


@pytest.mark.both_sessions
def test_registered_timers_and_flat_columns(spark: Any, roots: SourceRoots) -> None:
    timers = read(spark, roots.tws, readRegisteredTimers=True).toArrow()
    # Every key that got rows holds its one timer, an hour ahead.
    keys = {r["id"] for r in read_state_arrow(str(roots.tws), variable="$timers").to_pylist()}
    assert {r["key"]["id"] for r in timers.to_pylist()} == keys and len(keys) == 12
    assert timers.column_names == ["key", "expiration_timestamp_ms", "partition_id"]
    assert timers.num_rows == 12
    assert min(timers["expiration_timestamp_ms"].to_pylist()) > time.time() * 1000
    # columns=flat is read_state's form, equal to the pyarrow reader.
    flat = read_state(spark, str(roots.tws), variable="words").toArrow()
    want = read_state_arrow(str(roots.tws), variable="words")
    assert flat.column_names == want.column_names
    assert sorted(map(str, flat.to_pylist())) == sorted(map(str, want.to_pylist()))
    flat1 = read_state(spark, str(roots.level1), batch=2).toArrow()
    assert (
        flat1.sort_by("user").to_pylist()
        == read_state_arrow(str(roots.level1), batch=2).sort_by("user").to_pylist()
    )


@pytest.mark.both_sessions
def test_sink_root_reads_committed_output(spark: Any, roots: SourceRoots) -> None:
    def users(t: pa.Table) -> list[tuple[Any, ...]]:
        return sorted((r["user"], r["count"], r["total"]) for r in t.to_pylist())

    for batch in (None, 3):
        options = {} if batch is None else {"batchId": batch}
        got = read(spark, roots.sink, **options).toArrow()
        want = read_output_arrow(str(roots.sink), batch=batch)
        # update mode: the newest row per key, no key twice.
        assert users(got) == users(want)
        assert len({r["user"] for r in got.to_pylist()}) == got.num_rows
        assert users(read_output(spark, str(roots.sink), batch=batch).toArrow()) == users(want)
    assert snapshots.open(str(roots.sink)).list() == list(range(BATCHES))


BAD_STATE = [
    ({"nope": 1}, "unknown option 'nope'"),
    ({"readChangeFeed": True}, "needs 'changeStartBatchId'"),
    (
        {"readChangeFeed": True, "changeStartBatchId": 5, "changeEndBatchId": 3},
        "'changeStartBatchId' \\(5\\) is after 'changeEndBatchId' \\(3\\)",
    ),
    ({"readChangeFeed": True, "changeStartBatchId": 99}, "is after the newest committed batch"),
    ({"changeStartBatchId": 2}, "add .option\\('readChangeFeed', 'true'\\)"),
    ({"readChangeFeed": "yes", "changeStartBatchId": 2}, "must be true or false"),
    ({"batchId": 99}, "option 'batchId' is 99"),
    ({"batchId": "two"}, "option 'batchId' must be an integer"),
    ({"variable": "count"}, "holds one state table, not state variables"),
    ({"partitionId": 2}, "option 'partitionId' is 2, but state root .* has 2 partitions"),
    ({"readRegisteredTimers": True}, "has no timers"),
    ({"columns": "wide"}, "option 'columns' must be one of"),
]


@pytest.mark.both_sessions
@pytest.mark.parametrize(("options", "message"), BAD_STATE)
def test_bad_options_fail_at_planning(
    spark: Any, roots: SourceRoots, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(Exception, match=message) as failure:
        # .schema plans the read on both session kinds (Connect analyses lazily).
        read(spark, roots.level1, **options).schema  # noqa: B018
    assert "ConfigError" in str(failure.value)


@pytest.mark.both_sessions
def test_roots_of_the_wrong_kind_and_old_batches(
    spark: Any, roots: SourceRoots, tmp_path: Path
) -> None:
    cases = [
        (roots.sink, {"variable": "count"}, "option 'variable' reads a state root"),
        (roots.sink, {"readChangeFeed": True, "changeStartBatchId": 1}, "is a sink root"),
        (roots.tws, {}, "name one with option 'variable'"),
        (roots.tws, {"variable": "nope"}, "no state variable 'nope'"),
    ]
    for root, options, message in cases:
        with pytest.raises(Exception, match=message):
            read(spark, root, **options).schema  # noqa: B018
    with pytest.raises(Exception, match="neither a snapcut state root"):
        read(spark, tmp_path).schema  # noqa: B018
    with pytest.raises(Exception, match="option 'batchId' is 40, which sink root"):
        read(spark, roots.sink, batchId=40).collect()


@pytest.mark.both_sessions
def test_batches_retention_removed_are_refused(
    spark: Any, roots: SourceRoots, tmp_path: Path
) -> None:
    pruned = tmp_path / "pruned"
    shutil.copytree(roots.level1, pruned)
    snapshots.prune(str(pruned), keep=3)
    kept = snapshots.open(str(pruned)).list()
    assert kept[-1] == BATCHES - 1 and 1 not in kept
    with pytest.raises(Exception, match=r"option 'batchId' is 1, .* no longer retains"):
        read(spark, pruned, batchId=1).schema  # noqa: B018
    with pytest.raises(Exception, match=r"option 'changeStartBatchId': .*retention removed"):
        read(spark, pruned, readChangeFeed=True, changeStartBatchId=kept[0]).schema  # noqa: B018
    # From the batch after the oldest retained one, the feed is there.
    feed = read(spark, pruned, readChangeFeed=True, changeStartBatchId=kept[0] + 1).toArrow()
    assert set(feed["batch_id"].to_pylist()) <= set(kept[1:]) and feed.num_rows > 0


def test_register_is_safe_from_threads_and_second_sessions(spark: Any, roots: SourceRoots) -> None:
    """Queries started from several threads register at once (Spark refuses
    a second registration of a name); a second session of the same driver,
    where Spark 4.3 refuses the name, still reads through read_state."""
    from concurrent.futures import ThreadPoolExecutor

    from snapcut.spark.source import register as registry

    registry._known.pop(spark, None)
    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(lambda _: snapcut.spark.register(spark), range(8)))
    want = read(spark, roots.level1).toArrow().num_rows
    assert want > 0
    second = spark.newSession()
    usable = snapcut.spark.register(second)
    if usable:
        assert read(second, roots.level1).toArrow().num_rows == want
    assert read_state(second, roots.level1).count() == want
