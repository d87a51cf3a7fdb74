"""A cell's overhead with its 95 % interval: from windowed runs (on windows
against their off neighbours, `windowed.on_overheads`, the interval
clustered by run) or, for a runaway cell, from the grid's whole runs
(runtime over the same round's `none`, a bootstrap over rounds)."""

from __future__ import annotations

import csv
import statistics
from dataclasses import dataclass
from pathlib import Path

from snapcut.experiments.analysis import Row, overheads
from snapcut.experiments.grid import Cell
from snapcut.experiments.windowed import bootstrap_median_ci, clustered_median_ci, on_overheads
from snapcut.experiments.windows import WindowRun

WINDOWED = "windowed"
WHOLE_RUNS = "whole runs"


@dataclass(frozen=True)
class Effect:
    """A cell's overhead (a fraction: 0.1 = 10 % slower) and how it was measured."""

    cell: Cell
    method: str
    """WINDOWED or WHOLE_RUNS."""
    overhead: float
    low: float
    high: float
    samples: int
    """On windows (windowed) or rounds (whole runs) behind the median."""
    runs: int
    cpu_overhead: float | None = None
    """Median of the on windows' CPU seconds per record against their neighbours'."""
    idle_on: float | None = None
    idle_off: float | None = None
    baseline_rps: float | None = None
    """Median records/s of the off windows."""
    checkpoints: int = 0
    skipped: int = 0

    @property
    def width(self) -> float:
        return self.high - self.low

    @property
    def resolved(self) -> bool:
        """The interval excludes zero."""
        return self.low > 0 or self.high < 0


def windowed_effect(runs: list[WindowRun]) -> Effect | None:
    """The effect of one cell from its windowed runs (None: no on window)."""
    per_run = [on_overheads(r.rates) for r in runs]
    pooled = [o for g in per_run for o in g]
    if not pooled:
        return None
    lo, hi = clustered_median_ci(per_run)
    cpu = [o for r in runs for o in on_overheads(r.cpu_s_per_record, higher_is_faster=False)]
    idle_on = [v for r in runs for v in r.idle[1::2]]
    idle_off = [v for r in runs for v in r.idle[0::2]]
    off = [v for r in runs for v in r.rates[0::2]]
    return Effect(
        cell=runs[0].cell,
        method=WINDOWED,
        overhead=statistics.median(pooled),
        low=lo,
        high=hi,
        samples=len(pooled),
        runs=len(runs),
        cpu_overhead=statistics.median(cpu) if cpu else None,
        idle_on=statistics.mean(idle_on) if idle_on else None,
        idle_off=statistics.mean(idle_off) if idle_off else None,
        baseline_rps=statistics.median(off) if off else None,
        checkpoints=sum(r.checkpoints for r in runs),
        skipped=sum(r.skipped for r in runs),
    )


def whole_run_effects(rows: list[Row], cells: set[Cell]) -> list[Effect]:
    """Effects of `cells` from the grid's whole runs: per round, runtime over
    the same round's `none` - 1; the median with a bootstrap interval over
    rounds (few rounds: a wide interval, unless the effect dwarfs the
    rounds' spread, as a runaway's does)."""
    out = []
    for cell, ovh in overheads(rows).items():
        if cell not in cells or not ovh:
            continue
        lo, hi = bootstrap_median_ci(ovh)
        out.append(
            Effect(
                cell=cell,
                method=WHOLE_RUNS,
                overhead=statistics.median(ovh),
                low=lo,
                high=hi,
                samples=len(ovh),
                runs=len(ovh),
                checkpoints=sum(r.checkpoints for r in rows if r.cell == cell),
            )
        )
    return out


WINDOW_COLUMNS = [
    "experiment",
    "scenario",
    "protocol",
    "interval_s",
    "keys",
    "parallelism",
    "run",
    "window",
    "on",
    "window_s",
    "guard_s",
    "records_per_s",
    "cpu_s_per_record",
    "idle_share",
]


def cell_columns(c: Cell) -> list[object]:
    """The columns that name a cell, first in both CSVs."""
    return [
        c.experiment,
        c.scenario,
        c.protocol,
        "" if c.interval_s is None else c.interval_s,
        c.keys,
        c.parallelism,
    ]


def write_windows_csv(runs: list[WindowRun], path: Path) -> None:
    """One line per measured window of every windowed run."""
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(WINDOW_COLUMNS)
        for r in runs:
            c = r.cell
            for i, rate in enumerate(r.rates):
                w.writerow(
                    [
                        *cell_columns(c),
                        r.run,
                        i,
                        int(i % 2 == 1),
                        r.plan.window_s,
                        r.plan.guard_s,
                        round(rate, 1),
                        f"{r.cpu_s_per_record[i]:.4g}" if i < len(r.cpu_s_per_record) else "",
                        f"{r.idle[i]:.4f}" if i < len(r.idle) else "",
                    ]
                )


EFFECT_COLUMNS = [
    "experiment",
    "scenario",
    "protocol",
    "interval_s",
    "keys",
    "parallelism",
    "method",
    "overhead",
    "low",
    "high",
    "samples",
    "runs",
    "cpu_overhead",
    "idle_on",
    "idle_off",
    "baseline_rps",
    "checkpoints",
    "skipped",
]


def write_effects_csv(effects: list[Effect], path: Path) -> None:
    """One line per overhead cell: its effect and 95 % interval (fractions)."""

    def num(v: float | None) -> str:
        return "" if v is None else f"{v:.6g}"

    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(EFFECT_COLUMNS)
        for e in effects:
            c = e.cell
            w.writerow(
                [
                    *cell_columns(c),
                    e.method,
                    num(e.overhead),
                    num(e.low),
                    num(e.high),
                    e.samples,
                    e.runs,
                    num(e.cpu_overhead),
                    num(e.idle_on),
                    num(e.idle_off),
                    num(e.baseline_rps),
                    e.checkpoints,
                    e.skipped,
                ]
            )
