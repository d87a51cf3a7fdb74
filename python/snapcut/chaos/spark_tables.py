"""Table outputs of ``snapcut chaos --engine spark --output delta|iceberg``:
where a run's table is, what the chaos child is told of it, reading it back
with its own library, and checking its history.

The child's ``ArrowSnapshotSink`` writes the dwell query's update rows
(update mode by user) into a Delta table (``<run>/table``) or an Iceberg
table ``chaos.dwell`` in a SQLite catalog (``<run>/table/catalog.db``, the
warehouse beside it) instead of its sink root; the root keeps the manifests.
A run is checked as the Arrow output is (:func:`snapcut.chaos.spark.compare`)
on what the table shows:

- the batch's rows: the rows of the table at the batch's commit that are not
  in the table at the commit before (a merge by user changes exactly the
  rows of the users the batch touched: their counts grow);
- the newest committed output: the table's current rows, one per user;

and its history (:func:`check_table`): every batch committed to the table
exactly once. ``table_double_commits`` counts commits beyond one per batch
(a batch's second commit, a commit naming no batch); ``table_missing_batches``
the batches committed (in Spark's commit log or by a sink manifest) that have
no commit in the table, no manifest (the sink commits its manifest before
Spark commits the batch), or a manifest naming another commit than the
table's.
"""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from snapcut._core import ConfigError
from snapcut.chaos.core import Check
from snapcut.spark.sink import delta, iceberg
from snapcut.spark.sink.root import SinkRoot
from snapcut.spark.sink.table import BATCH_KEY, table_errors

OUTPUTS = ("arrow", "delta", "iceberg")

#: The Iceberg table of a run, in the run's own catalog.
ICEBERG_TABLE = "chaos.dwell"

#: What each table output imports (for the check before a campaign starts).
_NEEDS = {
    "delta": (("deltalake",), delta.INSTALL),
    "iceberg": (("pyiceberg", "sqlalchemy"), iceberg.INSTALL),
}


def check_output(output: str) -> None:
    """A ConfigError naming the fix unless `output` is one of :data:`OUTPUTS`
    with its library installed."""
    if output not in OUTPUTS:
        raise ConfigError(f"--output must be one of {', '.join(OUTPUTS)}, got {output!r}")
    if output == "arrow":
        return
    modules, install = _NEEDS[output]
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(
            f"--output {output} needs the {', '.join(missing)} package: {install} "
            "(or leave --output out: the rows go to the sink root)"
        )


@dataclass(frozen=True)
class TableCommit:
    version: int
    """Delta's table version, Iceberg's snapshot id (a manifest's ``table_version``)."""
    batch: int | None
    """The ``snapcut.batch`` the commit carries (None: none)."""


@dataclass
class TableRead:
    """A run's table history and what claims to have committed to it."""

    commits: list[TableCommit]
    """Oldest first."""
    committed: dict[int, int | None]
    """Batch → the table version its sink manifest names; None for a batch
    Spark committed with no manifest in the sink root."""


@dataclass
class TableFacts:
    commits: int = 0
    double_commits: int = 0
    missing_batches: int = 0


@dataclass(frozen=True)
class TableTarget:
    """A run's table: ``format`` "delta" or "iceberg"; ``where`` the Delta
    table's directory, or the Iceberg catalog's (``catalog.db``, ``warehouse/``)."""

    format: str
    where: Path

    def catalog_properties(self) -> dict[str, str]:
        return {
            "type": "sql",
            "uri": f"sqlite:///{self.where}/catalog.db",
            "warehouse": f"file://{self.where}/warehouse",
        }

    def prepare(self) -> None:
        """The directories the first batch's commit needs (SQLite does not
        create the catalog's directory)."""
        if self.format == "iceberg":
            (self.where / "warehouse").mkdir(parents=True, exist_ok=True)

    def child_args(self) -> list[str]:
        """``python -m snapcut.jobs.spark_dwell``'s arguments for the table."""
        if self.format == "delta":
            return ["--output", "delta", "--table", str(self.where)]
        catalog = json.dumps(self.catalog_properties())
        return ["--output", "iceberg", "--table", ICEBERG_TABLE, "--catalog", catalog]

    def name(self) -> str:
        return str(self.where) if self.format == "delta" else ICEBERG_TABLE

    def history(self) -> list[tuple[TableCommit, pa.Table]]:
        """Every commit, oldest first, with the table's rows at it (none if
        there is no table: no batch was committed)."""
        with table_errors(self.name(), "reading the table back"):
            return self._delta() if self.format == "delta" else self._iceberg()

    def _delta(self) -> list[tuple[TableCommit, pa.Table]]:
        import deltalake

        if not (self.where / "_delta_log").is_dir():
            return []
        uri = str(self.where)
        table = delta.DeltaOutput(uri)
        out = []
        for h in sorted(deltalake.DeltaTable(uri).history(), key=lambda h: int(h["version"])):
            version, batch = int(h["version"]), h.get(BATCH_KEY)
            rows = table.read(version)
            out.append((TableCommit(version, None if batch is None else int(batch)), rows))
        return out

    def _iceberg(self) -> list[tuple[TableCommit, pa.Table]]:
        from pyiceberg.catalog import load_catalog

        if not (self.where / "catalog.db").exists():
            return []
        catalog = load_catalog("snapcut", **self.catalog_properties())
        if not catalog.table_exists(ICEBERG_TABLE):
            return []
        table = catalog.load_table(ICEBERG_TABLE)
        out = []
        # The metadata lists snapshots in commit order (format v1 has no
        # sequence numbers to sort by).
        for s in table.snapshots():
            props = {} if s.summary is None else s.summary.additional_properties
            batch = props.get(BATCH_KEY)
            rows = table.scan(snapshot_id=s.snapshot_id).to_arrow()
            out.append((TableCommit(s.snapshot_id, None if batch is None else int(batch)), rows))
        return out


def changed_rows(before: pa.Table | None, after: pa.Table) -> pa.Table:
    """The rows of `after` that `before` does not have (as a multiset: a row
    twice in `after`, once in `before`, is changed once)."""
    had = Counter(_tuples(before)) if before is not None else Counter()
    rows = []
    for row in after.to_pylist():
        key = tuple(row.values())
        if had[key]:
            had[key] -= 1
        else:
            rows.append(row)
    return pa.Table.from_pylist(rows, schema=after.schema)


def _tuples(table: pa.Table) -> list[tuple[Any, ...]]:
    return [tuple(r.values()) for r in table.to_pylist()]


@dataclass
class TableRun:
    read: TableRead
    batches: dict[int, pa.Table] = field(default_factory=dict)
    """Batch → the rows its commit(s) changed."""
    final: pa.Table | None = None
    """The table's current rows."""


def read_table_run(target: TableTarget, sink_root: Path, spark_committed: set[int]) -> TableRun:
    """The table's history and rows, and the batches committed to it by
    Spark's commit log (`spark_committed`) and the sink root's manifests."""
    history = target.history()
    committed: dict[int, int | None] = dict.fromkeys(spark_committed)
    if sink_root.is_dir():
        for b in SinkRoot(str(sink_root)).history():
            committed[b.batch_id] = b.table_version
    run = TableRun(TableRead([c for c, _ in history], committed))
    before = None
    for commit, rows in history:
        changed = changed_rows(before, rows)
        if commit.batch is not None:
            had = run.batches.get(commit.batch)
            run.batches[commit.batch] = changed if had is None else pa.concat_tables([had, changed])
        before = rows
    run.final = before
    return run


def check_table(read: TableRead, check: Check) -> TableFacts:
    """Every batch committed to the table exactly once, the commit its
    manifest names; the violations go into `check`'s problems."""
    facts = TableFacts(commits=len(read.commits))
    by_batch: dict[int, list[int]] = {}
    for c in read.commits:
        if c.batch is None:
            facts.double_commits += 1
            check.problems.append(f"table commit {c.version} names no batch ({BATCH_KEY})")
        else:
            by_batch.setdefault(c.batch, []).append(c.version)
    twice = {b: v for b, v in by_batch.items() if len(v) > 1}
    if twice:
        facts.double_commits += sum(len(v) - 1 for v in twice.values())
        b = min(twice)
        check.problems.append(
            f"{len(twice)} batches committed to the table more than once, e.g. batch {b}: "
            f"commits {twice[b]}"
        )
    missing = [
        b
        for b, named in sorted(read.committed.items())
        if named is None or named not in by_batch.get(b, [])
    ]
    facts.missing_batches = len(missing)
    if missing:
        b, named = missing[0], read.committed[missing[0]]
        check.problems.append(
            f"{len(missing)} committed batches are not in the table as committed, e.g. batch "
            f"{b}: {'no manifest' if named is None else f'its manifest names commit {named}'}"
            f", the table's commits of it: {by_batch.get(b, [])}"
        )
    return facts
