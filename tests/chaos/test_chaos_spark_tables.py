"""``snapcut chaos --engine spark --output delta|iceberg`` without Spark: the
table check (snapcut.chaos.spark_tables) on tables written directly with
deltalake and pyiceberg, a batch committed twice, a batch missing or with a
manifest naming another commit, the rows each commit changed; and the
option checks (an unknown output, a missing library, a table output or its
crash point where it does not apply)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

pytest.importorskip("pandas")
pytest.importorskip("pyspark")

from snapcut.chaos.core import Check
from snapcut.chaos.spark_tables import (
    ICEBERG_TABLE,
    TableRead,
    TableTarget,
    changed_rows,
    check_table,
    read_table_run,
)
from snapcut.cli import main as cli_main


def rows(*users: tuple[int, int, int]) -> pa.Table:
    """(user, count, total) rows as the dwell query's output."""
    return pa.table(
        {
            "user": pa.array([u for u, _, _ in users], pa.int64()),
            "count": pa.array([c for _, c, _ in users], pa.int64()),
            "total": pa.array([t for _, _, t in users], pa.int64()),
            "avg": pa.array([t / c for _, c, t in users], pa.float64()),
        }
    )


# The rows each commit appends, and the batch it carries: batch 1 is
# committed twice (a replay that did not find its first commit). Appends: one
# snapshot per commit in pyiceberg (its overwrite makes two), and the rows a
# commit changed are the rows it added.
COMMITS = [
    (0, rows((1, 1, 10), (2, 1, 5))),
    (1, rows((2, 2, 8))),
    (1, rows((2, 2, 8))),
    (2, rows((1, 2, 30), (3, 1, 7))),
]


def delta_table(where: Path, commits: list[tuple[int, pa.Table]]) -> TableTarget:
    deltalake = pytest.importorskip("deltalake")
    for batch, table in commits:
        props = deltalake.CommitProperties(custom_metadata={"snapcut.batch": batch})
        deltalake.write_deltalake(str(where), table, mode="append", commit_properties=props)
    return TableTarget("delta", where)


def iceberg_table(where: Path, commits: list[tuple[int, pa.Table]]) -> TableTarget:
    pytest.importorskip("pyiceberg")
    pytest.importorskip("sqlalchemy")
    from pyiceberg.catalog import load_catalog

    target = TableTarget("iceberg", where)
    target.prepare()
    catalog = load_catalog("snapcut", **target.catalog_properties())
    catalog.create_namespace("chaos")
    table: Any = catalog.create_table(ICEBERG_TABLE, commits[0][1].schema)
    for batch, rows_at in commits:
        table.append(rows_at, snapshot_properties={"snapcut.batch": str(batch)})
    return target


TABLES = {"delta": delta_table, "iceberg": iceberg_table}


@pytest.mark.parametrize("fmt", sorted(TABLES))
def test_a_batch_committed_twice_is_reported(tmp_path: Path, fmt: str) -> None:
    target = TABLES[fmt](tmp_path / "table", COMMITS)
    commits = [c for c, _ in target.history()]
    assert [c.batch for c in commits] == [0, 1, 1, 2]
    versions = [c.version for c in commits]
    check = Check()
    facts = check_table(TableRead(commits, {0: versions[0], 1: versions[1], 2: versions[3]}), check)
    assert (facts.commits, facts.double_commits, facts.missing_batches) == (4, 1, 0)
    assert check.problems == [
        f"1 batches committed to the table more than once, e.g. batch 1: commits {versions[1:3]}"
    ]


@pytest.mark.parametrize("fmt", sorted(TABLES))
def test_one_commit_per_batch_passes_and_each_batch_has_its_changed_rows(
    tmp_path: Path, fmt: str
) -> None:
    once = [COMMITS[0], COMMITS[1], COMMITS[3]]
    target = TABLES[fmt](tmp_path / "table", once)
    # No sink root: the batches Spark committed have no manifest.
    run = read_table_run(target, tmp_path / "no-root", {0, 1, 2})
    assert run.read.committed == {0: None, 1: None, 2: None}
    versions = [c.version for c in run.read.commits]
    run.read.committed = dict(enumerate(versions))
    check = Check()
    facts = check_table(run.read, check)
    assert (facts.commits, facts.double_commits, facts.missing_batches) == (3, 0, 0)
    assert not check.problems
    for batch, added in once:
        assert run.batches[batch].sort_by("user") == added
    assert run.final is not None and run.final.num_rows == 5


def test_a_process_that_read_a_delta_tables_commits_exits_cleanly(tmp_path: Path) -> None:
    """The harness reads every commit back, then prints its summary and exits:
    read through deltalake's own Python filesystem handler, such a process
    aborted at exit about half the time (SIGABRT, ``terminate called without
    an active exception``) after a campaign that passed. Six processes: the
    old read fails this with probability 1 - 2^-6."""
    delta_table(tmp_path / "table", COMMITS)
    code = (
        "import sys; from pathlib import Path; "
        "from snapcut.chaos.spark_tables import TableTarget; "
        "h = TableTarget('delta', Path(sys.argv[1])).history(); "
        "print(sum(rows.num_rows for _, rows in h))"
    )
    for _ in range(6):
        cmd = [sys.executable, "-c", code, str(tmp_path / "table")]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert (res.returncode, res.stderr) == (0, ""), res.stderr
        assert res.stdout.split() == ["15"]  # 2 + 3 + 4 + 6 rows at the 4 commits


def test_reading_a_delta_version_the_table_lacks_names_the_table(tmp_path: Path) -> None:
    """``DeltaOutput.read``: a version the table does not have is a
    StorageError naming the table and what failed, not deltalake's own."""
    from snapcut._core import StorageError
    from snapcut.spark.sink.delta import DeltaOutput

    delta_table(tmp_path / "table", COMMITS)
    output = DeltaOutput(str(tmp_path / "table"))
    assert output.read(3).num_rows == 6
    with pytest.raises(StorageError, match=r"output table .*table: reading the table failed"):
        output.read(9)


def test_a_missing_batch_a_wrong_manifest_and_no_manifest_are_reported(tmp_path: Path) -> None:
    target = delta_table(tmp_path / "table", [COMMITS[0], COMMITS[1]])
    commits = [c for c, _ in target.history()]
    for committed, message in [
        (
            {0: 0, 1: 1, 2: 2},
            "e.g. batch 2: its manifest names commit 2, the table's commits of it: []",
        ),
        ({0: 0, 1: 0}, "e.g. batch 1: its manifest names commit 0, the table's commits of it: [1]"),
        ({0: None, 1: 1}, "e.g. batch 0: no manifest, the table's commits of it: [0]"),
    ]:
        check = Check()
        assert check_table(TableRead(commits, committed), check).missing_batches == 1
        assert len(check.problems) == 1 and message in check.problems[0], check.problems


def test_a_commit_naming_no_batch_is_an_extra_commit() -> None:
    from snapcut.chaos.spark_tables import TableCommit

    check = Check()
    read = TableRead([TableCommit(0, 0), TableCommit(1, None)], {0: 0})
    assert check_table(read, check).double_commits == 1
    assert check.problems == ["table commit 1 names no batch (snapcut.batch)"]


def test_changed_rows_are_a_merges_new_rows_as_a_multiset() -> None:
    before = rows((1, 1, 10), (2, 1, 5))
    # A merge by user: user 2's row changes, user 1's does not.
    assert changed_rows(before, rows((1, 1, 10), (2, 2, 8))) == rows((2, 2, 8))
    after = rows((1, 1, 10), (1, 1, 10), (2, 2, 8))
    assert changed_rows(before, after) == rows((1, 1, 10), (2, 2, 8))
    assert changed_rows(None, before) == before


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--engine", "spark", "--output", "parquet"], "--output must be one of arrow, delta"),
        (["--output", "delta"], "--output applies to --engine spark only"),
        (
            ["--engine", "spark", "--topology", "chain", "--output", "iceberg"],
            "--output does not apply to --topology chain",
        ),
        (
            ["--engine", "spark", "--failpoints", "sink.after_table_commit"],
            "sink.after_table_commit is reached with a table output only: add --output delta",
        ),
    ],
)
def test_bad_outputs_are_refused(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["chaos", "--runs", "1", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("output", "module", "install"),
    [("delta", "deltalake", "snapcut[delta]"), ("iceberg", "sqlalchemy", "snapcut[iceberg]")],
)
def test_a_table_output_without_its_library_is_refused(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    output: str,
    module: str,
    install: str,
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # find_spec: not installed
    assert cli_main(["chaos", "--runs", "1", "--engine", "spark", "--output", output]) == 2
    err = capsys.readouterr().err
    assert f"--output {output} needs the {module} package" in err and install in err


def test_the_table_crash_point_is_a_default_of_table_outputs_only() -> None:
    from snapcut.chaos.spark import SparkOptions

    assert "sink.after_table_commit" not in SparkOptions().points()
    assert "sink.after_table_commit" in SparkOptions(output="delta").points()
    assert SparkOptions(output="iceberg", failpoints=("sink.after_commit",)).points() == (
        "sink.after_commit",
    )
