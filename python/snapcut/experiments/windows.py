"""One windowed run of an experiment cell: checkpoints on and off in
alternating windows of one long run (the method of
:mod:`snapcut.experiments.windowed`, which this reuses).

The job runs with its protocol set and no periodic interval; a `Trigger`
takes a checkpoint every `interval_s` in on windows, the first one a guard
after the window's start, so that the measured part of an on window (after
its guard) holds exactly span / interval checkpoints. A checkpoint still in
flight when the next is due is not queued behind (the periodic trigger
waits too): the next trigger is simply skipped. Per window, records/s at
the last keyed stage come from the runtime's 50 ms timeline; CPU seconds per
record and the machine's idle share from the Trigger's counters.

A synchronous checkpoint pauses the sources only while it runs, so `sync`
is switched per window like the others. What cannot be: a *runaway* cell,
whose checkpoints (sync's full state write) would last longer than half an
interval, so that the last one of an on window runs on into the next off
window. Those are measured by the whole runs of the grid (`effects.py`).
"""

from __future__ import annotations

import math
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path

from snapcut.checkpointing import Checkpointing
from snapcut.dataflow import JobControl
from snapcut.experiments.flows import LAST_STAGE, build, build_scenario
from snapcut.experiments.grid import ALIGNED_TIMEOUT, ALIGNMENT_TIMEOUT_S, Cell, Preset
from snapcut.experiments.windowed import Trigger, window_counters, window_rates

MIN_ON_WINDOWS = 4
"""Fewer on windows than this give no interval worth reading."""
RUNAWAY_SHARE = 0.5
"""A cell whose estimated checkpoint lasts this share of its interval or
more is a runaway (`runaway`): not windowed."""
MARGIN_WINDOWS = 1
MARGIN_SHARE = 0.05
"""A windowed run is sized for its planned seconds plus this many windows
and this share more (`WindowPlan.run_seconds`): a machine a little faster
than its rate said still fills the planned windows. Short of them, a plan of
MIN_ON_WINDOWS on windows is run again, which costs a whole run."""
MAX_EXPECTED_OVERHEAD = 3.0
"""The most an on window is assumed to slow the job when a run is sized."""


@dataclass(frozen=True)
class WindowPlan:
    """The windows of one windowed run of a cell."""

    span_s: float
    """Measured part of a window: a whole number of intervals."""
    guard_s: float
    warmup_s: float
    on_windows: int

    @property
    def window_s(self) -> float:
        return self.guard_s + self.span_s

    @property
    def seconds(self) -> float:
        """Planned duration: warm-up, on and off windows, a last off window
        and the dropped partial one."""
        return self.warmup_s + (2 * self.on_windows + 2) * self.window_s

    @property
    def run_seconds(self) -> float:
        """What a run is sized for: `seconds` with its margin."""
        return self.seconds * (1 + MARGIN_SHARE) + MARGIN_WINDOWS * self.window_s


def mean_rate_share(overhead: float) -> float:
    """A windowed run's mean rate over its off windows' rate: equal time in
    off windows and in on windows slowed by `overhead` (clamped to
    [0, MAX_EXPECTED_OVERHEAD])."""
    x = min(max(overhead, 0.0), MAX_EXPECTED_OVERHEAD)
    return (1 + 1 / (1 + x)) / 2


def run_records(rate: float, plan: WindowPlan, overhead: float) -> int:
    """Records for a windowed run of `plan` lasting `plan.run_seconds`: off
    windows run at `rate` records/s, on windows at rate / (1 + overhead)
    (sizing by the off rate alone ran the 10M-key cells, +100 %, 1.4x their
    plan)."""
    return max(int(rate * mean_rate_share(overhead) * plan.run_seconds), 1)


def plan_windows(cell: Cell, preset: Preset) -> WindowPlan:
    """Windows sized to `cell`'s interval: the measured span is the preset's
    span rounded to a whole number of intervals (at least one); long
    windows get fewer on windows, to keep the run near `window_cell_seconds`."""
    iv = cell.interval_s or preset.window_span_s
    span = iv * max(1, round(preset.window_span_s / iv))
    window = preset.window_guard_s + span
    cell_s = preset.window_cell_seconds(cell.experiment)
    fit = math.floor((cell_s - preset.window_warmup_s) / window / 2 - 1)
    on = max(min(preset.on_windows, MIN_ON_WINDOWS), min(preset.on_windows, fit))
    return WindowPlan(span, preset.window_guard_s, preset.window_warmup_s, on)


def runaway(cell: Cell, checkpoint_s: float) -> bool:
    """Whether `cell`'s checkpoints (estimated `checkpoint_s` each) outlast
    RUNAWAY_SHARE of its interval."""
    return cell.interval_s is not None and checkpoint_s >= RUNAWAY_SHARE * cell.interval_s


@dataclass
class WindowRun:
    """What one windowed run measured, per window (even: off, odd: on)."""

    cell: Cell
    run: int
    rates: list[float]
    """Records/s at the last stage after each window's guard."""
    cpu_s_per_record: list[float]
    """The process's CPU seconds per record (0 for a window without records)."""
    idle: list[float]
    """The machine's idle share."""
    records: int
    runtime_s: float
    checkpoints: int
    skipped: int
    """Triggers skipped because a checkpoint was still in flight."""
    plan: WindowPlan
    extra: dict[str, float] = field(default_factory=dict)


class InFlightSkip:
    """`Trigger.fire`: triggers a checkpoint unless the last one it
    triggered has neither completed nor aborted yet (the job's own counts,
    `JobControl.checkpoints()`), as the periodic trigger waits rather than
    queueing."""

    def __init__(self, control: JobControl) -> None:
        self.control = control
        self.fired = 0
        self.skipped = 0

    def __call__(self) -> None:
        done = self.control.checkpoints()
        # A trigger sent and not yet started is in no count: `fired` is.
        if self.fired > done.completed + done.aborted:
            self.skipped += 1
            return
        self.control.trigger_checkpoint()
        self.fired += 1


def checkpointing(cell: Cell) -> Checkpointing:
    """`cell`'s protocol with no periodic interval (the Trigger fires)."""
    if cell.protocol == ALIGNED_TIMEOUT:
        return Checkpointing(
            protocol="unaligned", interval=None, alignment_timeout=ALIGNMENT_TIMEOUT_S
        )
    return Checkpointing(protocol=cell.protocol, interval=None)


def measure_windows(
    cell: Cell,
    plan: WindowPlan,
    rate: float,
    workdir: Path,
    *,
    run: int = 0,
    overhead: float = 0.0,
    inject_s: float = 0.0,
) -> WindowRun:
    """One windowed run of `cell` sized for `plan` (`run_records`): `rate`
    records/s without checkpoints, `overhead` the expected slowdown of an
    on window.

    `inject_s`: instead of checkpoints, what on windows switch on is this
    many more seconds of sleep per batch at the slow operator of a scenario
    cell (a known slowdown: tests of the estimator through the runner)."""
    records = run_records(rate, plan, overhead)
    sized = Cell(
        cell.experiment,
        cell.protocol,
        cell.interval_s,
        cell.keys,
        cell.parallelism,
        records,
        cell.scenario,
    )
    on = threading.Event()

    def switch(state: bool) -> None:
        (on.set if state else on.clear)()

    def extra() -> float:
        return inject_s if on.is_set() else 0.0

    if inject_s > 0 and not cell.scenario:
        raise ValueError(f"{cell.label()}: a slowdown is injected at a scenario's slow operator")
    if cell.scenario:
        flow = build_scenario(sized, extra if inject_s > 0 else None)
    else:
        flow = build(records, cell.keys, cell.parallelism)
    root = workdir / "windowed-checkpoints"
    shutil.rmtree(root, ignore_errors=True)
    control = JobControl()
    checkpoints = cell.protocol != "none" and inject_s <= 0
    fire = InFlightSkip(control) if checkpoints else None
    trigger = Trigger(
        control,
        plan.window_s,
        plan.guard_s,
        cell.interval_s if checkpoints else None,
        plan.warmup_s,
        fire=fire,
        switch=switch if inject_s > 0 else None,
        offset_s=plan.guard_s,
    )
    trigger.start()
    try:
        report = flow.run(
            checkpointing(cell) if checkpoints else Checkpointing(protocol="none"),
            checkpoint_dir=root if checkpoints else None,
            control=control,
        )
    finally:
        trigger.stop.set()
        trigger.join()
        shutil.rmtree(root, ignore_errors=True)
    if report.records_in != records:
        raise RuntimeError(
            f"{cell.label()}: a windowed run emitted {report.records_in:,} of {records:,} records"
        )
    rates = window_rates(
        report.timeline.get(LAST_STAGE, []),
        report.timeline_bucket_s,
        plan.window_s,
        plan.guard_s,
        plan.warmup_s,
    )
    counters = window_counters(trigger.marks, len(rates))
    rates = rates[: len(counters)]
    cpu = [
        w.cpu_s / (r * plan.span_s) if r > 0 else 0.0 for w, r in zip(counters, rates, strict=True)
    ]
    periodic = [c for c in report.completed_checkpoints if not c.is_final]
    return WindowRun(
        cell=cell,
        run=run,
        rates=rates,
        cpu_s_per_record=cpu,
        idle=[w.idle for w in counters],
        records=records,
        runtime_s=report.duration_s,
        checkpoints=len(periodic),
        skipped=0 if fire is None else fire.skipped,
        plan=plan,
    )
