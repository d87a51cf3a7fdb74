"""``rescale``: a committed batch of a state root copied into a new root with
another number of partitions, placed by Spark's own hash; the query restarted
from its checkpointLocation on the new root continues exactly as a query that
never changed its partitions (every later batch's output and the final state
are equal). The old root is only read; a non-empty target is refused."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark.sql import DataFrame
from tests.spark_support import dwell_frames, rows_of, run_to_end, start_session, write_inputs

from snapcut import ConfigError, snapshots
from snapcut.spark import committed_batches, keyed_state, read_state_arrow, rescale

SCHEMA = "user long, dwell_ms long, ts timestamp"
SESSION_KINDS = True  # tests/conftest.py: both_sessions tests also run on Connect


@pytest.fixture(scope="module")
def spark(request: pytest.FixtureRequest) -> Iterator[Any]:
    session = start_session(kind=request.param)
    yield session
    session.stop()


def frames() -> list[pd.DataFrame]:
    out = dwell_frames(files=4, rows=2000, users=250, seed=11)
    return [f.assign(region=(f["user"] % 3).map({0: "eu", 1: "us", 2: "ap"})) for f in out]


def query(spark: Any, directory: Path, root: Path, partitions: int) -> DataFrame:
    events = (
        spark.readStream.schema(SCHEMA + ", region string")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(directory))
    )
    ks = keyed_state(events, ["region", "user"], str(root), partitions)
    return ks.aggregate(n="count", total=("sum", "dwell_ms"), hi=("max", "dwell_ms"))


def files_of(root: Path) -> dict[str, bytes]:
    files = sorted(p for p in root.rglob("*") if p.is_file())
    return {str(p.relative_to(root)): p.read_bytes() for p in files}


@pytest.mark.both_sessions
def test_rescaled_root_continues_like_an_unchanged_query(spark: Any, tmp_path: Path) -> None:
    data = frames()
    full_dir = write_inputs(tmp_path / "all", data)
    reference = run_to_end(query(spark, full_dir, tmp_path / "ref", 2), tmp_path / "chk-ref")

    # The same query on the first two files, then rescaled 2 -> 3 and continued.
    directory = write_inputs(tmp_path / "grow", data[:2])
    before = run_to_end(query(spark, directory, tmp_path / "two", 2), tmp_path / "chk")
    assert sorted(before) == [0, 1]
    old_files = files_of(tmp_path / "two")
    report = rescale(spark, str(tmp_path / "two"), str(tmp_path / "three"), 3)
    assert (report.batch, report.partitions_before, report.partitions_after) == (1, 2, 3)
    assert files_of(tmp_path / "two") == old_files
    state_at_1 = read_state_arrow(str(tmp_path / "two"))
    assert report.rows == state_at_1.num_rows == sum(report.rows_per_partition)
    assert min(report.rows_per_partition) > 0
    assert rows_of(read_state_arrow(str(tmp_path / "three")), ["region", "user"]) == rows_of(
        state_at_1, ["region", "user"]
    )
    snap = snapshots.open(str(tmp_path / "three"))
    assert snap.list() == [1] and len(snap[1].states()) == 3

    write_inputs(tmp_path / "grow", data)  # files 2 and 3 arrive
    after = run_to_end(query(spark, directory, tmp_path / "three", 3), tmp_path / "chk")
    assert sorted(after) == [2, 3]
    for b in (2, 3):
        assert rows_of(after[b], ["region", "user"]) == rows_of(reference[b], ["region", "user"])
    assert committed_batches(str(tmp_path / "three")) == [1, 2, 3]
    assert rows_of(read_state_arrow(str(tmp_path / "three")), ["region", "user"]) == rows_of(
        read_state_arrow(str(tmp_path / "ref")), ["region", "user"]
    )
    # The old root still refuses 3 partitions, and names the fix.
    with pytest.raises(ConfigError, match="rescale the root first"):
        query(spark, directory, tmp_path / "two", 3)


def test_rescale_refuses_bad_targets_and_changes_nothing(spark: Any, tmp_path: Path) -> None:
    directory = write_inputs(tmp_path / "in", frames()[:1])
    run_to_end(query(spark, directory, tmp_path / "a", 2), tmp_path / "chk")
    run_to_end(query(spark, directory, tmp_path / "b", 2), tmp_path / "chk-b")
    a, b = files_of(tmp_path / "a"), files_of(tmp_path / "b")
    with pytest.raises(ConfigError, match="already holds a state root"):
        rescale(spark, str(tmp_path / "a"), str(tmp_path / "b"), 3)
    with pytest.raises(ConfigError, match="partitions must be at least 1"):
        rescale(spark, str(tmp_path / "a"), str(tmp_path / "c"), 0)
    with pytest.raises(Exception, match="not committed"):
        rescale(spark, str(tmp_path / "a"), str(tmp_path / "c"), 3, batch=7)
    assert files_of(tmp_path / "a") == a and files_of(tmp_path / "b") == b
    # The command line runs its own Spark job.
    cli = [sys.executable, "-m", "snapcut", "spark", "rescale", str(tmp_path / "a")]
    done = subprocess.run(
        [*cli, "--to", str(tmp_path / "d"), "--partitions", "4"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "2 -> 4 partitions" in done.stdout
    assert rows_of(read_state_arrow(str(tmp_path / "d")), ["region", "user"]) == rows_of(
        read_state_arrow(str(tmp_path / "a")), ["region", "user"]
    )
    refused = subprocess.run(
        [*cli, "--to", str(tmp_path / "d"), "--partitions", "4"], capture_output=True, text=True
    )
    assert refused.returncode == 2 and "already holds a state root" in refused.stderr
