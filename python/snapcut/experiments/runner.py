"""Runs a grid: every cell `repetitions` times in rotated order (whole
runs), then every overhead cell of a windowed experiment in windowed runs
(`windows.py`), with a progress bar (cell, runs done, time left)."""

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
from snapcut.experiments.effects import (
    Effect,
    whole_run_effects,
    windowed_effect,
    write_windows_csv,
)
from snapcut.experiments.flows import BATCH, parse_scenario
from snapcut.experiments.grid import Cell, Preset, schedule
from snapcut.experiments.job import run_cell
from snapcut.experiments.machine import Machine
from snapcut.experiments.measurement import Measurement
from snapcut.experiments.spark_writes import paired_effects
from snapcut.experiments.windowed import on_overheads
from snapcut.experiments.windows import (
    MIN_ON_WINDOWS,
    WindowPlan,
    WindowRun,
    mean_rate_share,
    measure_windows,
    plan_windows,
)
from snapcut.experiments.windows import runaway as is_runaway

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


class WindowFn(Protocol):
    def __call__(
        self,
        cell: Cell,
        plan: WindowPlan,
        rate: float,
        workdir: Path,
        *,
        run: int = 0,
        overhead: float = 0.0,
    ) -> WindowRun: ...


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
            return e.estimate(cell, self.preset)
        work = cell.records / max(self.rate, 1.0)
        if cell.scenario:
            # Experiment 4's slow operator sleeps per batch it is sent: about
            # one per source batch (fitted: 20M records at 2 ms, ~11 s a run).
            _kind, slow_ms = parse_scenario(cell.scenario)
            work += cell.records / BATCH * slow_ms / 1e3
        if cell.protocol == "sync" and cell.interval_s:
            # Every checkpoint writes all state (two stages keyed by user)
            # while the job stands still. The interval timer keeps running
            # during a stall (no minimum pause, as in Flink by default), so
            # the job works only the part of each interval the stall leaves;
            # a stall as long as the interval leaves almost nothing.
            work /= max(1.0 - self.stall_s(cell) / cell.interval_s, MIN_WORKING_SHARE)
        return work + SETUP_S

    @staticmethod
    def stall_s(cell: Cell) -> float:
        """Estimated stop-the-world pause of one of `cell`'s checkpoints:
        sync writes all state (two stages keyed by user) while the job
        stands still; the others pause for nothing like it."""
        if cell.protocol != "sync":
            return 0.0
        return 2 * cell.keys * STATE_BYTES_PER_KEY / WRITE_BYTES_PER_S + 0.005

    def _overhead_cells(self) -> list[Cell]:
        """Cells with checkpoints of the experiments measured windowed."""
        chosen = self.preset.windowed_experiments
        return [
            c
            for c in self.cells
            if c.protocol != "none"
            and (e := self._experiment(c)) is not None
            and e.windowed
            and (chosen is None or e.name in chosen)
        ]

    @property
    def windowed_cells(self) -> list[Cell]:
        """Overhead cells switched per window (not runaways: `windows.runaway`)."""
        return [c for c in self._overhead_cells() if not is_runaway(c, self.stall_s(c))]

    @property
    def runaway_cells(self) -> list[Cell]:
        """Overhead cells measured by whole runs instead."""
        return [c for c in self._overhead_cells() if is_runaway(c, self.stall_s(c))]

    @property
    def window_runs(self) -> list[tuple[int, Cell]]:
        return [(r, c) for r in range(self.preset.window_runs) for c in self.windowed_cells]

    def window_plan(self, cell: Cell) -> WindowPlan:
        return plan_windows(cell, self.preset)

    def windowed_estimate(self) -> float:
        """Seconds of every windowed run (each is sized to its plan)."""
        return sum(self.window_plan(c).run_seconds + SETUP_S for _, c in self.window_runs)

    def _experiment(self, cell: Cell) -> Experiment | None:
        """The experiment `cell` belongs to (None: a calibration cell)."""
        return next((e for e in self.experiments if e.name == cell.experiment), None)

    def total_estimate(self) -> float:
        return sum(self.estimate(c) for _, c in self.runs) + self.windowed_estimate()


@dataclass
class Outcome:
    rows: list[Row] = field(default_factory=list)
    timelines: Timelines = field(default_factory=dict)
    summaries: list[Summary] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    windows: list[WindowRun] = field(default_factory=list)
    effects: list[Effect] = field(default_factory=list)
    """Per overhead cell of a windowed experiment: windowed, or whole runs for a runaway."""
    unmeasured: list[Cell] = field(default_factory=list)
    """Windowed cells whose runs had no on window between two off ones (ended early)."""
    batches: dict[tuple[Cell, int], tuple[tuple[float, ...], ...]] = field(default_factory=dict)
    """(cell, grid round) -> per query round, its micro-batches' seconds
    (experiment 7, Spark)."""


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
    windows: WindowFn = measure_windows,
    on_row: Callable[[Outcome], None] | None = None,
) -> Outcome:
    """Runs every (repetition, cell) in order, then every windowed run;
    `on_row` sees the outcome so far after each run (to save partial results)."""
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
                if m.batch_s:
                    out.batches[(cell, rep)] = m.batch_s
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
            window_runs = plan.window_runs
            # Records/s without checkpoints that the last windowed run of each
            # job (a group) reached: sizes the next.
            learned: dict[tuple[str, str, int, int, int], float] = {}
            for i, (rep, cell) in enumerate(window_runs):
                step = f"w{i + 1}/{len(window_runs)}"
                wp = plan.window_plan(cell)
                progress.update(task, description=f"{cell.label()} (windowed)", step=step)
                rate = learned.get(cell.group()) or baseline_rate(out.rows, cell, plan.rate)
                w = windows(
                    cell, wp, rate, workdir, run=rep, overhead=expected_overhead(out.rows, cell)
                )
                out.windows.append(w)
                learned[cell.group()] = off_rate(w)
                if len(on_overheads(w.rates)) < min(MIN_ON_WINDOWS, wp.on_windows):
                    # The job ran slower than its whole runs said (a busier machine,
                    # more keys to insert): once more, sized at this run's own rate.
                    again = rep + plan.preset.window_runs
                    own = w.records / max(w.runtime_s, 1e-3)
                    w = windows(cell, wp, own, workdir, run=again)
                    out.windows.append(w)
                    learned[cell.group()] = off_rate(w)
                if on_row is not None:
                    on_row(out)
                progress.advance(task, wp.run_seconds + SETUP_S)
                if not console.is_terminal:
                    eff = windowed_effect([x for x in out.windows if x.cell == cell])
                    said = (
                        "no on window"
                        if eff is None
                        else f"{eff.overhead:+.1%} [{eff.low:+.1%}, {eff.high:+.1%}] "
                        f"over {eff.samples} on windows"
                    )
                    console.print(f"[{step}] {cell.label()} windowed: {said}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    out.summaries = summarize(out.rows)
    out.effects = effects_of(out, plan)
    measured = {e.cell for e in out.effects}
    out.unmeasured = [c for c in plan.windowed_cells if c not in measured]
    return out


def baseline_rate(rows: list[Row], cell: Cell, default: float) -> float:
    """Records/s of `cell`'s job without checkpoints: the fastest of its
    group's `none` whole runs, else `default` (sizes the group's first
    windowed run; later ones use the rate the last one reached)."""
    rates = [
        r.records / r.runtime_s
        for r in rows
        if r.protocol == "none" and r.cell.group() == cell.group() and r.runtime_s > 0
    ]
    # Short whole runs include the job's start: their rate is a lower bound.
    return max(rates) if rates else default


def expected_overhead(rows: list[Row], cell: Cell) -> float:
    """How much `cell`'s checkpoints slow its job, by its whole runs: the
    median runtime over its group's `none` median, - 1 (0 without both)."""
    own = [r.runtime_s for r in rows if r.cell == cell and r.runtime_s > 0]
    base = [
        r.runtime_s
        for r in rows
        if r.protocol == "none" and r.cell.group() == cell.group() and r.runtime_s > 0
    ]
    if not own or not base:
        return 0.0
    return statistics.median(own) / statistics.median(base) - 1


def off_rate(w: WindowRun) -> float:
    """Records/s of `w`'s job without checkpoints: its mean rate, with its
    on windows' measured slowdown taken out (`windows.run_records` inverted)."""
    mean = w.records / max(w.runtime_s, 1e-3)
    slowdowns = on_overheads(w.rates)
    return mean / mean_rate_share(statistics.median(slowdowns) if slowdowns else 0.0)


def effects_of(out: Outcome, plan: Plan) -> list[Effect]:
    """Windowed effects of every windowed cell, whole-run ones of runaways."""
    by_cell: dict[Cell, list[WindowRun]] = {}
    for w in out.windows:
        by_cell.setdefault(w.cell, []).append(w)
    effects = [e for ws in by_cell.values() if (e := windowed_effect(ws)) is not None]
    effects += whole_run_effects(out.rows, set(plan.runaway_cells))
    effects += paired_effects(out.batches)
    order = {c: i for i, c in enumerate(plan.cells)}
    return sorted(effects, key=lambda e: order.get(e.cell, len(order)))


def save_partial(outdir: Path) -> Callable[[Outcome], None]:
    def save(o: Outcome) -> None:
        write_csv(o.rows, outdir / "results.csv")
        if o.windows:
            write_windows_csv(o.windows, outdir / "windows.csv")

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
    wr = plan.window_runs
    if wr:
        lines.append(
            f"windowed: {len(wr)} runs ({len(plan.windowed_cells)} cells x "
            f"{plan.preset.window_runs}), {_duration(plan.windowed_estimate())}; "
            f"{len(plan.runaway_cells)} runaway cells measured by whole runs only"
        )
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
