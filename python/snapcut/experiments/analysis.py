"""From measured rows to per-cell summaries: runtime and overhead with spreads.

Overhead is computed from measured runtimes only: for each repetition r,
`runtime(cell, r) / runtime(none of the same group, r) - 1`, where the
group is the same experiment, keys, parallelism and record count, and r is
the same round of the rotated schedule (the two ran minutes apart, under the
same machine load). A cell's overhead is the median of those ratios, with
their min and max as the error bar.
"""

from __future__ import annotations

import csv
import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

from snapcut.experiments.grid import Cell

if TYPE_CHECKING:
    from snapcut.experiments.measurement import Measurement


@dataclass(frozen=True)
class Row:
    """One run: a line of results.csv."""

    experiment: str
    scenario: str
    protocol: str
    interval_s: float | None
    keys: int
    parallelism: int
    records: int
    repetition: int
    order: int
    runtime_s: float
    wall_s: float
    throughput_rps: float
    checkpoints: int
    checkpoint_ms_median: float
    checkpoint_ms_max: float
    state_bytes_max: int
    stall_s: float
    alignment_ms_max: float
    logged_records_max: int
    completed: float = 1.0
    """Share of the records emitted; below 1: stopped at its time budget,
    `runtime_s` projected from its progress (`job.stopped_at_budget`)."""

    @property
    def cell(self) -> Cell:
        return Cell(
            self.experiment,
            self.protocol,
            self.interval_s,
            self.keys,
            self.parallelism,
            self.records,
            self.scenario,
        )


def row_of(cell: Cell, m: Measurement, *, repetition: int, order: int) -> Row:
    """The results.csv line of one run of `cell`."""
    return Row(
        experiment=cell.experiment,
        scenario=cell.scenario,
        protocol=cell.protocol,
        interval_s=cell.interval_s,
        keys=cell.keys,
        parallelism=cell.parallelism,
        records=cell.records,
        repetition=repetition,
        order=order,
        runtime_s=m.runtime_s,
        wall_s=m.wall_s,
        throughput_rps=m.throughput_rps,
        checkpoints=m.checkpoints,
        checkpoint_ms_median=m.checkpoint_ms_median,
        checkpoint_ms_max=m.checkpoint_ms_max,
        state_bytes_max=m.state_bytes_max,
        stall_s=m.stall_s,
        alignment_ms_max=m.alignment_ms_max,
        logged_records_max=m.logged_records_max,
        completed=m.completed,
    )


COLUMNS = [f.name for f in fields(Row)]
_INTS = {
    "keys",
    "parallelism",
    "records",
    "repetition",
    "order",
    "checkpoints",
    "state_bytes_max",
    "logged_records_max",
}
_STRS = {"experiment", "scenario", "protocol"}


def write_csv(rows: Iterable[Row], path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            d = asdict(r)
            d["interval_s"] = "" if r.interval_s is None else r.interval_s
            w.writerow(d)


def read_csv(path: Path) -> list[Row]:
    rows = []
    with path.open(newline="") as f:
        for d in csv.DictReader(f):
            vals: dict[str, object] = {}
            for k in COLUMNS:
                if k == "completed" and k not in d:
                    continue  # written before runs had a time budget: all finished
                v = d[k]
                if k in _STRS:
                    vals[k] = v
                elif k == "interval_s":
                    vals[k] = float(v) if v else None
                elif k in _INTS:
                    vals[k] = int(v)
                else:
                    vals[k] = float(v)
            rows.append(Row(**vals))  # type: ignore[arg-type]
    return rows


@dataclass(frozen=True)
class Summary:
    """A cell over its repetitions. Overheads are fractions (0.1 = 10 % slower)."""

    cell: Cell
    runs: int
    runtime_median: float
    runtime_min: float
    runtime_max: float
    throughput_median: float
    overhead_median: float | None
    overhead_min: float | None
    overhead_max: float | None
    checkpoints_median: float
    checkpoint_ms_median: float
    checkpoint_ms_max: float
    stall_s_max: float
    state_bytes_max: int
    alignment_ms_max: float
    logged_records_max: int
    stopped: int = 0
    """Runs stopped at their time budget (their runtimes are projections)."""
    completed_min: float = 1.0


def overheads(rows: list[Row]) -> dict[Cell, list[float]]:
    """Per cell, runtime / same-round `none` runtime - 1, for every round that has both."""
    base: dict[tuple[tuple[str, str, int, int, int], int], float] = {}
    for r in rows:
        if r.protocol == "none":
            base[(r.cell.group(), r.repetition)] = r.runtime_s
    out: dict[Cell, list[float]] = {}
    for r in rows:
        b = base.get((r.cell.group(), r.repetition))
        if b is None or b <= 0:
            continue
        out.setdefault(r.cell, []).append(r.runtime_s / b - 1.0)
    return out


def summarize(rows: list[Row]) -> list[Summary]:
    by_cell: dict[Cell, list[Row]] = {}
    for r in rows:
        by_cell.setdefault(r.cell, []).append(r)
    ovh = overheads(rows)
    out = []
    for cell in sorted(by_cell, key=_sort_key):
        rs = by_cell[cell]
        rt = [r.runtime_s for r in rs]
        o = ovh.get(cell)
        out.append(
            Summary(
                cell=cell,
                runs=len(rs),
                runtime_median=statistics.median(rt),
                runtime_min=min(rt),
                runtime_max=max(rt),
                throughput_median=statistics.median(r.throughput_rps for r in rs),
                overhead_median=statistics.median(o) if o else None,
                overhead_min=min(o) if o else None,
                overhead_max=max(o) if o else None,
                checkpoints_median=statistics.median(r.checkpoints for r in rs),
                checkpoint_ms_median=statistics.median(r.checkpoint_ms_median for r in rs),
                checkpoint_ms_max=max(r.checkpoint_ms_max for r in rs),
                stall_s_max=max(r.stall_s for r in rs),
                state_bytes_max=max(r.state_bytes_max for r in rs),
                alignment_ms_max=max(r.alignment_ms_max for r in rs),
                logged_records_max=max(r.logged_records_max for r in rs),
                stopped=sum(1 for r in rs if r.completed < 1.0),
                completed_min=min(r.completed for r in rs),
            )
        )
    return out


def _sort_key(c: Cell) -> tuple[str, str, int, int, int, int, str, float]:
    order = (
        "none",
        "aligned",
        "aligned-timeout",
        "unaligned",
        "chandy-lamport",
        "sync-capture",
        "sync",
    )
    rank = order.index(c.protocol) if c.protocol in order else len(order)
    return (
        c.experiment,
        c.scenario,
        c.records,
        c.parallelism,
        c.keys,
        rank,
        c.protocol,
        -1.0 if c.interval_s is None else c.interval_s,
    )
