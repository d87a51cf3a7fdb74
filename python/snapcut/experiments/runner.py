"""Runs a grid: every cell `repetitions` times in rotated order, with a
progress bar (cell, runs done, time left), then writes the results."""

from __future__ import annotations

import dataclasses
import shutil
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from snapcut.experiments.analysis import Row, Summary, row_of, summarize, write_csv
from snapcut.experiments.base import Experiment, Timelines
from snapcut.experiments.grid import Cell, Preset, schedule
from snapcut.experiments.job import run_cell
from snapcut.experiments.machine import Machine
from snapcut.experiments.measurement import Measurement

SETUP_S = 0.15
"""Building and starting a job, roughly (added to every estimate)."""
DEFAULT_RATE = 5e6
"""Records/s assumed before calibration (the three-shuffle job, 2 tasks)."""
WRITE_BYTES_PER_S = 400e6
STATE_BYTES_PER_KEY = 26
"""Bytes of keyed state per key and stage (int64 key, count, sum in Arrow
IPC). Both measured: a sync checkpoint of 1M keys wrote 52 MiB in ~0.13 s."""
MIN_WORKING_SHARE = 0.02
"""Share of time a sync job still works when its stall outlasts the
interval. In practice it is less (1M keys at 100 ms: the sources got one
batch out per checkpoint, ~0.1 %); the run's budget bounds the estimate."""

BUDGET_FACTOR = 20.0
BUDGET_FLOOR_S = 60.0
"""A run with checkpoints is stopped once it has taken BUDGET_FACTOR times
the estimate of the same job without checkpoints, and at least
BUDGET_FLOOR_S (a sync job whose stall outlasts its interval would
otherwise take hours); its runtime is then projected from its progress."""


class RunFn(Protocol):
    def __call__(self, cell: Cell, workdir: Path, budget_s: float | None = None) -> Measurement: ...


@dataclass
class Plan:
    experiments: list[Experiment]
    preset: Preset
    repetitions: int
    cells: list[Cell]
    rate: float = DEFAULT_RATE

    @property
    def runs(self) -> list[tuple[int, Cell]]:
        return schedule(self.cells, self.repetitions)

    def estimate(self, cell: Cell) -> float:
        """Seconds one run of `cell` should take on this machine (at most its budget)."""
        budget = self.budget(cell)
        unbounded = self._unbounded_estimate(cell)
        return unbounded if budget is None else min(unbounded, budget)

    def budget(self, cell: Cell) -> float | None:
        """Seconds after which a run of `cell` is stopped (None: never)."""
        if cell.protocol == "none":
            return None
        baseline = dataclasses.replace(cell, protocol="none", interval_s=None)
        return max(BUDGET_FLOOR_S, BUDGET_FACTOR * self._unbounded_estimate(baseline))

    def _unbounded_estimate(self, cell: Cell) -> float:
        e = self._experiment(cell)
        if e is not None and e.estimate is not None:
            return e.estimate(cell)
        work = cell.records / max(self.rate, 1.0)
        if cell.protocol == "sync" and cell.interval_s:
            # Every checkpoint writes all state (two stages keyed by user)
            # while the job stands still. The interval timer keeps running
            # during a stall (no minimum pause, as in Flink by default), so
            # the job works only the part of each interval the stall leaves;
            # a stall as long as the interval leaves almost nothing.
            stall = 2 * cell.keys * STATE_BYTES_PER_KEY / WRITE_BYTES_PER_S + 0.005
            work /= max(1.0 - stall / cell.interval_s, MIN_WORKING_SHARE)
        return work + SETUP_S

    def _experiment(self, cell: Cell) -> Experiment | None:
        """The experiment `cell` belongs to (None: a calibration cell)."""
        return next((e for e in self.experiments if e.name == cell.experiment), None)

    def total_estimate(self) -> float:
        return sum(self.estimate(c) for _, c in self.runs)


@dataclass
class Outcome:
    rows: list[Row] = field(default_factory=list)
    timelines: Timelines = field(default_factory=dict)
    summaries: list[Summary] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)


def calibrate(plan: Plan, run: RunFn, workdir: Path) -> float:
    """Measures the job's rate without checkpoints (a short run), so that
    estimates and the time left mean something on this machine."""
    records = min(plan.preset.records, 2_000_000)
    cell = Cell("calibration", "none", None, plan.preset.keys, plan.preset.parallelism, records)
    m = run(cell, workdir)
    plan.rate = records / max(m.runtime_s, 1e-3)
    return plan.rate


def execute(
    plan: Plan,
    console: Console,
    *,
    run: RunFn = run_cell,
    on_row: Callable[[Outcome], None] | None = None,
) -> Outcome:
    """Runs every (repetition, cell) in order; `on_row` sees the outcome so
    far after each run (to save partial results)."""
    out = Outcome()
    runs = plan.runs
    workdir = Path(tempfile.mkdtemp(prefix="snapcut-experiment-"))
    measured_rates: list[float] = []
    try:
        with Progress(
            TextColumn("[bold]{task.fields[step]}"),
            BarColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            TextColumn("left"),
            TimeRemainingColumn(),
            console=console,
            disable=not console.is_terminal,
        ) as progress:
            task = progress.add_task("", total=plan.total_estimate(), step="")
            for i, (rep, cell) in enumerate(runs):
                step = f"{i + 1}/{len(runs)}"
                progress.update(task, description=f"{cell.label()} (round {rep + 1})", step=step)
                e = plan._experiment(cell)
                simulate = None if e is None else e.simulate
                if simulate is not None:
                    m = simulate(cell, out.rows, plan.preset, workdir)
                else:
                    m = run(cell, workdir, budget_s=plan.budget(cell))
                row = row_of(cell, m, repetition=rep, order=i)
                out.rows.append(row)
                if cell.timeline and cell not in out.timelines:
                    out.timelines[cell] = m
                if cell.protocol == "none" and simulate is None:
                    measured_rates.append(cell.records / max(m.runtime_s, 1e-3))
                progress.advance(task, plan.estimate(cell))
                if not console.is_terminal:
                    stopped = (
                        ""
                        if m.completed >= 1.0
                        else f" (stopped at its budget after {m.wall_s:.0f} s, "
                        f"{100 * m.completed:.1f} % done: runtime projected)"
                    )
                    console.print(
                        f"[{step}] {cell.label()} round {rep + 1}: {m.runtime_s:.3f} s, "
                        f"{m.checkpoints} checkpoints{stopped}"
                    )
                if on_row is not None:
                    on_row(out)
                if measured_rates:
                    # Later estimates (and the time left) follow the machine.
                    plan.rate = statistics.median(measured_rates)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    out.summaries = summarize(out.rows)
    return out


def save_partial(outdir: Path) -> Callable[[Outcome], None]:
    def save(o: Outcome) -> None:
        write_csv(o.rows, outdir / "results.csv")

    return save


def describe(plan: Plan) -> str:
    total = plan.total_estimate()
    lines = [
        f"preset {plan.preset.name}: {len(plan.cells)} cells x {plan.repetitions} repetitions "
        f"= {len(plan.runs)} runs",
    ]
    for e in plan.experiments:
        n = sum(1 for c in plan.cells if c.experiment == e.name)
        lines.append(f"  {e.number}. {e.title} ({e.name}): {n} cells")
    lines.append(
        f"estimated time: {_duration(total)} at {plan.rate / 1e6:.1f} M records/s "
        "without checkpoints (the estimate follows the measured rate as runs finish)"
    )
    return "\n".join(lines)


def _duration(s: float) -> str:
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


__all__ = ["Machine", "Outcome", "Plan", "calibrate", "describe", "execute", "save_partial"]
